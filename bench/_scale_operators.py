"""The two operators the scale bench compares, each run as a plain process on the host.

meshrun: ``python -m meshrun_operator`` with its defaults. Kubeflow's training-operator v1.8.1:
the binary hack/build-tools.sh builds from its Go module (on demand, never by ``make tools``),
its CRDs read from the Go module cache, its webhook certificates made by hack/peer/certs.sh and
its validating webhook pointed at the host port. Neither is tuned: training-operator keeps its
one worker thread per controller and its client's default rate limit (20 requests/s, burst 30).
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import yaml
from _scale_cluster import BIN, CERTS_SH, ROOT, Cluster, apply

from meshrun.localnet import free_port

GPU = "nvidia.com/gpu"
IMAGE = "meshrun/trainer:bench"
PEER_VERSION = re.search(
    r"^TRAINING_OPERATOR_VERSION=(\S+)", (ROOT / "hack" / "versions.env").read_text(), re.M
)
PEER_MODULE = "github.com/kubeflow/training-operator"
# Where training-operator's cert rotator checks that a serving certificate exists (hard-coded).
PEER_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")
CLK_TCK = os.sysconf("SC_CLK_TCK")

# The operator's main() under the bench's stack sampler (SIGUSR1 starts it, SIGUSR2 writes it).
PROFILED_MAIN = (
    f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import _stack_sampler; "
    "sys.exit(_stack_sampler.run(sys.argv[1], sys.argv[2:]))"
)


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def established(cluster: Cluster, crd: str, seconds: float = 300) -> None:
    """Wait until the API server serves ``crd`` (a freshly started API server under the load of
    thousands of new nodes may answer a first wait with an error)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{crd}")
            return
        except subprocess.CalledProcessError as error:
            if time.monotonic() > deadline:
                raise RuntimeError(f"CRD {crd} not established: {error.stderr}") from error
            time.sleep(2)


class Operator(ABC):
    """One operator under test: its objects, its process, its user in the audit log."""

    name: str
    user: str
    group: str
    version: str
    plural: str

    cwd: Path | None = None
    """Where the process starts (a ``python -m`` finds packages there first)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = Path(tempfile.mktemp(prefix=f"opbench-{self.user}-", suffix=".log"))
        self.log_offset = 0
        self.profile_path: Path | None = None
        self.kubeconfig = cluster.user_kubeconfig(self.user)

    @abstractmethod
    def install(self) -> None:
        """Put the operator's CRDs (and whatever else it needs) on the cluster, once."""

    @abstractmethod
    def command(self, profile: Path | None) -> tuple[list[str], dict[str, str]]:
        """The command line and extra environment of the operator process."""

    @abstractmethod
    def ready(self) -> bool:
        """The operator has started its controllers."""

    @abstractmethod
    def job(self, name: str, pods: int) -> dict[str, Any]:
        """A job of ``pods`` pods of 8 GPUs each."""

    @abstractmethod
    def running(self, job: dict[str, Any]) -> bool:
        """The job's status says it is running."""

    def start(self, profile: Path | None = None, timeout: float = 180) -> None:
        self.profile_path = profile
        argv, extra = self.command(profile)
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig), **extra)
        self.log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd
            )
        deadline = time.monotonic() + timeout
        while not self.ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = self.log_path.read_text(errors="replace")[-3000:]
                self.stop()
                raise SystemExit(f"{self.name} did not start (log {self.log_path}):\n{tail}")
            time.sleep(0.5)
        self.wait_quiet()  # the initial listing of pods and nodes fills its caches

    def profile(self, on: bool) -> None:
        """Start or stop the sampler of an operator started with ``profile``."""
        if self.process is not None and self.profile_path is not None:
            self.process.send_signal(signal.SIGUSR1 if on else signal.SIGUSR2)
            if not on:
                deadline = time.monotonic() + 30
                while not self.profile_path.exists() and time.monotonic() < deadline:
                    time.sleep(0.2)

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def _proc(self, name: str) -> str:
        assert self.process is not None, f"{self.name} is not running"
        return (Path("/proc") / str(self.process.pid) / name).read_text()

    def cpu_seconds(self) -> float:
        """User plus system CPU time of the operator process so far."""
        fields = self._proc("stat").rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def peak_rss_mib(self) -> float:
        match = re.search(r"^VmHWM:\s+(\d+) kB", self._proc("status"), re.M)
        return int(match.group(1)) / 1024 if match else float("nan")

    def wait_quiet(self, window: float = 1.0, share: float = 0.05, timeout: float = 120) -> None:
        """Wait until the process uses under ``share`` of a core over ``window`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            before = self.cpu_seconds()
            time.sleep(window)
            if self.cpu_seconds() - before < share * window:
                return


class Meshrun(Operator):
    name, user = "meshrun", "meshrun-operator"
    group, version, plural = "meshrun.dev", "v1alpha1", "paralleltrainingjobs"
    tree = ROOT
    """The checkout whose CRD is installed and whose operator runs."""

    def install(self) -> None:
        crd = self.tree / "crds" / "meshrun.dev_paralleltrainingjobs.yaml"
        self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
        established(self.cluster, "paralleltrainingjobs.meshrun.dev")

    def start(self, profile: Path | None = None, timeout: float = 180) -> None:
        self.install()  # its own CRD again: another meshrun revision may have run in between
        super().start(profile, timeout)

    def command(self, profile: Path | None) -> tuple[list[str], dict[str, str]]:
        self.metrics = free_port()
        args = ["--metrics-port", str(self.metrics), "--health-port", str(free_port())]
        args.append("--no-progress-http")  # no trainer runs in a fake pod
        if profile is None:
            return [sys.executable, "-m", "meshrun_operator", *args], {}
        return [sys.executable, "-c", PROFILED_MAIN, str(profile), *args], {}

    def ready(self) -> bool:
        return http_ok(f"http://127.0.0.1:{self.metrics}/metrics")

    def job(self, name: str, pods: int) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "image": IMAGE,
            "resources": {"numNodes": pods, "numProcPerNode": 8},
            "strategy": {"type": "ddp"},
            "model": {"preset": "tiny"},
            "training": {"globalBatchSize": 64, "microBatchSize": 1},
        }
        if pods == 128:  # 1,024 GPUs as dp 8 x pp 16 x tp 8, the 70b preset, blocks preferred
            spec["strategy"] = {
                "type": "hybrid",
                "dataParallel": 8,
                "pipelineParallel": 16,
                "tensorParallel": 8,
                "microBatches": 16,
            }
            spec["model"] = {"preset": "70b"}
            spec["training"] = {"globalBatchSize": 1024, "microBatchSize": 1}
            # A stage is 8 pods; a block of the fake nodes is 16 (hack/kwok/nodes.py), the size of
            # a leaf switch's group: each stage fits one, as the operator places it.
            spec["scheduling"] = {"topologyKey": "topology.meshrun.dev/block"}
        kind = "ParallelTrainingJob"
        api_version = f"{self.group}/{self.version}"
        return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}, "spec": spec}

    def running(self, job: dict[str, Any]) -> bool:
        return bool((job.get("status") or {}).get("phase") == "Running")


class MeshrunAt(Meshrun):
    """meshrun's operator at another commit (``--operators meshrun,meshrun@REV``): a git worktree
    of this checkout at REV, its packages first on the operator's PYTHONPATH, its CRD installed
    while it runs. The same jobs, flags and user as ``meshrun``, so the two alternate on one
    cluster like any two operators (ABBA) and "not slower than before" is one run's figure."""

    def __init__(self, cluster: Cluster, revision: str) -> None:
        super().__init__(cluster)
        self.name = f"meshrun@{revision}"
        self.tree = Path(tempfile.gettempdir()) / f"opbench-meshrun-{revision}"
        if not self.tree.exists():
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(self.tree), revision],
                check=True, capture_output=True,
            )  # fmt: skip
        self.cwd = self.tree
        code = "import meshrun, meshrun_operator as o; print(meshrun.__file__, o.__file__)"
        where = subprocess.run(
            [sys.executable, "-c", code], cwd=self.cwd,
            env=dict(os.environ, **self.paths()), capture_output=True, text=True, check=True,
        )  # fmt: skip
        outside = [f for f in where.stdout.split() if not Path(f).is_relative_to(self.tree)]
        if outside:
            self.remove()
            raise SystemExit(f"{self.name}: imported from outside {self.tree}: {outside}")

    def paths(self) -> dict[str, str]:
        return {"PYTHONPATH": os.pathsep.join([str(self.tree), str(self.tree / "operator")])}

    def command(self, profile: Path | None) -> tuple[list[str], dict[str, str]]:
        argv, extra = super().command(profile)
        return argv, {**extra, **self.paths()}

    def remove(self) -> None:
        """The worktree, once the bench is done with it."""
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(self.tree)],
            check=False, capture_output=True,
        )  # fmt: skip


class TrainingOperator(Operator):
    name, user = "training-operator", "training-operator"
    group, version, plural = "kubeflow.org", "v1", "pytorchjobs"

    def module_dir(self) -> Path:
        assert PEER_VERSION is not None, "hack/versions.env names no TRAINING_OPERATOR_VERSION"
        found = subprocess.run(
            ["go", "mod", "download", "-json", f"{PEER_MODULE}@{PEER_VERSION.group(1)}"],
            capture_output=True, text=True, check=True, cwd=tempfile.gettempdir(),
        )  # fmt: skip
        return Path(json.loads(found.stdout)["Dir"])

    def install(self) -> None:
        subprocess.run([str(ROOT / "hack" / "build-tools.sh"), "training-operator"], check=True)
        module = self.module_dir()
        crds = sorted((module / "manifests" / "base" / "crds").glob("kubeflow.org_*.yaml"))
        files = [arg for crd in crds for arg in ("-f", str(crd))]
        self.cluster.kubectl("apply", "--server-side", "--force-conflicts", *files)
        established(self.cluster, "pytorchjobs.kubeflow.org")
        certs = self.cluster.state / "peer-certs"
        subprocess.run([str(CERTS_SH), "webhook", str(certs)], check=True)
        apply(
            self.cluster,
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kubeflow"}},
        )
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "training-operator-webhook-cert", "namespace": "kubeflow"},
            "data": {
                name: base64.b64encode((certs / name).read_bytes()).decode()
                for name in ("ca.crt", "ca.key", "tls.crt", "tls.key")
            },
        }
        apply(self.cluster, secret)
        # The webhook server serves from $TMPDIR/k8s-webhook-server/serving-certs: a folder of
        # this cluster's own, so benches of other checkouts on the machine cannot swap its
        # certificate. The cert rotator only checks that tls.crt exists under /tmp.
        self.tmpdir = self.cluster.state / "peer-tmp"
        serving = self.tmpdir / "k8s-webhook-server" / "serving-certs"
        for folder in (serving, PEER_CERT_DIR):
            folder.mkdir(parents=True, exist_ok=True)
            for name in ("tls.crt", "tls.key"):
                if folder == serving or not (folder / name).exists():
                    (folder / name).write_bytes((certs / name).read_bytes())
        self.webhook_port = free_port()
        webhooks = yaml.safe_load((module / "manifests/base/webhook/manifests.yaml").read_text())
        ca = base64.b64encode((certs / "ca.crt").read_bytes()).decode()
        for hook in webhooks["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            url = f"https://127.0.0.1:{self.webhook_port}{path}"
            hook["clientConfig"] = {"url": url, "caBundle": ca}
        # The name the operator's cert rotator looks for (the module's kustomize patch).
        webhooks["metadata"] = {"name": "validator.training-operator.kubeflow.org"}
        apply(self.cluster, webhooks)

    def command(self, profile: Path | None) -> tuple[list[str], dict[str, str]]:
        self.health = free_port()
        binary = BIN / "training-operator"
        return [
            str(binary),
            f"--metrics-bind-address=127.0.0.1:{free_port()}",
            f"--health-probe-bind-address=127.0.0.1:{self.health}",
            f"--webhook-server-port={self.webhook_port}",
        ], {"MY_POD_NAMESPACE": "kubeflow", "TMPDIR": str(self.tmpdir)}

    def ready(self) -> bool:
        if not http_ok(f"http://127.0.0.1:{self.health}/readyz"):
            return False
        with self.log_path.open("rb") as log:  # this process's lines only
            log.seek(self.log_offset)
            text = log.read().decode(errors="replace")
        return bool(re.search(r"Starting workers.*pytorchjob", text))

    def job(self, name: str, pods: int) -> dict[str, Any]:
        def replicas(count: int) -> dict[str, Any]:
            container = {"name": "pytorch", "image": IMAGE, "resources": {"limits": {GPU: 8}}}
            template = {"spec": {"containers": [container]}}
            return {"replicas": count, "restartPolicy": "OnFailure", "template": template}

        specs = {"Master": replicas(1)}
        if pods > 1:
            specs["Worker"] = replicas(pods - 1)
        return {
            "apiVersion": f"{self.group}/{self.version}",
            "kind": "PyTorchJob",
            "metadata": {"name": name},
            "spec": {"pytorchReplicaSpecs": specs},
        }

    def running(self, job: dict[str, Any]) -> bool:
        conditions = (job.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Running" and c.get("status") == "True" for c in conditions)

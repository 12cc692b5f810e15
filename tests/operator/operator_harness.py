"""Cluster-test plumbing: the operator as a real subprocess, jobs, pods and fake nodes.

The operator runs exactly as users run it (``meshrun operator``) against the real
API server, restricted to the test's namespace so parallel tests and other operators never
reconcile each other's jobs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from meshrun_operator import names
from waiting import wait_for

from meshrun.api.crd import API_VERSION, KIND, PLURAL
from meshrun.localnet import free_port

Kubectl = Callable[..., subprocess.CompletedProcess[str]]

FAST_FLAGS = [
    "--resync-seconds",
    "0.5",
    "--backoff-base-seconds",
    "1",
    "--backoff-max-seconds",
    "2",
    "--node-toleration-seconds",
    "3",
    "--no-progress-http",
]


CHART_VALUES = Path(__file__).resolve().parents[2] / "helm" / "meshrun" / "values.yaml"


def chart_memory_limit() -> int:
    """The operator container's memory limit in the chart's values, in bytes."""
    values = yaml.safe_load(CHART_VALUES.read_text())
    limit = str(values["resources"]["limits"]["memory"])
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    return int(limit[:-2]) * units[limit[-2:]] if limit[-2:] in units else int(limit)


class MemoryCgroup:
    """A memory cgroup of ``limit`` bytes (swap included) below this process's own, as the
    kubelet gives a container with a memory limit: cgroup v2 (memory.max, memory.swap.max) or
    v1's memory controller (memory.limit_in_bytes, memory.memsw.limit_in_bytes). A process is
    put in it before it execs (``enter``), so all it allocates is counted."""

    def __init__(self, name: str, limit: int) -> None:
        self.limit = limit
        self.path, self.v2 = _memory_cgroup_root()
        self.path = self.path / f"{name}-{os.getpid()}-{time.monotonic_ns()}"
        self.path.mkdir()
        if self.v2:
            (self.path / "memory.max").write_text(str(limit))
            swap = self.path / "memory.swap.max"
            if swap.exists():
                swap.write_text("0")
        else:
            (self.path / "memory.limit_in_bytes").write_text(str(limit))
            swap = self.path / "memory.memsw.limit_in_bytes"
            if swap.exists():
                swap.write_text(str(limit))

    def enter(self) -> None:
        """Move the calling process into the cgroup (a preexec_fn: runs in the child)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def peak(self) -> int:
        """The most memory the cgroup's processes held at once (bytes)."""
        name = "memory.peak" if self.v2 else "memory.max_usage_in_bytes"
        return int((self.path / name).read_text())

    def oom_kills(self) -> int:
        """Processes the kernel killed for the cgroup's limit."""
        name = "memory.events" if self.v2 else "memory.oom_control"
        for line in (self.path / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self.path.rmdir()


def _memory_cgroup_root() -> tuple[Path, bool]:
    """This process's own memory cgroup folder and whether it is cgroup v2; AssertionError
    saying what is missing where none can be written."""
    own = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, where = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = where
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        root, mount, kind = fields[3], fields[4], fields[fields.index("-") + 1]
        options = fields[-1].split(",")

        def inside(where: str, root: str = root, mount: str = mount) -> Path:
            # the mount shows the hierarchy from ``root`` (a container's own cgroup) down
            below = where[len(root) :] if root != "/" and where.startswith(root) else where
            return Path(mount) / below.lstrip("/")

        if kind == "cgroup" and "memory" in options and "memory" in own:
            folder = inside(own["memory"])
            v2 = False
        elif kind == "cgroup2" and "" in own:
            folder = inside(own[""])
            controllers = folder / "cgroup.subtree_control"
            if "memory" not in (controllers.read_text() if controllers.exists() else ""):
                continue
            v2 = True
        else:
            continue
        if os.access(folder, os.W_OK):
            return folder, v2
    raise AssertionError(
        "no memory cgroup this test may create (a writable cgroup v1 memory controller, or a "
        "delegated cgroup v2 with the memory controller): run it as root, or with one delegated"
    )


class OperatorProcess:
    """``python -m meshrun operator --namespace NS`` with its log in a file; with
    ``memory_limit`` (bytes) it runs in a memory cgroup of that size, as in its pod."""

    def __init__(
        self,
        kubeconfig: str,
        namespace: str,
        log_dir: Path,
        extra: list[str] | None = None,
        flags: list[str] | None = None,
        name: str = "operator",
        memory_limit: int | None = None,
    ) -> None:
        self.kubeconfig, self.namespace = kubeconfig, namespace
        self.log_path = log_dir / f"{name}-{namespace}.log"
        self.extra = extra or []
        self.flags = FAST_FLAGS if flags is None else flags
        """The flags before ``extra``: FAST_FLAGS unless a test needs others."""
        self.metrics_port, self.health_port = free_port(), free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.cgroup = MemoryCgroup("meshrun-operator", memory_limit) if memory_limit else None
        """The memory cgroup it runs in, when it has a limit."""

    def start(self) -> OperatorProcess:
        """Start it and wait for /healthz. A port :func:`free_port` picked can be taken before
        the operator binds it (another test's process, or an outgoing connection's ephemeral
        port): then it is started again on other ports."""
        for _ in range(3):
            before = self.log_path.stat().st_size if self.log_path.exists() else 0
            try:
                return self._start_once()
            except AssertionError:
                with self.log_path.open("rb") as log:
                    log.seek(before)
                    if b"address already in use" not in log.read():
                        raise
                self.metrics_port, self.health_port = free_port(), free_port()
        return self._start_once()

    def _start_once(self) -> OperatorProcess:
        env = {**os.environ, "KUBECONFIG": self.kubeconfig, "PYTHONUNBUFFERED": "1"}
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "meshrun",
                "operator",
                "--namespace",
                self.namespace,
                "--metrics-port",
                str(self.metrics_port),
                "--health-port",
                str(self.health_port),
                *self.flags,
                *self.extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=self.cgroup.enter if self.cgroup is not None else None,
        )
        exited = lambda: self.proc is not None and self.proc.poll() is not None  # noqa: E731
        wait_for(
            lambda: exited() or self.healthy(),
            60,
            f"operator /healthz on port {self.health_port}",
            interval=0.3,
            describe=self.log_tail,
        )
        if exited():
            raise AssertionError(f"operator exited {self.proc.returncode}:\n{self.log_tail()}")
        return self

    def healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"operator exited {self.proc.returncode}:\n{self.log_tail()}")
        return http_get(f"http://127.0.0.1:{self.health_port}/healthz") is not None

    def metrics(self) -> str:
        return http_get(f"http://127.0.0.1:{self.metrics_port}/metrics") or ""

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, as when a node dies under the operator."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def http_get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return str(response.read().decode())
    except OSError:
        return None


def job_manifest(name: str, **spec: Any) -> dict[str, Any]:
    """A small GPU job (2 pods x 4 GPUs, tiny model); keyword arguments replace spec keys."""
    base: dict[str, Any] = {
        "image": "meshrun/trainer:test",
        "resources": {"numNodes": 2, "numProcPerNode": 4},
        "strategy": {"type": "ddp"},
        "model": {"preset": "tiny"},
        "training": {"steps": 10, "globalBatchSize": 16, "microBatchSize": 2},
    }
    base.update(spec)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": base,
    }


class Cluster:
    """kubectl helpers bound to one namespace."""

    def __init__(self, kubectl: Kubectl, namespace: str) -> None:
        self.kubectl, self.ns = kubectl, namespace

    def apply(
        self, manifest: dict[str, Any], check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self.kubectl(
            "apply", "-n", self.ns, "-f", "-", input=json.dumps(manifest), check=check
        )

    def job(self, name: str) -> dict[str, Any]:
        out = self.kubectl("get", PLURAL, name, "-n", self.ns, "-o", "json").stdout
        job: dict[str, Any] = json.loads(out)
        return job

    def status(self, name: str) -> dict[str, Any]:
        status: dict[str, Any] = self.job(name).get("status") or {}
        return status

    def condition(self, name: str, kind: str) -> dict[str, Any]:
        for condition in self.status(name).get("conditions") or []:
            if condition.get("type") == kind:
                return dict(condition)
        return {}

    def pods(self, job: str) -> list[dict[str, Any]]:
        out = self.kubectl(
            "get", "pods", "-n", self.ns, "-l", names.selector(job), "-o", "json"
        ).stdout
        items: list[dict[str, Any]] = json.loads(out)["items"]
        return sorted(items, key=lambda p: p["metadata"]["name"])

    def live_pods(self, job: str) -> list[dict[str, Any]]:
        return [p for p in self.pods(job) if not p["metadata"].get("deletionTimestamp")]

    def annotate(self, kind: str, name: str, *pairs: str, namespaced: bool = True) -> None:
        where = ["-n", self.ns] if namespaced else []
        self.kubectl("annotate", kind, name, *where, "--overwrite", *pairs)

    def finish(
        self, pod: str, outcome: str, exit_code: int | None = None, message: str | None = None
    ) -> None:
        """Make a KWOK pod end (the cluster's sim.meshrun.dev Stages), optionally with a
        termination message as the trainer writes it."""
        pairs = [f"sim.meshrun.dev/outcome={outcome}"]
        if exit_code is not None:
            pairs.append(f"sim.meshrun.dev/exit-code={exit_code}")
        if message is not None:
            pairs.append(f"sim.meshrun.dev/message={message}")
        self.annotate("pod", pod, *pairs)

    def events(self, name: str) -> list[dict[str, Any]]:
        out = self.kubectl(
            "get",
            "events",
            "-n",
            self.ns,
            "--field-selector",
            f"involvedObject.name={name}",
            "-o",
            "json",
        ).stdout
        items: list[dict[str, Any]] = json.loads(out)["items"]
        return items

    def wait_events(self, name: str, reason: str, timeout: float = 30) -> list[dict[str, Any]]:
        """The Events about ``name`` with ``reason``, once there is one. A reconcile posts its
        Events after its status write (and its deletes), so a test that has seen the status, or
        the pods go, may read the Events before they are there."""
        found: list[dict[str, Any]] = wait_for(
            lambda: [e for e in self.events(name) if e["reason"] == reason],
            timeout,
            f"a {reason} Event about {name}",
            describe=lambda: [(e["type"], e["reason"]) for e in self.events(name)],
        )
        return found

    def wait_phase(self, name: str, phase: str, timeout: float = 60) -> dict[str, Any]:
        status: dict[str, Any] = wait_for(
            lambda: (s := self.status(name)).get("phase") == phase and s,
            timeout,
            f"job {name} to reach phase {phase}",
            describe=lambda: {k: v for k, v in self.status(name).items() if k != "plan"},
        )
        return status

    def wait_running_pods(
        self, name: str, count: int, attempt: int = 0, timeout: float = 60
    ) -> list[dict[str, Any]]:
        def ready() -> list[dict[str, Any]] | None:
            pods = [
                p
                for p in self.live_pods(name)
                if p["metadata"]["labels"].get(names.LABEL_ATTEMPT) == str(attempt)
                and p.get("status", {}).get("phase") == "Running"
            ]
            return pods if len(pods) == count else None

        pods: list[dict[str, Any]] = wait_for(
            ready,
            timeout,
            f"{count} Running pods of job {name} attempt {attempt}",
            describe=lambda: [
                (p["metadata"]["name"], p.get("status", {}).get("phase")) for p in self.pods(name)
            ],
        )
        return pods


def fake_node(name: str) -> dict[str, Any]:
    """A private KWOK node, tainted so that only the test that tolerates it lands there."""
    resources = {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"type": "kwok-test", "kubernetes.io/hostname": name},
        },
        "spec": {
            "taints": [{"key": "meshrun.dev/test-node", "value": name, "effect": "NoSchedule"}]
        },
        "status": {"allocatable": resources, "capacity": resources},
    }


def on_node(name: str) -> dict[str, Any]:
    """A podTemplate that pins pods to the private node ``name``."""
    return {
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": name},
            "tolerations": [
                {
                    "key": "meshrun.dev/test-node",
                    "operator": "Equal",
                    "value": name,
                    "effect": "NoSchedule",
                }
            ],
        }
    }


def wait_seconds(seconds: float) -> None:
    """A deliberate pause, only where a test must show that something does NOT happen."""
    time.sleep(seconds)


def admission_refusal(
    namespace: str, name: str, rules: list[dict[str, Any]], message: str
) -> list[dict[str, Any]]:
    """A ValidatingAdmissionPolicy (and its binding) that refuses the requests ``rules`` match
    in one namespace, as a cluster admin's webhook or policy engine might."""
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": rules},
            "validations": [{"expression": "false", "message": message, "reason": "Forbidden"}],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            },
        },
    }
    return [policy, binding]

"""``meshrun plot NAME|FOLDER``: draw a job's loss and tokens/s against the plan's prediction
from the TensorBoard event files its trainer wrote (docs/user-guide.md, "Metrics").

FOLDER: a folder of event files here (a local run's, or the job's volume copied or mounted).
NAME: a job on the cluster; its event files are read from ``--logdir`` when given, else from
its pod 0 while that pod runs (through the exec API, as ``kubectl exec`` does). The cluster is
reached with the ``kubernetes`` package's own kubeconfig loading: the current context and its
namespace, as kubectl resolves them, unless ``--context`` / ``-n`` say otherwise.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import io
import sys
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from meshrun.api.crd import GROUP, PLURAL, VERSION
from meshrun.envcontract import metrics_dir
from meshrun.files.curves import PICTURE_SUFFIXES, Curves, curves_from_events, draw
from meshrun.jobdoc import JOB_VARIABLE, read_document
from meshrun.rules.names import pod_name

EXIT_USAGE = 2
"""Bad input or nothing to draw: one line on stderr."""
PACK_FOLDER = (
    "import base64, io, sys, tarfile\n"
    "buffer = io.BytesIO()\n"
    "with tarfile.open(fileobj=buffer, mode='w') as tar:\n"
    "    tar.add(sys.argv[1], arcname='.')\n"
    "sys.stdout.write(base64.b64encode(buffer.getvalue()).decode())\n"
)
"""Run by the pod's own Python (the trainer image has no promise of tar): the folder as a
base64 tar on stdout, since the exec stream carries text."""


class PlotError(Exception):
    """What the user must change, said in one line."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="meshrun plot",
        description="Draw a job's loss and tokens/s (against the plan's prediction) from the "
        "TensorBoard event files its trainer wrote.",
    )
    parser.add_argument("source", metavar="NAME|FOLDER", help="a job on the cluster, or a folder")
    parser.add_argument(
        "-o", "--output", metavar="PATH", help="the picture (.png, .svg, .pdf); default NAME.png"
    )
    parser.add_argument("--logdir", metavar="DIR", help="the job's event files, copied here")
    parser.add_argument("-n", "--namespace", help="the job's namespace (default: the context's)")
    parser.add_argument("--context", help="the kubeconfig context to use")
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        path = plot(args)
    except PlotError as error:
        print(f"meshrun plot: {error}", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {path}")
    return 0


def plot(args: argparse.Namespace) -> Path:
    """Draw the picture ``args`` ask for; return its path."""
    source = Path(args.source)
    output = Path(args.output or f"{source.name or 'job'}.png")
    if output.suffix.lower() not in PICTURE_SUFFIXES:
        raise PlotError(f"-o: {output} must end in {', '.join(PICTURE_SUFFIXES)}")
    if source.is_dir():
        title, curves = source.name, _read(source)
    else:
        title, curves = cluster_curves(args)
    try:
        draw(curves, output, title)
    except ModuleNotFoundError as error:
        raise PlotError(f"needs matplotlib (pip install 'meshrun[plot]'): {error}") from None
    except OSError as error:
        raise PlotError(f"cannot write {output}: {error}") from None
    return output


def _read(folder: Path) -> Curves:
    try:
        return curves_from_events(folder)
    except ValueError as error:  # EventFileError too
        raise PlotError(str(error)) from None


def cluster_curves(args: argparse.Namespace) -> tuple[str, Curves]:
    """The title and curves of the job ``args.source`` on the cluster."""
    try:
        from kubernetes import client, config
        from kubernetes.client.exceptions import ApiException
        from kubernetes.config.config_exception import ConfigException
    except ModuleNotFoundError:
        raise PlotError(
            f"{args.source} is no folder here, and reading a job from the cluster needs the "
            "kubernetes package (pip install 'meshrun[operator]')"
        ) from None
    try:
        config.load_kube_config(context=args.context)  # type: ignore[no-untyped-call]
        contexts, current = config.list_kube_config_contexts()  # type: ignore[no-untyped-call]
    except (ConfigException, OSError) as error:
        raise PlotError(f"no cluster to read {args.source} from: {error}") from None
    chosen = next((c for c in contexts if c["name"] == args.context), current)
    namespace = args.namespace or chosen.get("context", {}).get("namespace", "default")
    name = args.source
    try:
        job: Any = client.CustomObjectsApi().get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name
        )
    except ApiException as error:
        if error.status == 404:
            raise PlotError(
                f"no ParallelTrainingJob {name} in namespace {namespace} (meshrun plot FOLDER "
                "draws a folder of event files)"
            ) from None
        raise PlotError(f"cannot read job {namespace}/{name}: {error.reason}") from None
    except OSError as error:
        raise PlotError(f"cannot reach the cluster: {error}") from None
    if args.logdir:
        curves = _read(Path(args.logdir))
    else:
        with tempfile.TemporaryDirectory(prefix="meshrun-plot-") as tmp:
            _copy_from_pod(client.CoreV1Api(), namespace, name, Path(tmp), ApiException)
            curves = _read(Path(tmp))
    return with_status(job, curves)


def with_status(job: Mapping[str, Any], curves: Curves) -> tuple[str, Curves]:
    """The title (the job's name and layout) and the curves, with the plan's prediction from
    status.plan where the event files lack it (a job planned without an estimate)."""
    status = job.get("status") or {}
    plan = status.get("plan") or {}
    name = job["metadata"]["name"]
    title = f"{name} ({plan['layout']})" if plan.get("layout") else name
    predicted = plan.get("predictedTokensPerSecond")
    if curves.predicted_tokens_per_second is None and predicted is not None:
        curves = dataclasses.replace(curves, predicted_tokens_per_second=float(predicted))
    return title, curves


def _copy_from_pod(core: Any, namespace: str, job: str, target: Path, api_error: Any) -> None:
    """The event files of the job's pod 0 (rank 0 writes them) into ``target``."""
    from kubernetes.stream import stream

    name = pod_name(job, 0)
    try:
        pod = core.read_namespaced_pod(name, namespace)
    except api_error as error:
        raise PlotError(
            f"cannot read pod {name} of job {job} ({error.reason}): give --logdir with the "
            "job's event files (its volume mounted or copied)"
        ) from None
    if pod.status.phase != "Running":
        raise PlotError(
            f"pod {name} is {pod.status.phase}, so its files cannot be read: give --logdir with "
            "the job's event files (its volume mounted or copied)"
        )
    container = pod.spec.containers[0]
    document = next((e.value for e in container.env or [] if e.name == JOB_VARIABLE), None)
    if document is None:
        raise PlotError(f"pod {name} has no {JOB_VARIABLE}: not a meshrun trainer pod")
    job_document = read_document(document)
    folder = metrics_dir(job_document.spec, job_document.pod.checkpoint_dir)
    if folder is None:
        raise PlotError(f"job {job} writes no event files (spec.training.metrics.tensorboard)")
    response = stream(
        core.connect_get_namespaced_pod_exec,
        name,
        namespace,
        container=container.name,
        command=["python", "-c", PACK_FOLDER, folder],
        stdin=False,
        stdout=True,
        stderr=True,
        tty=False,
        _preload_content=False,
    )
    response.run_forever(timeout=120)
    text, said = response.read_stdout(), response.read_stderr()
    if response.returncode or not text:
        raise PlotError(f"cannot read {folder} in pod {name}: {said.strip()[-300:]}")
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(text)), mode="r") as tar:
        tar.extractall(target, filter="data")

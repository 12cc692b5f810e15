"""``meshrun plot NAME|FOLDER``: draw a job's loss and tokens/s against the plan's prediction
from the TensorBoard event files its trainer wrote (docs/user-guide.md, "Metrics").

FOLDER: a folder of event files here (a local run's, or the job's volume copied or mounted).
NAME: a job on the cluster; its event files are read from ``--logdir`` when given, else from
its pod 0 while that pod runs (through the exec API, as ``kubectl exec`` does). The cluster is
reached through :mod:`meshrun.client`: the current context and its namespace, as kubectl
resolves them, unless ``--kubeconfig`` / ``--context`` / ``-n`` say otherwise.
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

from meshrun.envcontract import metrics_dir
from meshrun.files.curves import PICTURE_SUFFIXES, Curves, curves_from_events, draw
from meshrun.jobdoc import JOB_VARIABLE, read_document

EXIT_USAGE = 2
"""Bad input or nothing to draw: one line on stderr."""
EXIT_CLUSTER = 1
"""The cluster did not answer as asked (no cluster, no such job, forbidden), as the other job
commands exit: one line on stderr."""
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
    """What the user must change, said in one line; ``exit_code`` is the command's."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


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
    parser.add_argument("--context", help="the kubeconfig context (default: the current one)")
    parser.add_argument("--kubeconfig", help="the kubeconfig file (default: KUBECONFIG)")
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        path = plot(args)
    except PlotError as error:
        print(f"meshrun plot: {error}", file=sys.stderr)
        return error.exit_code
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
    elif "/" in args.source or args.source.startswith("."):
        # No job is named so (a name is a DNS label): a folder that is not there.
        raise PlotError(f"{args.source}: no such folder here")
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
    """The title and curves of the job ``args.source`` on the cluster, read through
    :class:`meshrun.client.JobClient` (kubectl's context and namespace, its one-line errors)."""
    try:
        from meshrun.client import JobClient
        from meshrun.client.errors import ClientError
    except ModuleNotFoundError:
        raise PlotError(
            f"{args.source} is no folder here, and reading a job from the cluster needs the "
            "client extra (pip install 'meshrun[client]')"
        ) from None
    try:
        client = JobClient(
            namespace=args.namespace, context=args.context, kubeconfig=args.kubeconfig
        )
        job = client.get(args.source)
        if args.logdir:
            curves = _read(Path(args.logdir))
        else:
            with tempfile.TemporaryDirectory(prefix="meshrun-plot-") as tmp:
                _copy_from_pod(client, args.source, Path(tmp))
                curves = _read(Path(tmp))
    except ClientError as error:
        raise PlotError(str(error), EXIT_CLUSTER) from None
    return with_status(job.object, curves)


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


def _copy_from_pod(client: Any, job: str, target: Path) -> None:
    """The event files of the job's pod 0 (rank 0 writes them) into ``target``."""
    from meshrun.client.errors import NotFound

    try:
        pod = client.pod_object(job, pod=0)
    except NotFound as error:
        raise PlotError(
            f"{error}: give --logdir with the job's event files (its volume mounted or copied)",
            EXIT_CLUSTER,
        ) from None
    name = pod.metadata.name
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
    text = client.run_in_pod(job, ["python", "-c", PACK_FOLDER, folder])
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(text)), mode="r") as tar:
        tar.extractall(target, filter="data")

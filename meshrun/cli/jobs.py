"""``meshrun submit``, ``list``, ``status``, ``logs``, ``wait`` and ``delete``: jobs on a cluster,
through :class:`meshrun.client.JobClient`.

The cluster and namespace are kubectl's (``--kubeconfig``, ``--context``, ``-n``/``--namespace``,
else KUBECONFIG's current context and its namespace). A mistake of the user's (no cluster, the
CRD not installed, no such job, forbidden) is one line on stderr and exit 1; an invalid job is
refused as ``meshrun plan`` refuses it (exit 2, or 3 when it does not fit). The client and the
kubernetes package are imported only when one of these commands runs, so ``meshrun plan`` needs
neither.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from meshrun.files.mountflag import add_mount_flag

if TYPE_CHECKING:
    from meshrun.api.errors import SpecError
    from meshrun.client import Job, JobClient

EXIT_OK = 0
EXIT_ERROR = 1
"""A cluster said no, or a job failed: the reason on stderr."""
EXIT_INVALID = 2
EXIT_DOES_NOT_FIT = 3
EXIT_INTERRUPTED = 130

PHASES = ("Pending", "Running", "Restarting", "Suspended", "Succeeded", "Failed")
COMMANDS = ("submit", "list", "status", "logs", "wait", "delete")


def add_commands(commands: Any) -> None:
    """The job commands, as subcommands of ``meshrun``."""
    submit = commands.add_parser(
        "submit",
        help="plan a job and create it on the cluster (needs meshrun[client])",
        description="Plan each ParallelTrainingJob in FILE as meshrun plan does (an invalid one "
        "is refused: exit 2, 3 when it does not fit), then create it. With --follow, show its "
        "progress until it ends: exit 0 when it succeeded, 1 when it failed.",
    )
    submit.add_argument(
        "file", metavar="FILE", help="YAML file with one or more jobs (- for stdin)"
    )
    submit.add_argument("-f", "--follow", action="store_true", help="follow it until it ends")
    add_mount_flag(submit, "so its files are checked")
    listing = commands.add_parser("list", help="the jobs of a namespace, with their progress")
    listing.add_argument("-A", "--all-namespaces", action="store_true", help="of every namespace")
    _add_output(listing)
    status = commands.add_parser(
        "status", help="a job's plan, progress, conditions, restarts and last failure"
    )
    status.add_argument("name", metavar="NAME", help="the job (its metadata.name)")
    _add_output(status)
    logs = commands.add_parser(
        "logs",
        help="the log of one of a job's pods (pod 0 unless --pod or --rank)",
        description="Print the log of one pod of job NAME: pod I, or the pod that runs global "
        "rank R (from the job's placement); pod 0 by default.",
    )
    logs.add_argument("name", metavar="NAME", help="the job (its metadata.name)")
    which = logs.add_mutually_exclusive_group()
    which.add_argument("--pod", type=int, metavar="I", help="the pod of index I")
    which.add_argument("--rank", type=int, metavar="R", help="the pod that runs global rank R")
    logs.add_argument("-c", "--container", help="a container other than kubectl's default")
    logs.add_argument("-f", "--follow", action="store_true", help="stream it as it grows")
    logs.add_argument("-p", "--previous", action="store_true", help="the container's previous run")
    logs.add_argument(
        "--tail", type=_tail, metavar="N", help="only the last N lines (-1, the default: all)"
    )
    wait = commands.add_parser(
        "wait",
        help="wait until a job reaches a phase",
        description="Wait until job NAME's phase is PHASE: exit 0 then, 1 when it ends in "
        "another phase (with the reason) or the timeout passes.",
    )
    wait.add_argument("name", metavar="NAME", help="the job (its metadata.name)")
    wait.add_argument(
        "--for",
        dest="phase",
        choices=PHASES,
        default="Succeeded",
        metavar="PHASE",
        help=f"the phase to wait for: {', '.join(PHASES)} (default: Succeeded)",
    )
    wait.add_argument(
        "--timeout",
        type=_seconds,
        default=None,
        metavar="S",
        help="give up after S seconds (or 30s, 10m, 2h; default: no limit)",
    )
    delete = commands.add_parser("delete", help="delete a job, its pods and its Service")
    delete.add_argument("name", metavar="NAME", help="the job (its metadata.name)")
    for sub in (submit, listing, status, logs, wait, delete):
        sub.add_argument("-n", "--namespace", help="the namespace (default: the context's)")
        sub.add_argument("--context", help="the kubeconfig context (default: the current one)")
        sub.add_argument("--kubeconfig", help="the kubeconfig file (default: KUBECONFIG)")


def _add_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-o",
        "--output",
        choices=("text", "json", "yaml"),
        default="text",
        help="text (default), or the whole object as json or yaml",
    )


DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h)?$")


def _seconds(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``10m`` or ``2h`` (kubectl wait's --timeout forms)."""
    found = DURATION.match(text.strip())
    if not found:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (90, 90s, 10m, 2h)")
    return float(found.group(1)) * {"s": 1, "m": 60, "h": 3600}[found.group(2) or "s"]


def _tail(text: str) -> int | None:
    """Lines for ``--tail``: N >= 0, or -1 (None) for all, as kubectl logs takes it."""
    try:
        lines = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of lines") from None
    if lines < -1:
        raise argparse.ArgumentTypeError(f"must be 0 or more lines, or -1 for all, got {lines}")
    return None if lines == -1 else lines


def run(args: argparse.Namespace) -> int:
    """Run job command ``args.command``; return the exit code."""
    command = args.command
    try:
        from meshrun.client.errors import ClientError
    except ModuleNotFoundError as error:
        print(
            f"meshrun {command}: needs the client extra (pip install 'meshrun[client]'): {error}",
            file=sys.stderr,
        )
        return EXIT_ERROR
    try:
        if command == "submit":
            return submit(args)
        client = _client(args)
        if command == "list":
            return _list(client, args.all_namespaces, args.output)
        if command == "status":
            return _status(client, args.name, args.output)
        if command == "logs":
            return _logs(client, args)
        if command == "wait":
            job = client.wait(args.name, (args.phase,), args.timeout)
            print(f"job {job.name} {job.phase}")
            return EXIT_OK
        client.delete(args.name)
        print(f"job {args.name} deleted from namespace {client.namespace}")
        return EXIT_OK
    except ClientError as error:
        print(f"meshrun {command}: {error}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _client(args: argparse.Namespace) -> JobClient:
    from meshrun.client import JobClient

    return JobClient(namespace=args.namespace, context=args.context, kubeconfig=args.kubeconfig)


def submit(args: argparse.Namespace) -> int:
    """Plan every job in the file (all or none are created), create them, follow the one."""
    from meshrun.api.crd import documents_of, read_documents
    from meshrun.api.errors import SpecError
    from meshrun.files.checks import plan_document

    source = "<stdin>" if args.file == "-" else str(Path(args.file))
    try:
        documents = documents_of(sys.stdin.read()) if args.file == "-" else read_documents(source)
    except SpecError as error:
        print(f"meshrun submit: {error}", file=sys.stderr)  # the error names the file
        return EXIT_INVALID
    jobs = []
    for index, document in enumerate(documents):
        document_name = f"{source}[{index}]"
        where = document_name if len(documents) > 1 else source
        try:
            job, _, plan = plan_document(document, document_name, args.mount)
        except SpecError as error:
            print(f"meshrun submit: {refusal(error, document_name, where)}", file=sys.stderr)
            return EXIT_INVALID
        if not plan.memory.fits:
            print(
                f"meshrun submit: job {plan.name} in {where} does not fit in accelerator memory "
                f"(meshrun plan {args.file} shows the estimate; kubectl apply -f {args.file} "
                "creates it regardless)",
                file=sys.stderr,
            )
            return EXIT_DOES_NOT_FIT
        jobs.append(job)
    if args.follow and len(jobs) != 1:
        print(
            f"meshrun submit: --follow follows one job; {args.file} has {len(jobs)}",
            file=sys.stderr,
        )
        return EXIT_INVALID
    client = _client(args)
    for job in jobs:
        created = client.create(job)
        print(f"job {created.name} created in namespace {created.namespace}")
    if not args.follow:
        return EXIT_OK
    return follow(client, jobs[0]["metadata"]["name"])


def refusal(error: SpecError, document: str, where: str) -> str:
    """A refused document, said once: the error alone when it names the ``document`` itself
    (not a mapping, the wrong apiVersion or kind, no name), else ``invalid job in WHERE:``
    and the spec field at fault."""
    if error.field.startswith(document):
        return str(error)
    return f"invalid job in {where}: {error}"


def follow(client: JobClient, name: str) -> int:
    """The live view of job ``name`` until it ends: 0 when it succeeded, 1 (and the reason)
    when it failed."""
    from rich.console import Console
    from rich.progress import Progress

    from meshrun.cli.jobview import LiveView

    # Piped or logged, the bar would be one line cut at 80 columns: the lines of each change
    # and the final one say it all.
    shown = Console().is_terminal
    with Progress(*LiveView.columns(), disable=not shown) as progress:
        view = LiveView(progress)
        job = None
        for job in client.watch(name):
            view.show(job)
    assert job is not None
    if job.phase == "Succeeded":
        print(f"job {name} Succeeded: {_final(job)}")
        return EXIT_OK
    print(f"meshrun submit: job {name} Failed: {job.reason()}", file=sys.stderr)
    return EXIT_ERROR


def _final(job: Job) -> str:
    from meshrun.cli.jobview import progress_line

    return progress_line(job) or "no progress reported"


def _list(client: JobClient, all_namespaces: bool, output: str) -> int:
    jobs = client.list(all_namespaces)
    if output != "text":
        _dump({"items": [_shown(job.object) for job in jobs]}, output)
        return EXIT_OK
    if not jobs:
        where = "any namespace" if all_namespaces else f"namespace {client.namespace}"
        print(f"No jobs in {where}.", file=sys.stderr)
        return EXIT_OK
    from meshrun.cli.jobview import jobs_table

    print(jobs_table(jobs, datetime.now(UTC), namespaces=all_namespaces))
    return EXIT_OK


def _status(client: JobClient, name: str, output: str) -> int:
    job = client.get(name)
    if output != "text":
        _dump(_shown(job.object), output)
        return EXIT_OK
    from rich.console import Console

    from meshrun.cli.jobview import status_view

    Console().print(status_view(job, datetime.now(UTC)))
    return EXIT_OK


def _logs(client: JobClient, args: argparse.Namespace) -> int:
    lines = client.logs(
        args.name,
        pod=args.pod,
        rank=args.rank,
        container=args.container,
        follow=args.follow,
        previous=args.previous,
        tail=args.tail,
    )
    with _closing(lines):
        for line in lines:
            print(line, flush=args.follow)
    return EXIT_OK


@contextmanager
def _closing(lines: Iterator[str]) -> Iterator[None]:
    """Close the log stream (and its connection) however the printing ends."""
    try:
        yield
    finally:
        close = getattr(lines, "close", None)
        if close is not None:
            close()


def _shown(job: dict[str, Any]) -> dict[str, Any]:
    """The object as ``kubectl get -o json`` shows it, less the server's field bookkeeping."""
    metadata = {k: v for k, v in job.get("metadata", {}).items() if k != "managedFields"}
    return {**job, "metadata": metadata}


def _dump(document: Any, output: str) -> None:
    if output == "json":
        json.dump(document, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        yaml.safe_dump(document, sys.stdout, sort_keys=False)

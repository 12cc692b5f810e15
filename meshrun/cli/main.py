"""``meshrun``: plan a job, run it locally, submit and follow it on a cluster, or run the
operator.

``run`` and ``operator`` import their packages lazily, and so do the job commands (submit, list,
status, logs, wait, delete: meshrun/cli/jobs.py) the client, so ``meshrun plan`` works with only
the core installed (no torch, no kopf, no kubernetes).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from meshrun.cli.jobs import COMMANDS as JOB_COMMANDS
from meshrun.cli.jobs import add_commands as add_job_commands
from meshrun.cli.jobs import refusal
from meshrun.cli.jobs import run as run_job_command
from meshrun.files.mountflag import add_mount_flag

EXIT_OK = 0
EXIT_INVALID = 2
"""Invalid spec: message on stderr."""
EXIT_DOES_NOT_FIT = 3
"""Valid spec, but the plan does not fit in accelerator memory (the plan is still printed)."""


EXAMPLES = """\
examples:
  meshrun plan job.yaml --picture plan.svg   the plan and a picture, no cluster
  meshrun run job.yaml --local               train it on this machine
  meshrun submit job.yaml --follow           create it on the cluster, follow it
  meshrun list -n NS                         the jobs, their step, loss and ETA
  meshrun status NAME -n NS                  plan, progress, conditions, pods
  meshrun logs NAME -n NS --rank 4           the log of the pod that runs rank 4

'meshrun COMMAND --help' gives a command's flags."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="meshrun",
        description="Parallel training jobs on Kubernetes that understand parallelism.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EXAMPLES,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    plan = commands.add_parser(
        "plan",
        help="show how a ParallelTrainingJob is laid out (pods, ranks, memory)",
        description="Plan the ParallelTrainingJob(s) in FILE. Exit 0 when the plan fits, 2 for "
        "an invalid spec, 3 when it is valid but does not fit in accelerator memory.",
    )
    plan.add_argument("file", metavar="FILE", help="YAML file with one or more jobs (- for stdin)")
    plan.add_argument(
        "-o",
        "--output",
        choices=("text", "json", "yaml"),
        default="text",
        help="text (default), or the plan as json or yaml",
    )
    plan.add_argument(
        "--candidates",
        type=int,
        default=0,
        metavar="N",
        help="also list the N fastest layouts that fit (predicted tokens/s per GPU)",
    )
    plan.add_argument(
        "--picture",
        metavar="PATH",
        help="also draw nodes x processes to PATH (.svg, or .png with matplotlib)",
    )
    add_mount_flag(plan, "so its files are checked")
    add_job_commands(commands)
    for name, text in (
        ("run", "run a job locally with torchrun-style processes (needs meshrun[trainer])"),
        ("operator", "run the Kubernetes operator (needs meshrun[operator])"),
        ("prepare-data", "tokenize a dataset once for training (needs meshrun[trainer])"),
        (
            "calibrate",
            "time a job's matrix multiplies against the step-time model (needs meshrun[trainer])",
        ),
        (
            "example-files",
            "write a tiny Hugging Face model and data for examples/hf-finetune.yaml",
        ),
        (
            "plot",
            "draw a job's loss and tokens/s from its event files (needs meshrun[plot])",
        ),
    ):
        sub = commands.add_parser(name, help=text, add_help=False)
        sub.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Delegated subcommands parse their own flags: argparse's REMAINDER refuses a remainder
    # that starts with an option (`meshrun operator --namespace x`), so hand it over first.
    if argv and argv[0] in DELEGATES:
        return _delegate(argv[0], argv[1:])
    args = build_parser().parse_args(argv)
    try:
        if args.command in JOB_COMMANDS:
            return run_job_command(args)
        if args.candidates < 0:
            print("meshrun plan: --candidates must be 0 or more", file=sys.stderr)
            return EXIT_INVALID
        return plan_command(args.file, args.output, args.picture, args.mount, args.candidates)
    except BrokenPipeError:
        # `meshrun plan ... | head`: the reader left. Point stdout at /dev/null so the
        # interpreter's final flush does not fail again (Python docs, "Note on SIGPIPE").
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


DELEGATES = {
    "run": ("meshrun_trainer.local.run", "trainer"),
    "operator": ("meshrun_operator.process", "operator"),
    "prepare-data": ("meshrun_trainer.local.prepare", "trainer"),
    "calibrate": ("meshrun_trainer.local.calibrate", "trainer"),
    "example-files": ("meshrun_trainer.local.examplefiles", "trainer"),
    "plot": ("meshrun.cli.plot", "plot"),
}
"""Subcommand -> (module with ``main(argv) -> int``, the pip extra that installs it)."""


def _delegate(command: str, argv: list[str]) -> int:
    module_name, extra = DELEGATES[command]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        print(
            f"meshrun {command}: needs the {extra} extra (pip install 'meshrun[{extra}]'): {error}",
            file=sys.stderr,
        )
        return 1
    return int(module.main(argv))


def plan_command(
    file: str,
    output: str,
    picture: str | None,
    mounts: Sequence[str] = (),
    candidates: int = 0,
) -> int:
    """Plan every job in ``file`` and check the files it names that are visible here (through
    ``mounts``); print the plans (a refused document as its error, the others still planned);
    return the exit code."""
    from meshrun.api.crd import documents_of, read_documents
    from meshrun.api.errors import SpecError
    from meshrun.files.checks import plan_document
    from meshrun.planner.search import best_layouts

    if picture is not None and Path(picture).suffix.lower() not in (".svg", ".png"):
        print(f"meshrun plan: --picture: {picture} must end in .svg or .png", file=sys.stderr)
        return EXIT_INVALID
    source = "<stdin>" if file == "-" else str(Path(file))
    try:
        documents = documents_of(sys.stdin.read()) if file == "-" else read_documents(file)
    except SpecError as error:
        print(f"meshrun plan: {error}", file=sys.stderr)  # the error names the file
        return EXIT_INVALID
    from meshrun.planner.elastic import elastic_degrees

    results: list[Any] = []
    layouts: list[list[Any]] = []
    degrees: list[list[int]] = []
    for index, document in enumerate(documents):
        document_name = f"{source}[{index}]"
        where = document_name if len(documents) > 1 else source
        try:
            _, spec, plan = plan_document(document, document_name, mounts)
            results.append(plan)
            layouts.append(best_layouts(spec, candidates) if candidates else [])
            degrees.append(elastic_degrees(spec, plan))
        except SpecError as error:
            print(f"meshrun plan: {refusal(error, document_name, where)}", file=sys.stderr)
            results.append(error)
            layouts.append([])
            degrees.append([])
    plans = [r for r in results if not isinstance(r, SpecError)]
    if output != "text" or plans:
        _print_plans(results, output, layouts if candidates else None, degrees)
    if picture is not None and plans:
        error_code = _draw(plans, picture)
        if error_code:
            return error_code
    if len(plans) < len(results):
        return EXIT_INVALID
    return EXIT_OK if all(plan.memory.fits for plan in plans) else EXIT_DOES_NOT_FIT


def _print_plans(
    results: list[Any],
    output: str,
    layouts: list[list[Any]] | None,
    degrees: list[list[int]],
) -> None:
    """Plans (and refused documents' errors) as text, JSON or YAML; one document prints one
    object, several a list in document order; ``layouts``: each plan's fastest layouts for
    ``--candidates``; ``degrees``: the data-parallel degrees an elastic job may run at."""
    from meshrun.api.errors import SpecError
    from meshrun.planner.fastest import candidate_dict

    if output == "text":
        from rich.console import Console

        from meshrun.cli.text import render, render_candidates, render_elastic

        console = Console()
        for index, result in enumerate(results):
            if isinstance(result, SpecError):
                continue  # said on stderr
            console.print(render(result))
            if degrees[index]:
                console.print(render_elastic(result, degrees[index]))
            if layouts is not None:
                console.print(render_candidates(layouts[index]))
        return
    data: list[dict[str, Any]] = []
    for index, result in enumerate(results):
        if isinstance(result, SpecError):
            data.append({"error": str(result)})
            continue
        entry = result.to_dict()
        if degrees[index]:
            entry["elasticDataParallel"] = degrees[index]
        if layouts is not None:
            entry["candidates"] = [candidate_dict(c) for c in layouts[index]]
        data.append(entry)
    document: Any = data[0] if len(data) == 1 else data
    if output == "json":
        json.dump(document, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        yaml.safe_dump(document, sys.stdout, sort_keys=False)


def _draw(plans: list[Any], picture: str) -> int:
    from meshrun.api.errors import SpecError
    from meshrun.cli.picture import write_picture

    target = Path(picture)
    for plan in plans:
        # Several jobs in one file: one picture each, named after the job.
        path = target if len(plans) == 1 else target.with_stem(f"{target.stem}-{plan.name}")
        try:
            write_picture(plan, path)
        except SpecError as error:
            print(f"meshrun plan: {error}", file=sys.stderr)
            return EXIT_INVALID
        except OSError as error:
            print(f"meshrun plan: --picture: cannot write {path}: {error}", file=sys.stderr)
            return EXIT_INVALID
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())

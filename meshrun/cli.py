"""``meshrun``: plan a job, run it locally, or run the operator.

``run`` and ``operator`` import their packages lazily, so ``meshrun plan`` works with only the
core installed (no torch, no kopf).
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

EXIT_OK = 0
EXIT_INVALID = 2
"""Invalid spec: message on stderr."""
EXIT_DOES_NOT_FIT = 3
"""Valid spec, but the plan does not fit in accelerator memory (the plan is still printed)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="meshrun",
        description="Parallel training jobs on Kubernetes that understand parallelism.",
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
        "-o", "--output", choices=("text", "json", "yaml"), default="text", help="format"
    )
    plan.add_argument(
        "--picture",
        metavar="PATH",
        help="also draw nodes x processes to PATH (.svg, or .png with matplotlib)",
    )
    plan.add_argument(
        "--mount",
        action="append",
        default=[],
        metavar="CONTAINER=LOCAL",
        help="read the job's container path CONTAINER (model folder, data, export) at LOCAL on "
        "this machine, so its files are checked; repeatable",
    )
    for name, text in (
        ("run", "run a job locally with torchrun-style processes (needs meshrun[trainer])"),
        ("operator", "run the Kubernetes operator (needs meshrun[operator])"),
        ("prepare-data", "tokenize a dataset once for training (needs meshrun[trainer])"),
        (
            "example-files",
            "write a tiny Hugging Face model and data for examples/hf-finetune.yaml",
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
        return plan_command(args.file, args.output, args.picture, args.mount)
    except BrokenPipeError:
        # `meshrun plan ... | head`: the reader left. Point stdout at /dev/null so the
        # interpreter's final flush does not fail again (Python docs, "Note on SIGPIPE").
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


DELEGATES = {
    "run": ("meshrun_trainer.local", "trainer"),
    "operator": ("meshrun_operator.main", "operator"),
    "prepare-data": ("meshrun_trainer.prepare", "trainer"),
    "example-files": ("meshrun_trainer.examplefiles", "trainer"),
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


def plan_command(file: str, output: str, picture: str | None, mounts: Sequence[str] = ()) -> int:
    """Plan every job in ``file`` and check the files it names that are visible here (through
    ``mounts``); print the plans; return the exit code."""
    from meshrun.api import load_jobs, parse_jobs
    from meshrun.errors import SpecError
    from meshrun.inputs import mount, plan_checked
    from meshrun.planner import Plan

    if picture is not None and Path(picture).suffix.lower() not in (".svg", ".png"):
        print(f"meshrun plan: --picture: {picture} must end in .svg or .png", file=sys.stderr)
        return EXIT_INVALID
    try:
        jobs = parse_jobs(sys.stdin.read()) if file == "-" else load_jobs(file)
        specs = [mount(job["spec"], mounts) for job in jobs]
        names = [job["metadata"]["name"] for job in jobs]
        plans: list[Plan] = [
            plan_checked(spec, name) for spec, name in zip(specs, names, strict=True)
        ]
        degrees = [_elastic_degrees(spec, plan) for spec, plan in zip(specs, plans, strict=True)]
    except SpecError as error:
        print(f"meshrun plan: invalid job in {file}: {error}", file=sys.stderr)
        return EXIT_INVALID
    _print_plans(plans, output, degrees)
    if picture is not None:
        error_code = _draw(plans, picture)
        if error_code:
            return error_code
    return EXIT_OK if all(plan.memory.fits for plan in plans) else EXIT_DOES_NOT_FIT


def _elastic_degrees(spec: Any, plan: Any) -> list[int]:
    """The data-parallel degrees a job with spec.elastic may run at (none without it)."""
    from meshrun.planner.elastic import elastic_degrees
    from meshrun.specread import read_spec

    return elastic_degrees(read_spec(spec), plan)


def _print_plans(plans: list[Any], output: str, degrees: list[list[int]]) -> None:
    if output == "text":
        from rich.console import Console

        from meshrun.planner.text import elastic_text, render

        console = Console()
        for plan, allowed in zip(plans, degrees, strict=True):
            console.print(render(plan))
            if allowed:
                console.print(elastic_text(plan, allowed))
        return
    data = [
        {**plan.to_dict(), **({"elasticDataParallel": allowed} if allowed else {})}
        for plan, allowed in zip(plans, degrees, strict=True)
    ]
    document: Any = data[0] if len(data) == 1 else data
    if output == "json":
        json.dump(document, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        yaml.safe_dump(document, sys.stdout, sort_keys=False)


def _draw(plans: list[Any], picture: str) -> int:
    from meshrun.errors import SpecError
    from meshrun.planner.picture import write_picture

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

"""``meshrun run FILE --local``: plan a job and run it on this machine, one torchrun per pod.

Each "pod" gets exactly the environment the operator would give it (meshrun.envcontract.pod_env,
through :mod:`meshrun_trainer.local.env`) with 127.0.0.1 as the master address, so a local run
goes through the same reading, rules and contract as a cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from meshrun.api.crd import load_jobs
from meshrun.api.errors import SpecError
from meshrun.api.spec import Data
from meshrun.envcontract import TRAINER_COMMAND, metrics_dir
from meshrun.files.checks import mount, plan_checked, read_with_files
from meshrun.files.curves import PICTURE_SUFFIXES, curves_from_steps, draw
from meshrun.files.hf import HFModel
from meshrun.files.mountflag import add_mount_flag
from meshrun_trainer.components.data.windows import dataset_tokens
from meshrun_trainer.components.progress import finite
from meshrun_trainer.config.files import open_files, with_model
from meshrun_trainer.config.read import read_job
from meshrun_trainer.local.env import local_envs

MAX_LOCAL_PROCESSES = 64
"""More processes than this on one machine is almost surely a mistake (a GPU-sized job)."""


class UsageError(Exception):
    """Bad input: reported on stderr with exit code 2."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="meshrun run", description="Run a ParallelTrainingJob file on this machine."
    )
    parser.add_argument("file", help="YAML file with a ParallelTrainingJob")
    parser.add_argument("--local", action="store_true", help="run here (required)")
    parser.add_argument("--job", help="name of the job to run when the file holds several")
    parser.add_argument("--summary-json", metavar="PATH", help="write the run summary here")
    parser.add_argument("--plot", metavar="PATH.png", help="draw the loss and tokens/s curves here")
    parser.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="checkpoint here and resume from the newest complete checkpoint in it",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_mount_flag(parser, "where the run reads and writes it")
    return parser


def pick_job(path: str, name: str | None) -> dict[str, Any]:
    """The one job of the file at ``path``, or the one named ``name``; UsageError else."""
    jobs = load_jobs(path)
    if name is not None:
        jobs = [j for j in jobs if j.get("metadata", {}).get("name") == name]
        if not jobs:
            raise UsageError(f"--job: no ParallelTrainingJob named {name!r} in {path}")
    if len(jobs) != 1:
        raise UsageError(f"{path}: holds {len(jobs)} jobs; choose one with --job NAME")
    return jobs[0]


def prepare(args: argparse.Namespace, workdir: Path) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """Plan the job and build each pod's environment; UsageError/SpecError on bad input. The
    plan's dict carries ``metricsDir``: where rank 0 writes its event files (or None)."""
    if not args.local:
        raise UsageError("only --local is supported here; use the operator to run on a cluster")
    if args.plot and Path(args.plot).suffix.lower() not in PICTURE_SUFFIXES:
        raise UsageError(f"--plot: {args.plot} must end in .png, .svg or .pdf")
    job = pick_job(args.file, args.job)
    name = str(job.get("metadata", {}).get("name", "job"))
    spec = read_with_files(mount(job.get("spec", {}), args.mount))

    # Every file checked before any process starts; a text dataset is tokenized here, once.
    def count_tokens(data: Data, path: str, model: HFModel | None, vocab: int) -> int:
        folder = model.path if model is not None else None
        return len(dataset_tokens(data, path, folder, vocab, quiet=args.quiet))

    planned = plan_checked(spec, name, local=True, count_tokens=count_tokens)
    if planned.world_size > MAX_LOCAL_PROCESSES:
        raise UsageError(
            f"spec.resources: {planned.world_size} processes exceed the local limit of "
            f"{MAX_LOCAL_PROCESSES}; run it on a cluster"
        )
    envs, why_cpu = local_envs(spec, planned, workdir, args.checkpoint_dir)
    if why_cpu:
        print(f"meshrun run: {why_cpu}", file=sys.stderr)
    try:  # the trainer's own checks (the planner's rules), before any process starts
        document = read_job(envs[0])
    except SpecError as error:
        raise UsageError(f"the planned job cannot train: {error}") from None
    with_model(document, open_files(document))  # and its files, as the trainer opens them
    plan = planned.to_dict()
    plan["metricsDir"] = metrics_dir(document.spec, document.pod.checkpoint_dir)
    return plan, envs


def _launch(envs: list[dict[str, str]], workdir: Path) -> tuple[list[subprocess.Popen[str]], Any]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MESHRUN_", "PET_"))}
    base.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default too; avoids oversubscription
    command = [sys.executable, *TRAINER_COMMAND[1:]]
    procs: list[subprocess.Popen[str]] = []
    logs: list[IO[str]] = []
    for index, env in enumerate(envs):
        log = open(workdir / f"pod-{index}.log", "w", encoding="utf-8")  # noqa: SIM115
        logs.append(log)
        procs.append(
            subprocess.Popen(
                command,
                env={**base, **env},
                stdout=subprocess.PIPE if index == 0 else log,
                stderr=log,
                text=True,
            )
        )
    return procs, logs


def _follow(
    proc: subprocess.Popen[str], plan: Mapping[str, Any], quiet: bool
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Read rank 0's JSON lines, drive the progress bar; return (step events, summary event)."""
    steps: list[dict[str, Any]] = []
    summary: dict[str, Any] | None = None
    total = int(plan.get("layout", {}).get("steps", 0)) or None
    console = Console(stderr=True)
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("step {task.completed}/{task.total}"),
        TextColumn("{task.fields[info]}"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, disable=quiet) as progress:
        task = progress.add_task(plan.get("name", "job"), total=total, info="starting")
        assert proc.stdout is not None
        for line in proc.stdout:
            if not line.startswith('{"event"'):
                console.print(line.rstrip(), markup=False, highlight=False)
                continue
            event = json.loads(line)
            if event["event"] == "summary":
                summary = event
            elif event["event"] == "eval":
                console.print(f"validation loss at step {event['step']}: {event['loss']:.4f}")
            elif event["event"] == "step":
                steps.append(event)
                info = f"loss {event['loss']:.4f}  {event['tokensPerSecond']:.0f} tok/s"
                progress.update(task, completed=event["step"], total=event["totalSteps"], info=info)
    return steps, summary


CHILD_FAILED = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"
"""The line torchrun's own traceback ends with when a rank failed; its table of the failed ranks
follows."""


def log_tail(text: str, lines: int = 30) -> str:
    """The last ``lines`` lines a pod's processes wrote. When torchrun reported a failed rank,
    its own traceback (a dozen lines of the launcher's frames) is left out and its table of the
    failed ranks kept, so the ranks' last lines, where the error is, still show."""
    found = text.splitlines()
    report = next((i for i in range(len(found) - 1, -1, -1) if CHILD_FAILED in found[i]), None)
    if report is None:
        return "\n".join(found[-lines:])
    launcher = max(
        (i for i in range(report) if found[i].startswith("Traceback (most recent call last)")),
        default=report,
    )
    return "\n".join([*found[:launcher][-lines:], *found[report:]])


def _tail(path: Path) -> str:
    return log_tail(path.read_text(errors="replace"))


def build_summary(
    plan: Mapping[str, Any], steps: list[dict[str, Any]], final: Mapping[str, Any], wall: float
) -> dict[str, Any]:
    losses = [float(s["loss"]) for s in steps]
    return {
        "job": plan.get("name"),
        "strategy": plan.get("strategy"),
        "worldSize": plan.get("worldSize"),
        "layout": plan.get("layout"),
        "steps": final.get("steps"),
        "resumedFromStep": final.get("resumedFromStep", 0),
        "losses": losses,
        "finalLoss": losses[-1] if losses else final.get("finalLoss"),
        "eval": final.get("eval", []),
        "tokensPerSecond": final.get("tokensPerSecond"),
        "peakMemoryBytes": final.get("peakMemoryBytes"),
        "peakMemoryKind": final.get("peakMemoryKind"),
        "trainerLayout": final.get("layout"),
        "wallSeconds": wall,
    }


def run_job(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="meshrun-local-") as tmp:
        workdir = Path(tmp)
        plan, envs = prepare(args, workdir)
        started = time.monotonic()
        procs, logs = _launch(envs, workdir)
        try:
            steps, final = _follow(procs[0], plan, args.quiet)
            codes = [p.wait() for p in procs]
        except KeyboardInterrupt:
            for p in procs:
                p.terminate()
            raise
        finally:
            for log in logs:
                log.close()
        wall = time.monotonic() - started
        if any(codes) or final is None:
            print(f"meshrun run: training failed (exit codes {codes})", file=sys.stderr)
            for index in range(len(procs)):
                print(
                    f"--- pod {index} log (tail) ---\n{_tail(workdir / f'pod-{index}.log')}",
                    file=sys.stderr,
                )
            return 1
    summary = build_summary(plan, steps, final, wall)
    if steps:
        evals = summary["eval"]
        validation = f", validation loss {evals[-1]['loss']:.4f}" if evals else ""
        print(
            f"{summary['job']}: {len(steps)} steps, final loss {summary['finalLoss']:.4f}"
            f"{validation}, {summary['tokensPerSecond']:.0f} tokens/s, {wall:.1f}s"
        )
    else:
        print(f"{summary['job']}: already complete at step {summary['resumedFromStep']}")
    if plan["metricsDir"]:
        print(f"TensorBoard event files: {plan['metricsDir']} (tensorboard --logdir)")
    if args.summary_json:
        text = json.dumps(finite(summary), indent=2, allow_nan=False)
        Path(args.summary_json).write_text(text + "\n", encoding="utf-8")
    if args.plot and steps:
        curves = curves_from_steps(steps, summary["eval"], plan.get("predictedTokensPerSecond"))
        draw(curves, args.plot, f"{summary['job']} ({plan['layoutString']})")
    return 0


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        return run_job(args)
    except (UsageError, SpecError, OSError) as error:
        print(f"meshrun run: {error}", file=sys.stderr)
        return 2

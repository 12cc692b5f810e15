"""A job on a cluster as ``meshrun`` shows it: the table of ``meshrun list``, the readable
``meshrun status`` (plan, progress, conditions, restarts, the last failure, the pods), and the
live view of ``meshrun submit --follow``. The numbers come as the operator wrote them for
``kubectl get`` (``status.display``), so every view says the same."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Column, Table
from rich.text import Text

from meshrun.api.display import duration_text, rate_text
from meshrun.cli.text import gib
from meshrun.client import Job

PHASE_STYLES = {"Succeeded": "green", "Failed": "bold red", "Restarting": "yellow"}


def age(stamp: object, now: datetime) -> str:
    """The time since an API timestamp (``2026-01-02T03:04:05Z``) as kubectl writes an age;
    ``<unknown>`` when there is none."""
    if not isinstance(stamp, str) or not stamp:
        return "<unknown>"
    try:
        then = datetime.fromisoformat(stamp)
    except ValueError:
        return "<unknown>"
    return duration_text((now - then).total_seconds())


def jobs_table(jobs: Iterable[Job], now: datetime, namespaces: bool = False) -> str:
    """``meshrun list``: a row per job, the columns of ``kubectl get ptj`` and the restarts, as
    kubectl prints a table (columns three spaces apart, no cell cut, whatever the width)."""
    header = ["NAME", "PHASE", "LAYOUT", "PROCS", "STEP", "PROGRESS", "LOSS", "TOKENS/S", "ETA"]
    header = (["NAMESPACE"] if namespaces else []) + [*header, "RESTARTS", "AGE"]
    rows = [header]
    for job in jobs:
        status, shown = job.status, job.status.get("display") or {}
        row = [
            job.name,
            job.phase,
            str(status.get("layout") or ""),
            str(status.get("worldSize") or ""),
            *(str(shown.get(key) or "") for key in ("step", "progress", "loss", "tokensPerSecond")),
            # An ended job has nothing left to wait for; the operator writes no ETA for one,
            # but a job that ended under an older operator may still carry its last.
            "" if job.finished else str(shown.get("eta") or ""),
            str(job.restarts),
            age(job.object["metadata"].get("creationTimestamp"), now),
        ]
        rows.append(([job.namespace] if namespaces else []) + row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(line.rstrip() for line in lines)


def progress_line(job: Job) -> str:
    """Step, share done, loss, tokens/s against the prediction, the time per step and the ETA,
    as the operator wrote them; empty before the trainer's first report."""
    progress, shown = job.progress, job.status.get("display") or {}
    parts = []
    if shown.get("step"):
        share = f" ({shown['progress']})" if shown.get("progress") else ""
        parts.append(f"step {shown['step']}{share}")
    if shown.get("loss"):
        parts.append(f"loss {shown['loss']}")
    if shown.get("tokensPerSecond"):
        predicted = shown.get("predictedTokensPerSecond")
        against = f" of {predicted} predicted" if predicted else ""
        parts.append(f"{shown['tokensPerSecond']} tokens/s{against}")
    if isinstance(progress.get("stepTimeSeconds"), int | float):
        parts.append(f"{progress['stepTimeSeconds']:.3g} s/step")
    if isinstance(progress.get("evalLoss"), int | float):
        parts.append(f"eval loss {progress['evalLoss']:.4g} at step {progress.get('evalStep')}")
    if shown.get("eta") and not job.finished:
        parts.append(f"ETA {shown['eta']}")
    return ", ".join(parts)


def plan_line(plan: Mapping[str, Any]) -> str:
    """status.plan in one line: strategy, layout, processes, micro-batch, the prediction."""
    if not plan:
        return ""
    parts = [f"{plan.get('strategy')} {plan.get('layout')}"]
    world, gpus = plan.get("worldSize"), plan.get("gpus")
    parts.append(f"{world} processes" + (f" on {gpus} GPUs" if gpus else " on CPUs"))
    if plan.get("zeroStage"):
        parts.append(f"ZeRO-{plan['zeroStage']}")
    if plan.get("microBatchSize"):
        parts.append(f"micro-batch {plan['microBatchSize']}")
    predicted = plan.get("predictedTokensPerSecond")
    if isinstance(predicted, int | float) and gpus:
        parts.append(f"predicted {rate_text(predicted)} tokens/s")
    memory = plan.get("memory") or {}
    total = (memory.get("perGpuBytes") or {}).get("total")
    if isinstance(total, int) and memory.get("acceleratorBytes"):
        parts.append(f"{gib(total)} of {gib(memory['acceleratorBytes'])} per GPU (estimate)")
    return ", ".join(parts)


def failure_line(failure: Mapping[str, Any], now: datetime) -> str:
    """status.lastFailure: which pod, why, whether it counted, the exit code, when."""
    pod = f"pod {failure['pod']} " if failure.get("pod") else ""
    facts = [str(failure.get("class") or "")]
    if failure.get("exitCode") is not None:
        facts.append(f"exit code {failure['exitCode']}")
    facts.append(f"{age(failure.get('time'), now)} ago")
    said = ", ".join(fact for fact in facts if fact)
    return f"{pod}{failure.get('reason')} ({said}): {failure.get('message') or ''}".rstrip(": ")


def status_view(job: Job, now: datetime) -> RenderableType:
    """``meshrun status``: what the job is doing, its plan and progress, its restarts and last
    failure, its conditions and its pods."""
    status = job.status
    restarts = f"{job.restarts} restart" + ("" if job.restarts == 1 else "s")
    if status.get("disruptions"):
        restarts += f" (+{status['disruptions']} not counted)"
    head = Text.assemble(
        (job.name, "bold"),
        f" in {job.namespace}: ",
        (job.phase, PHASE_STYLES.get(job.phase, "bold")),
        f", attempt {status.get('attempt', 0)}, {restarts}, "
        f"age {age(job.object['metadata'].get('creationTimestamp'), now)}",
    )
    parts: list[RenderableType] = [head]
    if status.get("message"):
        parts.append(Text(str(status["message"])))
    for label, line in (
        ("Plan", plan_line(status.get("plan") or {})),
        ("Running", _running_now(status)),
        ("Progress", progress_line(job)),
        ("Last failure", failure_line(job.last_failure, now) if job.last_failure else ""),
    ):
        if line:
            parts.append(Text.assemble((f"{label}: ", "bold"), line))
    if job.conditions:
        parts.append(_conditions(job.conditions, now))
    if status.get("placement"):
        parts.append(_pods(status["placement"]))
    return Group(*parts)


def _running_now(status: Mapping[str, Any]) -> str:
    """The layout running now, when it differs from the plan's (an elastic resize)."""
    planned = (status.get("plan") or {}).get("layout")
    layout = status.get("layout")
    return f"{layout} ({status.get('worldSize')} processes)" if layout != planned else ""


def _conditions(conditions: list[dict[str, Any]], now: datetime) -> Table:
    table = Table(title="Conditions", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("type", "status", "reason", "age"):
        table.add_column(column, no_wrap=True)
    table.add_column("message", ratio=1)
    for c in conditions:
        table.add_row(
            str(c.get("type")),
            str(c.get("status")),
            str(c.get("reason") or ""),
            age(c.get("lastTransitionTime"), now),
            str(c.get("message") or ""),
        )
    return table


def _pods(placement: list[dict[str, Any]]) -> Table:
    table = Table(title="Pods", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("pod", "node", "ranks", "stage", "phase"):
        table.add_column(column, no_wrap=True)
    for row in placement:
        first, last = row.get("firstRank"), row.get("lastRank")
        ranks = "" if first is None else str(first) if first == last else f"{first}-{last}"
        table.add_row(
            str(row.get("pod") or f"{row.get('pods', '')} ({row.get('count')} pods)"),
            str(row.get("node") or ""),
            ranks,
            "" if row.get("stage") is None else str(row["stage"]),
            str(row.get("phase") or ""),
        )
    return table


def condition_text(condition: Mapping[str, Any] | None) -> str:
    """``Type: Reason`` of a condition (empty for None)."""
    if not condition:
        return ""
    return f"{condition.get('type')}: {condition.get('reason')}"


class LiveView:
    """``meshrun submit --follow``: a progress bar of the steps with the loss, tokens/s against
    the prediction, the ETA, the restarts and the latest condition, and a line above it each
    time the phase or the latest condition changes (what a log or a pipe keeps)."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task = progress.add_task("", total=None, detail="")
        self.said: tuple[str, str] | None = None

    @staticmethod
    def columns() -> tuple[Any, ...]:
        """The bar's columns: the job and its phase, the bar, and the figures."""
        return (
            TextColumn("{task.description}"),
            BarColumn(bar_width=20),
            # The figures wrap under themselves in a narrow terminal instead of being cut.
            TextColumn(
                "{task.fields[detail]}",
                table_column=Column(ratio=1, no_wrap=False, overflow="fold"),
            ),
        )

    def show(self, job: Job) -> None:
        progress = job.progress
        step, total = progress.get("step"), progress.get("totalSteps")
        latest = job.latest_condition()
        detail = [progress_line(job) or "no report yet", f"restarts {job.restarts}"]
        if latest:
            detail.append(condition_text(latest))
        self.progress.update(
            self.task,
            description=f"{job.name} [{PHASE_STYLES.get(job.phase, 'bold')}]{job.phase}[/]",
            total=total if isinstance(total, int) and total > 0 else None,
            completed=step if isinstance(step, int) else 0,
            detail=", ".join(detail),
        )
        said = (job.phase, condition_text(latest))
        if said != self.said:
            self.said = said
            line = f"{datetime.now(UTC):%H:%M:%S} {job.name} {job.phase}"
            if latest:
                line += f" [{said[1]}] {latest.get('message') or ''}".rstrip()
            self.progress.console.print(line, markup=False, highlight=False, soft_wrap=True)

"""The side-by-side table of the operator scale bench, printed and written to docs/benchmarks.md."""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from _docsection import write_section
from _scale_launch import Launch

BIG, SMALL = "big", "small"


@dataclass
class Run:
    """One operator process: its launches and its peak RSS when it stopped."""

    operator: str
    index: int
    launches: list[Launch] = field(default_factory=list)
    peak_rss_mib: float = 0.0


@dataclass
class Setup:
    """What the figures were measured on."""

    nodes: int
    jobs: int
    runs: int
    launches: int
    command: str
    revision: str = ""
    """The meshrun commit measured (and whether its operator had uncommitted changes)."""
    load: tuple[float, float] = (0.0, 0.0)
    """Load average (1 min) when the bench started and when it ended."""


Pick = Callable[[Launch], float | None]


def _values(
    runs: Sequence[Run], operator: str, scenario: str, pick: Pick
) -> list[list[float | None]]:
    """Per run of ``operator``, ``pick`` of each of its ``scenario`` launches."""
    return [
        [pick(x) for x in run.launches if x.scenario == scenario]
        for run in runs
        if run.operator == operator
    ]


def _per_run_means(values: list[list[float | None]], unit: str) -> tuple[str, float | None]:
    """'9.3 s, 8.1 s' (one mean per run; a timed-out launch makes its run 'timeout')."""
    means: list[float | None] = []
    for launches in values:
        taken = [v for v in launches if v is not None]
        means.append(statistics.fmean(taken) if taken and len(taken) == len(launches) else None)
    text = ", ".join("timeout" if m is None else f"{m:.1f}{unit}" for m in means)
    done = [m for m in means if m is not None]
    return text or "-", statistics.fmean(done) if done else None


def _span(values: list[list[float | None]], unit: str, digits: int) -> tuple[str, float | None]:
    """'12.9-13.8' over every launch of every run."""
    flat = [v for launches in values for v in launches if v is not None]
    if not flat:
        return "-", None
    low, high = min(flat), max(flat)
    text = (
        f"{low:.{digits}f}"
        if round(low, digits) == round(high, digits)
        else (f"{low:.{digits}f}-{high:.{digits}f}")
    )
    return text + unit, statistics.fmean(flat)


IDLE_TEXT = "the idle seconds after launch"


def _pods(x: Launch) -> float | None:
    return x.pods_running_s


def _jobs(x: Launch) -> float | None:
    return x.jobs_running_s


def _requests(x: Launch) -> float:
    return len(x.requests)


def _per_job(x: Launch) -> float:
    return x.per_job


def _idle(x: Launch) -> float:
    return len(x.idle)


def _cpu(x: Launch) -> float:
    return x.cpu_s


def table(runs: Sequence[Run], setup: Setup, operators: Sequence[str]) -> list[str]:
    """The markdown table: one column per operator and the ratio of the first to the second."""
    n = setup.jobs
    rows: list[tuple[str, str, Pick, str]] = [
        ("one 128-pod x 8-GPU job, pods Running, mean per run", BIG, _pods, "time"),
        (f"{n} concurrent 1-pod 8-GPU jobs, pods Running, mean per run", SMALL, _pods, "time"),
        ("one 128-pod job, job status Running, mean per run", BIG, _jobs, "time"),
        (f"{n} jobs, every job's status Running, mean per run", SMALL, _jobs, "time"),
        ("API requests for the 128-pod job (API server audit log)", BIG, _requests, "count"),
        ("API requests per 1-pod job (API server audit log)", SMALL, _per_job, "count1"),
        (f"API requests in {IDLE_TEXT}, {n} jobs running", SMALL, _idle, "count"),
        ("operator CPU seconds, 128-pod launch", BIG, _cpu, "cpu"),
        (f"operator CPU seconds, {n}-job launch", SMALL, _cpu, "cpu"),
    ]
    head = "| scenario | " + " | ".join(operators) + " | ratio |"
    lines = [head, "|---|" + "---|" * len(operators) + "---|"]
    for title, scenario, pick, kind in rows:
        cells, means = [], []
        for operator in operators:
            values = _values(runs, operator, scenario, pick)
            if kind == "time":
                text, mean = _per_run_means(values, " s")
            else:
                digits = 1 if kind in ("count1", "cpu") else 0
                text, mean = _span(values, " s" if kind == "cpu" else "", digits)
            cells.append(text)
            means.append(mean)
        lines.append(f"| {title} | " + " | ".join(cells) + f" | {_ratio(means)} |")
    rss = [[r.peak_rss_mib for r in runs if r.operator == op] for op in operators]
    cells = [
        f"{min(v):.0f}-{max(v):.0f} MiB" if v and round(min(v)) != round(max(v)) else
        (f"{v[0]:.0f} MiB" if v else "-")
        for v in rss
    ]  # fmt: skip
    means = [statistics.fmean(v) if v else None for v in rss]
    cells.append(_ratio(means))
    lines.append(f"| operator peak RSS, after {n} jobs | " + " | ".join(cells) + " |")
    return lines


def _ratio(means: list[float | None]) -> str:
    if len(means) < 2 or means[0] is None or not means[1]:
        return "-"
    return f"{means[0] / means[1]:.2f}"


def caption(setup: Setup, operators: Sequence[str]) -> list[str]:
    ratio = f"{operators[0]} / {operators[1]}" if len(operators) > 1 else "-"
    return [
        f"{setup.nodes:,} KWOK fake GPU nodes on the local control plane; one operator at a time, "
        f"alternating; {setup.runs} runs of {setup.launches} launches of each scenario; "
        "times from the first create. Ratio: "
        f"{ratio} (means; under 1 means {operators[0]} needs less).",
        f"meshrun at {setup.revision}. Machine: {os.cpu_count()} cores ({platform.machine()}), "
        f"load average {setup.load[0]:.1f} at the start and {setup.load[1]:.1f} at the end "
        "(a shared machine: the figures are noisy).",
    ]


def write_docs(lines: list[str], setup: Setup) -> Path:
    """Replace (or add) this scale's section of docs/benchmarks.md, keeping everything else."""
    key = f"operator_scale nodes={setup.nodes} jobs={setup.jobs}"
    today = datetime.now(UTC).date().isoformat()
    heading = f"### {setup.nodes:,} nodes, {setup.jobs:,} concurrent jobs ({today})"
    return write_section(key, [heading, "", f"Produced by `{setup.command}`.", "", *lines], HEADER)


HEADER = """# Benchmarks

Figures measured by the benches under `bench/`; each section is written by its bench (with
`--write-docs`), dated, and replaced when the bench runs again.

## Operator launch: meshrun and Kubeflow's training-operator side by side

`bench/operator_scale.py` starts a throwaway local control plane with fake GPU nodes and the API
server's audit log, and runs both operators on it, one at a time: Kubeflow's training-operator
v1.8.1 (built from its Go module, run as a plain process with its default settings) with
PyTorchJobs (one master and 127 workers; one master for the small jobs), and meshrun with
ParallelTrainingJobs of the same size. Every pod asks for 8 GPUs. API requests are counted by the
API server for each operator's own user; the bench's requests are not counted.
"""

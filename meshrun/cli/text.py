"""The readable form of a plan (``meshrun plan`` without ``-o``), drawn with rich."""

from __future__ import annotations

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from meshrun.api.spec import CPU
from meshrun.planner.auto import Choice
from meshrun.planner.explain import parameter_text
from meshrun.planner.fastest import layout_phrases
from meshrun.planner.plan import Plan
from meshrun.planner.ranks import compress_ranks
from meshrun.planner.steptime import StepEstimate

MAX_POD_ROWS = 16
"""Pods listed at most; large jobs show the first ones and a count."""


BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def binary_unit(value: int) -> tuple[str, int]:
    """The largest binary unit (B to TiB) that ``value`` bytes fill at least once, and its
    size in bytes."""
    power = 0
    while power < len(BINARY_UNITS) - 1 and value >= 1024 ** (power + 1):
        power += 1
    return BINARY_UNITS[power], 1024**power


def in_unit(value: int, size: int) -> str:
    """``value`` bytes in units of ``size`` bytes, with two decimals (whole bytes as they are)."""
    return f"{value / size:.2f}" if size > 1 else str(value)


def gib(value: int) -> str:
    """Bytes in binary units (KiB to TiB) with two decimals."""
    unit, size = binary_unit(value)
    return f"{in_unit(value, size)} {unit}"


class Phrases:
    """Phrases joined by spaces into lines as wide as the console, each line broken between two
    phrases, never inside one (a phrase wider than the console alone wraps at its spaces)."""

    def __init__(self, *phrases: str | Text, style: str = "") -> None:
        self.phrases = [Text(p) if isinstance(p, str) else p for p in phrases]
        self.style = style

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        line = Text(style=self.style)
        for phrase in self.phrases:
            if line and line.cell_len + 1 + phrase.cell_len > options.max_width:
                yield line
                line = Text(style=self.style)
            if line:
                line.append(" ")
            line.append(phrase)
        yield line

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        """At least the widest phrase, at most all of them on one line (a table's cell)."""
        widths = [phrase.cell_len for phrase in self.phrases]
        return Measurement(max(widths, default=0), sum(widths) + max(len(widths) - 1, 0))


def render(plan: Plan) -> RenderableType:
    """Header, layout, memory, stages, pods, explanation and warnings."""
    lay = plan.layout
    device = "CPU processes" if plan.accelerator == CPU else "GPUs"
    header = Phrases(
        Text.assemble((plan.name, "bold"), f": {plan.strategy} ", (lay.text(), "bold cyan")),
        f"on {plan.num_nodes} pod(s) x {plan.num_proc_per_node} {device}",
        f"(world size {plan.world_size}),",
        f"model {plan.preset or 'custom'} ({parameter_text(plan.model.parameters())} parameters)",
    )
    # Context parallelism shows only above 1, as in the layout string.
    dims = ("dp", "cp", "pp", "tp") if lay.cp > 1 else ("dp", "pp", "tp")
    layout = Table(box=box.SIMPLE_HEAD, title="Layout", title_justify="left")
    for column in (*dims, "ZeRO", "schedule", "micro", "virtual", "accum", "bubble"):
        layout.add_column(column, justify="right")
    layout.add_row(
        *(str(lay.degrees.size(dim)) for dim in dims),
        str(lay.zero_stage),
        lay.schedule,
        str(lay.micro_batches),
        str(lay.virtual_stages),
        str(lay.grad_accumulation),
        f"{lay.bubble_fraction():.0%}",
    )
    memory = render_memory(plan)
    stages = Table(box=box.SIMPLE_HEAD, title="Pipeline stages", title_justify="left")
    stages.add_column("stage", justify="right")
    stages.add_column("chunk", justify="right")
    stages.add_column("layers")
    for stage in plan.stages:
        layers = compress_ranks(range(stage.first, stage.last + 1))
        stages.add_row(str(stage.pp), str(stage.virtual), layers)
    pods = Table(box=box.SIMPLE_HEAD, title="Pods", title_justify="left")
    pod_dims = ("pp", "dp", "cp", "tp") if lay.cp > 1 else ("pp", "dp", "tp")
    for column in ("pod", "ranks", *pod_dims):
        pods.add_column(column)
    for pod in range(min(plan.num_nodes, MAX_POD_ROWS)):
        per_pod = plan.num_proc_per_node
        coords = [plan.coords(pod * per_pod + i) for i in range(per_pod)]
        pods.add_row(
            f"{plan.name}-{pod}",
            compress_ranks([c.rank for c in coords]),
            *(compress_ranks([getattr(c, dim) for c in coords]) for dim in pod_dims),
        )
    if plan.num_nodes > MAX_POD_ROWS:
        pods.add_row(f"... {plan.num_nodes - MAX_POD_ROWS} more", *[""] * (1 + len(pod_dims)))
    parts: list[RenderableType] = [header, layout, memory]
    if plan.estimate is not None:
        parts.append(render_estimate(plan.estimate, plan.accelerator == CPU))
    parts += [stages, pods, Text(plan.explanation)]
    parts.extend(Text(f"warning: {w}", "yellow") for w in plan.warnings)
    return Group(*parts)


def render_memory(plan: Plan) -> RenderableType:
    """The estimate per accelerator: a line with the total against the limit, and a column per
    kind, each in its own unit (under its name, so the cells stay narrow)."""
    mem = plan.memory
    said: list[str | Text] = [gib(mem.total)]
    if not mem.accelerator_bytes:
        said.append("(limit unchecked)")
    elif mem.fits:
        said += [f"of {gib(mem.accelerator_bytes)},", Text("fits", "green")]
    else:
        said += [f"of {gib(mem.accelerator_bytes)},", Text("does NOT fit", "bold red")]
    table = Table(box=box.SIMPLE_HEAD)
    sizes = {
        "params": mem.params,
        "grads": mem.grads,
        "optimizer": mem.optimizer,
        "activations": mem.activations,
        "gathered": mem.gathered,
        "total": mem.total,
    }
    cells = []
    for name, value in sizes.items():
        unit, size = binary_unit(value)
        table.add_column(f"{name}\n{unit}", justify="right")
        cells.append(in_unit(value, size))
    table.add_row(*cells)
    return titled(Phrases("Memory per accelerator (estimate):", *said, style="italic"), table)


def titled(title: Phrases, table: Table) -> RenderableType:
    """A table under a title of its own line: a table's title would wrap at the table's width,
    which is narrower than the console."""
    return Group(title, table)


PART_NAMES = {
    "compute": "compute (matmuls, attention)",
    "recompute": "activation recomputation",
    "elementwise": "element-wise (memory bound)",
    "tensorParallel": "tensor-parallel collectives",
    "contextParallel": "context-parallel key/value exchange",
    "launch": "waiting on kernel launches",
    "pipelineBubble": "pipeline bubble",
    "pipelineTransfer": "stage-to-stage transfers",
    "dataParallel": "data-parallel traffic (exposed)",
    "optimizer": "optimizer step",
    "memoryPressure": "memory pressure (little headroom)",
    "stepOverhead": "per-step host work (CPU)",
}


def render_estimate(est: StepEstimate, cpu: bool = False) -> RenderableType:
    """The predicted step: time, tokens/s per GPU (per process on CPUs), MFU, and seconds by
    part."""
    speed = f"{est.tokens_per_second_per_gpu:,.0f} tokens/s"
    if cpu:  # the CPU profile (docs/planner.md): no peak to compare with
        said = [f"{speed} per process", "(CPU profile)"]
    else:
        said = [f"{speed} per GPU,", f"MFU {est.mfu:.0%}"]
    title = Phrases(f"Predicted step: {seconds(est.step_seconds)},", *said, style="italic")
    table = Table(box=box.SIMPLE_HEAD)
    for column in ("part", "time", "share"):
        table.add_column(column, justify="left" if column == "part" else "right")
    for part, value in est.breakdown.items():
        if value > 0:
            share = value / est.step_seconds if est.step_seconds else 0.0
            table.add_row(PART_NAMES.get(part, part), seconds(value), f"{share:.0%}")
    return titled(title, table)


def seconds(value: float) -> str:
    """Seconds with three significant digits, in ms below one second."""
    return f"{value:.3g} s" if value >= 1 else f"{value * 1e3:.3g} ms"


def render_candidates(choices: list[Choice]) -> RenderableType:
    """``--candidates``: the fastest layouts that fit, fastest first."""
    table = Table(box=box.SIMPLE_HEAD, title="Fastest layouts that fit", title_justify="left")
    for column in ("#", "layout", "memory", "step", "tokens/s/GPU", "MFU"):
        table.add_column(column, justify="left" if column == "layout" else "right")
    for index, choice in enumerate(choices, 1):
        est = choice.estimate
        assert est is not None
        table.add_row(
            str(index),
            Phrases(*layout_phrases(choice)),
            gib(choice.memory.total),
            seconds(est.step_seconds),
            f"{est.tokens_per_second_per_gpu:,.0f}",
            f"{est.mfu:.0%}",
        )
    if not choices:
        table.add_row("", "no layout fits", "", "", "", "")
    return table


def render_elastic(plan: Plan, degrees: list[int]) -> RenderableType:
    """The sizes an elastic job may run at (spec.elastic), in one sentence."""
    per_replica = plan.layout.world_size // plan.layout.dp
    sizes = [f"dp{dp} ({dp * per_replica // plan.num_proc_per_node} pod(s))," for dp in degrees]
    return Phrases(
        "Elastic: may run at",
        *sizes,
        f"the same {plan.layout.degrees.text(without='dp')}",
        "and global batch",
        "(gradient accumulation follows the degree).",
    )

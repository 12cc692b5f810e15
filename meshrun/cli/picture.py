"""The layout as a picture: pods (rows) x processes (columns), coloured by pipeline stage.

Each cell is one process, labelled with its global rank and its pipeline, data, context (when
cp is above 1) and tensor-parallel indices; a frame goes round each TP group. SVG is written by
hand (no dependency); PNG uses matplotlib, imported only when asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from meshrun.api.errors import SpecError
from meshrun.planner.moe import held_experts
from meshrun.planner.plan import Plan

MAX_PODS = 32
"""Pods drawn at most; a note says how many more there are."""
CELL_W, CELL_H, GAP, TOP = 84, 56, 6, 44
CHAR_W = 7.5
"""Approximate width of one 12 px sans-serif character, to size the margins."""
# Colour-blind-safe palette (Okabe and Ito 2008), cycled over pipeline stages.
PALETTE = ["#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#999999"]


@dataclass(frozen=True)
class Box:
    """A rectangle to draw, in pixels from the top left."""

    x: float
    """Left edge."""
    y: float
    """Top edge."""
    w: float
    """Width."""
    h: float
    """Height."""
    fill: str
    """Fill colour, or "none" for a frame."""
    lines: tuple[str, ...] = ()
    """Text lines centred in the box."""


def layout_boxes(
    plan: Plan,
) -> tuple[list[Box], list[Box], list[tuple[float, float, str]], int, int]:
    """(cells, TP frames, free labels (x, y, text), width, height) of the picture."""
    pods = min(plan.num_nodes, MAX_PODS)
    cols = plan.num_proc_per_node
    cells: list[Box] = []
    frames: list[Box] = []
    title = f"{plan.name}: {plan.strategy}, {plan.layout.text()}; colour = pipeline stage"
    if plan.layout.tp > 1:
        title += ", dashed frame = TP group"
    if plan.model.moe is not None:
        title += ", eA-B = the routed experts held"
    left = 16 + CHAR_W * len(f"{plan.name}-{plan.num_nodes - 1}")
    labels: list[tuple[float, float, str]] = [(left, 24, title)]
    tp = plan.layout.tp
    for pod in range(pods):
        y = TOP + pod * (CELL_H + GAP)
        labels.append((8, y + CELL_H / 2 + 4, f"{plan.name}-{pod}"))
        for local in range(cols):
            coords = plan.coords(pod * cols + local)
            x = left + local * (CELL_W + GAP)
            third = f"cp{coords.cp} tp{coords.tp}" if plan.layout.cp > 1 else f"tp{coords.tp}"
            held = held_experts(plan.model, plan.layout, coords.dp, coords.cp, coords.tp)
            if held is not None:
                third += f" e{held[0]}" + (f"-{held[1]}" if held[1] > held[0] else "")
            cells.append(
                Box(
                    x,
                    y,
                    CELL_W,
                    CELL_H,
                    PALETTE[coords.pp % len(PALETTE)],
                    (f"rank {coords.rank}", f"pp{coords.pp} dp{coords.dp}", third),
                )
            )
            if tp > 1 and coords.tp == 0:
                width = tp * CELL_W + (tp - 1) * GAP
                frames.append(Box(x - 3, y - 3, width + 6, CELL_H + 6, "none"))
    height = TOP + pods * (CELL_H + GAP) + 24
    if plan.num_nodes > pods:
        labels.append((left, height - 8, f"... and {plan.num_nodes - pods} more pods"))
        height += 8
    span = max(cols * (CELL_W + GAP), CHAR_W * len(title))
    return cells, frames, labels, int(left + span + 8), max(height, 120)


def to_svg(plan: Plan) -> str:
    cells, frames, labels, width, height = layout_boxes(plan)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
    ]
    for cell in cells:
        out.append(
            f'<rect x="{cell.x}" y="{cell.y}" width="{cell.w}" height="{cell.h}" rx="4" '
            f'fill="{cell.fill}" stroke="#333"/>'
        )
        for i, line in enumerate(cell.lines):
            ty = cell.y + 17 + i * 15
            cx = cell.x + cell.w / 2
            out.append(f'<text x="{cx}" y="{ty}" text-anchor="middle">{escape(line)}</text>')
    for frame in frames:
        out.append(
            f'<rect x="{frame.x}" y="{frame.y}" width="{frame.w}" height="{frame.h}" rx="6" '
            'fill="none" stroke="black" stroke-width="2" stroke-dasharray="6 3"/>'
        )
    for x, y, text in labels:
        out.append(f'<text x="{x}" y="{y}">{escape(text)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_png(plan: Plan, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
        from matplotlib.patches import FancyBboxPatch
    except ImportError:
        raise SpecError(
            "--picture", "PNG output needs matplotlib (pip install 'meshrun[plot]'); use .svg"
        ) from None
    cells, frames, labels, width, height = layout_boxes(plan)
    dpi = 100
    figure = pyplot.figure(figsize=(width / dpi, height / dpi), dpi=dpi)
    axes = figure.add_axes((0, 0, 1, 1))
    axes.set_xlim(0, width)
    axes.set_ylim(height, 0)
    axes.axis("off")

    def rounded(box: Box, radius: int, **style: Any) -> None:
        boxstyle = f"round,pad=0,rounding_size={radius}"
        axes.add_patch(FancyBboxPatch((box.x, box.y), box.w, box.h, boxstyle=boxstyle, **style))

    for cell in cells:
        rounded(cell, 4, facecolor=cell.fill, edgecolor="#333")
        for i, line in enumerate(cell.lines):
            axes.text(
                cell.x + cell.w / 2,
                cell.y + 13 + i * 15,
                line,
                ha="center",
                va="center",
                fontsize=8,
            )
    for frame in frames:
        rounded(frame, 6, facecolor="none", edgecolor="black", linewidth=2, linestyle="--")
    for x, y, text in labels:
        axes.text(x, y, text, va="bottom", fontsize=9)
    figure.savefig(path, dpi=dpi)
    pyplot.close(figure)


def write_picture(plan: Plan, path: str | Path) -> None:
    """Write ``path`` as SVG or PNG by its suffix (SpecError naming --picture otherwise)."""
    target = Path(path)
    suffix = target.suffix.lower()
    if suffix == ".svg":
        target.write_text(to_svg(plan), encoding="utf-8")
    elif suffix == ".png":
        write_png(plan, target)
    else:
        raise SpecError("--picture", f"{target.name} must end in .svg or .png")

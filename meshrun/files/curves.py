"""A run's curves: the loss and tokens/s per step beside the plan's prediction, taken from the
trainer's TensorBoard event files or from a local run's step lines, and drawn to a picture
(``meshrun plot``, ``meshrun run --local --plot``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshrun.files import events

PICTURE_SUFFIXES = (".png", ".svg", ".pdf")
"""What matplotlib writes from the suffix alone."""


@dataclass(frozen=True, kw_only=True)
class Curves:
    """What the picture shows; each series as (step, value) pairs in step order."""

    loss: list[tuple[int, float]]
    """Training loss per step."""
    tokens_per_second: list[tuple[int, float]]
    """Measured tokens/s of the whole job per step."""
    predicted_tokens_per_second: float | None
    """The plan's prediction, or None when the plan has none."""
    eval_loss: list[tuple[int, float]]
    """Validation losses (step 0: before training)."""


def _pairs(series: Mapping[int, float]) -> list[tuple[int, float]]:
    return sorted(series.items())


def curves_from_events(folder: str | Path) -> Curves:
    """The curves of the event files in ``folder``; ValueError when it holds no loss."""
    series = events.read_scalars(folder)
    if not series.get(events.LOSS):
        raise ValueError(f"{folder}: no {events.LOSS} in any TensorBoard event file")
    predicted = series.get(events.PREDICTED_TOKENS_PER_SECOND, {})
    return Curves(
        loss=_pairs(series[events.LOSS]),
        tokens_per_second=_pairs(series.get(events.TOKENS_PER_SECOND, {})),
        predicted_tokens_per_second=predicted[max(predicted)] if predicted else None,
        eval_loss=_pairs(series.get(events.EVAL_LOSS, {})),
    )


def curves_from_steps(
    steps: Sequence[Mapping[str, Any]],
    evals: Sequence[Mapping[str, Any]],
    predicted: float | None,
) -> Curves:
    """The curves of a local run: rank 0's step lines ({"step", "loss", "tokensPerSecond"}),
    its validations ({"step", "loss"}) and the plan's predicted tokens/s."""
    return Curves(
        loss=[(int(s["step"]), float(s["loss"])) for s in steps],
        tokens_per_second=[
            (int(s["step"]), float(s["tokensPerSecond"]))
            for s in steps
            if s.get("tokensPerSecond") is not None
        ],
        predicted_tokens_per_second=predicted,
        eval_loss=[(int(e["step"]), float(e["loss"])) for e in evals],
    )


def draw(curves: Curves, path: str | Path, title: str) -> None:
    """The loss (and validation loss) above, tokens/s against the prediction below, written to
    ``path`` in the format its suffix names (.png, .svg, .pdf); needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")  # no display in pods or CI
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    figure, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    marker = "o" if len(curves.loss) <= 50 else None
    top.plot(*zip(*curves.loss, strict=True), marker=marker, linewidth=1.5, label="training")
    if curves.eval_loss:
        top.plot(
            *zip(*curves.eval_loss, strict=True), marker="s", linewidth=1.5, label="validation"
        )
        top.legend()
    top.set_ylabel("loss (cross-entropy, nats)")
    top.set_title(title)
    if curves.tokens_per_second:
        steps, values = zip(*curves.tokens_per_second, strict=True)
        bottom.plot(steps, values, marker=marker, linewidth=1.5, label="measured")
    if curves.predicted_tokens_per_second is not None:
        bottom.axhline(
            curves.predicted_tokens_per_second, color="tab:red", linestyle="--", label="predicted"
        )
    if curves.tokens_per_second or curves.predicted_tokens_per_second is not None:
        bottom.legend()
    bottom.set_ylabel("tokens/s (whole job)")
    highest = max(
        [v for _, v in curves.tokens_per_second] + [curves.predicted_tokens_per_second or 0.0]
    )
    # From zero, so the gap to the prediction shows at its true size.
    bottom.set_ylim(0, highest * 1.1 or 1.0)
    bottom.set_xlabel("step")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    for axes in (top, bottom):
        axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)

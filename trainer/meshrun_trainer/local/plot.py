"""Loss-curve picture for ``meshrun run --local --plot PATH.png``."""

from __future__ import annotations

from pathlib import Path


def plot_losses(losses: list[float], path: str | Path, title: str, first_step: int = 1) -> None:
    """Draw loss per step to ``path`` (format from the suffix: .png, .svg, .pdf)."""
    import matplotlib

    matplotlib.use("Agg")  # no display in pods or CI
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7, 4))
    steps = list(range(first_step, first_step + len(losses)))
    ax.plot(steps, losses, marker="o" if len(losses) <= 50 else None, linewidth=1.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("loss (cross-entropy, nats)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)

"""The parallel layout of a run as the trainer reads it: the planner's layout plus the layers each
pipeline stage holds. The layout's rules are the planner's
(:func:`meshrun.rules.strategy.check_layout`)."""

from __future__ import annotations

from dataclasses import dataclass

from meshrun.api.errors import SpecError
from meshrun.api.layout import Layout as PlannedLayout


class ConfigError(SpecError):
    """A configuration value breaks a rule; ``field`` names the environment variable (the same
    field-and-rule shape as the planner's SpecError, so callers handle both alike)."""


@dataclass(frozen=True)
class Layout(PlannedLayout):
    """The planner's layout (degrees, ZeRO stage, schedule, micro-batches) as a trainer process
    reads it from its environment, plus the layers each pipeline stage holds."""

    stage_layers: tuple[tuple[int, int], ...]
    """Inclusive layer range of each pipeline stage, pp * virtual_stages of them in stage order."""

    @property
    def num_stages(self) -> int:
        return self.pp * self.virtual_stages


def parse_stage_layers(
    raw: str, field: str = "MESHRUN_STAGE_LAYERS"
) -> tuple[tuple[int, int], ...]:
    """Parse ``"0-1,2-3"`` into ((0, 1), (2, 3)) (inclusive ranges, stage order)."""
    stages: list[tuple[int, int]] = []
    for part in raw.split(","):
        first, sep, last = part.strip().partition("-")
        try:
            stages.append((int(first), int(last if sep else first)))
        except ValueError:
            raise ConfigError(field, f"must look like '0-1,2-3', got {raw!r}") from None
    return tuple(stages)


def check_stage_layers(layout: Layout, layers: int) -> None:
    """The stage ranges of MESHRUN_STAGE_LAYERS: one per stage, contiguous, covering the model."""
    field = "MESHRUN_STAGE_LAYERS"
    if len(layout.stage_layers) != layout.num_stages:
        raise ConfigError(
            field,
            f"needs pp x virtualStages = {layout.num_stages} ranges in stage order, got "
            f"{len(layout.stage_layers)}",
        )
    expected = 0
    for first, last in layout.stage_layers:
        if first != expected or last < first:
            raise ConfigError(field, "ranges must be contiguous, non-empty and start at 0")
        expected = last + 1
    if expected != layers:
        raise ConfigError(field, f"ranges must cover all {layers} layers")

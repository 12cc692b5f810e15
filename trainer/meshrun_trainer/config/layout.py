"""The parallel layout of a run as the trainer reads it: the planner's layout plus the layers each
pipeline stage holds. The layout's rules are the planner's
(:func:`meshrun.rules.strategy.check_layout`)."""

from __future__ import annotations

from dataclasses import dataclass

from meshrun.api.errors import SpecError
from meshrun.api.layout import Layout as PlannedLayout


class ConfigError(SpecError):
    """The job document breaks a rule; ``field`` names the spec field (the planner's SpecError,
    raised by the trainer before any collective: exit code 2, reason ConfigError)."""


@dataclass(frozen=True)
class Layout(PlannedLayout):
    """The planner's layout (degrees, ZeRO stage, schedule, micro-batches) as a trainer process
    reads it from the job document, plus the layers each pipeline stage holds."""

    stage_layers: tuple[tuple[int, int], ...]
    """Inclusive layer range of each pipeline stage, pp * virtual_stages of them in stage order."""

    @property
    def num_stages(self) -> int:
        return self.pp * self.virtual_stages


def check_stage_layers(layout: Layout, layers: int) -> None:
    """The plan's stage ranges: one per stage, contiguous, covering the model."""
    field = "plan.stages"
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

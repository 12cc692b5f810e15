"""The parallel layout of a run and its rules: how many ranks along each mesh dimension, the
pipeline schedule, and which layers each pipeline stage holds."""

from __future__ import annotations

from dataclasses import dataclass

from meshrun.errors import SpecError
from meshrun.layout import Layout as PlannedLayout
from meshrun.presets import ModelShape

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")


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


def even_stage_layers(layers: int, stages: int) -> tuple[tuple[int, int], ...]:
    """Split ``layers`` into ``stages`` contiguous ranges, earlier stages taking the remainder."""
    base, extra = divmod(layers, stages)
    ranges, first = [], 0
    for stage in range(stages):
        count = base + (1 if stage < extra else 0)
        ranges.append((first, first + count - 1))
        first += count
    return tuple(ranges)


def validate_layout(layout: Layout, model: ModelShape) -> None:
    """Check that the layout can split this model; raise ConfigError naming the variable."""
    if layout.zero_stage > 3:
        raise ConfigError("MESHRUN_ZERO_STAGE", f"must be 0-3, got {layout.zero_stage}")
    if model.layers < layout.num_stages:
        raise ConfigError("MESHRUN_PP", f"{layout.num_stages} stages need >= that many layers")
    expected = 0
    for first, last in layout.stage_layers:
        if first != expected or last < first:
            raise ConfigError(
                "MESHRUN_STAGE_LAYERS", "ranges must be contiguous, non-empty and start at 0"
            )
        expected = last + 1
    if expected != model.layers:
        raise ConfigError("MESHRUN_STAGE_LAYERS", f"ranges must cover all {model.layers} layers")
    tp = layout.tp
    for name, value in (
        ("HEADS", model.heads),
        ("KV_HEADS", model.kv_heads),
        ("FFN_HIDDEN", model.ffn_hidden),
        ("VOCAB", model.vocab),
        ("SEQ_LEN", model.seq_len),  # sequence parallel shards the sequence dimension
    ):
        if value % tp:
            raise ConfigError("MESHRUN_TP", f"{tp} must divide MESHRUN_MODEL_{name}={value}")

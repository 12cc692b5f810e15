"""Trainer configuration from the environment: defaults, parsing and every validation rule."""

from __future__ import annotations

import pytest
from meshrun_trainer.config import (
    ConfigError,
    even_stage_layers,
    from_env,
    parse_stage_layers,
)

from meshrun.presets import PRESETS

pytestmark = pytest.mark.unit


def make_env(**overrides: str) -> dict[str, str]:
    env = {"MESHRUN_MODEL_PRESET": "tiny", "MESHRUN_GLOBAL_BATCH_SIZE": "8"}
    env.update({f"MESHRUN_{k.upper()}": v for k, v in overrides.items()})
    return env


def test_defaults_describe_a_single_process_tiny_run() -> None:
    cfg = from_env(make_env())
    assert cfg.model == PRESETS["tiny"]
    assert (cfg.layout.dp, cfg.layout.pp, cfg.layout.tp, cfg.layout.world_size) == (1, 1, 1, 1)
    assert cfg.layout.stage_layers == ((0, 3),)
    assert cfg.training.precision == "fp32"
    assert cfg.metrics_port == 9400
    assert cfg.tokens_per_step == 8 * 64


def test_interleaved_pipeline_takes_planner_ranges_in_stage_order() -> None:
    cfg = from_env(
        make_env(
            pp="2",
            pipeline_schedule="interleaved-1f1b",
            virtual_stages="2",
            micro_batches="4",
            stage_layers="0-0,1-1,2-2,3-3",
        )
    )
    assert cfg.layout.num_stages == 4
    assert cfg.layout.stage_layers == ((0, 0), (1, 1), (2, 2), (3, 3))


def test_one_range_per_rank_is_resplit_for_interleaving() -> None:
    cfg = from_env(
        make_env(
            pp="2",
            pipeline_schedule="interleaved-1f1b",
            virtual_stages="2",
            stage_layers="0-1,2-3",
        )
    )
    assert cfg.layout.stage_layers == ((0, 0), (1, 1), (2, 2), (3, 3))


def test_explicit_model_overrides_the_preset() -> None:
    cfg = from_env(
        make_env(
            model_preset="",
            model_layers="2",
            model_hidden="32",
            model_heads="2",
            model_vocab="64",
            model_seq_len="16",
        )
    )
    assert cfg.preset == "custom"
    assert (cfg.model.layers, cfg.model.ffn_hidden, cfg.model.kv_heads) == (2, 128, 2)


@pytest.mark.parametrize(
    ("overrides", "field", "fragment"),
    [
        ({"dp": "two"}, "MESHRUN_DP", "integer"),
        ({"tp": "0"}, "MESHRUN_TP", ">= 1"),
        ({"tp": "3"}, "MESHRUN_TP", "must divide MESHRUN_MODEL_HEADS=4"),
        ({"pp": "8"}, "MESHRUN_PP", "need >= that many layers"),
        ({"zero_stage": "4"}, "MESHRUN_ZERO_STAGE", "0-3"),
        ({"pipeline_schedule": "zigzag"}, "MESHRUN_PIPELINE_SCHEDULE", "one of"),
        ({"pp": "2", "pipeline_schedule": "interleaved-1f1b"}, "MESHRUN_VIRTUAL_STAGES", ">= 2"),
        ({"pp": "2", "stage_layers": "0-2,2-3"}, "MESHRUN_STAGE_LAYERS", "contiguous"),
        ({"pp": "2", "stage_layers": "0-0,1-2"}, "MESHRUN_STAGE_LAYERS", "cover all 4"),
        ({"pp": "2", "stage_layers": "a-b,c"}, "MESHRUN_STAGE_LAYERS", "look like"),
        ({"dp": "3"}, "MESHRUN_GLOBAL_BATCH_SIZE", "dp*gradAccumulation*microBatches=3"),
        ({"pp": "2", "micro_batches": "16"}, "MESHRUN_GLOBAL_BATCH_SIZE", "=16"),
        ({"learning_rate": "fast"}, "MESHRUN_LEARNING_RATE", "number"),
        ({"learning_rate": "-1"}, "MESHRUN_LEARNING_RATE", ">= 0"),
        ({"precision": "fp8"}, "MESHRUN_PRECISION", "fp32, bf16"),
        ({"model_preset": "huge"}, "MESHRUN_MODEL_PRESET", "unknown preset"),
        ({"model_kv_heads": "3"}, "MESHRUN_MODEL_KV_HEADS", "must divide heads=4"),
        ({"dataset": "corpus", "model_vocab": "128"}, "MESHRUN_DATASET", "vocab >= 256"),
    ],
)
def test_bad_values_name_the_variable_and_rule(
    overrides: dict[str, str], field: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        from_env(make_env(**overrides))
    assert caught.value.field == field
    assert fragment in caught.value.rule
    assert str(caught.value).startswith(f"{field}: ")


def test_world_size_must_match_the_layout() -> None:
    with pytest.raises(ConfigError, match="WORLD_SIZE: 4 != MESHRUN_DP"):
        from_env({**make_env(dp="2"), "WORLD_SIZE": "4"})


def test_stage_layer_helpers() -> None:
    assert parse_stage_layers("0-1, 2-3,4") == ((0, 1), (2, 3), (4, 4))
    assert even_stage_layers(10, 4) == ((0, 2), (3, 5), (6, 7), (8, 9))

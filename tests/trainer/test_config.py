"""Trainer configuration from the environment: no defaults, and the planner's rules."""

from __future__ import annotations

import pytest
from meshrun_trainer.config.layout import ConfigError, parse_stage_layers
from meshrun_trainer.config.read import from_env
from meshrun_trainer.local.env import layout_env

from meshrun.api.presets import PRESETS
from meshrun.envcontract import ENV_OF_FIELD

pytestmark = pytest.mark.unit

TINY = {"preset": "tiny"}
TRAINING = {"steps": 4, "globalBatchSize": 8, "precision": "fp32", "dataset": "synthetic"}


def make_env(**overrides: str) -> dict[str, str]:
    """A one-process tiny job's environment, with MESHRUN_<KEY> overrides."""
    env = layout_env(TINY, TRAINING)
    del env["WORLD_SIZE"]  # torchrun sets it for each process it starts
    env.update({f"MESHRUN_{k.upper()}": v for k, v in overrides.items()})
    return env


def test_a_planned_environment_reads_back_exactly() -> None:
    cfg = from_env(make_env())
    assert cfg.model == PRESETS["tiny"] and cfg.preset == "tiny"
    assert (cfg.layout.dp, cfg.layout.pp, cfg.layout.tp, cfg.layout.world_size) == (1, 1, 1, 1)
    assert cfg.layout.stage_layers == ((0, 3),)
    assert cfg.training.precision == "fp32" and cfg.training.steps == 4
    assert cfg.training.learning_rate == 3e-4, "the CRD's default, not one of the trainer's"
    assert cfg.metrics_port == 0 and cfg.training.checkpoint_dir is None
    assert cfg.tokens_per_step == 8 * 64


def test_interleaved_pipeline_takes_planner_ranges_in_stage_order() -> None:
    env = layout_env(
        TINY, TRAINING, pp=2, schedule="interleaved-1f1b", virtual_stages=2, micro_batches=4
    )
    cfg = from_env(env)
    assert env["MESHRUN_STAGE_LAYERS"] == "0-0,1-1,2-2,3-3"
    assert cfg.layout.num_stages == 4
    assert cfg.layout.stage_layers == ((0, 0), (1, 1), (2, 2), (3, 3))


READ = sorted(
    name
    for name in layout_env(TINY, TRAINING)
    # torchrun reads PET_* and MASTER_*; these two are for people and tools, not the trainer.
    if name.startswith("MESHRUN_") and name not in ("MESHRUN_POD_INDEX", "MESHRUN_STRATEGY")
)


@pytest.mark.parametrize("name", READ)
def test_every_variable_is_required(name: str) -> None:
    env = make_env()
    del env[name]
    with pytest.raises(ConfigError) as caught:
        from_env(env)
    assert caught.value.field == name
    assert "is required" in caught.value.rule


def test_every_field_the_rules_name_has_a_variable() -> None:
    env = make_env()
    assert set(ENV_OF_FIELD.values()) - {"WORLD_SIZE"} <= set(env)


@pytest.mark.parametrize(
    ("overrides", "field", "fragment"),
    [
        ({"dp": "two"}, "MESHRUN_DP", "integer"),
        ({"tp": "0"}, "MESHRUN_TP", ">= 1"),
        ({"tp": "3"}, "MESHRUN_TP", "spec.strategy.tensorParallel: must divide spec.model.heads"),
        ({"model_seq_len": "30", "tp": "4"}, "MESHRUN_TP", "(4 does not divide seqLen=30)"),
        ({"pp": "8", "micro_batches": "8"}, "MESHRUN_PP", "8 stages for layers=4"),
        ({"zero_stage": "4"}, "MESHRUN_ZERO_STAGE", "must be 0, 1, 2 or 3"),
        ({"pipeline_schedule": "zigzag"}, "MESHRUN_PIPELINE_SCHEDULE", "one of"),
        (
            {
                "pp": "2",
                "micro_batches": "2",
                "micro_batch_size": "4",
                "pipeline_schedule": "interleaved-1f1b",
            },
            "MESHRUN_VIRTUAL_STAGES",
            "at least 2",
        ),
        (
            {"pp": "2", "micro_batches": "2", "micro_batch_size": "4", "stage_layers": "0-2,2-3"},
            "MESHRUN_STAGE_LAYERS",
            "contiguous",
        ),
        (
            {"pp": "2", "micro_batches": "2", "micro_batch_size": "4", "stage_layers": "0-0,1-2"},
            "MESHRUN_STAGE_LAYERS",
            "cover all 4",
        ),
        (
            {"pp": "2", "micro_batches": "2", "micro_batch_size": "4"},
            "MESHRUN_STAGE_LAYERS",
            "needs pp x virtualStages = 2",
        ),
        ({"stage_layers": "a-b,c"}, "MESHRUN_STAGE_LAYERS", "look like"),
        ({"dp": "3"}, "MESHRUN_GLOBAL_BATCH_SIZE", "(8 against 3x8 = 24)"),
        ({"grad_accumulation": "2"}, "MESHRUN_GLOBAL_BATCH_SIZE", "gradient accumulation"),
        ({"learning_rate": "fast"}, "MESHRUN_LEARNING_RATE", "number"),
        ({"learning_rate": "-1"}, "MESHRUN_LEARNING_RATE", "greater than 0"),
        ({"precision": "fp8"}, "MESHRUN_PRECISION", "bf16, fp32"),
        ({"model_kv_heads": "3"}, "MESHRUN_MODEL_KV_HEADS", "(3 does not divide heads=4)"),
        ({"model_heads": "64", "model_kv_heads": "4"}, "MESHRUN_MODEL_HEADS", "rotary"),
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
    with pytest.raises(ConfigError, match=r"WORLD_SIZE: spec.strategy: .*1x1x1 = 1, not 4"):
        from_env({**make_env(), "WORLD_SIZE": "4"})


def test_stage_layer_parsing() -> None:
    assert parse_stage_layers("0-1, 2-3,4") == ((0, 1), (2, 3), (4, 4))

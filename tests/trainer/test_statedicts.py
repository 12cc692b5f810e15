"""Checkpoint state: canonical names, and a key missing from a checkpoint is an error."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from meshrun_trainer.components import statedicts
from meshrun_trainer.components.optim import make_optimizer
from meshrun_trainer.models.llama import build_model
from meshrun_trainer.runner import Runner
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from meshrun.api.presets import PRESETS

pytestmark = pytest.mark.unit


def _runner(seed: int) -> Runner:
    model = build_model(PRESETS["tiny"], seed)
    return Runner([model], [make_optimizer(model.parameters(), 0.01)], None, True, True)


def test_state_is_keyed_by_model_names(tmp_path: Path) -> None:
    saved = statedicts.merged(statedicts.part_states(_runner(1)))
    names = {n for n, _ in build_model(PRESETS["tiny"], 0).named_parameters()}
    assert set(saved["model"]) == names
    assert {k for k in saved["optim"] if k.startswith("state.")} == {
        f"state.{name}.{key}" for name in names for key in ("step", "exp_avg", "exp_avg_sq")
    }
    dcp_save(saved, checkpoint_id=str(tmp_path), no_dist=True)
    target = _runner(2)
    states = statedicts.part_states(target)
    loaded = statedicts.merged(states)
    statedicts.load(loaded, str(tmp_path), no_dist=True)
    statedicts.apply(target, states, loaded)
    for name, param in target.parts[0].named_parameters():
        assert torch.equal(param, saved["model"][name]), name


def test_a_key_missing_from_the_checkpoint_is_an_error(tmp_path: Path) -> None:
    saved = statedicts.merged(statedicts.part_states(_runner(1)))
    del saved["optim"]["state.layers.1.feed_forward.w2.weight.exp_avg"]
    dcp_save(saved, checkpoint_id=str(tmp_path), no_dist=True)
    loaded = statedicts.merged(statedicts.part_states(_runner(2)))
    missing = r"Missing key in checkpoint state_dict: optim\.state\.layers\.1\.feed_forward"
    with pytest.raises(statedicts.CheckpointMismatch, match=missing):
        statedicts.load(loaded, str(tmp_path), no_dist=True)

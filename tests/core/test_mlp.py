"""``spec.model.mlp``: a two-matrix GeLU MLP in the spec, the parameter count, the memory model
and the step-time model, against the SwiGLU block of the same width."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from planner_factories import make_cpu_spec

from meshrun.api.errors import SpecError
from meshrun.api.modelsource import mlp_of_config
from meshrun.api.presets import PRESETS
from meshrun.api.read import read_spec
from meshrun.planner.memory import layer_activation_elements
from meshrun.planner.plan import plan_job
from meshrun.planner.steptime import layer_compute_seconds, layer_gemms

pytestmark = pytest.mark.unit

PYTHIA_1_4B = {"layers": 24, "hidden": 2048, "heads": 16, "vocab": 50304, "seqLen": 2048}
"""GPT-NeoX's Pythia-1.4B (Biderman et al. 2023, table 1): a GeLU MLP of 4h = 8,192."""


def sized(**model: Any) -> dict[str, Any]:
    """A CPU job of the sizes given (no preset)."""
    spec = make_cpu_spec(model=model)
    spec["model"].pop("preset")
    return spec


def gpu_job(model: dict[str, Any], **training: Any) -> dict[str, Any]:
    return {
        "image": "trainer:1",
        "resources": {"numNodes": 1, "numProcPerNode": 8},
        "strategy": {"type": "hybrid", "dataParallel": 4, "tensorParallel": 2},
        "model": model,
        "training": {"globalBatchSize": 32, "microBatchSize": 2, **training},
    }


def test_swiglu_is_the_default_and_gelu_defaults_to_four_h() -> None:
    assert read_spec(make_cpu_spec()).shape.mlp == "swiglu"
    shape = read_spec(sized(mlp="gelu", **PYTHIA_1_4B)).shape
    assert shape.mlp == "gelu" and shape.ffn_hidden == 4 * 2048
    preset = read_spec(make_cpu_spec(model={"mlp": "gelu"})).shape
    assert preset == dataclasses.replace(PRESETS["tiny"], mlp="gelu")
    with pytest.raises(SpecError) as caught:
        read_spec(make_cpu_spec(model={"mlp": "geglu"}))
    assert caught.value.field == "spec.model.mlp"


def test_pythia_counts_two_matrices_of_h_by_f() -> None:
    """Pythia-1.4B's published 1,414,647,808 parameters are this block's (4h^2 attention, 2hf
    MLP, two norms) plus what GPT-NeoX adds: biases of every linear (3h + h + f + h) and of
    both LayerNorms (2h) per layer, and the final LayerNorm's bias."""
    shape = read_spec(sized(mlp="gelu", **PYTHIA_1_4B)).shape
    h, f, layers = 2048, 8192, 24
    assert shape.layer_parameters() == 4 * h * h + 2 * h * f + 2 * h
    assert shape.parameters() + layers * (7 * h + f) + h == 1_414_647_808
    swiglu = dataclasses.replace(shape, mlp="swiglu")
    assert swiglu.layer_parameters() - shape.layer_parameters() == h * f


def test_gelu_keeps_half_the_mlp_activations_and_multiplies_two_thirds() -> None:
    gelu = read_spec(sized(mlp="gelu", **PYTHIA_1_4B)).shape
    swiglu = dataclasses.replace(gelu, mlp="swiglu")
    f, t = gelu.ffn_hidden, 2
    # none: w1 and GeLU's outputs (2f/t) against w1, w3, SiLU's and the product (4f/t);
    # selective: w1's output against w1's and w3's.
    for mode, saved in (("none", 2 * f / t), ("selective", f / t), ("full", 0.0)):
        got = layer_activation_elements(swiglu, t, mode) - layer_activation_elements(gelu, t, mode)
        assert got == pytest.approx(saved), mode
    assert "w1" in layer_gemms(gelu, 4096, t) and "w1,w3" in layer_gemms(swiglu, 4096, t)
    assert layer_gemms(gelu, 4096, t)["w1"][1] * 2 == layer_gemms(swiglu, 4096, t)["w1,w3"][1]
    fast, slow = (layer_compute_seconds(s, 4096, t, 989e12)[0] for s in (gelu, swiglu))
    assert 0.7 < fast / slow < 0.9  # the MLP is 2/3 of a block's matmul FLOPs at f = 4h


def test_a_gelu_plan_holds_less_and_steps_faster_than_swiglu_of_the_same_width() -> None:
    model = {**PYTHIA_1_4B, "ffnHidden": 8192}
    gelu, swiglu = (plan_job(gpu_job({**model, "mlp": mlp})) for mlp in ("gelu", "swiglu"))
    assert gelu.to_dict()["model"]["mlp"] == "gelu"
    assert gelu.model.parameters() < swiglu.model.parameters()
    assert gelu.memory.params < swiglu.memory.params
    assert gelu.memory.activations < swiglu.memory.activations
    assert gelu.estimate is not None and swiglu.estimate is not None
    assert gelu.estimate.step_seconds < swiglu.estimate.step_seconds


def test_hugging_face_families_name_their_mlp() -> None:
    field = "spec.model.hf.path"
    assert mlp_of_config({"model_type": "gpt_neox", "hidden_act": "gelu"}, field) == "gelu"
    assert mlp_of_config({"model_type": "gpt2", "activation_function": "gelu_new"}, field) == "gelu"
    assert mlp_of_config({"model_type": "falcon"}, field) == "gelu"
    assert mlp_of_config({"model_type": "qwen2", "hidden_act": "silu"}, field) == "swiglu"
    for wrong in (
        {"model_type": "llama", "hidden_act": "gelu"},
        {"model_type": "gpt_neox", "hidden_act": "relu"},
        {"model_type": "t5"},
    ):
        with pytest.raises(SpecError) as caught:
            mlp_of_config(wrong, field)
        assert caught.value.field == field


def test_gelu_mlp_agrees_with_config_json_and_is_not_exported() -> None:
    folder_shape = PRESETS["small"]
    model = {"hf": {"path": "/models/x"}, "seqLen": 1024, "mlp": "gelu"}
    spec = sized(**model)
    with pytest.raises(SpecError) as caught:
        read_spec(spec, folder_shape=folder_shape)
    assert caught.value.field == "spec.model.mlp"
    exported = make_cpu_spec(model={"mlp": "gelu"}, training={"export": {"path": "/out"}})
    with pytest.raises(SpecError) as caught:
        plan_job(exported)
    assert caught.value.field == "spec.training.export"

"""The memory estimate against its sources: the ZeRO paper and Korthikanti et al. 2022."""

from __future__ import annotations

from typing import Any

import pytest

from meshrun.api.read import read_spec
from meshrun.api.spec import GIB
from meshrun.planner.memory import estimate_memory, in_flight, layer_activation_bytes
from meshrun.planner.plan import plan_job

pytestmark = pytest.mark.unit


def make_spec(
    strategy: dict[str, Any],
    nodes: int = 8,
    procs: int = 8,
    accelerator: str = "nvidia.com/gpu",
    precision: str = "bf16",
    model: dict[str, Any] | None = None,
    batch: int = 64,
) -> dict[str, Any]:
    return {
        "image": "trainer:1",
        "resources": {
            "numNodes": nodes,
            "numProcPerNode": procs,
            "accelerator": accelerator,
            "acceleratorMemoryGiB": 80,
        },
        "strategy": strategy,
        "model": model or {"preset": "7b"},
        "training": {"globalBatchSize": batch, "microBatchSize": 1, "precision": precision},
    }


def model_states(spec: dict[str, Any]) -> tuple[int, int]:
    """(params + grads + optimizer bytes per GPU, parameter count)."""
    plan = plan_job(spec)
    m = plan.memory
    return m.params + m.grads + m.optimizer, plan.model.parameters()


@pytest.mark.parametrize(
    ("stage", "per_param", "paper_gb"),
    [
        # ZeRO paper, figure 1: psi = 7.5B, N = 64, K = 12.
        (0, 16.0, 120.0),
        (1, 4 + 12 / 64, 31.4),
        # The paper's 16.6 GB keeps bf16 gradient shards; FSDP2 reduces them into fp32 shards.
        (2, 2 + 16 / 64, 16.9),
        (3, 16 / 64, 1.9),
    ],
)
def test_zero_model_states_follow_the_paper(stage: int, per_param: float, paper_gb: float) -> None:
    strategy = {"type": "zero", "zeroStage": stage} if stage else {"type": "ddp"}
    states, psi = model_states(make_spec(strategy))
    assert states == pytest.approx(per_param * psi, abs=64)
    assert round(states / psi * 7.5, 1) == paper_gb


def test_fp32_keeps_sixteen_bytes_split_four_four_eight() -> None:
    plan = plan_job(make_spec({"type": "ddp"}, precision="fp32"))
    psi = plan.model.parameters()
    assert (plan.memory.params, plan.memory.grads, plan.memory.optimizer) == (
        4 * psi,
        4 * psi,
        8 * psi,
    )


def test_tensor_parallel_divides_weights() -> None:
    one = plan_job(make_spec({"type": "ddp"}, nodes=1)).memory
    eight = plan_job(make_spec({"type": "tensor", "tensorParallel": 8}, nodes=1)).memory
    assert eight.params == pytest.approx(one.params / 8, rel=1e-6)


def test_an_arriving_gradient_counts_beside_the_accumulated_ones() -> None:
    # Under accumulation autograd adds each new gradient into the one kept: the largest (here
    # the embedding's and the head's, vocab x h) exists twice for a moment. bf16: 2 B each.
    once = plan_job(make_spec({"type": "ddp"}, batch=64))
    twice = plan_job(make_spec({"type": "ddp"}, batch=128))
    assert twice.layout.grad_accumulation == 2 and once.layout.grad_accumulation == 1
    model = twice.model
    assert twice.memory.grads - once.memory.grads == 2 * model.vocab * model.hidden
    # FSDP2 reduces each unit's gradient into its shard (its working set, not a second copy).
    zero3 = {"type": "zero", "zeroStage": 3}
    assert plan_job(make_spec(zero3, batch=128)).memory.grads == (
        plan_job(make_spec(zero3, batch=64)).memory.grads
    )


def test_tensor_parallel_counts_the_embedding_gradient_whole() -> None:
    # DTensor computes the vocabulary-sharded embedding's gradient whole on every TP rank
    # before the trainer reshards it (tests/trainer/test_tp_activations.py sees it arrive), as
    # the last step of backward: it counts where it outgrows the activations freed by then.
    tp8 = {"type": "tensor", "tensorParallel": 8}
    for seq, outgrows in ((256, True), (8192, False)):
        model = {"preset": "7b", "seqLen": seq}
        plan = plan_job(make_spec(tp8, nodes=1, batch=1, model=model))
        assert plan.layout.grad_accumulation == 1
        whole = 2 * plan.model.vocab * plan.model.hidden
        assert (whole > plan.memory.activations) is outgrows
        extra = plan.memory.grads - plan.memory.params
        assert extra == max(0, whole - plan.memory.activations)
    # On CPUs the freed activations' pages stay in malloc's heaps: the gradient counts whole.
    model = {"preset": "7b", "seqLen": 8192}
    plan = plan_job(
        make_spec(tp8, nodes=1, accelerator="cpu", precision="fp32", model=model, batch=1)
    )
    assert plan.memory.grads - plan.memory.params == 4 * plan.model.vocab * plan.model.hidden


def test_pipeline_stage_holds_its_layers_and_the_embedding() -> None:
    plan = plan_job(make_spec({"type": "pipeline", "pipelineParallel": 4}, nodes=1, procs=4))
    model = plan.model
    first = 8 * model.layer_parameters() + model.vocab * model.hidden
    # Under 1F1B stage 0 keeps the most micro-batches in flight, so it is the worst rank.
    assert plan.memory.params == 2 * first


def activation_spec(accelerator: str, precision: str, tp: int = 1) -> dict[str, Any]:
    model = {
        "layers": 1,
        "hidden": 1024,
        "heads": 16,
        "kvHeads": 4,
        "ffnHidden": 4096,
        "vocab": 1024,
        "seqLen": 2048,
    }
    strategy = {"type": "tensor", "tensorParallel": tp} if tp > 1 else {"type": "ddp"}
    return make_spec(strategy, 1, 8, accelerator, precision, model, batch=8)


@pytest.mark.parametrize(
    ("precision", "tp", "checkpointing", "per_token"),
    [
        # Korthikanti et al.'s per-tensor accounting of the Llama block (h = q = 1024, f = 4096,
        # 16 heads of 64, 4 key/value heads: kv = 256): see layer_activation_elements.
        ("bf16", 1, "none", 2 * (6 * 1024 + 4 * 1024 + 4 * 4096 + 16 + 2)),
        ("fp32", 1, "none", 4 * (6 * 1024 + 4 * 1024 + 4 * 4096 + 16 + 2)),
        # Under TP the norms' outputs are kept as sequence shards (gathered again in backward).
        ("bf16", 4, "none", 2 * (10 * 1024 + 4 * 4096 + 16 + 2) / 4),
        ("bf16", 1, "selective", 2 * (3 * 1024 + 2 * 1024 + 2 * 256 + 2 * 4096 + 16)),
        ("bf16", 4, "selective", 2 * (2 * 1024 + (5 * 1024 + 2 * 256 + 2 * 4096 + 16) / 4)),
        # Full recomputation keeps each layer's input: 2*s*b*h bytes in bf16.
        ("bf16", 1, "full", 2 * 1024),
        ("bf16", 4, "full", 2 * 1024 / 4),
    ],
)
def test_layer_activations_per_token(
    precision: str, tp: int, checkpointing: str, per_token: float
) -> None:
    job = read_spec(activation_spec("nvidia.com/gpu", precision, tp))
    assert layer_activation_bytes(job, tp, 1, checkpointing) == int(2048 * per_token)


def test_checkpointing_shrinks_the_estimate_and_full_adds_one_recomputed_layer() -> None:
    job = read_spec(activation_spec("nvidia.com/gpu", "bf16"))
    plan = plan_job(activation_spec("nvidia.com/gpu", "bf16"))
    none, full = (
        estimate_memory(job, plan.layout, plan.stages, mode).activations
        for mode in ("none", "full")
    )
    assert none == plan.memory.activations  # the default plans without checkpointing
    s, h, vocab = 2048, 1024, 1024
    head = s * (2 * vocab + 2 * 3 * h)  # the bf16 logits the loss keeps, the final norm's
    # Backward starts with the logits' bf16 gradient, built a slice of rows at a time in fp32.
    gradients = 2 * s * vocab + 4 * s * vocab
    one_layer = layer_activation_bytes(job, 1, 1)
    assert none == one_layer + head + gradients
    assert full == layer_activation_bytes(job, 1, 1, "full") + head + max(gradients, one_layer)


def test_schedules_hold_different_micro_batches_in_flight() -> None:
    def stage0(schedule: str) -> float:
        spec = make_spec(
            {"type": "pipeline", "pipelineParallel": 4, "pipelineSchedule": schedule},
            nodes=1,
            procs=4,
            batch=16,
        )
        return in_flight(plan_job(spec).layout, 0)

    assert stage0("gpipe") == 16
    assert stage0("1f1b") == 4
    assert stage0("interleaved-1f1b") == pytest.approx(4 * (1 + 3 / 8))


def test_fits_compares_with_accelerator_memory() -> None:
    plan = plan_job(make_spec({"type": "ddp"}, nodes=1))
    assert plan.memory.accelerator_bytes == 80 * GIB
    assert plan.memory.total > 80 * GIB and not plan.memory.fits


GPT_530B_SHAPE = {
    "layers": 105,
    "hidden": 20480,
    "heads": 128,
    "vocab": 51200,
    "seqLen": 2048,
    "ffnHidden": 81920,
    "mlp": "gelu",
}


@pytest.mark.parametrize(
    ("strategy", "split", "per_parameter"),
    [
        ({"type": "zero", "zeroStage": 3}, True, 10),  # 2w + g + 4 bytes
        ({"type": "zero", "zeroStage": 2}, False, 6),  # every unit's weights stay whole anyway
        ({"type": "hybrid", "zeroStage": 3, "tensorParallel": 8}, False, 10),  # 0.63G a rank
        ({"type": "hybrid", "zeroStage": 3, "pipelineParallel": 5}, False, 4),  # kept gathered
    ],
)
def test_zero3_gathers_a_block_past_a_billion_parameters_matrix_by_matrix(
    strategy: dict[str, Any], split: bool, per_parameter: int
) -> None:
    """A 530B block (5.03G parameters) is gathered matrix by matrix under ZeRO-3 without
    pipelining: FSDP2's working set is then the largest matrix's (hidden x 4 hidden, 1.68G),
    and the ZeRO-3 run DeepSpeed made on 640 A100s fits."""
    spec = make_spec(strategy, nodes=80, model=GPT_530B_SHAPE, batch=640)
    spec["training"]["activationCheckpointing"] = "full"
    plan = plan_job(spec)
    largest = 20480 * 81920 + 81920
    block = 4 * 20480**2 + 2 * 20480 * 81920 + 2 * 20480
    unit = largest if split else -(-block // plan.layout.tp)
    assert plan.memory.gathered == unit * per_parameter
    if split:
        assert plan.memory.fits

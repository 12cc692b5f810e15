"""The rules of a mixture of experts and of expert parallelism (``spec.model.moe``,
``spec.strategy.expertParallel`` and ``expertTensorParallel``).

Expert parallelism is folded from the dense ranks of one pipeline stage, as torchtitan's
ParallelDims and Megatron-Core's MoE parallel folding do: the ``expertParallel`` ranks that
share a MoE layer's experts are drawn from the data-parallel ranks, and also from the
tensor-parallel ones when ``expertTensorParallel`` is 1, so it adds no processes.
"""

from __future__ import annotations

from meshrun.api.errors import Rule, SpecError
from meshrun.api.layout import Layout
from meshrun.api.presets import ModelShape
from meshrun.api.spec import JobSpec

STRATEGY, MOE = "spec.strategy", "spec.model.moe"
EP_NEEDS_MOE = Rule(
    f"{STRATEGY}.expertParallel", f"{STRATEGY}.expertParallel above 1 needs spec.model.moe"
)
EP_EXPERTS = Rule(
    f"{STRATEGY}.expertParallel", f"{STRATEGY}.expertParallel must divide {MOE}.experts"
)
ETP_VALUES = Rule(
    f"{STRATEGY}.expertTensorParallel",
    f"{STRATEGY}.expertTensorParallel must be 1 or equal {STRATEGY}.tensorParallel",
)
TOP_K = Rule(f"{MOE}.expertsPerToken", f"{MOE}.expertsPerToken must not exceed {MOE}.experts")
FIRST_DENSE = Rule(
    f"{MOE}.firstDenseLayers",
    f"{MOE}.firstDenseLayers must be below spec.model.layers (a mixture of experts needs a MoE "
    "layer)",
)
MOE_RULES = (EP_NEEDS_MOE, EP_EXPERTS, ETP_VALUES, TOP_K, FIRST_DENSE)
"""The rules of this module the CRD also states as CEL."""


def check_moe_spec(spec: JobSpec) -> None:
    """The mixture of experts against the model, and the expert degrees as given."""
    check_moe_shape(spec.shape)
    check_moe_export(spec)
    s = spec.strategy
    ep, etp = s.expert_parallel, s.expert_tensor_parallel
    if etp not in (None, 1) and etp != s.tensor_parallel:
        raise ETP_VALUES.error(f"got {etp} with tensorParallel {s.tensor_parallel}")
    if ep is not None:
        check_experts(ep, spec.shape)


def check_moe_export(spec: JobSpec) -> None:
    """What a Hugging Face folder can hold of a mixture of experts: no routing bias in any of
    the formats; a model not read from a folder is written as Mixtral, which has neither
    shared experts nor dense layers nor a sigmoid router, and a qkv or output bias."""
    moe = spec.shape.moe
    if moe is None or spec.training.export is None:
        return
    field = "spec.training.export"
    if moe.bias_balancing:
        raise SpecError(
            field,
            "a Hugging Face folder holds no routing bias: a model trained with "
            f"{MOE}.biasBalancing would route differently once exported",
        )
    if spec.model.hf is not None:
        return
    shape = spec.shape
    mixtral = (
        not moe.shared_width
        and moe.first_dense_layers == 0
        and moe.router == "softmax"
        and moe.normalize_top_k
        and not (shape.qkv_bias or shape.output_bias or shape.tie_embeddings)
    )
    if not mixtral:
        raise SpecError(
            field,
            f"a {MOE} not read from spec.model.hf is exported as Mixtral, which has no shared "
            "experts, dense first layers, sigmoid router or tied embeddings: start from a "
            "Hugging Face folder of the architecture (Qwen2-MoE for shared experts) instead",
        )


def check_moe_shape(shape: ModelShape) -> None:
    """The model's own MoE rules: top-k within the experts, a MoE layer after the dense ones."""
    moe = shape.moe
    if moe is None:
        return
    if moe.experts_per_token > moe.experts:
        raise TOP_K.error(f"{moe.experts_per_token} of {moe.experts}")
    if moe.first_dense_layers >= shape.layers:
        raise FIRST_DENSE.error(f"{moe.first_dense_layers} for layers={shape.layers}")


def check_experts(ep: int, shape: ModelShape) -> None:
    """An expert-parallel degree against the model's experts."""
    if ep > 1 and shape.moe is None:
        raise EP_NEEDS_MOE.error(f"got {ep}")
    if shape.moe is not None and shape.moe.experts % ep:
        raise EP_EXPERTS.error(f"{ep} does not divide {shape.moe.experts}")


def check_expert_layout(layout: Layout, shape: ModelShape) -> None:
    """Expert parallelism inside one pipeline stage: ep x etp divides its dp x cp x tp ranks, and
    the expert tensor-parallel degree is 1 or tp."""
    check_experts(layout.ep, shape)
    if shape.moe is not None and layout.tp > 1 and layout.etp != 1:
        raise SpecError(
            f"{STRATEGY}.expertTensorParallel",
            f"{layout.etp}: the trainer keeps each expert whole (expertTensorParallel 1) under "
            f"tensorParallel {layout.tp}; set expertTensorParallel: 1 (the tensor-parallel "
            "ranks then join the expert-parallel group)",
        )
    if layout.etp not in (1, layout.tp):
        raise ETP_VALUES.error(f"got {layout.etp} with tensorParallel {layout.tp}")
    stage_ranks = layout.dp * layout.cp * layout.tp
    if stage_ranks % (layout.ep * layout.etp):
        raise SpecError(
            f"{STRATEGY}.expertParallel",
            f"{STRATEGY}.expertParallel x expertTensorParallel ({layout.ep}x{layout.etp}) must "
            f"divide dataParallel x contextParallel x tensorParallel ({layout.dp}x{layout.cp}x"
            f"{layout.tp}), the ranks of one pipeline stage",
        )

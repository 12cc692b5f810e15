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
    s = spec.strategy
    ep, etp = s.expert_parallel, s.expert_tensor_parallel
    if etp not in (None, 1) and etp != s.tensor_parallel:
        raise ETP_VALUES.error(f"got {etp} with tensorParallel {s.tensor_parallel}")
    if ep is not None:
        check_experts(ep, spec.shape)


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
    """Expert parallelism inside one pipeline stage: ep x etp divides its dp x tp ranks, and
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
    stage_ranks = layout.dp * layout.tp
    if stage_ranks % (layout.ep * layout.etp):
        raise SpecError(
            f"{STRATEGY}.expertParallel",
            f"{STRATEGY}.expertParallel x expertTensorParallel ({layout.ep}x{layout.etp}) must "
            f"divide dataParallel x tensorParallel ({layout.dp}x{layout.tp}), the ranks of one "
            "pipeline stage",
        )

"""A mixture of experts: ``spec.model.moe`` as written, and the resolved shape of the MoE layers.

Each MoE layer replaces a block's SwiGLU MLP by ``experts`` routed SwiGLU experts of width
``expert_ffn_hidden``, of which a router picks ``experts_per_token`` per token (top-k), plus
``shared_experts`` experts every token visits (one SwiGLU of their summed width, as DeepSeek's
shared experts are). The first ``first_dense_layers`` blocks keep the dense MLP of width
``ffnHidden``. Balancing: Switch Transformer's auxiliary loss (Fedus et al. 2022) with
``aux_loss_coefficient``, and/or DeepSeek-V3's loss-free bias balancing (Wang et al. 2024): a
per-expert bias added to the router's scores for the selection only, moved each step against
the sign of each expert's load error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Router = Literal["softmax", "sigmoid"]

DEFAULT_AUX_LOSS = 0.01
"""auxLossCoefficient when unset without biasBalancing (Switch Transformer's 1e-2)."""
BIAS_UPDATE_RATE = 0.001
"""How far bias balancing moves an expert's bias each step (DeepSeek-V3's gamma)."""


@dataclass(frozen=True, kw_only=True)
class Moe:
    """``spec.model.moe``: a mixture of experts, as given (the CRD's defaults applied)."""

    experts: int
    """Routed experts per MoE layer."""
    experts_per_token: int
    """Experts the router picks for each token (top-k)."""
    shared_experts: int
    """Experts every token visits."""
    expert_ffn_hidden: int | None
    """One expert's SwiGLU width; None: ffnHidden."""
    first_dense_layers: int
    """Blocks before the first MoE layer, which keep the dense MLP."""
    router: Router
    """softmax or sigmoid scores of the router."""
    aux_loss_coefficient: float | None
    """Weight of the load-balancing loss; None: 0.01, or 0 with biasBalancing."""
    bias_balancing: bool
    """DeepSeek-V3's loss-free balancing."""


@dataclass(frozen=True)
class MoeShape:
    """The resolved mixture of experts a model's MoE layers have."""

    experts: int
    """Routed experts per MoE layer."""
    experts_per_token: int
    """Top-k."""
    expert_ffn_hidden: int
    """One routed expert's SwiGLU width."""
    shared_experts: int = 0
    """Experts every token visits."""
    first_dense_layers: int = 0
    """Blocks before the first MoE layer (they keep the dense MLP)."""
    router: str = "softmax"
    """softmax or sigmoid."""
    aux_loss_coefficient: float = DEFAULT_AUX_LOSS
    """Weight of the auxiliary load-balancing loss (0: none)."""
    bias_balancing: bool = False
    """DeepSeek-V3's loss-free balancing bias."""
    normalize_top_k: bool = True
    """The k picked weights are renormalized to sum to 1 (Mixtral; Qwen2-MoE's norm_topk_prob)."""
    shared_ffn_hidden: int = 0
    """Width of the shared experts' one SwiGLU; 0: shared_experts x expert_ffn_hidden."""
    shared_expert_gate: bool = False
    """The shared experts' output is scaled by sigmoid(a learned gate) (Qwen2-MoE)."""

    @property
    def shared_width(self) -> int:
        return self.shared_ffn_hidden or self.shared_experts * self.expert_ffn_hidden

    def is_moe_layer(self, layer: int) -> bool:
        return layer >= self.first_dense_layers

    def routed_parameters(self, hidden: int) -> int:
        """The routed experts' parameters of one MoE layer (three matrices each)."""
        return self.experts * 3 * hidden * self.expert_ffn_hidden

    def fixed_parameters(self, hidden: int) -> int:
        """What every token uses in a MoE layer's MLP: router, shared experts and their gate."""
        gate = hidden if self.shared_expert_gate else 0
        return self.experts * hidden + 3 * hidden * self.shared_width + gate

    def active_parameters(self, hidden: int) -> int:
        """A MoE layer's MLP parameters one token uses: k experts, router, shared experts."""
        k_experts = self.experts_per_token * 3 * hidden * self.expert_ffn_hidden
        return k_experts + self.fixed_parameters(hidden)


def resolve_moe(moe: Moe, ffn_hidden: int) -> MoeShape:
    """The shape of ``spec.model.moe`` for a model whose dense MLP is ``ffn_hidden`` wide."""
    coefficient = moe.aux_loss_coefficient
    if coefficient is None:
        coefficient = 0.0 if moe.bias_balancing else DEFAULT_AUX_LOSS
    return MoeShape(
        experts=moe.experts,
        experts_per_token=moe.experts_per_token,
        expert_ffn_hidden=moe.expert_ffn_hidden or ffn_hidden,
        shared_experts=moe.shared_experts,
        first_dense_layers=moe.first_dense_layers,
        router=moe.router,
        aux_loss_coefficient=coefficient,
        bias_balancing=moe.bias_balancing,
    )

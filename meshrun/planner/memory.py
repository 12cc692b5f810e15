"""Per-accelerator memory estimate of a layout.

Model states follow the ZeRO paper (Rajbhandari et al. 2020, arXiv 1910.02054, section 3.1 and
figure 1): mixed-precision Adam keeps 2 B of bf16 weights, 2 B of bf16 gradients and K = 12 B of
fp32 master weights and moments per parameter (plain fp32: 4 + 4 + 8). Stage 1 divides the
optimizer part by the data-parallel degree N, stage 2 also the gradients, stage 3 also the
weights. Tensor parallelism divides a stage's weights by t; pipeline parallelism gives each rank
its own layers (plus the embedding on the first stage and the output head on the last).

Activations per transformer layer follow Korthikanti et al. 2022 (arXiv 2205.05198, section 4),
in bytes for 16-bit activations: s*b*h*(10 + 24/t + 5*a*s/(h*t)); FlashAttention (used by torch's
scaled_dot_product_attention on GPUs in bf16) removes the 5*a*s/h score term. fp32 doubles it.
The pipeline schedule sets how many micro-batches are in flight on a rank: GPipe keeps all m,
1F1B at most p - i on stage i, interleaving multiplies 1F1B's by 1 + (p-1)/(p*v) (Narayanan et
al. 2021, arXiv 2104.04473, section 2.2). The last stage also holds the fp32 logits s*b*V/t.
The estimate ignores the CUDA context, allocator fragmentation and ZeRO-3's gathered layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshrun.layout import Layout, Stage
from meshrun.spec import CPU, JobSpec


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per accelerator on the most loaded pipeline rank."""

    params: int
    """Model weights held (bf16, or fp32 for fp32 training)."""
    grads: int
    """Gradients held."""
    optimizer: int
    """Optimizer state held (fp32 master weights and Adam moments)."""
    activations: int
    """Activations kept for backward, for the micro-batches in flight."""
    accelerator_bytes: int
    """Memory of one accelerator; 0 when unknown (no fit check)."""

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations

    @property
    def fits(self) -> bool:
        return self.accelerator_bytes == 0 or self.total <= self.accelerator_bytes


def bytes_per_parameter(precision: str) -> tuple[int, int, int]:
    """(weights, gradients, optimizer) bytes per parameter for Adam (ZeRO paper, section 3.1)."""
    return (2, 2, 12) if precision == "bf16" else (4, 4, 8)


def flash_attention(job: JobSpec) -> bool:
    """Whether torch's SDPA uses a fused kernel that keeps no a*s*s score matrix."""
    return job.resources.accelerator != CPU and job.training.precision == "bf16"


def layer_activation_bytes(job: JobSpec, tp: int, micro_batch: int) -> int:
    """Activations one transformer layer keeps for backward (Korthikanti et al. 2022, eq. 2)."""
    m = job.shape
    s, b, h, a = m.seq_len, micro_batch, m.hidden, m.heads
    per_token = (10 + 24 / tp) * h
    if not flash_attention(job):
        per_token += 5 * a * s / tp
    scale = 1 if job.training.precision == "bf16" else 2
    return int(s * b * per_token * scale)


def in_flight(layout: Layout, pp_rank: int) -> float:
    """Micro-batches whose activations pipeline rank ``pp_rank`` holds at its peak."""
    p, m = layout.pp, layout.micro_batches
    if p == 1:
        return 1.0
    if layout.schedule == "gpipe":
        return float(m)
    one_f_one_b = float(min(m, p - pp_rank))
    if layout.schedule == "interleaved-1f1b":
        return one_f_one_b * (1 + (p - 1) / (p * layout.virtual_stages))
    return one_f_one_b


def estimate_memory(job: JobSpec, layout: Layout, stages: list[Stage]) -> MemoryEstimate:
    """The estimate for the pipeline rank with the largest total."""
    model, t, n = job.shape, layout.tp, layout.dp
    weight_b, grad_b, optim_b = bytes_per_parameter(job.training.precision)
    layers_on = [0] * layout.pp
    for stage in stages:
        layers_on[stage.pp] += stage.last - stage.first + 1
    per_layer_act = layer_activation_bytes(job, t, job.training.micro_batch_size)
    logits_scale = 4 * model.seq_len * job.training.micro_batch_size
    best: MemoryEstimate | None = None
    for rank in range(layout.pp):
        count = layers_on[rank] * model.layer_parameters()
        if rank == 0:
            count += model.vocab * model.hidden
        if rank == layout.pp - 1:
            count += model.vocab * model.hidden + model.hidden
        local = -(-count // t)
        params, grads, optim = local * weight_b, local * grad_b, local * optim_b
        if layout.zero_stage >= 1:
            optim = -(-optim // n)
        if layout.zero_stage >= 2:
            grads = -(-grads // n)
        if layout.zero_stage >= 3:
            params = -(-params // n)
        activations = int(per_layer_act * layers_on[rank] * in_flight(layout, rank))
        if rank == layout.pp - 1:
            activations += logits_scale * model.vocab // t
        estimate = MemoryEstimate(
            params, grads, optim, activations, job.resources.accelerator_bytes
        )
        if best is None or estimate.total > best.total:
            best = estimate
    assert best is not None
    return best

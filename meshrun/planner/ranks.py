"""Global rank order and the pods that hold each rank.

Order: TP innermost, then DP, PP outermost, ``rank = (pp * dp_size + dp) * tp_size + tp``
(Megatron-LM and torchtitan's mesh order (pp, dp, tp)). Consecutive ranks share a pod, and the
planner only allows a TP degree that divides the processes per pod, so a TP group (a per-layer
all-reduce, the most bandwidth-hungry collective) never leaves the NVLink domain of one node.
PP outermost puts whole pipeline stages on pods whenever dp x tp is a multiple of the pod
size: stages then exchange only point-to-point activations over the slower network.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class RankCoords:
    """Where one global rank sits."""

    rank: int
    """Global rank (torchrun's RANK)."""
    pod: int
    """Pod index (torchrun's node rank)."""
    local_rank: int
    """Process index inside the pod (LOCAL_RANK)."""
    dp: int
    """Data-parallel index."""
    pp: int
    """Pipeline stage index."""
    tp: int
    """Tensor-parallel index."""


def rank_of(pp: int, dp: int, tp: int, dp_size: int, tp_size: int) -> int:
    """The global rank with these coordinates."""
    return (pp * dp_size + dp) * tp_size + tp


def coords_of(rank: int, dp_size: int, tp_size: int, num_proc_per_node: int) -> RankCoords:
    """The coordinates of a global rank (inverse of :func:`rank_of`)."""
    tp = rank % tp_size
    dp = (rank // tp_size) % dp_size
    pp = rank // (tp_size * dp_size)
    return RankCoords(rank, rank // num_proc_per_node, rank % num_proc_per_node, dp, pp, tp)


def rank_table(
    world: int, dp_size: int, tp_size: int, num_proc_per_node: int
) -> list[dict[str, int]]:
    """``Plan.to_dict()['ranks']``: one entry per rank, built in one pass (16k ranks < 10 ms)."""
    group = dp_size * tp_size
    return [
        {
            "rank": r,
            "pod": r // num_proc_per_node,
            "localRank": r % num_proc_per_node,
            "dp": (r // tp_size) % dp_size,
            "pp": r // group,
            "tp": r % tp_size,
        }
        for r in range(world)
    ]


def pod_table(name: str, num_nodes: int, num_proc_per_node: int) -> list[dict[str, object]]:
    """``Plan.to_dict()['pods']``: pod index, name ``<job>-<index>`` and its global ranks."""
    return [
        {
            "index": pod,
            "name": f"{name}-{pod}",
            "ranks": list(range(pod * num_proc_per_node, (pod + 1) * num_proc_per_node)),
        }
        for pod in range(num_nodes)
    ]


def compress_ranks(ranks: Iterable[int]) -> str:
    """Distinct ranks as ranges: ``[0, 1, 2, 3, 8]`` -> ``"0-3,8"`` (labels, status, tables)."""
    parts: list[str] = []
    ordered = sorted(set(ranks))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def tp_groups(world: int, tp_size: int) -> list[list[int]]:
    """Ranks of each tensor-parallel group (consecutive ranks)."""
    return [list(range(start, start + tp_size)) for start in range(0, world, tp_size)]


def dp_groups(world: int, dp_size: int, tp_size: int) -> list[list[int]]:
    """Ranks of each data-parallel group (same pp and tp, stride tp)."""
    stage = dp_size * tp_size
    return [
        [base + dp * tp_size + tp for dp in range(dp_size)]
        for base in range(0, world, stage)
        for tp in range(tp_size)
    ]


def pp_groups(world: int, dp_size: int, tp_size: int) -> list[list[int]]:
    """Ranks of each pipeline (same dp and tp, stride dp x tp)."""
    stage = dp_size * tp_size
    return [list(range(offset, world, stage)) for offset in range(stage)]

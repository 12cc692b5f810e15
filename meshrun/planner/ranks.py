"""The pods that hold each global rank, and the rank tables of a plan.

The rank order is :data:`meshrun.api.layout.RANK_ORDER` (pp outermost, then dp, cp, tp
innermost; the reasons are there and in docs/planner.md). Consecutive ranks share a pod, and
the planner only allows a TP degree that divides the processes per pod (or spans whole pods), so
a TP group (the most bandwidth-hungry collectives) never leaves the NVLink domain of one node,
and a CP group stays on one node whenever cp x tp fits it. PP outermost puts whole pipeline
stages on pods whenever dp x cp x tp is a multiple of the pod size: stages then exchange only
point-to-point activations over the slower network.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from meshrun.api.layout import RANK_ORDER, Degrees, coordinates_of, groups_along


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
    cp: int = 0
    """Context-parallel index (which pair of sequence chunks the rank holds)."""


def coords_of(rank: int, degrees: Degrees, num_proc_per_node: int) -> RankCoords:
    """The pod and coordinates of a global rank."""
    index = coordinates_of(rank, degrees)
    return RankCoords(
        rank,
        rank // num_proc_per_node,
        rank % num_proc_per_node,
        dp=index["dp"],
        pp=index["pp"],
        tp=index["tp"],
        cp=index["cp"],
    )


def rank_table(degrees: Degrees, num_proc_per_node: int) -> list[dict[str, int]]:
    """``Plan.to_dict()['ranks']``: one entry per rank, its index along each dimension, its pod
    and local rank, built in one pass (16k ranks in tens of ms): the coordinates in rank order
    are the product of the dimensions' ranges, outermost first."""
    coordinates = itertools.product(*(range(size) for size in degrees.sizes()))
    return [
        dict(
            zip(RANK_ORDER, c, strict=True),
            rank=r,
            pod=r // num_proc_per_node,
            localRank=r % num_proc_per_node,
        )
        for r, c in enumerate(coordinates)
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


def tp_groups(degrees: Degrees) -> list[list[int]]:
    """Ranks of each tensor-parallel group (consecutive ranks)."""
    return groups_along("tp", degrees)


def cp_groups(degrees: Degrees) -> list[list[int]]:
    """Ranks of each context-parallel group (same pp, dp and tp, stride tp): the ranks that
    split one sequence and gather each other's keys and values."""
    return groups_along("cp", degrees)


def dp_groups(degrees: Degrees) -> list[list[int]]:
    """Ranks of each data-parallel group (same pp, cp and tp, stride cp x tp)."""
    return groups_along("dp", degrees)


def shard_groups(degrees: Degrees) -> list[list[int]]:
    """Ranks holding the same parameters (same pp and tp: the dp x cp ranks), over which
    gradients are reduced and ZeRO shards."""
    return groups_along(("dp", "cp"), degrees)


def pp_groups(degrees: Degrees) -> list[list[int]]:
    """Ranks of each pipeline (same dp, cp and tp, stride dp x cp x tp)."""
    return groups_along("pp", degrees)

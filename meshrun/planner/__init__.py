"""The topology planner: a job spec in, pods, ranks, stages and a memory estimate out.

Pure Python, no I/O, shared by ``meshrun plan`` and the operator. It reads the spec through
``meshrun.specread`` and checks it with ``meshrun.rules`` (the rules every component shares).
Modules, lowest first: ``layout`` (degrees and schedule), ``memory`` (per-GPU estimate),
``auto`` (the strategy table of docs/planner.md), ``ranks`` (rank order and pods),
``explain``, ``plan`` (``plan_job``), ``elastic`` (a job planned at another data-parallel
degree), and the renderers ``text`` and ``picture``.
"""

from meshrun.layout import Layout, Stage
from meshrun.planner.memory import MemoryEstimate
from meshrun.planner.plan import Plan, plan_job
from meshrun.planner.ranks import RankCoords, rank_of

__all__ = ["Layout", "MemoryEstimate", "Plan", "RankCoords", "Stage", "plan_job", "rank_of"]

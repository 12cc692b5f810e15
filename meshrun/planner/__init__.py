"""The topology planner: a job spec in, pods, ranks, stages, memory and step-time estimates out.

Pure Python, no I/O, shared by ``meshrun plan`` and the operator. It reads the spec through
``meshrun.api.read`` and checks it with ``meshrun.rules`` (the rules every component shares).
Modules, lowest first: ``degrees`` (degrees and schedule), ``memory`` (per-GPU estimate),
``steptime`` (the predicted step), ``auto`` (the strategy table of docs/planner.md), ``search``
(every layout that fits, fastest first), ``fastest`` (``strategy: auto``), ``ranks`` (rank
order and pods), ``explain``, ``plan`` (``plan_job``) and ``elastic`` (a job planned at another
data-parallel degree). The renderers live in ``meshrun.cli``.
"""

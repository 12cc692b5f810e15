"""``plan_job``: a job spec in, a complete layout (pods, ranks, stages, memory) out. Pure."""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from meshrun.api.layout import Layout, Stage
from meshrun.api.presets import ModelShape
from meshrun.api.read import read_spec, view_of, write_section
from meshrun.api.spec import CPU, JobSpec
from meshrun.planner.auto import Candidate, Choice, context_reason, fit_degrees, search_hybrid
from meshrun.planner.degrees import explicit_degrees
from meshrun.planner.explain import describe, warn
from meshrun.planner.fastest import choose_fastest
from meshrun.planner.memory import MemoryEstimate
from meshrun.planner.moe import describe_experts
from meshrun.planner.ranks import RankCoords, coords_of
from meshrun.planner.report import PlanReport, PlanStatus
from meshrun.planner.steptime import StepEstimate
from meshrun.rules.elastic import check_elastic
from meshrun.rules.names import check_job_name
from meshrun.rules.strategy import check_spec


@dataclass(frozen=True)
class Plan:
    """Where every process of a job goes and what it holds."""

    name: str
    """Job name; pods are ``<name>-<index>``."""
    strategy: str
    """The strategy type (auto resolved to the chosen one)."""
    num_nodes: int
    """Pods."""
    num_proc_per_node: int
    """Processes per pod."""
    accelerator: str
    """nvidia.com/gpu or cpu."""
    layout: Layout
    """Degrees, schedule and the batch split: ``layout.micro_batch_size`` is the one that runs
    (the spec's, or auto's choice when unset)."""
    stages: list[Stage]
    """Layer ranges per pipeline chunk, in model order."""
    memory: MemoryEstimate
    """Estimated bytes per accelerator."""
    activation_checkpointing: str
    """none, selective or full: what the memory estimate assumes and the trainer runs."""
    model: ModelShape
    """The model shape."""
    preset: str | None
    """The preset it came from, if any."""
    explanation: str
    """Why this layout, in sentences."""
    warnings: list[str]
    """Allowed but questionable choices."""
    estimate: StepEstimate | None = None
    """The predicted optimizer step (docs/planner.md, "The step-time model")."""

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.num_proc_per_node

    @property
    def gpus(self) -> int:
        return 0 if self.accelerator == CPU else self.world_size

    @property
    def stage_layers(self) -> tuple[tuple[int, int], ...]:
        """Inclusive layer range of each pipeline stage in stage order (virtual x pp + pp rank),
        the order the trainer numbers its stages in."""
        pp = self.layout.pp
        stages = sorted(self.stages, key=lambda stage: stage.virtual * pp + stage.pp)
        return tuple((stage.first, stage.last) for stage in stages)

    def coords(self, rank: int) -> RankCoords:
        """Pod, local rank and (dp, cp, pp, tp) of a global rank."""
        return coords_of(rank, self.layout.degrees, self.num_proc_per_node)

    def to_dict(self) -> dict[str, Any]:
        """The JSON of ``meshrun plan -o json`` (docs/planner.md describes each key)."""
        written: dict[str, Any] = write_section(view_of(PlanReport, self), nulls=True)
        return written

    def status_summary(self) -> dict[str, Any]:
        """``status.plan`` of the CRD: the summary the operator writes (a copy of its own)."""
        return copy.deepcopy(self._summary)

    @functools.cached_property
    def _summary(self) -> dict[str, Any]:
        # Written once per plan: the operator writes it at every status write of a job, and
        # a plan does not change (a tenth of the event loop's time in a launch of 200 jobs).
        written: dict[str, Any] = write_section(view_of(PlanStatus, self), nulls=True)
        return written

    def predicted_tokens_per_second(self) -> float | None:
        """The whole job's predicted tokens/s (what ``status.progress.tokensPerSecond``
        measures)."""
        est = self.estimate
        if est is None:
            return None
        return round(est.tokens_per_second_per_gpu * self.world_size, 1)


def plan_job(raw_spec: Mapping[str, Any] | JobSpec, name: str = "job") -> Plan:
    """Plan a ParallelTrainingJob spec (a mapping, or one already read by ``read_spec``).

    Every rule of :mod:`meshrun.rules` is checked here, at plan time; SpecError names the field
    when the job cannot be done.
    """
    spec = read_spec(raw_spec)
    check_job_name(name, spec.resources.num_nodes)
    check_spec(spec)
    choice = _choose(spec)
    # Under auto the micro-batch size is the plan's, so the elastic degrees are checked with it.
    check_elastic(spec, choice.layout)
    reasons = [*choice.reasons, *describe(spec, choice.strategy, choice.layout)]
    reasons += describe_experts(spec, choice.layout, choice.estimate)
    if spec.strategy.type != "auto":  # auto says why it chose its cp (meshrun.planner.fastest)
        reasons += context_reason(spec, choice)
    return Plan(
        name=name,
        strategy=choice.strategy,
        num_nodes=spec.resources.num_nodes,
        num_proc_per_node=spec.resources.num_proc_per_node,
        accelerator=spec.resources.accelerator,
        layout=choice.layout,
        stages=choice.stages,
        memory=choice.memory,
        activation_checkpointing=choice.checkpointing,
        model=spec.shape,
        preset=spec.model.preset,
        explanation=" ".join(reasons),
        warnings=warn(spec, choice.layout, choice.memory),
        estimate=choice.estimate,
    )


def _choose(spec: JobSpec) -> Choice:
    s = spec.strategy
    if s.type == "auto":
        return choose_fastest(spec)
    unset = [s.data_parallel, s.pipeline_parallel, s.tensor_parallel].count(None)
    if s.type == "hybrid" and unset >= 2:
        return search_hybrid(spec)
    choice = fit_degrees(spec, Candidate(explicit_degrees(spec), s.zero_stage or 0), s.type)
    choice.reasons.append(f"Strategy {s.type} as requested: {choice.layout.text()}.")
    return choice

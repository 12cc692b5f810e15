"""``spec.runPolicy.podFailurePolicy``: which pod failures fail the job, restart it, or restart it
without counting, like the Job controller's podFailurePolicy.

The rules are tried in order and the first that matches decides; a failure no rule matches is
classified by the operator's built-in table (docs/operator.md). The two rules the API server can
check alone are CEL rules of the CRD too (their messages word for word) and part of
:data:`meshrun.rules.strategy.ALL_RULES`; :func:`meshrun.rules.strategy.check_spec` runs
:func:`check_policy`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from meshrun.api.errors import Rule

FailureAction = Literal["FailJob", "RestartJob", "Ignore"]
ExitCodeOperator = Literal["In", "NotIn"]
ConditionStatus = Literal["True", "False", "Unknown"]


@dataclass(frozen=True, kw_only=True)
class OnExitCodes:
    """``rules[].onExitCodes``: the exit codes of terminated containers that match."""

    container_name: str | None
    """Only this container's exit code counts; None: any container's."""
    operator: ExitCodeOperator
    """In: a code is one of ``values``; NotIn: a code is none of them."""
    values: list[int]
    """Exit codes (a container that exited 0 never matches)."""


@dataclass(frozen=True, kw_only=True)
class OnPodCondition:
    """``rules[].onPodConditions[]``: a pod condition that matches (``DisruptionTarget``, ...)."""

    type: str
    """The condition type."""
    status: ConditionStatus
    """The condition's status."""


@dataclass(frozen=True, kw_only=True)
class FailurePolicyRule:
    """``rules[]``: one pattern (exactly one ``on*`` field) and what a match does."""

    action: FailureAction
    """FailJob: fail at once; RestartJob: restart the gang, counted against backoffLimit;
    Ignore: restart the gang without counting it."""
    on_exit_codes: OnExitCodes | None
    """Match by exit code."""
    on_pod_conditions: list[OnPodCondition] | None
    """Match when the pod has one of these conditions."""
    on_reasons: list[str] | None
    """Match by reason: the built-in table's (OOMKilled, NodeLost, ...), the pod's status.reason
    or a container's waiting or terminated reason (ErrImagePull, ...)."""


@dataclass(frozen=True, kw_only=True)
class PodFailurePolicy:
    """``spec.runPolicy.podFailurePolicy``."""

    rules: list[FailurePolicyRule]
    """Tried in order; the first match decides."""


POLICY_FIELD = "spec.runPolicy.podFailurePolicy"
"""Where the failure policy sits in a spec; its rules name fields under it."""
ONE_PATTERN = Rule(
    f"{POLICY_FIELD}.rules",
    f"{POLICY_FIELD}.rules needs exactly one of onExitCodes, onPodConditions and onReasons in"
    " each rule",
)
NO_ZERO_IN = Rule(
    f"{POLICY_FIELD}.rules.onExitCodes",
    f"{POLICY_FIELD}.rules.onExitCodes with operator In must not list 0 (exit code 0 is success)",
)
POLICY_RULES = (ONE_PATTERN, NO_ZERO_IN)
"""The rules of this module, all CEL rules of the CRD too."""


def check_policy(policy: PodFailurePolicy | None) -> None:
    """Raise SpecError naming the rule a podFailurePolicy breaks."""
    for index, rule in enumerate(policy.rules if policy else []):
        patterns = (rule.on_exit_codes, rule.on_pod_conditions, rule.on_reasons)
        if sum(pattern is not None for pattern in patterns) != 1:
            raise ONE_PATTERN.error(f"rule {index}")
        codes = rule.on_exit_codes
        if codes is not None and codes.operator == "In" and 0 in codes.values:
            raise NO_ZERO_IN.error(f"rule {index}")

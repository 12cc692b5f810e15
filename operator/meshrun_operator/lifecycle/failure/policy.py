"""spec.runPolicy.podFailurePolicy applied to a classified failure (the Job API's
podFailurePolicy, for a gang).

The built-in table (classes.py) classifies first; the first rule of the policy that matches the
failure and its pod then decides the class: FailJob fails the job, RestartJob restarts the gang
(counted against backoffLimit), Ignore restarts it without counting. A failure no rule matches
keeps the table's class.
"""

from __future__ import annotations

from dataclasses import replace

from meshrun.api.policyspec import FailureAction, FailurePolicyRule, PodFailurePolicy
from meshrun_operator.lifecycle.failure.classes import Failure, FailureClass
from meshrun_operator.seen.views import PodView

ACTIONS: dict[FailureAction, FailureClass] = {
    "FailJob": FailureClass.PERMANENT,
    "RestartJob": FailureClass.RETRYABLE,
    "Ignore": FailureClass.IGNORED,
}


def judge(failure: Failure, pod: PodView | None, policy: PodFailurePolicy | None) -> Failure:
    """``failure`` with the class the first matching rule gives it, the rule named."""
    for index, rule in enumerate(policy.rules if policy else []):
        if matches(rule, failure, pod):
            note = f"podFailurePolicy rule {index}: {rule.action}"
            return replace(
                failure, kind=ACTIONS[rule.action], message=f"{failure.message} ({note})"
            )
    return failure


def matches(rule: FailurePolicyRule, failure: Failure, pod: PodView | None) -> bool:
    """Whether ``rule``'s one pattern matches the failure and its pod (None: no pod, e.g. a hang:
    only onReasons can match)."""
    if rule.on_reasons is not None:
        return not reasons(failure, pod).isdisjoint(rule.on_reasons)
    if pod is None:
        return False
    if rule.on_pod_conditions is not None:
        return any((c.type, c.status) in pod.conditions for c in rule.on_pod_conditions)
    codes = rule.on_exit_codes
    if codes is None:
        return False
    for container, code in pod.exit_codes:
        if code == 0 or codes.container_name not in (None, container):
            continue  # a container that exited 0 never matches (as in the Job API)
        if (code in codes.values) == (codes.operator == "In"):
            return True
    return False


def reasons(failure: Failure, pod: PodView | None) -> set[str]:
    """Every reason a rule's onReasons may name: the failure's, the pod's status.reason, and the
    trainer's terminated or a container's waiting reason."""
    found = {failure.reason}
    if pod is not None:
        waiting = pod.waiting[0] if pod.waiting else None
        found.update(r for r in (pod.pod_reason, pod.container_reason, waiting) if r)
    return found

"""Why the gang is not placed yet, both pure: a GPU product no node carries, and the scheduler's
own words on the first pod it cannot place."""

from __future__ import annotations

from collections.abc import Collection

from meshrun.api.hardware import PRODUCT_LABEL
from meshrun.api.spec import JobSpec
from meshrun_operator.jobstatus import Reason
from meshrun_operator.seen.views import PodView

WHY_MAX = 500
"""The longest scheduler or kubelet message copied into the job's status."""


def scheduler_says(unbound: list[PodView]) -> tuple[str, str] | None:
    """(pod, "reason: message") of the first unbound pod the scheduler said something about."""
    for pod in sorted(unbound, key=lambda p: p.index):
        if pod.unschedulable:
            return pod.name, pod.unschedulable[:WHY_MAX]
    return None


def missing_product(spec: JobSpec, products: Collection[str] | None) -> str | None:
    """The NoNodeWithProduct message when the job names a GPU product no node carries, else
    None (also when the operator does not see the nodes' labels)."""
    wanted = spec.resources.accelerator_product
    if wanted is None or products is None or wanted in products:
        return None
    present = ", ".join(sorted(products)[:8]) or "none"
    return Reason.NO_NODE_WITH_PRODUCT.message(label=PRODUCT_LABEL, product=wanted, present=present)

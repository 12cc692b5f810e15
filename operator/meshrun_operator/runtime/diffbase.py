"""kopf's diff base, never built: the operator has no change handler to diff for.

At every watch event, kopf builds the object's "essence" (a deep copy of its whole body, status
included, then cut down) and diffs it with the last one stored, for its change handlers
(``on.create``, ``on.update``, ``on.resume``) and daemons. The operator registers only event and
index handlers, so the diff is never read; yet for a launch of a hundred pods, and for every
node heartbeat of the cluster, the copies were the largest share of the event loop's time. Here
no essence is built and none is read.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import kopf


class NoDiffBase(kopf.AnnotationsDiffBaseStorage):
    """kopf's annotation diff base (same key, should a change handler ever be added and this
    storage be dropped), with nothing built or fetched."""

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None
    ) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

"""Watch-gap audits, pure parts: which versions count as seen before a list, and the pod view
without the pods an audit found gone."""

from __future__ import annotations

import asyncio

import pytest
from meshrun_operator.seen import relist
from meshrun_operator.seen.relist import LiveIndex, older
from meshrun_operator.seen.views import PodView

from meshrun.api.crd import PLURAL

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("seen", "listed", "result"),
    [
        ("41", "42", True),
        ("42", "42", True),
        ("43", "42", False),
        ("x", "42", False),
        (None, "42", False),
        ("41", "", False),
    ],
)
def test_only_what_was_last_seen_before_the_list_can_be_gone(
    seen: str | None, listed: str, result: bool
) -> None:
    # Seen after the list's version: created after it, so its absence from the list says nothing.
    assert older(seen, listed) is result


def test_the_reconciler_no_longer_sees_pods_found_gone() -> None:
    live = PodView(name="job-0", index=0, attempt=0, phase="Running", uid="a")
    ghost = PodView(name="job-1", index=1, attempt=0, phase="Running", uid="b")
    index = {("ns", "job"): [live, ghost]}
    ghosts: set[str] = set()
    view = LiveIndex(index, ghosts)
    assert view.get(("ns", "job"), ()) == (live, ghost)
    ghosts.add("b")
    assert view.get(("ns", "job"), ()) == (live,)
    assert view.get(("ns", "other"), ()) == ()


def test_the_ghost_set_keeps_only_what_the_index_still_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    listings = {PLURAL: ("100", set()), "pods": ("100", {"live"})}

    async def list_uids(kube: object, what: str, namespaces: object) -> tuple[str, set[str]]:
        return listings[what]

    monkeypatch.setattr(relist, "list_uids", list_uids)
    versions = {"live": [("10", "ns")], "gone": [("11", "ns")]}
    auditor = relist.Auditor(None, {}, lambda uid: None, versions, ())  # type: ignore[arg-type]
    shared = auditor.ghosts  # the set the reconciler's LiveIndex reads
    asyncio.run(auditor.audit())
    assert shared == {"gone"}
    # The index let the ghost go (and held another, since gone): the set follows it, in place.
    del versions["gone"]
    versions["later"] = [("12", "ns")]
    asyncio.run(auditor.audit())
    assert auditor.ghosts is shared and shared == {"later"}

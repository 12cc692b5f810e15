"""Pure helpers of the reconciler: choosing the newest copy of a job, plain conversion."""

from __future__ import annotations

from types import MappingProxyType

import pytest
from meshrun_operator.plaindata import newest, plain

pytestmark = pytest.mark.unit


def copy_at(version: str, phase: str) -> dict[str, object]:
    return {"metadata": {"resourceVersion": version}, "status": {"phase": phase}}


def test_our_newer_write_wins_over_a_stale_body() -> None:
    body, ours = copy_at("100", "Pending"), copy_at("105", "Running")
    assert newest(body, ours) is ours


def test_a_newer_body_wins_over_our_older_write() -> None:
    body, ours = copy_at("110", "Running"), copy_at("105", "Pending")
    assert newest(body, ours) is body
    assert newest(body, None) is body


def test_opaque_versions_fall_back_to_the_body() -> None:
    body, ours = copy_at("abc", "Pending"), copy_at("105", "Running")
    assert newest(body, ours) is body


def test_plain_turns_mapping_views_into_dicts() -> None:
    view = MappingProxyType({"a": MappingProxyType({"b": (1, 2)})})
    assert plain(view) == {"a": {"b": [1, 2]}}

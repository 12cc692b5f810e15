"""Kubernetes objects as plain data: copies of kopf bodies, the newer of two copies, and merge
patches."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def plain(value: Any) -> Any:
    """A deep copy of a kopf body (mapping views) as plain dicts and lists."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def kept(body: Mapping[str, Any]) -> dict[str, Any]:
    """A plain copy of an object as the operator keeps it: without ``metadata.managedFields``
    (the API server's record of who set which field, often the largest part of an object),
    which no decision reads."""
    copy = {str(k): plain(v) for k, v in body.items() if k != "metadata"}
    meta = body.get("metadata") or {}
    copy["metadata"] = {str(k): plain(v) for k, v in meta.items() if k != "managedFields"}
    return copy


def without_none(value: Any) -> Any:
    """``value`` without the None entries of its dicts (as the API server stores a merge patch)."""
    if isinstance(value, dict):
        return {k: without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_none(v) for v in value]
    return value


def newest(body: dict[str, Any], cached: dict[str, Any] | None) -> dict[str, Any]:
    """The more recent of two copies of a job, by resourceVersion.

    resourceVersion is formally opaque, but every API server backed by etcd uses the etcd
    revision, an increasing integer; when either is not an integer the watched body wins.
    """
    if cached is None:
        return body
    try:
        newer = int(cached["metadata"]["resourceVersion"]) > int(
            body["metadata"]["resourceVersion"]
        )
    except (KeyError, TypeError, ValueError):
        return body
    return cached if newer else body


def with_unwritten(
    body: dict[str, Any], unwritten: tuple[dict[str, Any], dict[str, Any]] | None
) -> dict[str, Any]:
    """``body`` with the status a lost write meant to set, if its status is still the one that
    decision started from (only metadata or spec changed meanwhile)."""
    if unwritten is None:
        return body
    based_on, meant = unwritten
    if without_none(body.get("status") or {}) != without_none(based_on):
        return body
    return {**body, "status": without_none(meant)}


def merged(target: Any, patch: Any) -> Any:
    """``target`` after a JSON merge patch (RFC 7386, as the API server applies one): dicts
    merge key by key, None removes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merged(result.get(key), value)
    return result


def replacing(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The merge patch that turns ``old`` into exactly ``new``: ``new`` with None for every
    key of ``old`` it lacks, at every depth (a merge patch alone would keep them)."""
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            patch[key] = replacing(before, value)
        else:
            patch[key] = value
    return patch

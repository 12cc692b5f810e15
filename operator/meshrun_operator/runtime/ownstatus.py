"""The operator's own record of each job's status: a status it did not write is not acted on.

A status is only as true as its writer. Whoever may patch ``paralleltrainingjobs/status`` can
write ``phase: Succeeded, restarts: 99`` into a running job; deciding on that, the operator would
apply the finished job's clean-up and delete the running gang. So the operator keeps, per job,
the status it last wrote (the API server's answer to its patch) or first found, with the
resourceVersion it stood at. A job that comes back at a newer resourceVersion with another
status carries a status someone else wrote: the operator decides on its own record, writes it
back in full (a merge patch that also removes what was added), and says so once in a Warning
Event (StatusRestored). A status write that got no answer may have been applied: its result is
taken as the operator's own too.

The record lives in memory. After the operator starts, or takes the lead over, the status it
first finds is its record: what was written while no operator acted cannot be told apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from meshrun_operator.plaindata import merged, without_none

SCALARS = (str, int, float, bool)
"""Values an Event shows as they are (other fields are named only)."""
SHOWN = 60
"""The longest value an Event shows."""


@dataclass
class Record:
    """What the operator knows of one job's status."""

    version: str
    """The job's resourceVersion where the record was made or last confirmed."""
    status: dict[str, Any]
    """The status as the operator wrote or first found it (without None values)."""
    sent: dict[str, Any] | None = None
    """The status a write that got no answer would have left: taken as the operator's own."""
    told: str | None = None
    """The resourceVersion of the last foreign status an Event was posted about."""


@dataclass(frozen=True)
class Foreign:
    """A status someone else wrote, and the operator's own."""

    found: dict[str, Any]
    """The status the job carries."""
    own: dict[str, Any]
    """The status the operator wrote or first found."""
    new: bool
    """Not told in an Event yet."""

    def changes(self) -> str:
        """What differs, field by field (``phase Succeeded, not Running``)."""
        said = []
        for key in sorted(set(self.found) | set(self.own)):
            found, own = self.found.get(key), self.own.get(key)
            if found == own:
                continue
            if key not in self.found:
                said.append(f"{key} removed")
            elif not isinstance(found, SCALARS):
                said.append(f"{key} changed" if key in self.own else f"{key} added")
            elif key not in self.own:
                said.append(f"{key} {str(found)[:SHOWN]} added")
            else:
                said.append(f"{key} {str(found)[:SHOWN]}, not {str(own)[:SHOWN]}")
        return "; ".join(said)


def _newer(version: str, than: str) -> bool:
    """Whether resourceVersion ``version`` is after ``than`` (etcd revisions; two versions that
    are not integers are only told apart)."""
    try:
        return int(version) > int(than)
    except ValueError:
        return version != than


class StatusLedger:
    """The operator's record of every job's status, by uid."""

    def __init__(self) -> None:
        self.records: dict[str, Record] = {}

    def check(self, uid: str, job: Mapping[str, Any]) -> Foreign | None:
        """A Foreign when ``job`` (the newest copy the operator holds) carries a status someone
        else wrote; None when it is the operator's own (or older news), which it then records
        as confirmed at ``job``'s version."""
        status = without_none(job.get("status") or {})
        version = str((job.get("metadata") or {}).get("resourceVersion") or "")
        record = self.records.get(uid)
        if record is None:
            self.records[uid] = Record(version, status)
            return None
        if status in (record.status, record.sent):
            if _newer(version, record.version):
                self.records[uid] = Record(version, status, told=record.told)
            return None
        if not _newer(version, record.version):
            return None  # a copy older than the operator's own last write
        new, record.told = record.told != version, version
        return Foreign(status, record.status, new)

    def sending(self, uid: str, patch: Mapping[str, Any]) -> None:
        """A status patch is about to be sent: should its answer be lost, the status it leaves
        is the operator's own."""
        record = self.records.get(uid)
        if record is not None:
            record.sent = without_none(merged(record.status, dict(patch)))

    def wrote(self, uid: str, job: Mapping[str, Any]) -> None:
        """The API server's answer to the operator's status patch: the job as it holds it."""
        version = str((job.get("metadata") or {}).get("resourceVersion") or "")
        told = self.records[uid].told if uid in self.records else None
        self.records[uid] = Record(version, without_none(job.get("status") or {}), told=told)

    def forget(self, uid: str) -> None:
        self.records.pop(uid, None)

    def clear(self) -> None:
        """Forget every record (the lead changed hands: the other operator wrote meanwhile)."""
        self.records.clear()

"""Times as Kubernetes writes them: RFC 3339 in UTC, second precision."""

from __future__ import annotations

from datetime import UTC, datetime

from meshrun.api import read


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC with a ``Z``, second precision, as the API server writes times (and
    :func:`meshrun.api.read.write_section` writes every time of the status)."""
    return read.format_time(moment)


def parse_time(text: object) -> datetime | None:
    """Parse an RFC 3339 timestamp written by format_time or the API server; None if absent."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None

"""A bench's own section of docs/benchmarks.md, written with --write-docs and replaced when the
bench runs again; everything else in the file is kept."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def write_section(key: str, lines: list[str], missing: str = "") -> Path:
    """Put ``lines`` between the ``key`` markers (appended when absent); ``missing``: the text
    to start from when docs/benchmarks.md does not exist."""
    begin, end = f"<!-- {key}: begin -->", f"<!-- {key}: end -->"
    section = "\n".join([begin, *lines, end])
    text = DOCS.read_text() if DOCS.exists() else missing
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text)
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    DOCS.write_text(text)
    return DOCS

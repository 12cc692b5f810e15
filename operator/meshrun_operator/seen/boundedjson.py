"""JSON a trainer wrote, read within bounds: its ``/progress`` answer, the progress annotation on
its pod, and its container's termination message.

A trainer is not trusted to write well. Python's decoder recurses once per level of nesting and
raises RecursionError at about 1,000 levels, which no ``except ValueError`` catches: a report
nested 5,000 levels would end the reconcile of its job before any decision, or make the pod's
view raise inside kopf's index. So the depth is measured first, by one linear scan that cannot
recurse, and only text within ``MAX_CHARS`` and ``MAX_DEPTH`` is decoded at all.
"""

from __future__ import annotations

import json
from typing import Any

MAX_CHARS = 64 * 1024
"""The longest text read: a report or summary is a few hundred bytes (a termination message
at most 4096)."""
MAX_DEPTH = 16
"""The deepest nesting of objects and arrays read: the deepest a trainer writes is 3 (the
summary's ``eval`` list of objects)."""


class Unreadable(ValueError):
    """Text that is not a JSON object within the bounds; the message says which bound or rule."""


def nested_deeper_than(text: str, limit: int) -> bool:
    """Whether objects and arrays in ``text`` nest more than ``limit`` levels deep: one pass
    over the characters, stopping at the first level past the limit.

    Brackets inside a string do not count, as they do not for the decoder; past a string that
    never ends nothing counts, and the decoder stops there too. So the decoder never goes
    deeper than this counts.
    """
    depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char == "[" or char == "{":
            depth += 1
            if depth > limit:
                return True
        elif char == "]" or char == "}":
            depth = max(depth - 1, 0)  # a stray closer ends the decoder; never a credit here
    return False


def read_object(
    text: str | bytes, max_chars: int = MAX_CHARS, max_depth: int = MAX_DEPTH
) -> dict[str, Any]:
    """The JSON object in ``text`` (bytes are read as UTF-8, a bad byte replaced).

    Raises Unreadable when the text is longer than ``max_chars``, nests deeper than
    ``max_depth``, is not JSON, or holds anything but an object.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if len(text) > max_chars:
        raise Unreadable(f"longer than {max_chars} characters ({len(text)})")
    if nested_deeper_than(text, max_depth):
        raise Unreadable(f"nested deeper than {max_depth} levels")
    try:
        data = json.loads(text)
    except ValueError as error:  # the decoder's own errors, and integers of over 4,300 digits
        raise Unreadable(f"not JSON: {error}") from None
    if not isinstance(data, dict):
        raise Unreadable(f"not an object but {type(data).__name__}")
    return data

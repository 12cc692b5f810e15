"""The one way into the operator's process: ``meshrun operator`` and ``python -m meshrun_operator``.

The operator talks to the API server itself (client/rest.py). kopf imports the kubernetes client
whenever it is installed (a development environment has it; the operator image does not), only
to recognise the client's model objects, which the operator never hands it: a fifth of the
operator's memory for nothing. Importing it is refused here, before kopf is imported, on both
paths into the process (tests that import ``meshrun_operator.main`` keep their client).
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Refuse the kubernetes client, then run the operator (``meshrun_operator.main.main``)."""
    sys.modules.setdefault("kubernetes", None)  # type: ignore[arg-type]
    from meshrun_operator.main import main as run_operator

    return run_operator(argv)

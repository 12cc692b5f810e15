"""The ``meshrun`` CLI called in-process through its own ``main`` (what the script runs): the
exit code, argparse's own exits included, and what it wrote."""

from __future__ import annotations

import pytest

from meshrun.cli.main import main


def meshrun(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of ``meshrun ARGV...``."""
    try:
        code = main(list(argv))
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err

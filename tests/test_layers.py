"""The layers keep their arrows: the import-linter contracts of pyproject.toml hold.

Each package shows its layers (docs/development.md); ``lint-imports`` checks every import,
functions' own included, against the contracts, and ``make verify`` runs it too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]


def test_every_import_contract_is_kept() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    path = os.pathsep.join(str(ROOT / p) for p in (".", "operator", "trainer"))
    result = subprocess.run(
        [str(lint_imports), "--no-cache"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 broken" in result.stdout

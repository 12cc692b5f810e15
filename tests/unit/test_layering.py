"""The layers stay apart and the modules stay small.

The core (``meshrun``: API, spec, rules, planner, CLI) imports neither the operator nor the
trainer; the operator and the trainer never import each other (both may import the core). The
``meshrun run`` and ``meshrun operator`` subcommands reach their packages by name at run time
(meshrun/cli/main.py), which is not an import of the core. A module past MAX_LINES usually holds two
ideas: split it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 300
PACKAGES = {
    "meshrun": ROOT / "meshrun",
    "meshrun_operator": ROOT / "operator" / "meshrun_operator",
    "meshrun_trainer": ROOT / "trainer" / "meshrun_trainer",
}
FORBIDDEN = {
    "meshrun": {"meshrun_operator", "meshrun_trainer"},
    "meshrun_operator": {"meshrun_trainer"},
    "meshrun_trainer": {"meshrun_operator"},
}
MODULES = sorted((name, path) for name, root in PACKAGES.items() for path in root.rglob("*.py"))


def imported_packages(path: Path) -> set[str]:
    """Top-level packages a module imports anywhere in its body (functions included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize(
    ("package", "path"), MODULES, ids=[str(p.relative_to(ROOT)) for _, p in MODULES]
)
def test_a_layer_imports_only_what_lies_below_it(package: str, path: Path) -> None:
    wrong = imported_packages(path) & FORBIDDEN[package]
    assert not wrong, f"{path.relative_to(ROOT)} ({package}) imports {sorted(wrong)}"


@pytest.mark.parametrize(
    ("package", "path"), MODULES, ids=[str(p.relative_to(ROOT)) for _, p in MODULES]
)
def test_modules_stay_small(package: str, path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines (at most {MAX_LINES})"


def test_the_checks_see_a_forbidden_import(tmp_path: Path) -> None:
    module = tmp_path / "late.py"
    module.write_text("def run() -> None:\n    from meshrun_trainer.config import from_env\n")
    assert imported_packages(module) & FORBIDDEN["meshrun"] == {"meshrun_trainer"}
    assert len(MODULES) > 40, "the package folders were not found"

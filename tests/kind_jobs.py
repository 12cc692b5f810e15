"""hack/e2e_kind_jobs.py as a module: the examples shrunk to CPU, as `make e2e-kind` runs them
(a script, not a package, so it is loaded from its path)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def shrinker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("e2e_kind_jobs", ROOT / "hack/e2e_kind_jobs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

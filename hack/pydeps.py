#!/usr/bin/env python3
"""Print the requirements of pyproject.toml (the core plus the named extras), one per line.

The Dockerfile installs them in a layer of their own before it copies the source, so a code
change rebuilds in seconds instead of reinstalling torch. Standard library only.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path


def requirements(pyproject: Path, extras: list[str]) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    found = list(project.get("dependencies", []))
    optional = project.get("optional-dependencies", {})
    for extra in extras:
        if extra not in optional:
            raise SystemExit(f"pydeps: no extra {extra!r} in {pyproject}")
        found += optional[extra]
    return found


if __name__ == "__main__":
    print("\n".join(requirements(Path("pyproject.toml"), sys.argv[1:])))

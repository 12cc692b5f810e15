"""Names shared by the real-node tests (a module of its own: several test folders have a
conftest.py, so importing constants from "conftest" would be ambiguous)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REAL_NODE_LABEL = "meshrun.dev/real-node"
# The imported Debian image (hack/realnode/images.sh): python3 and busybox, never pulled.
BASE_IMAGE = "meshrun.local/debian:bookworm"

Kubectl = Callable[..., subprocess.CompletedProcess[str]]

"""The Hugging Face tests launch torchrun like the trainer tests: share their launch helpers."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "trainer"))

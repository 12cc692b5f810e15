"""Small job-spec factories shared by the planner's unit tests."""

from __future__ import annotations

import copy
from typing import Any


def make_cpu_spec(**sections: dict[str, Any]) -> dict[str, Any]:
    """A tiny 2 x 4 CPU job; keyword arguments replace keys inside each section."""
    spec: dict[str, Any] = {
        "image": "trainer:1",
        "resources": {"numNodes": 2, "numProcPerNode": 4, "accelerator": "cpu"},
        "strategy": {"type": "ddp"},
        "model": {"preset": "tiny"},
        "training": {"globalBatchSize": 8, "microBatchSize": 1},
    }
    for name, values in sections.items():
        spec[name] = {**spec.get(name, {}), **copy.deepcopy(values)}
    return spec

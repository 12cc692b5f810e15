"""The user guide shows exactly the Kueue objects the tests run against, and the local Kueue's
configuration says what the guide says."""

from __future__ import annotations

import re
from pathlib import Path

import kueue_objects as ko
import pytest
import yaml

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]


def _section(path: Path, heading: str) -> str:
    text = path.read_text()
    start = text.index(heading)
    end = text.find("\n#", start + len(heading))
    return text[start : end if end > 0 else len(text)]


def _yaml_blocks(text: str) -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)


def test_the_guides_queues_are_the_tests_objects() -> None:
    section = _section(ROOT / "docs" / "user-guide.md", "### The queues")
    (block,) = _yaml_blocks(section)
    shown = list(yaml.safe_load_all(block))
    expected = [*ko.cluster_objects(), *(ko.local_queue(team, team) for team in ko.TEAMS)]
    assert shown == expected


def test_the_guides_configuration_is_the_local_kueues() -> None:
    section = _section(ROOT / "docs" / "user-guide.md", "### Kueue's configuration")
    (block,) = _yaml_blocks(section)
    shown = yaml.safe_load(block)
    local = yaml.safe_load((ROOT / "hack" / "kueue" / "config.yaml").read_text().replace("@", ""))
    for key in ("manageJobsWithoutQueueName", "waitForPodsReady", "integrations"):
        assert shown[key] == local[key], key
    assert local["integrations"]["externalFrameworks"] == [
        "ParallelTrainingJob.v1alpha1.meshrun.dev"
    ]

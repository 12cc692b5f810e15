"""The suite's own scheduling (tests/scheduling.py), on a small suite of its shape run by a real
pytest with xdist's workers: each training tier runs on a worker of its own, one test after
another and before anything else there; each other module and the Kueue tests stay on one
worker; the run ends with the time per tier; a test without a tier stops the run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parent

CONFTEST = f"""
import os, sys
import pytest
sys.path.insert(0, {str(TESTS)!r})
from scheduling import (
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_runtest_logreport,
    pytest_runtest_logstart,
    pytest_runtest_makereport,
    pytest_terminal_summary,
    pytest_xdist_make_scheduler,
)

@pytest.fixture(scope="session")
def real_node():
    return "node"

@pytest.fixture
def record(request):
    with open(os.environ["RECORD"], "a") as out:
        out.write(os.environ.get("PYTEST_XDIST_WORKER", "main") + " " + request.node.nodeid + "\\n")
"""

INI = """[pytest]
markers =
    unit: u
    cluster: c
    trainer: t
    realnode: r
    slow: s
"""


def _module(marker: str, tests: int, fixtures: str = "record") -> str:
    body = "".join(f"def test_{i}({fixtures}):\n    pass\n\n" for i in range(tests))
    return f"import pytest\n\npytestmark = pytest.mark.{marker}\n\n{body}"


def _suite(root: Path) -> None:
    (root / "conftest.py").write_text(CONFTEST)
    (root / "pytest.ini").write_text(INI)
    files = {
        "test_pure.py": _module("unit", 3),
        "test_wait_a.py": _module("cluster", 4),
        "test_wait_b.py": _module("cluster", 4),
        "kueue/test_queue_a.py": _module("cluster", 2),
        "kueue/test_queue_b.py": _module("cluster", 2),
        "test_pods.py": _module("cluster", 3, "record, real_node"),
        "trainer/test_launch.py": _module("trainer", 4),
        # A unit test in a folder named after another tier is still a unit test.
        "trainer/test_quick.py": _module("unit", 2),
    }
    for name, text in files.items():
        (root / name).parent.mkdir(exist_ok=True)
        (root / name).write_text(text)


def _pytest(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RECORD": str(root / "record.txt")}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=240)


def test_each_training_tier_has_a_worker_and_each_module_stays_whole(tmp_path: Path) -> None:
    _suite(tmp_path)
    proc = _pytest(tmp_path, "-n", "4", "--dist", "loadgroup")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ran = [line.split(" ", 1) for line in (tmp_path / "record.txt").read_text().splitlines()]
    assert len(ran) == 24
    by_worker: dict[str, list[str]] = defaultdict(list)
    worker_of: dict[str, set[str]] = defaultdict(set)
    for worker, nodeid in ran:
        by_worker[worker].append(nodeid)
        worker_of["kueue" if "kueue/" in nodeid else nodeid.split("::")[0]].add(worker)
    assert all(len(workers) == 1 for workers in worker_of.values()), dict(worker_of)
    for module, count in (("trainer/test_launch.py", 4), ("test_pods.py", 3)):
        (worker,) = worker_of[module]
        assert {n.split("::")[0] for n in by_worker[worker][:count]} == {module}
    assert worker_of["trainer/test_launch.py"] != worker_of["test_pods.py"]
    assert len(by_worker) == 4, "the other groups spread over the other workers"
    summary = proc.stdout[proc.stdout.index("time per tier") :]
    for tier, count in (("unit", 5), ("trainer", 4), ("cluster", 12), ("realnode", 3)):
        assert f"{tier:<9} {count:>5} tests" in summary, summary


def test_a_test_without_a_tier_stops_the_run(tmp_path: Path) -> None:
    _suite(tmp_path)
    (tmp_path / "test_loose.py").write_text("def test_nothing():\n    pass\n")
    proc = _pytest(tmp_path)
    assert proc.returncode != 0
    assert "tests without a tier marker" in proc.stdout + proc.stderr
    assert "test_loose.py::test_nothing" in proc.stdout + proc.stderr


BURN = """
import subprocess, sys, time
import pytest

pytestmark = pytest.mark.{marker}

SPIN = "import time\\nend = time.process_time() + {seconds}\\nwhile time.process_time() < end: pass"


@pytest.fixture
def spun_at_teardown():
    yield
    subprocess.run([sys.executable, "-c", SPIN], check=True)


def test_spins_in_a_child():
    subprocess.run([sys.executable, "-c", SPIN], check=True)


def test_spins_itself():
    end = time.process_time() + {seconds}
    while time.process_time() < end:
        pass


def test_spins_at_teardown(spun_at_teardown):
    pass
"""


def test_the_summary_counts_each_tests_cpu_its_own_and_its_childrens(tmp_path: Path) -> None:
    """The CPU per tier and the costliest tests: a child process's CPU is charged to the test
    that waited for it, in whichever phase (here a fixture's tear-down), and a test's own CPU
    to the test, across xdist's workers."""
    _suite(tmp_path)
    (tmp_path / "test_burn.py").write_text(BURN.format(marker="cluster", seconds=0.6))
    proc = _pytest(tmp_path, "-n", "3", "--dist", "loadgroup")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tiers = proc.stdout[proc.stdout.index("time per tier") :]
    cluster = next(line for line in tiers.splitlines() if line.strip().startswith("cluster"))
    assert float(cluster.split()[-2]) >= 1.8 * 0.9, cluster
    assert "the machine's CPUs busy" in tiers
    costliest = tiers[tiers.index("the 20 tests whose own processes spent the most CPU") :]
    rows = {line.split()[-1]: line for line in costliest.splitlines()[1:] if "CPU-s" in line}
    for name, own_or_children in (
        ("test_spins_in_a_child", "its processes"),
        ("test_spins_itself", "the test's process"),
        ("test_spins_at_teardown", "its processes"),
    ):
        row = rows[f"test_burn.py::{name}"]
        spent = re.search(rf"([0-9.]+) {own_or_children}", row)
        assert spent and float(spent.group(1)) >= 0.55, row

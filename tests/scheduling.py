"""What each test needs, where it runs, and where the suite's time went.

Every test belongs to one tier, named by its marker: ``unit`` (pure), ``trainer`` (launches
trainer processes), ``cluster`` (the local control plane) and ``realnode`` (pods that really run
on the real kubelet node; added here to every test that uses the ``real_node`` fixture, on top of
its ``cluster`` marker).

Under pytest-xdist (``make test`` runs ``-n 4 --dist loadgroup``) the tests are put in groups
that one worker runs whole, handed out in this order:

1. ``train``: the trainer tier, one test after another on a single worker, and
2. ``pods``: the real-node tier, likewise on another. Each trains on the machine's CPUs, so two
   tests of one tier at once would make neither finish sooner; the two tiers side by side do
   finish sooner, since each spends much of its time starting processes, waiting for pods and
   rendezvous. They go first: they are the longest.
3. ``kueue``: the Kueue tests, which share one ClusterQueue's quota and a private node pool.
4. one group per module for every other cluster test, slow modules first: these mostly wait on
   the API server and the fake nodes, so several run side by side in their own namespaces.
5. one group per module for the unit tests.

A worker is handed a new group only when the one it holds is nearly done (xdist's LoadScope
scheduling), so the workers that take ``train`` and ``pods`` take nothing else until their ends.

xdist's own ``loadgroup`` reads a group from a suffix it writes into each test's node id, which
pytest 9.2's structured node ids no longer keep; so the workers write the groups of their
collection to a file (``GROUPS_FILE``, named by the controller in the environment it hands them)
and :class:`GroupScheduling` reads it there.
"""

from __future__ import annotations

import fcntl
import json
import os
import resource
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

TIERS = ("unit", "trainer", "cluster", "realnode")
"""The markers that say what a test needs (``slow`` comes on top of one of them)."""
MARKED_TIERS = ("unit", "cluster", "trainer")
"""The tiers a test module must mark itself; ``realnode`` follows from the fixture."""
REAL_NODE_FIXTURE = "real_node"
TRAIN_GROUP, PODS_GROUP, KUEUE_GROUP = "train", "pods", "kueue"


def tier(item: pytest.Item) -> str:
    """The tier of a test from its markers: the most demanding one it has. (Not from its
    keywords, which also hold the names of its folders: tests/trainer/ holds unit tests too.)"""
    names = {mark.name for mark in item.iter_markers()}
    return next((n for n in ("realnode", "trainer", "cluster", "unit") if n in names), "unmarked")


def mark_tiers(items: list[pytest.Item]) -> None:
    """Fail on unmarked tests (``-m unit`` and the other tiers would skip them silently) and
    mark every user of the real node ``realnode``."""
    unmarked = [i.nodeid for i in items if not any(i.get_closest_marker(t) for t in MARKED_TIERS)]
    if unmarked:
        raise pytest.UsageError(
            f"tests without a tier marker ({', '.join(MARKED_TIERS)}), add one to each: "
            + ", ".join(unmarked)
        )
    for item in items:
        if REAL_NODE_FIXTURE in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.realnode)
        # Carried by the test's reports to the xdist controller, whose clock sums them.
        item.user_properties.append(("tier", tier(item)))


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def group_of(item: pytest.Item) -> str:
    """The xdist group of a test (see the module's docstring)."""
    kind = tier(item)
    if kind == "trainer":
        return TRAIN_GROUP
    if kind == "realnode":
        return PODS_GROUP
    if kind == "cluster" and "kueue" in Path(_module(item)).parts[:-1]:
        return KUEUE_GROUP
    return _module(item)


def _rank(item: pytest.Item) -> tuple[int, int]:
    group = group_of(item)
    if group in (TRAIN_GROUP, PODS_GROUP):
        return (0, 0 if group == TRAIN_GROUP else 1)
    if group == KUEUE_GROUP:
        return (1, 0)
    if tier(item) == "cluster":
        # Slow modules first, so that no long module starts last.
        return (2, 0 if item.get_closest_marker("slow") else 1)
    return (3, 0)


GROUPS_FILE = "MESHRUN_TEST_GROUPS"
"""The variable that names the file of {node id: group} the workers write for the controller."""


def group_for_workers(items: list[pytest.Item]) -> None:
    """Order the tests as the docstring says (a stable sort: modules stay whole and in their
    order within a rank) and, in an xdist worker, write each test's group for the controller."""
    items.sort(key=_rank)
    path = os.environ.get(GROUPS_FILE)
    if path:
        partial = Path(f"{path}.{os.getpid()}")
        partial.write_text(json.dumps({item.nodeid: group_of(item) for item in items}))
        partial.replace(path)


def name_groups_file(config: pytest.Config) -> None:
    """On the xdist controller: a fresh file for the workers' groups, named in the environment
    the workers are started with."""
    if hasattr(config, "workerinput") or config.getoption("dist", "no") != "loadgroup":
        return
    os.environ[GROUPS_FILE] = str(Path(tempfile.mkdtemp(prefix="meshrun-groups-")) / "groups")


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """The xdist scheduler for ``--dist loadgroup``: LoadScope scheduling with the groups the
    workers wrote (tests of one group run on one worker, in collection order)."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                self.groups = json.loads(Path(os.environ[GROUPS_FILE]).read_text())
            return self.groups.get(nodeid, nodeid)

    config.option.loadscopereorder = False  # collection order: the longest group first
    return GroupScheduling(config, log)


def own_cpu_seconds() -> tuple[float, float]:
    """CPU seconds (user and system) of this process and of the child processes it has waited
    for, theirs with their own waited-for children: a trainer launch, an operator stopped at a
    test's end, kubectl. Pods count for the kubelet that runs them, not here."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def machine_cpu_seconds() -> float | None:
    """Busy CPU seconds of the whole machine since boot (every core; Linux's /proc/stat), or
    None where there is none."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """On a worker: the CPU each phase of a test spent (set-up, call, tear-down), the worker's
    own and its waited-for children's, written into the phase's report for the controller."""

    def __init__(self) -> None:
        self.start()

    def start(self) -> None:
        self.mark = own_cpu_seconds()

    def phase(self, report: pytest.TestReport) -> None:
        now = own_cpu_seconds()
        report.user_properties.append(("cpu", (now[0] - self.mark[0], now[1] - self.mark[1])))
        self.mark = now


@dataclass
class TierClock:
    """The seconds each tier's tests took (set-up, call and tear-down) and the CPU their own
    processes spent, summed over workers; the tests that spent the most CPU; the suite's wall
    time and the machine's busy CPU over it: printed at the end of the run."""

    started: float = field(default_factory=time.monotonic)
    machine_at_start: float | None = field(default_factory=machine_cpu_seconds)
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    tests: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    cpu: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    cpu_of_test: dict[str, list[float]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))

    def add(self, report: pytest.TestReport) -> None:
        properties = dict(report.user_properties)
        name = str(properties.get("tier", "unmarked"))
        self.seconds[name] += report.duration
        self.tests[name].add(report.nodeid)
        own, children = properties.get("cpu", (0.0, 0.0))
        self.cpu[name] += own + children
        spent = self.cpu_of_test[report.nodeid]
        spent[0] += own
        spent[1] += children

    def lines(self) -> list[str]:
        wall = time.monotonic() - self.started
        rows = [
            f"  {name:<9} {len(self.tests[name]):>5} tests {self.seconds[name]:>8.0f} s"
            f" {self.cpu[name]:>8.0f} CPU-s"
            for name in (*TIERS, "unmarked")
            if name in self.seconds
        ]
        busy, cpu = sum(self.seconds.values()), sum(self.cpu.values())
        rows.append(
            f"  {'all':<9} {sum(map(len, self.tests.values())):>5} tests {busy:>8.0f} s"
            f" {cpu:>8.0f} CPU-s"
        )
        rows.append(f"  wall time {wall:.0f} s")
        machine_now = machine_cpu_seconds()
        if self.machine_at_start is not None and machine_now is not None:
            rows.append(
                f"  the machine's CPUs busy {machine_now - self.machine_at_start:.0f} s of"
                f" {wall * (os.cpu_count() or 1):.0f} s ({os.cpu_count()} cores; the rest of"
                " the busy time is pods, the control plane and whatever else ran)"
            )
        return rows

    def costliest(self, count: int = 20) -> list[str]:
        ranked = sorted(self.cpu_of_test.items(), key=lambda kv: -sum(kv[1]))[:count]
        return [
            f"  {own + children:7.1f} CPU-s  ({own:6.1f} the test's process,"
            f" {children:6.1f} its processes)  {nodeid}"
            for nodeid, (own, children) in ranked
        ]


LOCKS = Path(__file__).resolve().parent.parent / ".cluster" / "locks"


@contextmanager
def shared_setup(name: str) -> Iterator[None]:
    """Held while one xdist worker sets up what all of them share (the cluster, the real node and
    its images, Kueue): the others wait, then find it done. A lock file under .cluster/locks,
    released by the kernel if the worker dies."""
    LOCKS.mkdir(parents=True, exist_ok=True)
    with (LOCKS / f"{name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# The hooks, imported by tests/conftest.py.


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test has a tier, and a group and a place in the order that xdist's workers follow
    (without xdist the groups change nothing)."""
    mark_tiers(items)
    group_for_workers(items)


def pytest_configure(config: pytest.Config) -> None:
    name_groups_file(config)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist") != "loadgroup":
        return None
    return make_scheduler(config, log)


CLOCK = TierClock()
METER = CpuMeter()


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    METER.start()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    METER.phase(report)
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    CLOCK.add(report)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """The time and CPU per tier, and the tests that spent the most CPU: on the controller alone
    when xdist runs the tests."""
    if hasattr(config, "workerinput") or not CLOCK.seconds:
        return
    terminalreporter.write_sep(
        "=", "time per tier (tests' own seconds and their processes' CPU, summed over workers)"
    )
    for line in CLOCK.lines():
        terminalreporter.write_line(line)
    terminalreporter.write_sep("=", "the 20 tests whose own processes spent the most CPU")
    for line in CLOCK.costliest():
        terminalreporter.write_line(line)

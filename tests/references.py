"""The local runs that real-node tests compare their pods with: ``meshrun run JOB --local``;
and other uninterrupted runs that tests compare with (``kept_run``).

A reference is trained once per distinct job and kept in a cache keyed by everything that decides
its result: the job file's bytes, every source file of the core and the trainer, the versions of
Python and torch, and the CPU (its model and flags: the kernels torch picks, and with them the
rounding). A change to any of these is a new key, so a kept summary is the one a new run would
write. The cache sits beside the tool cache (``$MESHRUN_CACHE``, default ~/.cache/meshrun);
``MESHRUN_REFERENCE_CACHE=0`` trains every reference again.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from functools import cache
from importlib.metadata import version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SOURCES = (ROOT / "meshrun", ROOT / "trainer" / "meshrun_trainer")
CACHE = Path(os.environ.get("MESHRUN_CACHE", Path.home() / ".cache" / "meshrun")) / "references"


@cache
def _code_and_machine() -> str:
    """A digest of the sources and the machine: the part of every key that one run shares."""
    digest = hashlib.sha256()
    files = (p for source in SOURCES for p in source.rglob("*") if p.is_file())
    for path in sorted(p for p in files if "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    cpu = [
        line
        for line in Path("/proc/cpuinfo").read_text().splitlines()
        if line.startswith(("model name", "flags"))
    ][:2]
    for part in (sys.version, version("torch"), platform.machine(), *cpu):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()


def _cache_on() -> bool:
    return os.environ.get("MESHRUN_REFERENCE_CACHE", "1") != "0"


def _keep(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all (tests on other workers may read it meanwhile)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial")
    partial.write_text(text)
    partial.replace(path)


def kept_run(name: str, material: object, produce: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``produce()``, a run's JSON result, computed once per ``material`` (everything the test
    decides about the run, JSON-able: the job, the test's own source) and the code and machine
    of every key; kept beside the references."""
    text = json.dumps(material, sort_keys=True) + _code_and_machine()
    path = CACHE / f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:32]}.json"
    if _cache_on() and path.is_file():
        kept: dict[str, Any] = json.loads(path.read_text())
        return kept
    result = produce()
    _keep(path, json.dumps(result))
    return result


def key(job_file: Path) -> str:
    return hashlib.sha256(job_file.read_bytes() + _code_and_machine().encode()).hexdigest()[:32]


class LocalReference:
    """``meshrun run JOB_FILE --local`` started in the background unless the cache has its
    summary; ``summary()`` returns the run's summary (waiting for the run, then keeping it)."""

    def __init__(self, job_file: Path, timeout: float = 900) -> None:
        self.job_file, self.timeout = job_file, timeout
        self.kept = CACHE / f"{key(job_file)}.json"
        self.summary_file = job_file.with_name(job_file.stem + "-summary.json")
        self.proc: subprocess.Popen[str] | None = None
        if _cache_on() and self.kept.is_file():
            return
        cmd = [sys.executable, "-m", "meshrun", "run", str(job_file), "--local", "--quiet"]
        cmd += ["--summary-json", str(self.summary_file)]
        self.proc = subprocess.Popen(
            cmd,
            cwd=job_file.parent,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def summary(self) -> dict[str, Any]:
        if self.proc is None:
            kept: dict[str, Any] = json.loads(self.kept.read_text())
            return kept
        out, _ = self.proc.communicate(timeout=self.timeout)
        assert self.proc.returncode == 0, f"meshrun run --local failed:\n{out}"
        text = self.summary_file.read_text()
        _keep(self.kept, text)
        result: dict[str, Any] = json.loads(text)
        return result

    def stop(self) -> None:
        """Kill the run if it is still going (its test ended first)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

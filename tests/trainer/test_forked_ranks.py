"""forked_ranks.py, the launcher of the trainer tier's many-layout checks: every rank gets
torchrun's environment and runs the script as __main__ after one shared import, and the first
rank to fail stops the others with its exit code."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trainer_launch import cpu_env, forked

pytestmark = pytest.mark.unit

HELPER = "import os\nIMPORTED_IN = os.getpid()\n"
"""A module the script imports: where it was imported is where its body ran."""
SCRIPT = """
import json, os, sys, time
import ranks_helper  # beside the script, as the checks import trainer_launch

if __name__ == "__main__":
    rank = int(os.environ["RANK"])
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    facts = {key: os.environ[key] for key in keys}
    facts.update(argv=sys.argv[1:], imported_in=ranks_helper.IMPORTED_IN, pid=os.getpid())
    path = os.path.join(sys.argv[1], f"rank{rank}.json")
    with open(path + ".tmp", "w") as out:
        json.dump(facts, out)
    os.replace(path + ".tmp", path)  # whole when it appears: rank 1 waits for the others' files
    if sys.argv[2] == "fail" and rank == 1:
        others = [os.path.join(sys.argv[1], f"rank{r}.json") for r in (0, 2)]
        while not all(os.path.exists(path) for path in others):
            time.sleep(0.05)  # the others have written theirs and are sleeping
        sys.exit(3)
    if sys.argv[2] == "fail":
        time.sleep(120)  # stopped by the launcher when rank 1 fails
"""


def _launch(tmp_path: Path, mode: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """The launcher's run, and the seconds from rank 1's start (its file) to the launcher's
    end: the launcher's own start (torch's imports, seconds on a loaded machine) left out."""
    script = tmp_path / "ranks_check.py"
    script.write_text(SCRIPT)
    (tmp_path / "ranks_helper.py").write_text(HELPER)
    proc = subprocess.run(
        forked(3, script, str(tmp_path), mode),
        env=cpu_env(),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    ended = time.time()
    started = tmp_path / "rank1.json"
    return proc, ended - started.stat().st_mtime if started.exists() else float("inf")


def test_each_rank_gets_torchruns_environment_after_one_import(tmp_path: Path) -> None:
    proc, _ = _launch(tmp_path, "ok")
    assert proc.returncode == 0, proc.stderr
    facts = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    assert [f["RANK"] for f in facts] == ["0", "1", "2"]
    assert [f["LOCAL_RANK"] for f in facts] == ["0", "1", "2"]
    assert {f["WORLD_SIZE"] for f in facts} == {"3"} == {f["LOCAL_WORLD_SIZE"] for f in facts}
    assert {f["MASTER_ADDR"] for f in facts} == {"127.0.0.1"}
    assert len({f["MASTER_PORT"] for f in facts}) == 1
    assert {tuple(f["argv"]) for f in facts} == {(str(tmp_path), "ok")}
    # The script's imports ran once, in the launcher; each rank is a process of its own.
    assert len({f["imported_in"] for f in facts}) == 1
    assert len({f["pid"] for f in facts} | {facts[0]["imported_in"]}) == 4


def test_the_first_rank_to_fail_stops_the_others_with_its_exit_code(tmp_path: Path) -> None:
    proc, seconds = _launch(tmp_path, "fail")
    assert proc.returncode == 3, proc.stderr
    assert "rank 1 exited with 3" in proc.stderr
    assert seconds < 30  # from rank 1's start: not the 120 s the other ranks would sleep
    for rank in (0, 2):
        pid = json.loads((tmp_path / f"rank{rank}.json").read_text())["pid"]
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid), f"rank {rank} still runs"


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def test_a_bad_command_line_is_refused() -> None:
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("forked_ranks.py")), "script.py"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "--nproc-per-node=N" in proc.stderr

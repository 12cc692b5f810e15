"""``meshrun plan``: formats, exit codes, pictures, and errors without tracebacks."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from rich.table import Table

from meshrun.api.crd import read_documents
from meshrun.api.read import read_spec
from meshrun.cli.main import EXIT_DOES_NOT_FIT, EXIT_INVALID, EXIT_OK, main
from meshrun.cli.text import render, render_candidates
from meshrun.planner.plan import plan_job
from meshrun.planner.search import best_layouts

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "demo-3d-cpu.yaml"
JOB = """\
apiVersion: meshrun.dev/v1alpha1
kind: ParallelTrainingJob
metadata:
  name: {name}
spec:
  image: trainer:1
  resources: {{numNodes: 1, numProcPerNode: 8, acceleratorMemoryGiB: {gib}}}
  strategy: {strategy}
  model: {{preset: {preset}}}
  training: {{globalBatchSize: 8}}
"""


DEMO_MEASURED = 893.0
"""Tokens/s the demo measured here (8 gloo processes on 2 cores); 512 with the machine loaded
by other work."""


def test_the_cpu_demo_is_predicted_from_the_cpu_profile(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A CPU job's prediction prices eager operations and gloo's latencies, not GPU kernels:
    the demo is predicted within 1.25x of what it measured (the GPU model's arithmetic on a
    nominal profile said 32,526), and the text says per process, with no MFU."""
    spec = read_spec(read_documents(DEMO)[0]["spec"])
    plan = plan_job(spec, "demo-3d-cpu")
    predicted = plan.predicted_tokens_per_second()
    assert predicted is not None
    assert DEMO_MEASURED / 1.25 < predicted < DEMO_MEASURED * 1.25
    assert plan.to_dict()["estimate"]["stepSeconds"] > 0
    assert plan.status_summary()["predictedTokensPerSecond"] == predicted
    assert main(["plan", str(DEMO)]) == EXIT_OK
    out = " ".join(capsys.readouterr().out.split())
    assert "tokens/s per process (CPU profile)" in out and "MFU" not in out


def write_job(
    tmp_path: Path,
    gib: int = 80,
    strategy: str = "{type: ddp}",
    preset: str = "1b",
    name: str = "job",
) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(JOB.format(name=name, gib=gib, strategy=strategy, preset=preset))
    return path


def test_json_output_has_the_issue_shape(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(DEMO), "-o", "json"]) == EXIT_OK
    data = json.loads(capsys.readouterr().out)
    for key in (
        "worldSize",
        "strategy",
        "layout",
        "model",
        "pods",
        "ranks",
        "stages",
        "memory",
        "explanation",
        "warnings",
    ):
        assert key in data, key
    assert set(data["layout"]) >= {
        "dp",
        "pp",
        "tp",
        "zeroStage",
        "pipelineSchedule",
        "microBatches",
        "gradAccumulation",
    }
    assert set(data["memory"]["perGpuBytes"]) == {
        "params",
        "grads",
        "optimizer",
        "activations",
        "gathered",
        "total",
    }
    assert data["pods"][1] == {"index": 1, "name": "demo-3d-cpu-1", "ranks": [4, 5, 6, 7]}
    assert data["ranks"][5] == {
        "rank": 5,
        "pod": 1,
        "localRank": 1,
        "dp": 0,
        "cp": 0,
        "pp": 1,
        "tp": 1,
    }
    assert data["stages"] == [
        {"pp": 0, "virtual": 0, "layers": [0, 1]},
        {"pp": 1, "virtual": 0, "layers": [2, 3]},
    ]


def test_yaml_and_text_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(DEMO), "-o", "yaml"]) == EXIT_OK
    assert yaml.safe_load(capsys.readouterr().out)["layoutString"] == "dp2 x pp2 x tp2"
    assert main(["plan", str(DEMO)]) == EXIT_OK
    text = capsys.readouterr().out
    for words in (
        "demo-3d-cpu",
        "dp2 x pp2 x tp2",
        "Pipeline stages",
        "demo-3d-cpu-1",
        "DataParallel",
    ):
        assert words in text


def test_invalid_spec_exits_2_with_the_field_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write_job(tmp_path, strategy="{type: tensor, tensorParallel: 3}")
    assert main(["plan", str(bad)]) == EXIT_INVALID
    captured = capsys.readouterr()
    assert captured.out == ""
    assert (
        "spec.strategy.tensorParallel: must divide spec.resources.numProcPerNode or be a "
        "multiple of it (a tensor-parallel group stays inside one pod or spans whole pods) (3 "
        "neither divides nor is a multiple of numProcPerNode=8)"
    ) in captured.err


def test_plan_that_does_not_fit_exits_3_and_still_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    big = write_job(tmp_path, gib=8, preset="7b")
    assert main(["plan", str(big), "-o", "json"]) == EXIT_DOES_NOT_FIT
    data = json.loads(capsys.readouterr().out)
    assert data["memory"]["fits"] is False


def test_several_jobs_worst_exit_code_and_a_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fits = write_job(tmp_path, name="a").read_text()
    too_big = write_job(tmp_path, gib=8, preset="7b", name="b").read_text()
    both = tmp_path / "both.yaml"
    both.write_text(fits + "---\n" + too_big)
    assert main(["plan", str(both), "-o", "json"]) == EXIT_DOES_NOT_FIT
    assert [plan["name"] for plan in json.loads(capsys.readouterr().out)] == ["a", "b"]


def test_svg_picture(tmp_path: Path) -> None:
    target = tmp_path / "demo.svg"
    assert main(["plan", str(DEMO), "-o", "json", "--picture", str(target)]) == EXIT_OK
    root = ET.fromstring(target.read_text())
    texts = [node.text for node in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "rank 7" in texts and "pp1 dp1" in texts and "demo-3d-cpu-1" in texts
    fills = {
        node.get("fill")
        for node in root.iter("{http://www.w3.org/2000/svg}rect")
        if node.get("rx") == "4"
    }
    assert len(fills) == 2, "two pipeline stages, two colours"
    frames = [n for n in root.iter("{http://www.w3.org/2000/svg}rect") if n.get("stroke-dasharray")]
    assert len(frames) == 4, "four TP groups of two"


def test_png_picture(tmp_path: Path) -> None:
    target = tmp_path / "demo.png"
    assert main(["plan", str(DEMO), "-o", "json", "--picture", str(target)]) == EXIT_OK
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert target.stat().st_size > 5000


def test_bad_picture_suffix_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(DEMO), "--picture", str(tmp_path / "x.gif")]) == EXIT_INVALID
    assert "--picture" in capsys.readouterr().err


def test_real_process_missing_file_no_traceback(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "meshrun", "plan", str(tmp_path / "absent.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == EXIT_INVALID
    assert "cannot be read" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (
            JOB.format(name="a", gib=80, strategy="{type: ddp}", preset="1b").encode("utf-16"),
            "is not UTF-8 text (byte 0xff at offset 0); save it as UTF-8",
        ),
        (b"", "holds no ParallelTrainingJob"),
    ],
)
def test_an_unreadable_file_is_one_line_naming_it_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, words: str
) -> None:
    """A file saved as UTF-16 (as some editors do) or an empty one: exit 2 and one line that
    names the file once, never a traceback."""
    path = tmp_path / "job.yaml"
    path.write_bytes(content)
    assert main(["plan", str(path)]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert err == f"meshrun plan: {path}: {words}\n"


def test_a_document_that_is_no_job_is_named_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_job(tmp_path)
    path.write_text(path.read_text().replace("kind: ParallelTrainingJob", "kind: PyTorchJob"))
    assert main(["plan", str(path)]) == EXIT_INVALID
    assert capsys.readouterr().err == (
        f"meshrun plan: {path}[0].kind: must be ParallelTrainingJob, got 'PyTorchJob'\n"
    )


def test_reads_stdin() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "meshrun", "plan", "-", "-o", "json"],
        input=DEMO.read_text(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == EXIT_OK, result.stderr
    assert json.loads(result.stdout)["worldSize"] == 8


def test_plan_needs_neither_torch_nor_kopf() -> None:
    probe = (
        "import sys\n"
        "from meshrun.cli.main import main\n"
        f"code = main(['plan', {str(DEMO)!r}, '-o', 'json'])\n"
        "heavy = [m for m in ('torch', 'kopf', 'kubernetes', 'matplotlib') if m in sys.modules]\n"
        "sys.exit(10 if heavy else code)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == EXIT_OK, result.stderr


def test_closed_pipe_is_not_a_traceback() -> None:
    big = DEMO.read_text().replace("numNodes: 2", "numNodes: 4096")
    big = big.replace("dataParallel: 2", "dataParallel: 4096").replace(
        "globalBatchSize: 8", "globalBatchSize: 16384"
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "meshrun", "plan", "-", "-o", "json"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(big.encode())
    process.stdin.close()
    assert process.stdout.read(100).startswith(b"{")
    process.stdout.close()  # like `| head`: the reader leaves while megabytes remain
    assert process.wait(timeout=60) == 1
    assert process.stderr is not None
    stderr = process.stderr.read()
    process.stderr.close()
    assert b"Traceback" not in stderr


@pytest.mark.parametrize(
    ("command", "flag"), [("operator", "--namespace"), ("run", "--summary-json")]
)
def test_delegated_subcommands_receive_their_own_flags(command: str, flag: str) -> None:
    # `meshrun operator --namespace x`: the flags belong to the subcommand, not to meshrun.
    result = subprocess.run(
        [sys.executable, "-m", "meshrun", command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert f"usage: meshrun {command}" in result.stdout
    assert flag in result.stdout


def test_several_jobs_one_refused_plans_the_others_in_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = write_job(tmp_path, name="a").read_text()
    bad = write_job(tmp_path, strategy="{type: tensor, tensorParallel: 3}", name="b").read_text()
    last = write_job(tmp_path, preset="small", name="c").read_text()
    three = tmp_path / "three.yaml"
    three.write_text(good + "---\n" + bad + "---\n" + last)
    assert main(["plan", str(three), "-o", "json"]) == EXIT_INVALID
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert [entry.get("name") for entry in data] == ["a", None, "c"]
    assert set(data[1]) == {"error"}
    assert data[1]["error"].startswith("spec.strategy.tensorParallel: must divide")
    assert "three.yaml[1]" in captured.err
    for entry in (data[0], data[2]):
        estimate = entry["estimate"]
        assert set(estimate) == {"stepSeconds", "tokensPerSecondPerGpu", "mfu", "breakdown"}
        total = sum(estimate["breakdown"].values())
        assert total == pytest.approx(estimate["stepSeconds"], abs=1e-5)
        tokens = 8 * 2048 / estimate["stepSeconds"] / 8  # globalBatchSize 8 of the 1b's 2,048
        if entry["name"] == "a":
            assert estimate["tokensPerSecondPerGpu"] == pytest.approx(tokens, 1e-3)


def test_text_shows_the_predicted_step_and_candidates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = write_job(tmp_path, strategy="{type: auto}", preset="7b")
    assert main(["plan", str(job), "--candidates", "3"]) == EXIT_OK
    out = " ".join(capsys.readouterr().out.split())  # the console wraps long titles
    assert "Predicted step: " in out and "tokens/s per GPU, MFU " in out
    assert "pipeline bubble" in out or "compute (matmuls, attention)" in out
    assert "Fastest layouts that fit" in out
    assert main(["plan", str(job), "--candidates", "3", "-o", "json"]) == EXIT_OK
    data = json.loads(capsys.readouterr().out)
    speeds = [c["tokensPerSecondPerGpu"] for c in data["candidates"]]
    assert len(speeds) == 3 and speeds == sorted(speeds, reverse=True)
    assert data["estimate"]["tokensPerSecondPerGpu"] == pytest.approx(speeds[0])
    assert data["layoutString"] == data["candidates"][0]["layoutString"]


def test_plan_of_an_elastic_job_names_the_degrees_it_may_run_at(
    capsys: pytest.CaptureFixture[str],
) -> None:
    elastic = ROOT / "examples" / "elastic.yaml"
    assert main(["plan", str(elastic), "-o", "json"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out)["elasticDataParallel"] == [2, 4, 8]
    assert main(["plan", str(elastic)]) == EXIT_OK
    assert "Elastic: may run at dp2 (2 pod(s)), dp4 (4 pod(s)), dp8 (8 pod(s))" in " ".join(
        capsys.readouterr().out.split()
    )
    assert main(["plan", str(DEMO), "-o", "json"]) == EXIT_OK
    assert "elasticDataParallel" not in json.loads(capsys.readouterr().out)


EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
ONE_LAYER_STAGES = """\
apiVersion: meshrun.dev/v1alpha1
kind: ParallelTrainingJob
metadata:
  name: one-layer
spec:
  image: trainer:1
  resources: {numNodes: 4, numProcPerNode: 1, accelerator: cpu}
  strategy: {type: pipeline, pipelineParallel: 4, pipelineSchedule: gpipe, microBatches: 4}
  model: {preset: tiny}
  training: {globalBatchSize: 4}
"""


def tables(renderable: object) -> Iterator[Table]:
    """The tables in a rendering, nested groups included."""
    if isinstance(renderable, Table):
        yield renderable
    for part in getattr(renderable, "renderables", ()):
        yield from tables(part)


def header_words(path: Path) -> set[str]:
    """Every word of every table header the plan of ``path``'s job has, candidates included."""
    job = read_documents(str(path))[0]
    spec = read_spec(job["spec"])
    plan = plan_job(spec, job["metadata"]["name"])
    shown = [*tables(render(plan)), *tables(render_candidates(best_layouts(spec, 3)))]
    return {
        word for table in shown for column in table.columns for word in str(column.header).split()
    }


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.stem)
def test_text_fits_the_terminal_with_whole_headers(
    example: Path, width: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", str(width))
    assert main(["plan", str(example), "--candidates", "3"]) in (EXIT_OK, EXIT_DOES_NOT_FIT)
    text = capsys.readouterr().out
    too_wide = [line for line in text.splitlines() if len(line.rstrip()) > width]
    assert too_wide == [], f"lines wider than {width} columns"
    assert "…" not in text, "a header or a cell cut short"
    words = set(text.split())
    assert header_words(example) - words == set(), "header words cut or broken"
    # Phrases stay whole: the job's degrees, its machines, the predicted speed.
    lines = text.splitlines()
    assert any(re.search(r"on \d+ pod\(s\) x \d+ (GPUs|CPU processes)", line) for line in lines)
    assert any(re.search(r"[\d,]+ tokens/s per (GPU,|process)", line) for line in lines)
    if "Elastic:" in text:
        assert any(re.search(r"the same pp\d+ x tp\d+", line) for line in lines)
    candidates = text[text.index("Fastest layouts that fit") :]
    cut = re.search(r"\b(selective|full) *$", candidates, re.MULTILINE)
    assert cut is None, "'selective recompute' broken over two lines"


def test_one_layer_stages_and_one_process_pods_are_single_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "one-layer.yaml"
    job.write_text(ONE_LAYER_STAGES)
    assert main(["plan", str(job)]) == EXIT_OK
    text = capsys.readouterr().out
    assert re.search(r"\b(\d+)-\1\b", text) is None, "a range of one number"
    stages = re.findall(r"^\s+(\d+)\s+0\s+(\d+)\s*$", text, re.MULTILINE)
    assert stages == [("0", "0"), ("1", "1"), ("2", "2"), ("3", "3")]
    pods = re.findall(r"^\s+one-layer-(\d+)\s+(\d+)\s", text, re.MULTILINE)
    assert pods == [("0", "0"), ("1", "1"), ("2", "2"), ("3", "3")]

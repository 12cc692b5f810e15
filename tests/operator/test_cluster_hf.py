"""On the real control plane: a job fine-tuning a Hugging Face folder on its own data.

The operator never opens a job's files, even where it could see them: it plans from the sizes
given beside spec.model.hf, writes the model-folder and data variables into every pod with the
podTemplate's volumes, refuses a folder without those sizes (Invalid, naming the field), and a
job naming kernel files or another's files is judged purely (the operator's memory stays where it
is and it keeps serving other jobs); the validation loss reaches status.progress while running
and from the final summary.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from meshrun_operator import names
from meshrun_trainer.local.examplefiles import write_example
from operator_harness import Cluster, OperatorProcess
from waiting import wait_for

from meshrun.files.checks import mount

SIZES = {"layers": 4, "hidden": 64, "heads": 4, "kvHeads": 2, "vocab": 384, "ffnHidden": 192}
"""The example folder's sizes (its config.json), given beside spec.model.hf."""

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hf-finetune.yaml"


def hf_job(name: str, root: Path | None, **model: Any) -> dict[str, Any]:
    """The example job on 2 pods x 4 GPUs; its paths under ``root`` (None: container paths)."""
    job: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    job["metadata"] = {"name": name}
    spec = job["spec"]
    spec["resources"] = {"numNodes": 2, "numProcPerNode": 4}
    spec["training"].pop("checkpoint")
    if root is not None:
        spec = mount(spec, [f"/{part}={root / part}" for part in ("models", "data", "out")])
    spec["model"] = {k: v for k, v in spec["model"].items() if k in ("hf", "seqLen")} | model
    for volume in spec["podTemplate"]["spec"]["volumes"]:  # KWOK pods: no claims needed
        del volume["persistentVolumeClaim"]
        volume["emptyDir"] = {}
    job["spec"] = spec
    return job


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}


def document_of(pod: dict[str, Any]) -> dict[str, Any]:
    """The job document the pod's trainer reads."""
    document: dict[str, Any] = json.loads(env_of(pod)["MESHRUN_JOB"])
    return document


def hf_path_of(pod: dict[str, Any]) -> str:
    return str(document_of(pod)["spec"]["model"]["hf"]["path"])


def invalid_message(cluster: Cluster, name: str) -> str:
    cluster.wait_phase(name, "Failed")
    invalid = cluster.condition(name, "Invalid")
    assert invalid["status"] == "True"
    assert cluster.pods(name) == []
    return str(invalid["message"])


def test_an_hf_job_is_planned_from_the_sizes_and_its_pods_get_the_files(
    cluster: Cluster, operator_process: OperatorProcess, tmp_path: Path
) -> None:
    write_example(tmp_path)
    cluster.apply(hf_job("hf", tmp_path, **SIZES))
    pods = cluster.wait_running_pods("hf", 2)
    document = document_of(pods[1])
    spec, training = document["spec"], document["spec"]["training"]
    assert spec["model"]["hf"]["path"] == str(tmp_path / "models" / "tiny-llama")
    assert training["data"]["path"] == str(tmp_path / "data" / "train.jsonl")
    assert training["data"]["validation"]["path"] == str(tmp_path / "data" / "val.jsonl")
    assert (training["data"]["format"], training["data"]["evalEverySteps"]) == ("jsonl", 5)
    assert document["plan"]["model"]["kvHeads"] == 2
    assert document["plan"]["model"]["ffnHidden"] == 192
    assert training["lrSchedule"]["decay"] == "cosine"
    assert training["optimizer"]["betas"] == [0.9, 0.95]
    assert training["export"]["path"] == str(tmp_path / "out" / "tiny-llama-finetuned")
    assert document["pod"]["index"] == 1
    volumes = {v["name"] for v in pods[0]["spec"]["volumes"]}
    assert {"models", "data", "out"} <= volumes
    mounts = {m["mountPath"] for m in pods[0]["spec"]["containers"][0]["volumeMounts"]}
    assert {"/models", "/data", "/out"} <= mounts
    assert cluster.wait_phase("hf", "Running")["plan"]["layout"]

    report = {"step": 5, "totalSteps": 20, "loss": 5.1, "evalLoss": 5.25, "evalStep": 5}
    cluster.annotate("pod", "hf-0", f"{names.ANNOTATION_PROGRESS}={json.dumps(report)}")
    progress = wait_for(
        lambda: (p := cluster.status("hf").get("progress") or {}).get("evalStep") == 5 and p,
        30,
        "evalLoss and evalStep in status.progress",
    )
    assert progress["evalLoss"] == 5.25

    evals = [{"step": 0, "loss": 5.96}, {"step": 20, "loss": 4.58}]
    summary = {"status": "Succeeded", "steps": 20, "finalLoss": 4.6, "eval": evals}
    cluster.finish("hf-0", "Succeeded", message=json.dumps(summary))
    cluster.finish("hf-1", "Succeeded")
    final = cluster.wait_phase("hf", "Succeeded")["progress"]
    assert (final["evalLoss"], final["evalStep"]) == (4.58, 20)


def test_the_operator_never_reads_a_folder_it_could_see(
    cluster: Cluster, operator_process: OperatorProcess, tmp_path: Path
) -> None:
    write_example(tmp_path)
    folder = tmp_path / "models" / "tiny-llama"
    config = json.loads((folder / "config.json").read_text())
    (folder / "model.safetensors").unlink()  # weights are optional; vocab_size no longer fits
    (folder / "config.json").write_text(json.dumps(config | {"vocab_size": 300}))
    cluster.apply(hf_job("badtok", tmp_path, **SIZES))
    cluster.wait_running_pods("badtok", 2)  # the trainer refuses it first thing in its pod
    assert cluster.condition("badtok", "Invalid").get("status") != "True"


def test_a_folder_on_a_volume_needs_the_sizes_beside_it(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    cluster.apply(hf_job("nosizes", None))
    message = invalid_message(cluster, "nosizes")
    assert message.startswith("spec.model.hf.path: /models/tiny-llama is not read"), message
    assert "spec.model needs layers, hidden, heads, kvHeads, vocab, ffnHidden" in message
    cluster.apply(hf_job("sizes", None, **SIZES))
    pods = cluster.wait_running_pods("sizes", 2)
    assert hf_path_of(pods[0]) == "/models/tiny-llama"


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


HOSTILE_PATHS = [
    ({"data": {"format": "jsonl", "path": "/proc/self/pagemap"}}, "/etc"),
    ({"data": {"format": "tokens", "path": "/dev/zero"}}, "/proc/self"),
    ({"data": {"format": "jsonl", "path": "/etc/passwd"}}, "/etc/passwd"),
]
"""Training data and model folders naming kernel files and files of the operator's container."""


def test_hostile_paths_neither_grow_nor_block_the_operator(
    cluster: Cluster, operator_process: OperatorProcess, tmp_path: Path
) -> None:
    assert operator_process.proc is not None
    pid = operator_process.proc.pid
    cluster.apply(hf_job("calm", None, **SIZES))
    cluster.wait_running_pods("calm", 2)
    before = rss_bytes(pid)
    for index, (training, folder) in enumerate(HOSTILE_PATHS):
        job = hf_job(f"hostile{index}", None, **SIZES)
        job["spec"]["model"]["hf"] = {"path": folder}
        job["spec"]["training"] = {**job["spec"]["training"], **training}
        job["spec"]["training"]["data"].pop("evalEverySteps", None)
        cluster.apply(job)
    for index in range(len(HOSTILE_PATHS)):  # judged purely: planned, pods created as asked
        pods = cluster.wait_running_pods(f"hostile{index}", 2)
        assert hf_path_of(pods[0]) == HOSTILE_PATHS[index][1]
    cluster.apply(hf_job("after", None, **SIZES))  # the loop still serves everyone else
    cluster.wait_running_pods("after", 2)
    assert operator_process.healthy()
    grown = rss_bytes(pid) - before
    assert grown < 32 * 1024**2, f"the operator grew by {grown / 1024**2:.1f} MiB"


def test_kubectl_explain_documents_the_fields(cluster: Cluster) -> None:
    def explain(path: str) -> str:
        return " ".join(cluster.kubectl("explain", f"ptj.{path}").stdout.split())

    assert "config.json (model_type llama, mistral or qwen2)" in explain("spec.model.hf")
    data = explain("spec.training.data")
    assert "jsonl" in data and "textField" in data and "evalEverySteps" in data
    assert "seqLen + 1 tokens" in data
    assert "evaluated before the first step (step 0)" in explain("spec.training.data.validation")
    assert "cosine or linear decay" in explain("spec.training.lrSchedule")
    assert "betas" in explain("spec.training.optimizer")
    assert "from_pretrained" in explain("spec.training.export")
    assert "Validation loss" in explain("status.progress.evalLoss")

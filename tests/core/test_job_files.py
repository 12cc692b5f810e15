"""A job's own model folder, data, optimizer, schedule and export, without processes: the plan
reads config.json (exact parameter counts), the files are checked before anything starts with
errors naming the field, the rules refuse nonsense, the env contract carries every field to the
trainer's configuration, and the operator's status shows the validation loss."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_run import meshrun
from meshrun_operator.lifecycle.evaluation import evaluate
from meshrun_operator.lifecycle.summary import final_progress, progress_status
from meshrun_operator.seen.views import parse_progress
from meshrun_trainer.components.data.windows import dataset_tokens
from meshrun_trainer.components.optim import ADAMW_BETAS, WEIGHT_DECAY
from meshrun_trainer.config.files import open_files, with_model
from meshrun_trainer.config.read import read_job
from meshrun_trainer.local.env import edit_document
from meshrun_trainer.local.examplefiles import write_example

from meshrun.api import modelsource
from meshrun.api.crd import with_defaults
from meshrun.api.errors import Rule, SpecError
from meshrun.api.modelsource import HF_SIZES
from meshrun.api.read import read_spec
from meshrun.envcontract import pod_env
from meshrun.files.checks import mount, plan_checked, read_with_files
from meshrun.files.hf import safetensors_header
from meshrun.planner.memory import bytes_per_parameter
from meshrun.planner.plan import plan_job
from meshrun.rules import files as file_rules

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hf-finetune.yaml"
SIZES = tuple(HF_SIZES.values())


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("example")
    write_example(root)
    return root


def example_spec(files: Path | None = None, sizes: bool = True) -> dict[str, Any]:
    """The example job's spec, its container paths read under ``files`` when given."""
    spec: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())["spec"]
    if not sizes:
        spec["model"] = {k: v for k, v in spec["model"].items() if k not in SIZES}
    if files is None:
        return spec
    return mount(spec, [f"/{name}={files / name}" for name in ("models", "data", "out")])


def folder_copy(files: Path, tmp: Path, weights: bool = True, **config: Any) -> Path:
    """A copy of the example's model folder with config.json changed."""
    folder = tmp / "model"
    shutil.copytree(files / "models" / "tiny-llama", folder)
    if not weights:
        (folder / "model.safetensors").unlink()
    written = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(written | config))
    return folder


def count_tokens(data: Any, path: str, model: Any, vocab: int) -> int:
    return len(dataset_tokens(data, path, model.path if model else None, vocab, quiet=True))


def test_the_plan_reads_config_json_and_counts_parameters_exactly(files: Path) -> None:
    plan = plan_checked(example_spec(files), "hf")
    header = safetensors_header(files / "models" / "tiny-llama" / "model.safetensors")
    stored = sum(math.prod(info["shape"]) for info in header.values())
    assert plan.model.parameters() == stored == 246_336
    assert plan.to_dict()["model"]["parameters"] == stored
    assert plan.memory.params == stored * bytes_per_parameter("bf16")[0]
    assert "LlamaForCausalLM from" in plan.explanation and "246,336 exactly" in plan.explanation
    assert (plan.model.kv_heads, plan.model.ffn_hidden, plan.model.seq_len) == (2, 192, 64)
    assert plan.model.norm_eps == 1e-6 and plan.model.architecture == "llama"


def test_a_tied_embedding_is_counted_once(files: Path, tmp_path: Path) -> None:
    folder = folder_copy(files, tmp_path, weights=False, tie_word_embeddings=True)
    spec = example_spec(files, sizes=False)
    spec["model"]["hf"]["path"] = str(folder)
    plan = plan_checked(spec, "tied")
    assert plan.model.parameters() == 246_336 - 384 * 64
    assert plan.memory.params == plan.model.parameters() * bytes_per_parameter("bf16")[0]
    assert "the tied embedding counted once" in plan.explanation


def test_a_folder_not_visible_is_planned_from_the_sizes_beside_it() -> None:
    plan = plan_checked(example_spec(), "cluster")
    assert (plan.model.layers, plan.model.vocab, plan.model.ffn_hidden) == (4, 384, 192)
    assert any("/models/tiny-llama is not visible here" in w for w in plan.warnings)
    assert any("/data/train.jsonl is not visible here" in w for w in plan.warnings)
    with pytest.raises(SpecError) as caught:
        plan_checked(example_spec(sizes=False), "cluster")
    assert caught.value.field == "spec.model.hf.path"
    assert "spec.model needs layers, hidden, heads, kvHeads, vocab, ffnHidden" in caught.value.rule


def test_sizes_beside_hf_must_be_config_jsons(files: Path) -> None:
    spec = example_spec(files)
    spec["model"]["ffnHidden"] = 256
    with pytest.raises(SpecError) as caught:
        plan_checked(spec, "hf")
    assert caught.value.field == "spec.model.ffnHidden"
    assert "256, but config.json in spec.model.hf.path gives 192" in caught.value.rule


def _missing_data(spec: dict[str, Any], files: Path, tmp: Path) -> None:
    spec["training"]["data"]["path"] = str(files / "data" / "absent.jsonl")


def _text_field(spec: dict[str, Any], files: Path, tmp: Path) -> None:
    spec["training"]["data"]["textField"] = "body"


def _tokenizer_too_big(spec: dict[str, Any], files: Path, tmp: Path) -> None:
    spec["model"] = example_spec(sizes=False)["model"]
    spec["model"]["hf"]["path"] = str(folder_copy(files, tmp, weights=False, vocab_size=300))


def _weights_off_config(spec: dict[str, Any], files: Path, tmp: Path) -> None:
    spec["model"] = example_spec(sizes=False)["model"]
    spec["model"]["hf"]["path"] = str(folder_copy(files, tmp, intermediate_size=256))


def _too_small(spec: dict[str, Any], files: Path, tmp: Path) -> None:
    spec["training"]["globalBatchSize"] = 512


def _no_folder(spec: dict[str, Any], files: Path, tmp: Path) -> None:
    spec["model"]["hf"]["path"] = str(tmp / "absent")


@pytest.mark.parametrize(
    ("change", "field", "fragment"),
    [
        (_missing_data, "spec.training.data.path", "absent.jsonl does not exist"),
        (_text_field, "spec.training.data.textField", "has no field 'body'"),
        (_tokenizer_too_big, "spec.model.hf.path", "tokenizer has 320 tokens but the model's"),
        (_weights_off_config, "spec.model.hf.path", "has shape [192, 64] but config.json"),
        (_too_small, "spec.training.data.path", "fewer than one global batch of 512"),
        (_no_folder, "spec.model.hf.path", "absent does not exist"),
    ],
    ids=lambda v: v.__name__.strip("_") if callable(v) else None,
)
def test_bad_files_are_refused_before_anything_starts(
    files: Path, tmp_path: Path, change: Any, field: str, fragment: str
) -> None:
    spec = example_spec(files)
    change(spec, files, tmp_path)
    with pytest.raises(SpecError) as caught:
        plan_checked(spec, "bad", local=True, count_tokens=count_tokens)
    assert caught.value.field == field
    assert fragment in caught.value.rule


def test_the_dataset_size_is_known_from_the_cache_or_noted(files: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(files / "data", data)
    spec = example_spec(files)
    spec["training"]["data"] |= {"path": str(data / "train.jsonl")}
    spec["training"]["data"]["validation"] = {"path": str(data / "val.jsonl")}
    plan = plan_checked(spec, "hf")
    assert any("checked once it is tokenized" in w for w in plan.warnings)
    plan_checked(spec, "hf", local=True, count_tokens=count_tokens)  # tokenizes into the cache
    spec["training"]["globalBatchSize"] = 512
    with pytest.raises(SpecError, match="5944 tokens, 91 windows"):
        plan_checked(spec, "hf")  # no tokenizer run: the cache beside the data tells


@pytest.mark.parametrize(
    ("rule", "model", "training"),
    [
        (modelsource.MODEL_SOURCE, {"layers": 2}, {}),
        (modelsource.HF_PRESET, {"preset": "tiny", "hf": {"path": "/m"}, "seqLen": 8}, {}),
        (modelsource.HF_SEQ_LEN, {"hf": {"path": "/m"}}, {}),
        (file_rules.TEXT_DATA_HF, {"preset": "tiny"}, {"data": {"path": "/d.jsonl"}}),
        (
            file_rules.TOKENS_TEXT_FIELD,
            {"preset": "tiny"},
            {"data": {"format": "tokens", "path": "/t.bin", "textField": "body"}},
        ),
        (
            file_rules.EVAL_VALIDATION,
            {"preset": "tiny"},
            {"data": {"format": "tokens", "path": "/t.bin", "evalEverySteps": 5}},
        ),
        (
            file_rules.DATA_DATASET,
            {"preset": "tiny"},
            {"dataset": "synthetic", "data": {"format": "tokens", "path": "/t.bin"}},
        ),
        (
            file_rules.WARMUP_STEPS,
            {"preset": "tiny"},
            {"steps": 4, "lrSchedule": {"warmupSteps": 5}},
        ),
    ],
    ids=lambda v: v.field if isinstance(v, Rule) else None,
)
def test_the_rules_of_the_own_parts(
    rule: Rule, model: dict[str, Any], training: dict[str, Any]
) -> None:
    with pytest.raises(SpecError) as caught:
        plan_job({"image": "i", "model": model, "training": training})
    assert caught.value.field == rule.field
    assert rule.message.removeprefix(f"{rule.field} ") in caught.value.rule


def test_the_env_contract_carries_every_field_to_the_trainer(files: Path) -> None:
    job = read_with_files(example_spec(files))
    plan = plan_job(job, "hf")
    env = pod_env(plan, job, job_name="hf", namespace="ns", pod_index=0, master_addr="m")
    trained = read_job(env)
    assert trained.spec == replace(job, pod_template=None, command=None, args=None)
    training = trained.spec.training
    assert job.model.hf is not None and trained.spec.model == job.model
    assert training.export is not None
    assert training.export.path == str(files / "out" / "tiny-llama-finetuned")
    hf = open_files(trained)
    assert hf is not None and hf.path == Path(job.model.hf.path)
    assert with_model(trained, hf).plan.model == plan.model, "config.json's whole architecture"
    assert training.optimizer.betas == [0.9, 0.95] and training.lr_schedule.decay == "cosine"
    with pytest.raises(SpecError) as caught:
        with_model(read_job(edit_document(env, plan={"model": {"vocab": 512}})), hf)
    assert caught.value.field == "spec.model.vocab"


@pytest.mark.parametrize(
    ("training", "field", "fragment"),
    [
        ({"optimizer": {"betas": [0.9]}}, "spec.training.optimizer.betas", "2 items"),
        ({"optimizer": {"betas": [0.9, 1.0]}}, "spec.training.optimizer.betas[1]", "less than 1"),
        ({"optimizer": {"weightDecay": -0.1}}, "spec.training.optimizer.weightDecay", "at least 0"),
        ({"lrSchedule": {"decay": "step"}}, "spec.training.lrSchedule.decay", "constant"),
        ({"lrSchedule": {"minRatio": 1.5}}, "spec.training.lrSchedule.minRatio", "at most 1"),
        ({"data": {"format": "csv"}}, "spec.training.data.format", "jsonl"),
        ({"lrSchedule": {"warmupSteps": 21}}, "spec.training.lrSchedule.warmupSteps", "must not"),
    ],
)
def test_a_bad_document_names_the_spec_field(
    files: Path, training: dict[str, Any], field: str, fragment: str
) -> None:
    job = read_with_files(example_spec(files))
    env = pod_env(plan_job(job), job, job_name="j", namespace="n", pod_index=0, master_addr="m")
    with pytest.raises(SpecError) as caught:
        read_job(edit_document(env, spec={"training": training}))
    assert caught.value.field == field and fragment in caught.value.rule, caught.value


def test_a_job_without_own_parts_gets_the_crds_optimizer() -> None:
    job = read_spec({"image": "i", "model": {"preset": "tiny"}})
    env = pod_env(plan_job(job), job, job_name="j", namespace="n", pod_index=0, master_addr="m")
    trained = read_job(env)
    training = trained.spec.training
    assert trained.spec.model.hf is None and training.data is None and training.export is None
    assert open_files(trained) is None
    defaults = with_defaults({"training": {}})  # not a spec, but the CRD's training defaults
    assert defaults["training"]["optimizer"] == {"betas": [0.9, 0.95], "weightDecay": 0.1}
    assert tuple(training.optimizer.betas) == ADAMW_BETAS, "the trainer's fallback is the CRD's"
    assert training.optimizer.weight_decay == WEIGHT_DECAY


def test_the_operator_judges_the_spec_and_never_its_files(files: Path, tmp_path: Path) -> None:
    spec = example_spec(files)
    _tokenizer_too_big(spec, files, tmp_path)
    with pytest.raises(SpecError, match="the tokenizer has 320 tokens"):
        plan_checked(spec, "hf")  # meshrun plan, which may read the visible folder
    ev = evaluate(spec, "hf")  # the operator reads no config.json: it needs the sizes
    assert ev.error is not None and ev.error.field == "spec.model.hf.path"
    assert "is not read where the job is planned" in ev.error.rule
    sized = {**spec, "model": {**example_spec()["model"], "hf": spec["model"]["hf"]}}
    ev = evaluate(sized, "hf")  # planned from the sizes beside hf; the trainer checks the folder
    assert ev.error is None and ev.plan is not None
    assert ev.plan.model.vocab == sized["model"]["vocab"]


def test_the_validation_loss_reaches_status_progress() -> None:
    served = json.dumps({"step": 10, "totalSteps": 20, "evalLoss": 4.25, "evalStep": 10})
    reported = parse_progress(served)  # rank 0's /progress, or the pod annotation
    assert reported is not None
    running = progress_status(reported)
    assert running["evalLoss"] == 4.25 and running["evalStep"] == 10
    summary = {
        "status": "Succeeded",
        "steps": 20,
        "finalLoss": 4.5,
        "eval": [{"step": 0, "loss": 5.9}, {"step": 20, "loss": 4.58}],
    }
    final = final_progress(summary)
    assert final is not None and (final["evalLoss"], final["evalStep"]) == (4.58, 20)
    assert "evalLoss" not in (final_progress({**summary, "eval": []}) or {})


def test_plan_cli_checks_mounted_files(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from meshrun.cli.main import main

    mounts = ["--mount", f"/models={files / 'models'}", "--mount", f"/data={files / 'data'}"]
    assert main(["plan", str(EXAMPLE), "-o", "json", *mounts]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["model"]["parameters"] == 246_336 and shown["model"]["kvHeads"] == 2
    assert main(["plan", str(EXAMPLE), "--mount", f"/data={files / 'models'}", *mounts[:2]]) == 2
    assert "spec.training.data.path" in capsys.readouterr().err
    # A malformed flag is the command line's fault, not the job's: argparse's exit 2.
    code, _, err = meshrun(capsys, "plan", str(EXAMPLE), "--mount", "models=/x")
    assert code == 2
    assert "argument --mount: 'models=/x' must look like /container/path=local/path" in err
    assert "invalid job" not in err


def test_mount_takes_the_longest_container_path() -> None:
    spec = example_spec()
    mounted = mount(spec, ["/=/root", "/data=/local/data", "/data/train.jsonl=/other.jsonl"])
    assert mounted["training"]["data"]["path"] == "/other.jsonl"
    assert mounted["training"]["data"]["validation"]["path"] == "/local/data/val.jsonl"
    assert mounted["model"]["hf"]["path"] == "/root/models/tiny-llama"
    assert spec["model"]["hf"]["path"] == "/models/tiny-llama", "the spec itself is untouched"

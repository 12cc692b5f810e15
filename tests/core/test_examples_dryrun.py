"""The CRD on a real API server: examples accepted, defaults as meshrun.api.crd applies them, and
every CEL rule refusing what meshrun.rules.strategy refuses, with the same message."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import pytest
import yaml

from meshrun.api import modelsource, policyspec
from meshrun.api.crd import with_defaults
from meshrun.api.errors import SpecError
from meshrun.planner.plan import plan_job
from meshrun.rules import elastic, names, strategy
from meshrun.rules import files as file_rules
from meshrun.rules import moe as moe_rules

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

Kubectl = Callable[..., CompletedProcess[str]]
ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


@pytest.fixture
def ns(crds_installed: list[str], namespace: str) -> str:
    assert "paralleltrainingjobs.meshrun.dev" in crds_installed
    return namespace


def load(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(path.read_text())
    return loaded


def dry_run(kubectl: Kubectl, ns: str, job: dict[str, Any]) -> CompletedProcess[str]:
    return kubectl(
        "create",
        "--dry-run=server",
        "-n",
        ns,
        "-o",
        "json",
        "-f",
        "-",
        input=json.dumps(job),
        check=False,
    )


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_is_accepted_with_the_same_defaults(kubectl: Kubectl, ns: str, path: Path) -> None:
    job = load(path)
    result = dry_run(kubectl, ns, job)
    assert result.returncode == 0, f"{path.name} rejected by the API server: {result.stderr}"
    served = json.loads(result.stdout)["spec"]
    assert served == with_defaults(job["spec"]), "server defaults differ from meshrun.api.crd"
    plan_job(served, job["metadata"]["name"])


def base_job() -> dict[str, Any]:
    return load(ROOT / "examples" / "demo-3d-cpu.yaml")


@pytest.mark.parametrize(
    ("section", "change", "message"),
    [
        ("strategy", {"tensorParallel": 3, "dataParallel": None}, "must divide spec.resources"),
        ("strategy", {"dataParallel": 4}, "must equal spec.resources.numNodes"),
        ("strategy", {"type": "auto"}, "spec.strategy.type auto chooses"),
        (
            "strategy",
            {
                "type": "zero",
                "pipelineParallel": None,
                "tensorParallel": None,
                "dataParallel": None,
            },
            "spec.strategy.zeroStage must be 1, 2 or 3",
        ),
        ("strategy", {"virtualStages": 2}, "spec.strategy.virtualStages above 1"),
        ("model", {"preset": None, "layers": 2}, "spec.model needs a preset"),
        ("model", {"hidden": 65, "heads": 4}, "spec.model.heads must divide"),
        ("training", {"globalBatchSize": 9}, "multiple of spec.training.microBatchSize"),
    ],
)
def test_cel_rules_reject_with_field_names(
    kubectl: Kubectl, ns: str, section: str, change: dict[str, Any], message: str
) -> None:
    job = base_job()
    for key, value in change.items():
        if value is None:
            job["spec"][section].pop(key, None)
        else:
            job["spec"][section][key] = value
    result = dry_run(kubectl, ns, job)
    assert result.returncode != 0, f"the API server accepted {change}"
    assert message in " ".join(result.stderr.split())


MOE = {"experts": 4, "expertsPerToken": 2, "expertFfnHidden": 64}
"""A small mixture of experts on the demo's tiny model."""

# One spec per CEL rule of the CRD, changed from the demo job (2 pods x 4, dp2 x pp2 x tp2):
# the API server must refuse it with the rule's message and the planner must refuse it too.
BREAKS: list[tuple[strategy.Rule, dict[str, dict[str, Any]]]] = [
    (strategy.AUTO_DEGREES, {"strategy": {"type": "auto"}}),
    (
        strategy.PRODUCT_GPU,
        {"resources": {"accelerator": "cpu", "acceleratorProduct": "NVIDIA-H100-80GB-HBM3"}},
    ),
    (strategy.DATA_PARALLEL_ONLY, {"strategy": {"type": "ddp", "dataParallel": None}}),
    (
        strategy.DATA_PARALLEL_WORLD,
        {
            "strategy": {
                "type": "zero",
                "zeroStage": 1,
                "dataParallel": 4,
                "pipelineParallel": None,
                "tensorParallel": None,
            }
        },
    ),
    (
        strategy.DDP_ZERO,
        {
            "strategy": {
                "type": "ddp",
                "zeroStage": 1,
                "dataParallel": None,
                "pipelineParallel": None,
                "tensorParallel": None,
            }
        },
    ),
    (
        strategy.ZERO_STAGE,
        {
            "strategy": {
                "type": "zero",
                "dataParallel": None,
                "pipelineParallel": None,
                "tensorParallel": None,
            }
        },
    ),
    (strategy.PIPELINE_TP, {"strategy": {"type": "pipeline", "dataParallel": None}}),
    (strategy.TENSOR_PP, {"strategy": {"type": "tensor", "dataParallel": None}}),
    (strategy.VIRTUAL_STAGES, {"strategy": {"virtualStages": 2}}),
    (
        strategy.INTERLEAVED_VIRTUAL,
        {"strategy": {"pipelineSchedule": "interleaved-1f1b", "virtualStages": 1}},
    ),
    (strategy.TP_PROCS, {"strategy": {"tensorParallel": 3, "dataParallel": None}}),
    (strategy.DEGREES_WORLD, {"strategy": {"dataParallel": 4}}),
    (strategy.CP_WORLD, {"strategy": {"contextParallel": 3}}),
    (
        strategy.CP_SEQUENCE,
        {"strategy": {"dataParallel": 1, "contextParallel": 2}, "model": {"seqLen": 66}},
    ),
    (strategy.BATCH, {"training": {"globalBatchSize": 9}}),
    (strategy.DP_BATCH, {"training": {"globalBatchSize": 6}}),
    (strategy.TP_MODEL, {"model": {"seqLen": 63}}),
    (strategy.PP_LAYERS, {"model": {"layers": 1}}),
    (strategy.HEADS, {"model": {"hidden": 66, "heads": 4}}),
    (strategy.KV_HEADS, {"model": {"heads": 4, "kvHeads": 3}}),
    (strategy.ROTARY, {"model": {"hidden": 12, "heads": 4}}),
    (strategy.CORPUS_VOCAB, {"model": {"vocab": 128}, "training": {"dataset": "corpus"}}),
    (modelsource.MODEL_SOURCE, {"model": {"preset": None, "layers": 2}}),
    (modelsource.HF_PRESET, {"model": {"hf": {"path": "/models/m"}, "seqLen": 64}}),
    (modelsource.HF_SEQ_LEN, {"model": {"preset": None, "hf": {"path": "/models/m"}}}),
    (file_rules.TEXT_DATA_HF, {"training": {"data": {"path": "/data/train.jsonl"}}}),
    (
        file_rules.TOKENS_TEXT_FIELD,
        {"training": {"data": {"format": "tokens", "path": "/t.bin", "textField": "body"}}},
    ),
    (
        file_rules.EVAL_VALIDATION,
        {"training": {"data": {"format": "tokens", "path": "/t.bin", "evalEverySteps": 5}}},
    ),
    (
        file_rules.DATA_DATASET,
        {"training": {"dataset": "corpus", "data": {"format": "tokens", "path": "/t.bin"}}},
    ),
    (file_rules.WARMUP_STEPS, {"training": {"lrSchedule": {"warmupSteps": 21}}}),
    (
        file_rules.METRICS_PATH,
        {"training": {"metrics": {"tensorboard": False, "path": "/runs/a"}}},
    ),
    (
        file_rules.EXPORT_MLP,
        {"model": {"mlp": "gelu"}, "training": {"export": {"path": "/out"}}},
    ),
    (moe_rules.EP_NEEDS_MOE, {"strategy": {"expertParallel": 2}}),
    (
        moe_rules.EP_EXPERTS,
        {"strategy": {"expertParallel": 2}, "model": {"moe": {**MOE, "experts": 3}}},
    ),
    (moe_rules.ETP_VALUES, {"strategy": {"expertTensorParallel": 4}, "model": {"moe": MOE}}),
    (moe_rules.TOP_K, {"model": {"moe": {**MOE, "expertsPerToken": 5}}}),
    (moe_rules.FIRST_DENSE, {"model": {"layers": 4, "moe": {**MOE, "firstDenseLayers": 4}}}),
    (names.JOB_NAME, {"metadata": {"name": "9lives"}}),
    (names.JOB_NAME_LENGTH, {"metadata": {"name": "a" * 62}}),
    (names.QUEUE_NAME, {"scheduling": {"queueName": "Team_A"}}),
    (
        policyspec.ONE_PATTERN,
        {
            "runPolicy": {
                "podFailurePolicy": {
                    "rules": [{"action": "Ignore", "onReasons": ["X"]}, {"action": "FailJob"}]
                }
            }
        },
    ),
    (elastic.MIN_PLANNED, {"elastic": {"minDataParallel": 4}}),
    (elastic.BOUNDS_BATCH, {"elastic": {"minDataParallel": 1, "maxDataParallel": 3}}),
    (elastic.MAX_MIN, {"elastic": {"minDataParallel": 2, "maxDataParallel": 1}}),
    (
        policyspec.NO_ZERO_IN,
        {
            "runPolicy": {
                "podFailurePolicy": {
                    "rules": [
                        {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [0, 3]}}
                    ]
                }
            }
        },
    ),
]


def test_every_cel_rule_has_a_case() -> None:
    assert sorted(r.message for r, _ in BREAKS) == sorted(r.message for r in strategy.ALL_RULES)


@pytest.mark.parametrize(("rule", "changes"), BREAKS, ids=[r.message[:50] for r, _ in BREAKS])
def test_the_api_server_and_the_planner_refuse_alike(
    kubectl: Kubectl, ns: str, rule: strategy.Rule, changes: dict[str, dict[str, Any]]
) -> None:
    job = base_job()
    for section, change in changes.items():
        if section == "metadata":
            job["metadata"].update(change)
            continue
        for key, value in change.items():
            if value is None:
                job["spec"][section].pop(key, None)
            else:
                job["spec"].setdefault(section, {})[key] = value
    result = dry_run(kubectl, ns, job)
    assert result.returncode != 0, f"the API server accepted {changes}"
    assert rule.message in " ".join(result.stderr.split()), result.stderr
    with pytest.raises(SpecError):
        plan_job(job["spec"], job["metadata"]["name"])


def test_the_issue_example_is_refused_by_the_api_server(kubectl: Kubectl, ns: str) -> None:
    job = base_job()
    job["spec"]["resources"]["numProcPerNode"] = 8
    job["spec"]["strategy"] = {"type": "tensor", "tensorParallel": 8}
    job["spec"]["model"] = {"layers": 2, "hidden": 512, "heads": 8, "vocab": 32000, "seqLen": 100}
    result = dry_run(kubectl, ns, job)
    assert result.returncode != 0 and strategy.TP_MODEL.message in " ".join(result.stderr.split())


def test_explain_describes_fields(kubectl: Kubectl, ns: str) -> None:
    text = kubectl("explain", "ptj.spec.strategy").stdout
    assert "tensorParallel" in text and "the strategy table of docs/planner.md" in " ".join(
        text.split()
    )


def test_resources_strategy_model_are_immutable(kubectl: Kubectl, ns: str) -> None:
    job = base_job()
    job["spec"]["runPolicy"] = {"suspend": True}  # no pods even if an operator is watching
    kubectl("create", "-n", ns, "-f", "-", input=json.dumps(job))
    name = job["metadata"]["name"]
    for patch, field in (
        ({"resources": {"numNodes": 4}}, "spec.resources"),
        ({"strategy": {"tensorParallel": 1}}, "spec.strategy"),
        ({"model": {"preset": "small"}}, "spec.model"),
    ):
        result = kubectl(
            "patch",
            "ptj",
            name,
            "-n",
            ns,
            "--type",
            "merge",
            "-p",
            json.dumps({"spec": patch}),
            check=False,
        )
        assert result.returncode != 0 and f"{field} is immutable" in result.stderr, result.stderr
    kubectl(
        "patch",
        "ptj",
        name,
        "-n",
        ns,
        "--type",
        "merge",
        "-p",
        json.dumps({"spec": {"training": {"steps": 40}}}),
    )
    header = kubectl("get", "ptj", "-n", ns).stdout.splitlines()[0].split()
    progress = ["STEP", "PROGRESS", "LOSS", "TOKENS/S", "ETA"]
    assert header == ["NAME", "STRATEGY", "LAYOUT", "PROCS", "PHASE", *progress, "AGE"]


def test_status_schema_keeps_what_operator_and_trainer_write(kubectl: Kubectl, ns: str) -> None:
    job = base_job()
    job["spec"]["runPolicy"] = {"suspend": True}
    kubectl("create", "-n", ns, "-f", "-", input=json.dumps(job))
    name = job["metadata"]["name"]
    plan = plan_job(with_defaults(job["spec"]), name)
    status = {
        "phase": "Running",
        "strategy": plan.strategy,
        "layout": plan.layout.text(),
        "gpus": plan.gpus,
        "worldSize": plan.world_size,
        "plan": {**plan.status_summary(), "extraKeyTheOperatorAdds": "kept"},
        "placement": [
            {"pod": f"{name}-0", "node": "n0", "firstRank": 0, "lastRank": 3, "phase": "Running"}
        ],
        "conditions": [
            {
                "type": "Running",
                "status": "True",
                "reason": "AllPodsRunning",
                "message": "8 processes",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
        "restarts": 1,
        "attempt": 1,
        "startTime": "2026-01-01T00:00:00Z",
        # /progress as the trainer serves it (docs/env-contract.md) plus the operator's ETA.
        "progress": {
            "step": 5,
            "totalSteps": 20,
            "loss": 4.5,
            "tokensPerSecond": 1234.5,
            "stepTimeSeconds": 0.25,
            "updatedAt": 1764400000.25,
            "etaSeconds": 3.75,
        },
        # The printer columns' text, as the operator writes it.
        "display": {
            "step": "5/20",
            "progress": "25%",
            "loss": "4.5",
            "tokensPerSecond": "1.23k",
            "eta": "3s",
        },
        "observedGeneration": 1,
    }
    kubectl(
        "patch",
        "ptj",
        name,
        "-n",
        ns,
        "--subresource=status",
        "--type",
        "merge",
        "-p",
        json.dumps({"status": status}),
    )
    stored = json.loads(kubectl("get", "ptj", name, "-n", ns, "-o", "json").stdout)["status"]
    assert stored == status, "the status schema pruned or changed fields"
    row = kubectl("get", "ptj", name, "-n", ns, "--no-headers").stdout.split()
    layout = ["hybrid", "dp2", "x", "pp2", "x", "tp2", "8", "Running"]
    assert row[1:-1] == [*layout, "5/20", "25%", "4.5", "1.23k", "3s"], row


def test_elastic_job_without_micro_batch_size_is_accepted(kubectl: Kubectl, ns: str) -> None:
    """An unset microBatchSize (auto's to choose) passes every CEL rule that reads it."""
    job = load(ROOT / "examples" / "elastic.yaml")
    del job["spec"]["training"]["microBatchSize"]
    result = dry_run(kubectl, ns, job)
    assert result.returncode == 0, result.stderr
    served = json.loads(result.stdout)["spec"]
    assert "microBatchSize" not in served["training"]
    plan_job(served, job["metadata"]["name"])

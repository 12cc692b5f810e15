"""pod_env: the operator/trainer contract, torchrun's variables, the coordinates for a custom
entrypoint and the job document, round-tripped through the trainer's reading of it."""

from __future__ import annotations

import copy
import dataclasses
import re
from pathlib import Path

import pytest
from meshrun_operator.lifecycle.evaluation import Admission, admit, evaluate
from meshrun_trainer.config.read import read_job

from meshrun.api import crd as crd_module
from meshrun.api import read as read_module
from meshrun.api import spec as spec_module
from meshrun.api.crd import load_jobs
from meshrun.api.errors import SpecError
from meshrun.api.read import read_spec
from meshrun.api.spec import JobSpec, Training
from meshrun.envcontract import pod_env
from meshrun.jobdoc import JOB_VARIABLE, read_document
from meshrun.planner.plan import Plan, plan_job

pytestmark = pytest.mark.unit

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def planned(name: str) -> tuple[Plan, JobSpec]:
    job = load_jobs(EXAMPLES / f"{name}.yaml")[0]
    spec = read_spec(job["spec"])
    return plan_job(spec, job["metadata"]["name"]), spec


def test_demo_job_env_for_second_pod() -> None:
    plan, spec = planned("demo-3d-cpu")
    env = pod_env(
        plan,
        spec,
        job_name="demo",
        namespace="ns",
        pod_index=1,
        master_addr="demo-0.demo",
        master_port=29501,
        attempt=2,
        checkpoint_dir="/ckpt",
    )
    assert env["PET_NNODES"] == "2" and env["PET_NPROC_PER_NODE"] == "4"
    assert env["PET_NODE_RANK"] == "1" and env["MESHRUN_POD_INDEX"] == "1"
    assert env["PET_MASTER_ADDR"] == env["MASTER_ADDR"] == "demo-0.demo"
    assert env["PET_MASTER_PORT"] == env["MASTER_PORT"] == "29501"
    assert env["WORLD_SIZE"] == "8" and env["MESHRUN_ATTEMPT"] == "2"
    assert (env["MESHRUN_DP"], env["MESHRUN_PP"], env["MESHRUN_TP"]) == ("2", "2", "2")
    assert (env["MESHRUN_EP"], env["MESHRUN_ETP"]) == ("1", "2")  # a dense model's
    assert env["MESHRUN_CP"] == "1" and env["MESHRUN_RANK_ORDER"] == "pp,dp,cp,tp"
    assert env["MESHRUN_CHECKPOINT_DIR"] == "/ckpt"
    assert set(env) == {*TORCHRUN, *COORDINATES, JOB_VARIABLE}
    assert "RANK" not in env and "LOCAL_RANK" not in env, "torchrun sets these per process"
    assert all(isinstance(v, str) for v in env.values())
    job = read_job(env)
    assert (job.plan.layout.dp, job.plan.layout.pp, job.plan.layout.tp) == (2, 2, 2)
    assert job.spec.training.steps == 20 and job.spec.training.precision == "fp32"
    assert (job.pod.job_name, job.pod.namespace, job.pod.attempt, job.pod.index) == (
        "demo",
        "ns",
        2,
        1,
    )
    assert job.plan.stage_layers == ((0, 1), (2, 3))
    assert job.pod.checkpoint_dir == "/ckpt" and job.spec.training.checkpoint.every_steps == 5


TORCHRUN = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "PET_NNODES", "PET_NPROC_PER_NODE")
TORCHRUN += ("PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
COORDINATES = ("MESHRUN_JOB_NAME", "MESHRUN_NAMESPACE", "MESHRUN_ATTEMPT", "MESHRUN_POD_INDEX")
COORDINATES += ("MESHRUN_DP", "MESHRUN_CP", "MESHRUN_PP", "MESHRUN_TP", "MESHRUN_RANK_ORDER")
COORDINATES += ("MESHRUN_CHECKPOINT_DIR",)
COORDINATES += ("MESHRUN_EP", "MESHRUN_ETP")
"""The variables docs/env-contract.md documents for a custom entrypoint."""


def test_the_documented_variables_are_the_pods() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "env-contract.md").read_text()
    documented = set(re.findall(r"`((?:MESHRUN|PET|MASTER)_[A-Z_]+|WORLD_SIZE)`", doc))
    assert documented == {*TORCHRUN, *COORDINATES, JOB_VARIABLE}


@pytest.mark.parametrize("name", [path.stem for path in sorted(EXAMPLES.glob("*.yaml"))])
def test_every_field_of_the_spec_round_trips_through_the_document(name: str) -> None:
    plan, spec = planned(name)
    env = pod_env(plan, spec, job_name=name, namespace="ns", pod_index=0, master_addr="m")
    document = read_document(env[JOB_VARIABLE])
    assert document.spec == dataclasses.replace(spec, pod_template=None, command=None, args=None)
    assert document.plan == plan
    assert len(env[JOB_VARIABLE]) < 8192, "far below the 128 KiB of one environment string"


def test_an_auto_job_without_a_micro_batch_size_trains_with_the_plans() -> None:
    """Left unset, auto chooses the micro-batch size: the spec the operator and the trainer read
    keeps it unset, and the plan (status.plan, the trainer's layout) holds the one that runs."""
    spec = {
        "image": "x",
        "resources": {"numNodes": 2, "numProcPerNode": 8},
        "strategy": {"type": "auto"},
        "model": {"preset": "1b"},
        "training": {"globalBatchSize": 64},
    }
    ev = evaluate(spec, "auto")  # the operator's reading and plan
    assert ev.error is None and ev.spec is not None and ev.plan is not None
    size = ev.plan.layout.micro_batch_size
    assert size == 4, "auto's choice, not the 1 every other strategy type runs"
    assert ev.spec.training.micro_batch_size is None
    assert ev.plan.status_summary()["microBatchSize"] == size
    env = pod_env(ev.plan, ev.spec, job_name="auto", namespace="ns", pod_index=1, master_addr="m")
    job = read_job(env)
    assert job.spec.training.micro_batch_size is None
    layout = job.plan.layout
    assert layout.micro_batch_size == size
    # each replica's rows of a step are passes of the plan's size
    assert layout.dp * size * layout.micro_batches * layout.grad_accumulation == 64


def test_a_document_too_big_for_the_environment_makes_the_job_invalid() -> None:
    job = load_jobs(EXAMPLES / "ddp.yaml")[0]
    # the pod carries args, not the document: the most the CRD admits still runs
    huge = {**job["spec"], "args": ["x" * 4096] * 1024}
    assert evaluate(huge, "big").error is None
    # The CRD's bounds keep every admitted spec's document small; past them (a spec read by
    # hand), the operator's admission, which writes pod 0's document, refuses it before any pod
    # is made.
    spec = read_spec(job["spec"])
    plan = plan_job(job["spec"], "big")
    with pytest.raises(SpecError) as caught:
        admit(dataclasses.replace(spec, image="r/" + "x" * 100_000), plan, "big", Admission())
    assert caught.value.field == "spec" and "the job document is" in caught.value.rule


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainingWithANewField(Training):
    """``spec.training`` with one more field, as a developer adding one would write it."""

    warmup_jitter: int
    """A new field: only its CRD property and this line were added."""


def test_a_new_spec_field_reaches_the_trainer_with_no_other_edit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    served = copy.deepcopy(crd_module.crd())
    version = next(v for v in served["spec"]["versions"] if v["name"] == crd_module.VERSION)
    training = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["training"]
    training["properties"]["warmupJitter"] = {"type": "integer", "minimum": 0, "default": 3}
    monkeypatch.setattr(crd_module, "crd", lambda: served)
    monkeypatch.setattr(spec_module, "Training", TrainingWithANewField)
    # The edited module is read as a new process would: its annotations resolved again.
    monkeypatch.setattr(read_module, "HINTS", {})
    job = load_jobs(EXAMPLES / "ddp.yaml")[0]
    for given, expected in (
        (job["spec"], 3),
        ({**job["spec"], "training": {"warmupJitter": 7}}, 7),
    ):
        spec = read_spec(given)
        plan = plan_job(spec, "new")
        env = pod_env(plan, spec, job_name="new", namespace="ns", pod_index=0, master_addr="m")
        trained = read_job(env)  # the trainer's own reading of its pod's environment
        assert isinstance(trained.spec.training, TrainingWithANewField)
        assert trained.spec.training.warmup_jitter == expected


@pytest.mark.parametrize(
    "name", ["ddp", "zero1", "zero2", "zero3", "pipeline", "tensor", "3d", "auto"]
)
def test_every_example_parses_in_the_trainer(name: str) -> None:
    plan, spec = planned(name)
    env = pod_env(plan, spec, job_name=name, namespace="ns", pod_index=0, master_addr="m")
    job = read_job(env)
    assert job.plan == plan
    assert job.plan.layout.world_size == plan.world_size
    assert job.plan.stage_layers[-1][1] == job.plan.model.layers - 1
    assert job.spec == dataclasses.replace(spec, pod_template=None, command=None, args=None)


def test_interleaved_stage_ranges_are_in_stage_order() -> None:
    plan, spec = planned("3d")
    env = pod_env(plan, spec, job_name="x", namespace="ns", pod_index=0, master_addr="m")
    firsts = [first for first, _ in read_job(env).plan.stage_layers]
    assert firsts == sorted(firsts) and len(firsts) == plan.layout.pp * plan.layout.virtual_stages


def test_pod_index_out_of_range_is_an_error() -> None:
    plan, spec = planned("ddp")
    with pytest.raises(ValueError, match="pod_index: 5 must be in"):
        pod_env(plan, spec, job_name="x", namespace="ns", pod_index=5, master_addr="m")


@pytest.mark.parametrize(
    ("accelerator", "gpus", "pod", "visible", "warned"),
    [
        ("cpu", ["0", "1", "2", "3"], 1, "", False),
        ("nvidia.com/gpu", ["0", "1", "2", "3"], 0, "0,1", False),
        ("nvidia.com/gpu", ["0", "1", "2", "3"], 1, "2,3", False),
        ("nvidia.com/gpu", ["4", "6", "5", "7"], 1, "5,7", False),  # a user's own selection
        ("nvidia.com/gpu", ["0"], 0, "", True),
    ],
)
def test_local_pods_get_disjoint_gpus(
    accelerator: str, gpus: list[str], pod: int, visible: str, warned: bool
) -> None:
    from meshrun_trainer.local.env import device_env

    env, reason = device_env(accelerator, world=4, per_pod=2, pod_index=pod, gpus=gpus)
    assert env == {"CUDA_VISIBLE_DEVICES": visible}
    assert (reason is not None) == warned

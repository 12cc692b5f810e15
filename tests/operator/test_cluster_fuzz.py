"""Hostile specs against the real API server, with the operator running.

Hypothesis generates jobs a careless or hostile author could write: wrong types, huge strings,
NaN and 1e308, unicode names, nesting past the 1,000 levels Python's JSON decoder takes, paths of
the operator's own filesystem, pod templates of every malformed shape and of a megabyte, gangs
past the operator's --max-pods-per-job, and names of Services, NetworkPolicies and pods that
someone else already owns. Each is sent to the API server as it is. The operator runs in a
memory cgroup of the chart's memory limit (values.yaml), as the kubelet would run it. Whatever
the API server accepts, the operator must judge without falling over: at the end the operator
process is the one that started (not killed for memory, no restart, no traceback), every
accepted job either says Invalid naming the field, says NameConflict, or is running (pods or a
phase that is not an error), and nothing the test created beside the jobs has been changed or
deleted.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from meshrun_operator import names
from meshrun_operator.main import parse_args
from operator_harness import Cluster, OperatorProcess
from waiting import wait_for

from meshrun.api.crd import API_VERSION, GROUP, KIND, PLURAL, VERSION

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(1200)]

EXAMPLES = 300
MAX_PODS = parse_args([]).max_pods_per_job
"""The operator's --max-pods-per-job (the fixture's operator keeps the default): a larger gang
must be Invalid, never built."""

# Objects someone else made, each named as a job might be. The operator may read them, never
# change them: the job of that name must say so instead.
BYSTANDER_SERVICE = "postgres"
BYSTANDER_POLICY = "locked-down"
BYSTANDER_POD_JOB = "web"  # a pod called web-0 that is not the job's, labelled to look like it
BYSTANDER_CONFIGMAP = "settings"
TAKEN_NAMES = [BYSTANDER_SERVICE, BYSTANDER_POLICY, BYSTANDER_POD_JOB, BYSTANDER_CONFIGMAP]


def bystanders(namespace: str) -> list[dict[str, Any]]:
    helm = {"app.kubernetes.io/managed-by": "Helm", "app": "db"}
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": BYSTANDER_SERVICE, "namespace": namespace, "labels": helm},
            "spec": {"selector": {"app": "db"}, "ports": [{"port": 5432}]},
        },
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": BYSTANDER_POLICY, "namespace": namespace, "labels": helm},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress"]},
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{BYSTANDER_POD_JOB}-0",
                "namespace": namespace,
                # the job-name label alone, as anyone may write it: not the operator's pod
                "labels": {names.LABEL_JOB: BYSTANDER_POD_JOB},
            },
            "spec": {
                # no scheduler has this name, so none touches it and it stays exactly as made
                # (an unschedulable pod's condition is rewritten whenever the nodes change)
                "schedulerName": "no-such-scheduler",
                "containers": [{"name": "app", "image": "example.invalid/app:1"}],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": BYSTANDER_CONFIGMAP, "namespace": namespace},
            "data": {"k": "v"},
        },
    ]


# --- values ----------------------------------------------------------------------------------

NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -1e308, 5e-324, 0, -1, 2**63, 2**31, 0.5, 1.5]),
)
HUGE_STRINGS = st.builds(
    lambda ch, n: ch * n,
    st.sampled_from(["a", "é", "💥", "\u202e", "-"]),
    st.integers(min_value=300, max_value=120_000),
)
STRINGS = st.one_of(
    st.text(max_size=40),
    HUGE_STRINGS,
    st.sampled_from(["", " ", "../..", "${HOME}", "$(rm -rf /)", "\x00", "nvidia.com/gpu", "1Gi"]),
)
LEAVES = st.one_of(st.none(), st.booleans(), NUMBERS, STRINGS)
NESTED = st.recursive(
    LEAVES,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=25,
)


def deep(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = {"a": value}
    return value


# Past 1,000 levels Python's JSON decoder gives up: the operator must never be handed one.
DEEP = st.one_of(
    st.integers(min_value=20, max_value=90).map(deep), st.sampled_from([1_001, 3_000]).map(deep)
)
HOSTILE = st.one_of(LEAVES, NESTED, DEEP)
# Values the schema lets through but the rules may not: most jobs must reach the operator.
PLAUSIBLE = st.one_of(
    st.integers(min_value=0, max_value=70_000),
    st.sampled_from(
        [
            "auto",
            "ddp",
            "zero",
            "pipeline",
            "tensor",
            "hybrid",
            "tiny",
            "70b",
            "cpu",
            "nvidia.com/gpu",
            "bf16",
            "fp32",
            True,
            False,
            1e308,
            0.0,
        ]
    ),
    st.text(max_size=30),
)

# Paths of the operator's own container: it must never open any of them.
OWN_PATHS = st.sampled_from(
    [
        "/proc/self/pagemap",
        "/proc/self/environ",
        "/dev/zero",
        "/dev/urandom",
        "/etc/passwd",
        "/var/run/secrets/kubernetes.io/serviceaccount/token",
        "/",
        "/proc/kcore",
        "relative/../x",
    ]
)

# --- pod templates ---------------------------------------------------------------------------

TEMPLATE_SHAPES: list[Any] = [
    {"spec": "x"},
    {"spec": None},
    {"spec": {"securityContext": None}},
    {"spec": {"securityContext": "root"}},
    {"spec": {"containers": "trainer"}},
    {"spec": {"containers": [None]}},
    {"spec": {"containers": [{"name": "trainer", "image": 5}]}},
    {"spec": {"containers": [{"name": "trainer", "env": "A=B"}]}},
    {"spec": {"containers": [{"name": "trainer", "resources": {"limits": {"cpu": 1e308}}}]}},
    {"spec": {"containers": [{"name": "trainer", "securityContext": {"privileged": True}}]}},
    {"spec": {"containers": [{"name": "side", "image": "busybox", "securityContext": None}]}},
    {"spec": {"initContainers": [{"name": "init", "image": "busybox"}]}},
    {"spec": {"hostNetwork": True, "hostPID": True, "hostIPC": True}},
    {"spec": {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}},
    {"spec": {"nodeName": "some-node"}},
    {"spec": {"serviceAccountName": "default", "automountServiceAccountToken": True}},
    {"spec": {"tolerations": "all"}},
    {"metadata": "x"},
    {"metadata": {"labels": {names.LABEL_JOB: "someone-else", names.LABEL_MANAGED_BY: "me"}}},
    {"metadata": {"annotations": {names.ANNOTATION_RANKS: "0-999"}}},
    {"metadata": {"labels": {"a": 1.5, "b": None}}},
    [],
    "template",
    # deep where the schema has no field (pruned) and where it has one (refused)
    {"spec": {"containers": [{"name": "side", "image": "busybox", "x": deep(3_000)}]}},
    {"spec": {"nodeSelector": deep(1_001)}, "status": deep(3_000)},
    {"metadata": {"labels": deep(3_000)}},
    # big: a megabyte of environment, and annotations past what a pod may carry
    {
        "spec": {
            "containers": [
                {
                    "name": "side",
                    "image": "busybox",
                    "env": [{"name": f"V{i}", "value": "x" * 1_000} for i in range(1_000)],
                }
            ]
        }
    },
    {"metadata": {"annotations": {"big": "x" * 300_000}}},
]
TEMPLATES = st.one_of(
    st.sampled_from(TEMPLATE_SHAPES),
    NESTED,
    st.dictionaries(st.sampled_from(["spec", "metadata", "status"]), NESTED, max_size=2),
    DEEP.map(lambda value: {"spec": value}),
)

# --- whole specs -----------------------------------------------------------------------------

PATHS = [
    ("image",),
    ("command",),
    ("args",),
    ("resources", "numNodes"),
    ("resources", "numProcPerNode"),
    ("resources", "accelerator"),
    ("resources", "acceleratorMemoryGiB"),
    ("strategy", "type"),
    ("strategy", "tensorParallel"),
    ("strategy", "pipelineParallel"),
    ("strategy", "zeroStage"),
    ("model", "preset"),
    ("model", "layers"),
    ("model", "hidden"),
    ("model", "hf"),
    ("training", "steps"),
    ("training", "globalBatchSize"),
    ("training", "microBatchSize"),
    ("training", "learningRate"),
    ("training", "optimizer", "betas"),
    ("training", "checkpoint", "volume"),
    ("runPolicy", "backoffLimit"),
    ("runPolicy", "podFailurePolicy"),
    ("runPolicy", "activeDeadlineSeconds"),
    ("scheduling", "schedulerName"),
    ("scheduling", "topologyKey"),
    ("scheduling", "gang"),
    ("unknownField",),
    ("training", "unknownField"),
]
FILE_FIELDS = [
    ("model", "hf", "path"),
    ("training", "data", "path"),
    ("training", "data", "validation", "path"),
    ("training", "export", "path"),
]


def base_spec() -> dict[str, Any]:
    """A job the operator runs as it is: one CPU pod on the fake nodes, a tiny model."""
    return {
        "image": "meshrun/trainer:test",
        "resources": {"numNodes": 1, "numProcPerNode": 1, "accelerator": "cpu"},
        "strategy": {"type": "ddp"},
        "model": {"preset": "tiny"},
        "training": {"steps": 5, "globalBatchSize": 2, "microBatchSize": 1},
    }


def put(spec: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = spec
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    node[path[-1]] = value


# Values the schema and its rules admit, each for a field no rule ties to another: a job made
# of these always reaches the operator, whatever the draws. (Hypothesis also draws constants
# from the local modules already imported, so the same derandomized test draws other values
# in an xdist worker that imported the whole suite than alone: how many of the hostile specs
# the API server admits is not a number to count on.)
ADMITTED = {
    ("resources", "numNodes"): st.integers(min_value=1, max_value=4),
    ("resources", "numProcPerNode"): st.integers(min_value=1, max_value=64),
    ("resources", "acceleratorMemoryGiB"): st.integers(min_value=1, max_value=4096),
    ("strategy", "type"): st.sampled_from(["auto", "ddp", "pipeline", "tensor", "hybrid"]),
    ("model", "preset"): st.sampled_from(["tiny", "small", "1b", "70b", "moe-small"]),
    ("training", "steps"): st.integers(min_value=1, max_value=2**31 - 1),
    ("training", "learningRate"): st.floats(min_value=1e-300, max_value=1e300),
    ("runPolicy", "backoffLimit"): st.integers(min_value=0, max_value=2**31 - 1),
    ("runPolicy", "activeDeadlineSeconds"): st.integers(min_value=1, max_value=2**62),
    ("scheduling", "schedulerName"): st.text(max_size=60),
    ("scheduling", "topologyKey"): st.text(max_size=60),
    ("scheduling", "gang"): st.booleans(),
}


@st.composite
def admitted_jobs(draw: st.DrawFn) -> tuple[str, dict[str, Any], bool]:
    """A job the API server admits: the base with odd but admitted values."""
    name = draw(st.from_regex(r"\Aok-[a-z0-9]{1,20}\Z"))
    spec = base_spec()
    for path in draw(st.lists(st.sampled_from(sorted(ADMITTED)), min_size=1, max_size=3)):
        put(spec, path, draw(ADMITTED[path]))
    return name, spec, True


@st.composite
def jobs(draw: st.DrawFn) -> tuple[str, dict[str, Any], bool]:
    """A job's name, its spec, and whether the API server must admit it: one in three is
    admitted as sent, the rest are the base with a few hostile edits."""
    if draw(st.sampled_from([False, False, True])):
        return draw(admitted_jobs())
    # hypothesis leans towards the first choice of a one_of: the usual case comes first
    kind = draw(st.sampled_from(["dns", "dns", "dns", "dns", "taken", "unicode"]))
    if kind == "dns":
        name = draw(st.from_regex(r"\A[a-z][a-z0-9-]{0,30}[a-z0-9]\Z"))
    elif kind == "taken":
        name = draw(st.sampled_from(TAKEN_NAMES))
    else:  # unicode, uppercase, too long: the API server says no
        name = draw(st.text(min_size=1, max_size=70))
    spec = base_spec()
    for path in draw(st.lists(st.sampled_from(PATHS), max_size=3)):
        put(spec, path, draw(st.one_of(PLAUSIBLE, PLAUSIBLE, HOSTILE)))
    if draw(st.booleans()):
        put(spec, draw(st.sampled_from(FILE_FIELDS)), draw(st.one_of(OWN_PATHS, STRINGS)))
        if spec["training"].get("data") and draw(st.booleans()):
            spec["training"]["data"]["format"] = draw(
                st.sampled_from(["jsonl", "parquet", "arrow", "tokens"])
            )
    if draw(st.sampled_from([False, False, True])):  # most malformed ones never reach the operator
        spec["podTemplate"] = draw(TEMPLATES)
    if draw(st.sampled_from([False] * 19 + [True])):
        spec = draw(NESTED)  # not even an object, now and then
    return name, spec, False


def children(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return list(value.values())
    return value if isinstance(value, list) else []


def has_non_finite(value: Any) -> bool:
    """Without recursion: a spec may nest 3,000 levels."""
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return True
        todo.extend(children(item))
    return False


def nesting(value: Any) -> int:
    """How deep ``value`` nests, without recursion."""
    deepest, todo = 0, [(value, 0)]
    while todo:
        item, level = todo.pop()
        deepest = max(deepest, level)
        todo.extend((child, level + 1) for child in children(item))
    return deepest


def huge_gang(spec: Any) -> bool:
    """The spec asks for more pods than the operator makes for one job."""
    resources = spec.get("resources") if isinstance(spec, dict) else None
    nodes = resources.get("numNodes") if isinstance(resources, dict) else None
    return type(nodes) is int and nodes > MAX_PODS


# --- the test --------------------------------------------------------------------------------


def snapshot(cluster: Cluster) -> dict[str, tuple[str, str]]:
    """kind/name -> (uid, resourceVersion) of every bystander."""
    seen = {}
    for obj in bystanders(cluster.ns):
        kind, name = obj["kind"].lower(), obj["metadata"]["name"]
        out = cluster.kubectl("get", kind, name, "-n", cluster.ns, "-o", "json", check=False)
        if out.returncode == 0:
            meta = json.loads(out.stdout)["metadata"]
            seen[f"{kind}/{name}"] = (meta["uid"], meta["resourceVersion"])
    return seen


def verdict(job: dict[str, Any]) -> str | None:
    """How the operator judged an accepted job, or None while it has not yet."""
    status = job.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    invalid = conditions.get("Invalid")
    if invalid and invalid.get("status") == "True":
        message = str(invalid.get("message", ""))
        assert "spec" in message, f"Invalid without the field named: {message!r}"
        return "invalid"
    if any(c.get("reason") == "NameConflict" for c in conditions.values()):
        return "conflict"
    refused = conditions.get("CreationRefused")
    if refused and refused.get("status") == "True":
        # the API server refused the pods the template makes: the job must say which field
        message = str(refused.get("message", ""))
        assert "spec" in message, f"CreationRefused without the field named: {message!r}"
        return "refused"
    phase = status.get("phase")
    if phase in ("Pending", "Running", "Succeeded", "Restarting", "Suspended"):
        return "runs"
    if phase == "Failed" and any(
        c.get("reason") == "DeadlineExceeded" for c in conditions.values()
    ):  # a deadline of a second or two, as sent
        return "deadline"
    if phase == "Failed":
        return f"failed: {[(c.get('reason'), c.get('message')) for c in conditions.values()]}"
    return None


def test_hostile_specs_never_break_the_operator_or_touch_what_it_does_not_own(
    cluster: Cluster, operator_at_chart_limit: OperatorProcess, api_client: Any
) -> None:
    from kubernetes import client

    for obj in bystanders(cluster.ns):
        cluster.apply(obj)
    before = snapshot(cluster)
    assert len(before) == len(TAKEN_NAMES)
    operator = operator_at_chart_limit  # in a memory cgroup of the chart's limit
    assert operator.cgroup is not None
    pid = operator.proc.pid if operator.proc else None
    custom = client.CustomObjectsApi(api_client)
    sent: list[tuple[str, bool]] = []  # name, accepted
    accepted: set[str] = set()  # the jobs that exist now
    huge: set[str] = set()  # the accepted jobs that ask for more pods than the cap
    deep_sent: list[bool] = []  # accepted or not, for each spec nested past 1,000 levels
    refused_admissible: list[str] = []  # jobs the schema admits that the API server refused

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(jobs())
    def apply_one(job: tuple[str, dict[str, Any], bool]) -> None:
        name, spec, admissible = job
        if name in accepted:
            custom.delete_namespaced_custom_object(GROUP, VERSION, cluster.ns, PLURAL, name)
            wait_for(
                lambda: (
                    cluster.kubectl("get", PLURAL, name, "-n", cluster.ns, check=False).returncode
                    != 0
                ),
                60,
                f"{name} gone",
            )
            accepted.discard(name)
            huge.discard(name)
        ok = create(custom, cluster.ns, name, spec)
        sent.append((name, ok))
        if admissible and not ok:
            refused_admissible.append(name)
        if nesting(spec) > 1_000:
            deep_sent.append(ok)
        if ok:
            accepted.add(name)
            assert not has_non_finite(spec), "the API server accepted a non-finite number"
            if huge_gang(spec):
                huge.add(name)

    apply_one()
    # gangs the operator must not build: just past its cap, and the most the CRD admits
    for name, pods in (("huge-past-cap", MAX_PODS + 1), ("huge-most", 65_536)):
        spec = base_spec()
        spec["resources"]["numNodes"] = spec["training"]["globalBatchSize"] = pods
        assert create(custom, cluster.ns, name, spec), name
        accepted.add(name)
        huge.add(name)
    # and one past 1,000 levels every run sends, where the schema has no field: pruned, so the
    # API server stores it and the operator judges what is left (the drawn ones may all land
    # where the schema types them, and be refused)
    spec = base_spec()
    spec["podTemplate"] = {
        "spec": {"containers": [{"name": "side", "image": "busybox", "x": deep(3_000)}]}
    }
    deep_sent.append(create(custom, cluster.ns, "deep-pruned", spec))
    assert deep_sent[-1], "a template nested 3,000 levels under an unknown key was refused"
    accepted.add("deep-pruned")
    assert len(sent) >= EXAMPLES, f"only {len(sent)} specs were generated"
    assert not refused_admissible, f"jobs the schema admits were refused: {refused_admissible}"
    reached = sum(ok for _, ok in sent)
    assert reached >= 75, f"only {reached} of {len(sent)} specs reached the operator"

    def judged() -> dict[str, str] | None:
        out = cluster.kubectl("get", PLURAL, "-n", cluster.ns, "-o", "json").stdout
        items = {j["metadata"]["name"]: j for j in json.loads(out)["items"]}
        result = {name: verdict(items[name]) for name in accepted if name in items}
        return None if None in result.values() else result  # type: ignore[return-value]

    def unjudged() -> dict[str, Any]:
        out = cluster.kubectl("get", PLURAL, "-n", cluster.ns, "-o", "json").stdout
        items = {j["metadata"]["name"]: j for j in json.loads(out)["items"]}
        return {
            name: {
                "status": {
                    k: v for k, v in (items[name].get("status") or {}).items() if k != "plan"
                },
                "spec": json.dumps(items[name].get("spec"))[:600],
            }
            for name in accepted
            if name in items and verdict(items[name]) is None
        }

    results = wait_for(
        judged, 240, "every accepted job judged by the operator", interval=2, describe=unjudged
    )
    wrong = {name: v for name, v in results.items() if v.startswith("failed")}
    assert not wrong, f"jobs that neither ran nor were Invalid: {wrong}"
    built = {name: results[name] for name in huge if results[name] not in ("invalid", "conflict")}
    assert not built, f"gangs past --max-pods-per-job {MAX_PODS} were not refused: {built}"
    for name in ("huge-past-cap", "huge-most"):
        job = json.loads(
            cluster.kubectl("get", PLURAL, name, "-n", cluster.ns, "-o", "json").stdout
        )
        invalid = next(c for c in job["status"]["conditions"] if c["type"] == "Invalid")
        assert invalid["message"].startswith("spec.resources.numNodes"), invalid
        assert not cluster.kubectl(
            "get", "pods", "-n", cluster.ns, "-l", names.selector(name), "-o", "name"
        ).stdout.strip(), f"{name} has pods"
    for name in {BYSTANDER_SERVICE, BYSTANDER_POLICY, BYSTANDER_POD_JOB} & set(results):
        assert results[name] in ("conflict", "invalid"), f"{name} took a name someone owns"
    assert operator.cgroup.oom_kills() == 0, f"killed past {operator.cgroup.limit} bytes"
    assert operator.proc is not None and operator.proc.poll() is None, operator.log_tail()
    assert operator.proc.pid == pid
    log = operator.log_path.read_text(errors="replace")
    assert "Traceback" not in log, operator.log_tail(120)
    assert snapshot(cluster) == before, "a bystander was changed or deleted"
    # the impostor pod was never adopted or relabelled
    impostor = json.loads(
        cluster.kubectl(
            "get", "pod", f"{BYSTANDER_POD_JOB}-0", "-n", cluster.ns, "-o", "json"
        ).stdout
    )
    assert not impostor["metadata"].get("ownerReferences")
    print(
        f"operator's peak {operator.cgroup.peak() / 2**20:.0f} MiB of its "
        f"{operator.cgroup.limit / 2**20:.0f} MiB limit; "
        f"sent {len(sent)} specs ({len(deep_sent)} past 1,000 levels, {sum(deep_sent)} of them "
        f"accepted and pruned), {reached} reached the operator, {len(accepted)} still there at the "
        f"end, {len(huge)} past the pod cap; "
        "verdicts: "
        f"{ {v: list(results.values()).count(v) for v in set(results.values())} }"
    )


def create(custom: Any, namespace: str, name: str, spec: Any) -> bool:
    """Create the job as a client would send it (NaN and Infinity go out as written); False
    when the API server refuses it."""
    from kubernetes.client.exceptions import ApiException

    job = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": spec,
    }
    limit = sys.getrecursionlimit()
    # the client serialises recursively: a 3,000-level spec needs more frames than the default
    sys.setrecursionlimit(max(limit, 20_000))
    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job)
    except ApiException as exc:
        assert exc.status is not None and 400 <= exc.status < 500, f"{exc.status}: {exc.body}"
        return False
    except ValueError:  # the client itself refuses some values (a name it cannot put in a URL)
        return False
    finally:
        sys.setrecursionlimit(limit)
    return True

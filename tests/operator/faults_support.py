"""Helpers of the fault tests: what every fault test asserts at the end, and nodes whose kubelet
can die (a KWOK controller of the test's own, which the test can freeze)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from meshrun_operator import names
from operator_harness import Cluster, Kubectl, fake_node
from waiting import wait_for

from meshrun.api.crd import PLURAL

ROOT = Path(__file__).resolve().parents[2]
KWOK = ROOT / ".cluster" / "bin" / "kwok"
STAGES = ROOT / "hack" / "kwok" / "stages.yaml"


def one_pod_per_index(cluster: Cluster, job: str, count: int, attempt: int) -> list[dict[str, Any]]:
    """The job's live pods: exactly one per index, all of ``attempt``, owned by the job."""
    pods = cluster.live_pods(job)
    labels = [p["metadata"]["labels"] for p in pods]
    indices = sorted(int(lab[names.LABEL_POD_INDEX]) for lab in labels)
    assert indices == list(range(count)), f"pod indices {indices}"
    assert {lab[names.LABEL_ATTEMPT] for lab in labels} == {str(attempt)}
    uid = cluster.job(job)["metadata"]["uid"]
    for pod in pods:
        owners = [o["uid"] for o in pod["metadata"].get("ownerReferences") or [] if o["controller"]]
        assert owners == [uid], f"{pod['metadata']['name']} is owned by {owners}, not {uid}"
    return pods


def deleted_leaves_nothing(cluster: Cluster, job: str) -> None:
    """Delete the job; no pod and no Service of it may be left."""
    cluster.kubectl("delete", PLURAL, job, "-n", cluster.ns, "--wait=true", "--timeout=60s")

    def nothing_left() -> bool:
        service = cluster.kubectl("get", "service", job, "-n", cluster.ns, check=False)
        return not cluster.pods(job) and service.returncode != 0

    wait_for(
        nothing_left,
        60,
        f"no pod and no Service of job {job} after its deletion",
        describe=lambda: [p["metadata"]["name"] for p in cluster.pods(job)],
    )


def events_of(cluster: Cluster, job: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in cluster.events(job) if e["reason"] == reason]


class FreezableNode:
    """A fake GPU node run by a KWOK controller of its own (``--manage-single-node``).

    ``down()`` makes it report NotReady; ``freeze()`` kills its controller: nothing answers for
    the node any more, as when a kubelet dies or is cut off, so a graceful pod deletion is never
    confirmed. ``thaw()`` starts a new controller (a kubelet that comes back lists its pods
    afresh) and ``up()`` makes the node Ready again.
    """

    def __init__(self, kubectl: Kubectl, kubeconfig: str, name: str, log: Path) -> None:
        self.kubectl, self.kubeconfig, self.name = kubectl, kubeconfig, name
        node = fake_node(name)
        del node["metadata"]["annotations"]["kwok.x-k8s.io/node"]  # not the shared controller's
        kubectl("apply", "-f", "-", input=json.dumps(node))
        self.log = log.open("ab")
        self.proc: subprocess.Popen[bytes] | None = None
        self.thaw()
        self.wait_ready(True)

    def ready(self) -> bool:
        path = "jsonpath={.status.conditions[?(@.type=='Ready')].status}"
        return self.kubectl("get", "node", self.name, "-o", path).stdout.strip() == "True"

    def wait_ready(self, ready: bool) -> None:
        state = "Ready" if ready else "NotReady"
        wait_for(lambda: self.ready() == ready, 60, f"node {self.name} {state}")

    def down(self) -> None:
        self.kubectl("annotate", "node", self.name, "sim.meshrun.dev/node-down=true")
        self.wait_ready(False)

    def up(self) -> None:
        self.kubectl("annotate", "node", self.name, "sim.meshrun.dev/node-down-")
        self.wait_ready(True)

    def freeze(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=20)
            self.proc = None

    def thaw(self) -> None:
        if self.proc is not None:
            return
        self.proc = subprocess.Popen(
            [
                str(KWOK),
                "--kubeconfig",
                self.kubeconfig,
                "--manage-single-node",
                self.name,
                "--config",
                str(STAGES),
                "--server-address",
                "127.0.0.1:0",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def close(self) -> None:
        self.freeze()
        self.log.close()
        self.kubectl("delete", "node", self.name, "--wait=false", check=False)


def wait_condition(cluster: Cluster, job: str, kind: str, **fields: str) -> dict[str, Any]:
    """Wait until the job's ``kind`` condition has ``fields`` (status defaults to True)."""
    want = {"status": "True", **fields}
    found: dict[str, Any] = wait_for(
        lambda: (
            (c := cluster.condition(job, kind))
            and all(c.get(k) == v for k, v in want.items())
            and c
        ),
        60,
        f"condition {kind} {want} on job {job}",
        describe=lambda: cluster.condition(job, kind),
    )
    return found


def merge_patch(
    cluster: Cluster, kind: str, name: str, patch: dict[str, Any], *subresource: str
) -> None:
    """``kubectl patch --type=merge`` of an object in the test's namespace (``subresource``:
    e.g. ``--subresource=status``)."""
    body = json.dumps(patch)
    cluster.kubectl("patch", kind, name, "-n", cluster.ns, *subresource, "--type=merge", "-p", body)

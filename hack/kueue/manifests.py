#!/usr/bin/env python3
"""Rewrite Kueue's release manifests (read from its Go module) for a manager on the host.

kubectl turns the module's YAML into JSON on stdin (one object after another, or a List); this
prints the List to apply:

  manifests.py crds KUSTOMIZATION URL CA_FILE      the CRDs; those whose conversion webhook
                                                   the kustomization enables call URL/convert
  manifests.py webhooks URL CA_FILE                the two webhook configurations, pointed at
                                                   URL, keeping only what this cluster runs

In a cluster Kueue's webhooks sit behind a Service; here the manager listens on 127.0.0.1, so
each clientConfig becomes a URL with the CA bundle of the certificate up.sh made. Only the
webhooks of Kueue's own objects and of the batch/job integration are kept: the manager serves
every other integration's path as a no-op, but a `failurePolicy: Fail` webhook on pods or
Deployments would make every pod creation in the cluster depend on this one process. The
batch/job webhooks only see Jobs that name a queue. Standard library only.
"""

from __future__ import annotations

import base64
import json
import re
import sys
from pathlib import Path
from typing import Any

KUEUE_GROUP = "kueue.x-k8s.io"
# The integrations the local Configuration enables (integrations.frameworks).
INTEGRATION_GROUPS = {"batch"}
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# Kueue's own release renames the configurations with its kustomize namePrefix "kueue-".
NAME_PREFIX = "kueue-"
SYSTEM_NAMESPACES = ["kube-system", "kueue-system"]


def ca_bundle(path: str) -> str:
    return base64.b64encode(Path(path).read_bytes()).decode()


def conversion_crds(kustomization: str) -> set[str]:
    """CRDs whose `patches/webhook_in_<plural>.yaml` line is active (not commented out)."""
    text = Path(kustomization).read_text()
    plurals = re.findall(r"^- path: patches/webhook_in_([a-z]+)\.yaml\s*$", text, re.MULTILINE)
    return {f"{plural}.{KUEUE_GROUP}" for plural in plurals}


def crds(items: list[dict[str, Any]], kustomization: str, url: str, ca: str) -> None:
    convert = conversion_crds(kustomization)
    for crd in items:
        if crd["metadata"]["name"] in convert:
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": {"url": f"{url}/convert", "caBundle": ca},
                    "conversionReviewVersions": ["v1"],
                },
            }


def _groups(webhook: dict[str, Any]) -> set[str]:
    return {group for rule in webhook.get("rules", []) for group in rule.get("apiGroups", [])}


def webhooks(items: list[dict[str, Any]], url: str, ca: str) -> None:
    for config in items:
        config["metadata"]["name"] = NAME_PREFIX + config["metadata"]["name"]
        kept = []
        for webhook in config.get("webhooks", []):
            groups = _groups(webhook)
            if not groups <= {KUEUE_GROUP, *INTEGRATION_GROUPS}:
                continue
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = {"url": url + path, "caBundle": ca}
            webhook["namespaceSelector"] = {
                "matchExpressions": [
                    {
                        "key": "kubernetes.io/metadata.name",
                        "operator": "NotIn",
                        "values": SYSTEM_NAMESPACES,
                    }
                ]
            }
            if KUEUE_GROUP not in groups:
                # manageJobsWithoutQueueName is false: a Job without a queue is not Kueue's.
                webhook["objectSelector"] = {
                    "matchExpressions": [{"key": QUEUE_LABEL, "operator": "Exists"}]
                }
            kept.append(webhook)
        config["webhooks"] = kept


def read_objects(text: str) -> list[dict[str, Any]]:
    """Every object of a stream of JSON documents, Lists unpacked."""
    decoder, items, position = json.JSONDecoder(), [], 0
    while position < len(text):
        if text[position].isspace():
            position += 1
            continue
        doc, position = decoder.raw_decode(text, position)
        items.extend(doc.get("items", [doc]) if doc.get("kind") == "List" else [doc])
    return items


def main(argv: list[str]) -> int:
    items = read_objects(sys.stdin.read())
    if len(argv) == 5 and argv[1] == "crds":
        crds(items, argv[2], argv[3], ca_bundle(argv[4]))
    elif len(argv) == 4 and argv[1] == "webhooks":
        webhooks(items, argv[2], ca_bundle(argv[3]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    json.dump({"apiVersion": "v1", "kind": "List", "items": items}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env bash
# Checks that generated or copied files are in sync with their source of truth.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
status=0

# The chart and the Python package ship copies of crds/ (hack/sync-crds.sh writes them).
"$ROOT/hack/sync-crds.sh" --check || status=1

# spec.podTemplate is Kubernetes' PodTemplateSpec of KUBE_VERSION (hack/podtemplate_schema.py
# writes it from the OpenAPI in the Go module cache, where hack/build-tools.sh kube puts it).
if command -v go >/dev/null; then
  python3 "$ROOT/hack/podtemplate_schema.py" --check --cached-only || status=1
else
  echo "verify: no go on PATH; spec.podTemplate's schema not checked" >&2
fi

# Shell scripts parse.
for f in "$ROOT"/hack/*.sh "$ROOT"/.ci/run; do
  bash -n "$f" || { echo "verify: $f does not parse" >&2; status=1; }
done
((status == 0)) && echo "verify: ok"
exit $status

#!/usr/bin/env bash
# Checks that generated or copied files are in sync with their source of truth.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
status=0

# The Helm chart ships a copy of crds/ (hack/sync-chart-crds.sh writes it).
chart_crds=$ROOT/helm/meshrun/crds
if [[ -d $chart_crds ]]; then
  if ! diff -r "$ROOT/crds" "$chart_crds" >/dev/null; then
    echo "verify: helm/meshrun/crds differs from crds/; run hack/sync-chart-crds.sh" >&2
    diff -r "$ROOT/crds" "$chart_crds" | head -20 >&2 || true
    status=1
  fi
fi

# Shell scripts parse.
for f in "$ROOT"/hack/*.sh "$ROOT"/.ci/run; do
  bash -n "$f" || { echo "verify: $f does not parse" >&2; status=1; }
done
((status == 0)) && echo "verify: ok"
exit $status

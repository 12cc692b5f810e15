#!/usr/bin/env bash
# Checks that generated or copied files are in sync with their source of truth.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
status=0

# The chart and the Python package ship copies of crds/ (hack/sync-crds.sh writes them).
"$ROOT/hack/sync-crds.sh" --check || status=1

# Shell scripts parse.
for f in "$ROOT"/hack/*.sh "$ROOT"/.ci/run; do
  bash -n "$f" || { echo "verify: $f does not parse" >&2; status=1; }
done
((status == 0)) && echo "verify: ok"
exit $status

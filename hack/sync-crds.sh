#!/usr/bin/env bash
# crds/ is the single source of truth for the API. Two copies ship elsewhere:
#   helm/meshrun/crds/  byte for byte: the chart (Helm installs crds/ before the templates and
#                       never upgrades or deletes them, see docs/install.md, "Upgrading"), and
#   meshrun/data/       the same objects as JSON: the Python package, so an installed `meshrun`
#                       reads the CRD's defaults (JSON because every process that evaluates a job
#                       parses it: meshrun/api/crd.py says what YAML cost).
# Run this after editing a CRD. `hack/sync-crds.sh --check` changes nothing and fails when a copy
# differs; hack/verify.sh (`make verify`) runs it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
src=$ROOT/crds
chart=$ROOT/helm/meshrun/crds
package=$ROOT/meshrun/data
PY=$ROOT/.venv/bin/python
[[ -x $PY ]] || PY=python3
check=0
[[ ${1:-} == --check ]] && check=1

# as_json SOURCE: the YAML file's one document as compact JSON (key order kept), one line.
as_json() {
  "$PY" -c 'import json, sys, yaml
with open(sys.argv[1], encoding="utf-8") as f:
    print(json.dumps(yaml.safe_load(f), separators=(",", ":"), ensure_ascii=False))' "$1"
}

# orphans: the copies without a source in crds/ (and any YAML left in the package's folder).
orphans() {
  local f name
  for f in "$chart"/*.yaml; do
    [[ -e $f && ! -e $src/$(basename "$f") ]] && echo "$f"
  done
  for f in "$package"/*.json; do
    name=$(basename "$f" .json)
    [[ -e $f && ! -e $src/$name.yaml ]] && echo "$f"
  done
  for f in "$package"/*.yaml; do
    [[ -e $f ]] && echo "$f"
  done
  return 0
}

status=0
if ((check)); then
  for f in "$src"/*.yaml; do
    name=$(basename "$f")
    if ! cmp -s "$f" "$chart/$name"; then
      echo "sync-crds: helm/meshrun/crds/$name differs from crds/; run hack/sync-crds.sh" >&2
      status=1
    fi
    rendered=$(as_json "$f")
    if ! cmp -s <(printf '%s\n' "$rendered") "$package/${name%.yaml}.json"; then
      echo "sync-crds: meshrun/data/${name%.yaml}.json differs from crds/$name; run hack/sync-crds.sh" >&2
      status=1
    fi
  done
  for f in $(orphans); do
    echo "sync-crds: ${f#"$ROOT"/} has no source in crds/" >&2
    status=1
  done
  exit $status
fi

mkdir -p "$chart" "$package"
# Remove copies whose source is gone, so a deleted CRD does not linger.
for f in $(orphans); do rm -f "$f"; done
for f in "$src"/*.yaml; do
  name=$(basename "$f")
  cp "$f" "$chart/"
  as_json "$f" >"$package/${name%.yaml}.json"
done
echo "synced $(ls "$src"/*.yaml | wc -l) CRD file(s) into helm/meshrun/crds and meshrun/data"

#!/usr/bin/env bash
# crds/ is the single source of truth for the API. Two byte-for-byte copies ship elsewhere:
#   helm/meshrun/crds/  the chart (Helm installs crds/ before the templates and never upgrades or
#                       deletes them, see docs/install.md, "Upgrading"), and
#   meshrun/data/       the Python package, so an installed `meshrun` reads the CRD's defaults.
# Run this after editing a CRD. `hack/sync-crds.sh --check` changes nothing and fails when a copy
# differs; hack/verify.sh (`make verify`) runs it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
src=$ROOT/crds
targets=("$ROOT/helm/meshrun/crds" "$ROOT/meshrun/data")
check=0
[[ ${1:-} == --check ]] && check=1

status=0
for dst in "${targets[@]}"; do
  if ((check)); then
    for f in "$src"/*.yaml; do
      if ! cmp -s "$f" "$dst/$(basename "$f")"; then
        echo "sync-crds: ${dst#"$ROOT"/}/$(basename "$f") differs from crds/; run hack/sync-crds.sh" >&2
        status=1
      fi
    done
    for f in "$dst"/*.yaml; do
      [[ -e $f && ! -e $src/$(basename "$f") ]] || continue
      echo "sync-crds: ${dst#"$ROOT"/}/$(basename "$f") has no source in crds/" >&2
      status=1
    done
    continue
  fi
  mkdir -p "$dst"
  # Remove copies whose source is gone, so a deleted CRD does not linger.
  for f in "$dst"/*.yaml; do
    [[ -e $f ]] || continue
    [[ -e $src/$(basename "$f") ]] || rm -f "$f"
  done
  cp "$src"/*.yaml "$dst"/
  echo "synced $(ls "$src"/*.yaml | wc -l) CRD file(s) into ${dst#"$ROOT"/}"
done
exit $status

#!/usr/bin/env bash
# Copies crds/ (the single source of truth) into the Helm chart's crds/ folder, byte for byte.
# hack/verify.sh (`make verify`) fails when the two differ, so run this after editing a CRD.
# Helm installs crds/ before the templates and never upgrades or deletes them (see
# docs/install.md, "Upgrading"), which is why the chart ships a copy instead of templates.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
src=$ROOT/crds
dst=$ROOT/helm/meshrun/crds
mkdir -p "$dst"
# Remove copies whose source is gone, so a deleted CRD does not linger in the chart.
for f in "$dst"/*.yaml; do
  [[ -e $f ]] || continue
  [[ -e $src/$(basename "$f") ]] || rm -f "$f"
done
cp "$src"/*.yaml "$dst"/
echo "synced $(ls "$src"/*.yaml | wc -l) CRD file(s) into ${dst#"$ROOT"/}"

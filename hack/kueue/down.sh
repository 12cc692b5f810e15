#!/usr/bin/env bash
# Remove Kueue from the local cluster (hack/cluster.sh down calls this): the webhook
# configurations first (with the manager gone they would refuse every Kueue object, and Jobs
# that name a queue), then the manager process and its state. The CRDs and the Kueue objects
# stay, so hack/kueue/up.sh brings back the same queues.
set -euo pipefail
source "$(dirname "$0")/common.sh"

if api_up; then
  kc delete mutatingwebhookconfiguration "$MUTATING_WEBHOOK" --ignore-not-found >/dev/null 2>&1 || true
  kc delete validatingwebhookconfiguration "$VALIDATING_WEBHOOK" --ignore-not-found >/dev/null 2>&1 || true
fi
if kueue_alive; then
  stop_kueue
  log "Kueue manager stopped"
fi
rm -rf "$KQ"

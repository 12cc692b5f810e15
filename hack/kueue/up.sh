#!/usr/bin/env bash
# Add Kueue to the running local cluster (hack/cluster.sh up calls this when KUEUE=1): its CRDs
# and webhook configurations read from the Kueue Go module, and its manager as a plain process
# of this machine with self-signed webhook certificates. Idempotent: a manager already serving
# this cluster with the same configuration is left alone; the manifests are re-applied.
#
#   hack/kueue/up.sh        (needs a running cluster: hack/cluster.sh up)
set -euo pipefail
source "$(dirname "$0")/common.sh"
t0=$SECONDS

api_up || die "no cluster at $STATE: run hack/cluster.sh up first"
"$ROOT/hack/build-tools.sh" kueue
[[ -x $BIN/kueue ]] || die "missing $BIN/kueue (hack/build-tools.sh kueue)"
mkdir -p "$KQ/certs"

# The module's manifests, from the Go module cache (downloaded once, checksummed by go).
MODULE_DIR=$(GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
CRD_DIR=$MODULE_DIR/config/components/crd

# ---- certificates: a CA and a serving certificate for 127.0.0.1, made once per cluster folder
certs() {
  local d=$KQ/certs
  [[ -s $d/tls.crt && -s $d/tls.key && -s $d/ca.crt ]] && return 0
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=meshrun-local-kueue-ca" \
    -keyout "$d/ca.key" -out "$d/ca.crt" 2>/dev/null
  openssl req -new -newkey rsa:2048 -nodes -subj "/CN=kueue-webhook" \
    -keyout "$d/tls.key" -out "$d/tls.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >"$d/ext.cnf"
  openssl x509 -req -in "$d/tls.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
    -days 3650 -extfile "$d/ext.cnf" -out "$d/tls.crt" 2>/dev/null
  log "made the webhook certificate (CA $d/ca.crt)"
}
certs
if ! [[ -s $METRICS_CERT_DIR/tls.crt && -s $METRICS_CERT_DIR/tls.key ]]; then
  mkdir -p "$METRICS_CERT_DIR"
  cp "$KQ/certs/tls.crt" "$KQ/certs/tls.key" "$METRICS_CERT_DIR/"
fi

# ---- configuration: the same text for the same ports, so a running manager can be kept
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
render_config() {  # WEBHOOK_PORT HEALTH_PORT
  sed -e "s|@WEBHOOK_PORT@|$1|" -e "s|@HEALTH_PORT@|$2|" -e "s|@CERT_DIR@|$KQ/certs|" \
    -e "s|@NAMESPACE@|$KUEUE_NAMESPACE|" "$ROOT/hack/kueue/config.yaml"
}
cluster_uid=$(kc get namespace kube-system -o jsonpath='{.metadata.uid}')
identity="$cluster_uid $(readlink -f "$BIN/kueue")"
keep=0
if kueue_alive && [[ -s $KQ/ports && $(cat "$KQ/identity" 2>/dev/null) == "$identity" ]]; then
  read -r webhook_port health_port <"$KQ/ports"
  [[ $(render_config "$webhook_port" "$health_port") == "$(cat "$KQ/config.yaml")" ]] && keep=1
fi
if ((!keep)); then
  stop_kueue
  webhook_port=$(free_port) health_port=$(free_port)
  while [[ $health_port == "$webhook_port" ]]; do health_port=$(free_port); done
  echo "$webhook_port $health_port" >"$KQ/ports"
  render_config "$webhook_port" "$health_port" >"$KQ/config.yaml"
fi
URL=https://127.0.0.1:$webhook_port

# ---- CRDs (conversion webhooks pointed at the manager), then the manager, then its webhooks:
# in this order no request ever reaches a webhook that is not listening yet.
kc create --dry-run=client -o json -f "$CRD_DIR/bases" \
  | python3 "$ROOT/hack/kueue/manifests.py" crds "$CRD_DIR/kustomization.yaml" "$URL" "$KQ/certs/ca.crt" \
  | kc apply --server-side --force-conflicts -f - >/dev/null
# `kubectl wait` errors out (instead of waiting) on a CRD the API server has not yet given any
# condition, so it is retried until every CRD reports Established.
wait_for "Kueue's CRDs to be established" 60 \
  kc wait --for=condition=Established --timeout=10s -f "$CRD_DIR/bases"
kc create namespace "$KUEUE_NAMESPACE" --dry-run=client -o yaml | kc apply -f - >/dev/null

if ((!keep)); then
  log "starting the Kueue $KUEUE_VERSION manager (webhooks on $URL, log $KQ/kueue.log)"
  KUBECONFIG=$KUBECONFIG_ADMIN setsid "$BIN/kueue" --config "$KQ/config.yaml" \
    --feature-gates=VisibilityOnDemand=false --zap-log-level=info \
    >>"$KQ/kueue.log" 2>&1 </dev/null &
  echo $! >"$KQ/kueue.pid"
  echo "$identity" >"$KQ/identity"
fi
ready() { curl -sf "http://127.0.0.1:$health_port/readyz"; }
wait_for "the Kueue manager to be ready" 120 ready || { tail -20 "$KQ/kueue.log" >&2; die "Kueue did not start"; }

kc create --dry-run=client -o json -f "$MODULE_DIR/config/components/webhook/manifests.yaml" \
  | python3 "$ROOT/hack/kueue/manifests.py" webhooks "$URL" "$KQ/certs/ca.crt" \
  | kc apply --server-side --force-conflicts -f - >/dev/null
# The API server reaches the webhook: a server-side dry run goes through both of Kueue's
# ResourceFlavor webhooks (and its validation would refuse a malformed object).
flavor='{"apiVersion":"kueue.x-k8s.io/v1beta2","kind":"ResourceFlavor","metadata":{"name":"probe"}}'
webhook_answers() { kc create --dry-run=server -f - <<<"$flavor"; }
wait_for "the API server to reach Kueue's webhooks" 60 webhook_answers
log "Kueue $KUEUE_VERSION ready ($((SECONDS - t0)) s)"

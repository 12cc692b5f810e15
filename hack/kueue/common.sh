# Shared settings of the local Kueue (sourced by up.sh and down.sh, not run on its own).
# Kueue's manager runs as a plain process of this machine next to the control plane, like the
# processes kwokctl starts; its webhooks are served on 127.0.0.1 and the API server calls them
# there (the webhook configurations name the URL and carry the CA bundle).
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=../versions.env
source "$ROOT/hack/versions.env"
CACHE=${MESHRUN_CACHE:-$HOME/.cache/meshrun}
STATE=${MESHRUN_CLUSTER_DIR:-$ROOT/.cluster}
BIN=$ROOT/.cluster/bin
KUBECONFIG_ADMIN=$STATE/kubeconfig
# Per-cluster state (configuration, certificates, log, pid, ports): removed by down.sh.
KQ=$STATE/kueue
# Kueue's namespace (its Configuration's `namespace`): events and leader election would live here.
KUEUE_NAMESPACE=kueue-system
# With internal certificate management off, the manager reads its metrics certificate from this
# fixed path (cmd/kueue/main.go); it refuses to start without one.
METRICS_CERT_DIR=/etc/kueue/metrics/certs
# The webhook configurations' names, as Kueue's release manifests name them.
MUTATING_WEBHOOK=kueue-mutating-webhook-configuration
VALIDATING_WEBHOOK=kueue-validating-webhook-configuration

LOG_TAG=kueue KUBECTL=$BIN/kubectl KUBECONFIG_FILE=$KUBECONFIG_ADMIN
# shellcheck source=../lib.sh
source "$ROOT/hack/lib.sh"
api_up() { [[ -s $KUBECONFIG_ADMIN ]] && kc get --raw /readyz >/dev/null 2>&1; }

kueue_pid() { [[ -s $KQ/kueue.pid ]] && cat "$KQ/kueue.pid"; }
kueue_alive() {
  local pid
  pid=$(kueue_pid) || return 1
  kill -0 "$pid" 2>/dev/null && grep -q kueue "/proc/$pid/cmdline" 2>/dev/null
}

# stop_kueue: SIGTERM (the manager drains its controllers), SIGKILL if still there after 10 s.
stop_kueue() {
  local pid
  pid=$(kueue_pid) || return 0
  if kill "$pid" 2>/dev/null && ! timeout 10 tail --pid="$pid" -f /dev/null; then
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$KQ/kueue.pid"
}

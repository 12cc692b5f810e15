# Shared settings of the real node (sourced by up.sh, down.sh, images.sh; not run on its own).
# The node's parts run as plain root processes of this machine, like the control plane that
# kwokctl starts: containerd (own socket and state), kubelet, kube-proxy and CoreDNS.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=../versions.env
source "$ROOT/hack/versions.env"
CACHE=${MESHRUN_CACHE:-$HOME/.cache/meshrun}
STATE=${MESHRUN_CLUSTER_DIR:-$ROOT/.cluster}
NAME=${MESHRUN_CLUSTER_NAME:-meshrun}
BIN=$ROOT/.cluster/bin
KUBECONFIG_ADMIN=$STATE/kubeconfig
PKI=$STATE/kwok/clusters/$NAME/pki
# Per-cluster state (configs, certificates, logs, pids): removed by down.sh.
RN=$STATE/realnode
# One real node per machine: these are machine-wide names (sockets, bridge, ports).
NODE_NAME=${REAL_NODE_NAME:-real-node-0}
CONTAINERD_SOCK=/run/meshrun-containerd/containerd.sock
# Images outlive a cluster so that a warm `make demo` does not import them again.
CONTAINERD_ROOT=$CACHE/containerd-root
KUBELET_ROOT=/var/lib/meshrun-kubelet
BRIDGE=mr0
POD_CIDR=${REAL_NODE_POD_CIDR:-10.244.0.0/24}
# In the kube-apiserver's default service range 10.0.0.0/24, inside the static band (the first
# 16 addresses) that dynamic ClusterIP allocation avoids (KEP-3070).
DNS_SERVICE_IP=10.0.0.10
PAUSE_IMAGE=meshrun.local/pause:3.10
BASE_IMAGE=meshrun.local/debian:bookworm
REAL_NODE_LABEL=meshrun.dev/real-node

LOG_TAG=realnode KUBECTL=$BIN/kubectl KUBECONFIG_FILE=$KUBECONFIG_ADMIN
# shellcheck source=../lib.sh
source "$ROOT/hack/lib.sh"
ctr_k8s() { ctr --address "$CONTAINERD_SOCK" -n k8s.io "$@"; }

# start_daemon NAME CMD...: run CMD in its own session, log to $RN/logs/NAME.log, pid in
# $RN/pids/NAME.pid; a daemon already running from that pid file is left alone.
start_daemon() {
  local name=$1; shift
  mkdir -p "$RN/logs" "$RN/pids"
  if [[ -s $RN/pids/$name.pid ]] && kill -0 "$(cat "$RN/pids/$name.pid")" 2>/dev/null; then
    return 0
  fi
  setsid "$@" >>"$RN/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$RN/pids/$name.pid"
}

# stop_daemon NAME: SIGTERM, then SIGKILL after 10 s.
stop_daemon() {
  local name=$1 pid
  [[ -s $RN/pids/$name.pid ]] || return 0
  pid=$(cat "$RN/pids/$name.pid")
  if kill "$pid" 2>/dev/null; then
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$RN/pids/$name.pid"
}


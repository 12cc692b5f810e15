#!/usr/bin/env bash
# The local control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler (all
# built from Go modules by hack/build-tools.sh) and the KWOK controller, run as plain processes
# by kwokctl's binary runtime, plus NODES fake GPU nodes.
# The KWOK controller manages only nodes annotated kwok.x-k8s.io/node=fake (the extra args below
# override kwokctl's manage-all-nodes), so a real kubelet node can join the same cluster.
#
#   hack/cluster.sh up      start, or reuse a running cluster (idempotent; a component that died
#                           is started again); NODES=N nodes, KUEUE=1 adds Kueue (hack/kueue/up.sh)
#   hack/cluster.sh down    stop every process and remove the cluster's state
#   hack/cluster.sh status  say whether it is up, and name any component that is not running
#
# A single-instance control plane needs no leader election: kube-controller-manager and
# kube-scheduler run without it, so a machine too loaded to renew a lease in time (parallel CPU
# training) no longer makes them give up their lease and exit.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$ROOT/hack/versions.env"
CACHE=${MESHRUN_CACHE:-$HOME/.cache/meshrun}
# MESHRUN_CLUSTER_DIR / MESHRUN_CLUSTER_NAME let a benchmark run a second, throwaway cluster.
STATE=${MESHRUN_CLUSTER_DIR:-$ROOT/.cluster}
BIN=$ROOT/.cluster/bin
KUBECONFIG_OUT=$STATE/kubeconfig
NAME=${MESHRUN_CLUSTER_NAME:-meshrun}
NODES=${NODES:-8}
# REAL_NODE=1 adds a real kubelet node (hack/realnode/up.sh) next to the fake ones.
REAL_NODE=${REAL_NODE:-1}
# KUEUE=1 adds Kueue (hack/kueue/up.sh): its manager next to the control plane, webhooks included.
KUEUE=${KUEUE:-0}
# AUDIT_POLICY=FILE turns on the API server's audit log with that policy (written to
# $KWOK_WORKDIR/clusters/$NAME/logs/audit.log); the operator scale bench counts requests with it.
AUDIT_POLICY=${AUDIT_POLICY:-}
# APISERVER_ARGS="key=value" passes an extra flag to kube-apiserver, for a throwaway cluster
# (the watch-gap tests turn its watch cache off); one only: kwokctl 0.8 mishandles several.
APISERVER_ARGS=${APISERVER_ARGS:-}
export KWOK_WORKDIR=$STATE/kwok
KWOKCTL=$BIN/kwokctl
KUBECTL=$BIN/kubectl

LOG_TAG=cluster KUBECONFIG_FILE=$KUBECONFIG_OUT
source "$ROOT/hack/lib.sh"

healthy() {
  [[ -s $KUBECONFIG_OUT ]] && kc get --raw /readyz >/dev/null 2>&1
}

# kwokctl's binary runtime keeps one pid file per component (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kwok).
PIDS=$KWOK_WORKDIR/clusters/$NAME/pids

# component_running PIDFILE: its process is alive, not a zombie, and still this cluster's
# component (after a machine restart the number may belong to something else).
component_running() {
  local pid state cmdline
  pid=$(<"$1") || return 1
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
  [[ -n $state && $state != Z ]] || return 1
  cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
  [[ $(basename "${cmdline%% *}") == "$(basename "$1" .pid)" ]]
}

# dead_components: the names of this cluster's components that are not running.
dead_components() {
  local f
  [[ -d $PIDS ]] || return 0
  for f in "$PIDS"/*.pid; do
    [[ -e $f ]] || continue
    component_running "$f" || basename "$f" .pid
  done
}

# revive: start again the components that died while others kept running (kwokctl starts each
# one whose pid file names no live process, with the arguments it first ran it with). A cluster
# with no live component at all (machine restart) is left to the full restart in up().
revive() {
  local dead total
  [[ -d $PIDS ]] || return 0
  dead=$(dead_components)
  [[ -n $dead ]] || return 0
  total=$(find "$PIDS" -name '*.pid' | wc -l)
  (($(wc -w <<<"$dead") < total)) || return 0
  log "not running: $(echo $dead); starting them again (their logs: $KWOK_WORKDIR/clusters/$NAME/logs)"
  local c
  for c in $dead; do rm -f "$PIDS/$c.pid"; done
  "$KWOKCTL" start cluster --name "$NAME" --wait 120s >/dev/null
  dead=$(dead_components)
  [[ -z $dead ]] || { log "still not running: $(echo $dead)"; return 1; }
}

# Only the fake nodes this script made (label type=kwok) beyond NODES are removed.
sync_nodes() {
  local t0=$SECONDS
  python3 "$ROOT/hack/kwok/nodes.py" "$NODES" >"$STATE/nodes.json"
  if ((NODES > 0)); then
    kc apply --server-side --force-conflicts -f "$STATE/nodes.json" >/dev/null
  fi
  local extra
  extra=$(kc get nodes -l type=kwok -o name | sort | awk -v n="$NODES" 'NR > n')
  [[ -n $extra ]] && kc delete --wait=false $extra >/dev/null
  log "waiting for $NODES fake GPU nodes to be Ready"
  local deadline=$((SECONDS + 300)) ready=0
  while ((SECONDS < deadline)); do
    ready=$(kc get nodes -l type=kwok --no-headers 2>/dev/null | awk '$2 == "Ready"' | wc -l)
    ((ready >= NODES)) && break
    sleep 1
  done
  if ((ready < NODES)); then
    log "only $ready of $NODES nodes became Ready within 300 s"; return 1
  fi
  log "$NODES nodes Ready ($((SECONDS - t0)) s)"
}

# create: a new control plane by kwokctl's binary runtime (the caller has removed any old one).
create() {
  local extra=()
  [[ -n $AUDIT_POLICY ]] && extra=(--kube-audit-policy "$AUDIT_POLICY")
  for arg in $APISERVER_ARGS; do extra+=(--extra-args "kube-apiserver=$arg"); done
  log "starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok-controller"
  KWOK_KUBE_VERSION=$KUBE_VERSION KWOK_ETCD_VERSION=${ETCD_VERSION#v} KWOK_KUBECTL_BINARY=$BIN/kubectl "$KWOKCTL" create cluster \
    --name "$NAME" --runtime binary \
    --config "$ROOT/hack/kwok/stages.yaml" \
    --extra-args kwok-controller=manage-all-nodes=false \
    --extra-args kwok-controller=manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --extra-args kube-controller-manager=leader-elect=false \
    --extra-args kube-scheduler=leader-elect=false \
    --kube-apiserver-binary "$BIN/kube-apiserver" \
    --kube-controller-manager-binary "$BIN/kube-controller-manager" \
    --kube-scheduler-binary "$BIN/kube-scheduler" \
    --etcd-binary "$BIN/etcd" \
    --kwok-controller-binary "$BIN/kwok" \
    --disable-qps-limits \
    "${extra[@]}" \
    --kubeconfig "$KUBECONFIG_OUT" \
    --wait 120s --quiet-pull
}

up() {
  for b in kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok kwokctl; do
    [[ -x $BIN/$b ]] || { echo "missing $BIN/$b: run 'make tools' (hack/build-tools.sh)" >&2; exit 1; }
  done
  mkdir -p "$STATE"
  revive
  if healthy; then
    log "reusing the running cluster"
  else
    # A cluster whose processes died (machine restart, killed session) is removed first.
    [[ -d $STATE/kueue ]] && { MESHRUN_CLUSTER_DIR=$STATE "$ROOT/hack/kueue/down.sh" || true; }
    "$KWOKCTL" delete cluster --name "$NAME" >/dev/null 2>&1 || true
    local t0=$SECONDS attempt
    # kwokctl chooses each component's ports when it creates the cluster; a port taken between
    # its choice and the component's start (a lingering process of the cluster just removed) has
    # once left the KWOK controller dead and no node Ready. Such a cluster is made again.
    for attempt in 1 2; do
      if create && kc config use-context "kwok-$NAME" >/dev/null && healthy && [[ -z $(dead_components) ]]; then
        break
      fi
      ((attempt == 1)) || { log "the control plane did not come up twice (logs: $KWOK_WORKDIR/clusters/$NAME/logs)"; return 1; }
      log "not running after create: $(echo $(dead_components)); creating the cluster again"
      "$KWOKCTL" delete cluster --name "$NAME" >/dev/null 2>&1 || true
      sleep 2
    done
    log "control plane up ($((SECONDS - t0)) s)"
  fi
  sync_nodes
  if [[ $REAL_NODE == 1 ]]; then
    MESHRUN_CLUSTER_DIR=$STATE MESHRUN_CLUSTER_NAME=$NAME "$ROOT/hack/realnode/up.sh"
  fi
  [[ $KUEUE == 1 ]] && MESHRUN_CLUSTER_DIR=$STATE "$ROOT/hack/kueue/up.sh"
  kc version 2>/dev/null | sed 's/^/  /'
  cat <<MSG

The local cluster is up. Point kubectl at it:
  export KUBECONFIG=$KUBECONFIG_OUT
  export PATH=$BIN:\$PATH
  kubectl get nodes -L nvidia.com/gpu.count,topology.meshrun.dev/rack
Stop it with: make cluster-down
MSG
}

down() {
  [[ -d $STATE/kueue ]] && { MESHRUN_CLUSTER_DIR=$STATE "$ROOT/hack/kueue/down.sh" || true; }
  # A real node (if one was added) goes first, while the API server can still see it.
  if [[ -d $STATE/realnode ]]; then
    MESHRUN_CLUSTER_DIR=$STATE MESHRUN_CLUSTER_NAME=$NAME "$ROOT/hack/realnode/down.sh" || true
  fi
  if [[ -x $KWOKCTL ]]; then
    "$KWOKCTL" delete cluster --name "$NAME" >/dev/null 2>&1 || true
  fi
  # Belt and braces: no process started from this cluster's folder may outlive it.
  local pids
  pids=$(pgrep -f -- "$KWOK_WORKDIR/clusters/$NAME" || true)
  if [[ -n $pids ]]; then
    kill $pids 2>/dev/null || true
    sleep 1
    kill -9 $pids 2>/dev/null || true
  fi
  rm -rf "$KWOK_WORKDIR" "$KUBECONFIG_OUT" "$STATE/nodes.json"
  log "cluster removed"
}

case ${1:-} in
  up) up ;;
  down) down ;;
  status)
    if ! healthy; then echo "down"; exit 1; fi
    dead=$(dead_components)
    if [[ -n $dead ]]; then echo "degraded: not running: $(echo $dead) (hack/cluster.sh up starts them)"; exit 1; fi
    echo "up: $KUBECONFIG_OUT" ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac

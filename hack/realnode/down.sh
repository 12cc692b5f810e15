#!/usr/bin/env bash
# Remove the real node: its pods (through the kubelet, so CNI releases their addresses), the
# node object, then kubelet, kube-proxy (and its iptables rules), CoreDNS, containerd and the
# image-building Docker engine. Imported images stay in $CACHE/containerd-root for the next run.
set -euo pipefail
source "$(dirname "$0")/common.sh"
t0=$SECONDS
api_up() { [[ -s $KUBECONFIG_ADMIN ]] && kc get --raw /readyz >/dev/null 2>&1; }
running_tasks() { ctr_k8s tasks ls 2>/dev/null | awk 'NR > 1 && $3 == "RUNNING"' | wc -l; }

kubelet_alive() { [[ -s $RN/pids/kubelet.pid ]] && kill -0 "$(cat "$RN/pids/kubelet.pid")" 2>/dev/null; }
if api_up && kubelet_alive; then
  # Let the kubelet stop every pod itself (StopPodSandbox runs CNI DEL) before it goes; cordoned
  # first so that controllers do not put replacements back on it.
  kc cordon "$NODE_NAME" >/dev/null 2>&1 || true
  kc delete pods -A --field-selector "spec.nodeName=$NODE_NAME" --grace-period=1 --wait=false \
    >/dev/null 2>&1 || true
  wait_for "the real node's pods to stop" 30 bash -c \
    "[[ \$(ctr --address $CONTAINERD_SOCK -n k8s.io tasks ls 2>/dev/null | awk 'NR > 1 && \$3 == \"RUNNING\"' | wc -l) == 0 ]]" \
    || true
fi
stop_daemon kubelet
api_up && kc delete node "$NODE_NAME" --wait=false >/dev/null 2>&1 || true

# Whatever is left (kubelet already gone, a crash): kill tasks and delete containers directly.
if [[ -S $CONTAINERD_SOCK ]]; then
  for id in $(ctr_k8s tasks ls -q 2>/dev/null); do
    ctr_k8s tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
  done
  sleep 0.5
  for id in $(ctr_k8s tasks ls -q 2>/dev/null); do ctr_k8s tasks delete -f "$id" >/dev/null 2>&1 || true; done
  for id in $(ctr_k8s containers ls -q 2>/dev/null); do ctr_k8s containers delete "$id" >/dev/null 2>&1 || true; done
fi
stop_daemon containerd
stop_daemon coredns
stop_daemon kube-proxy
[[ -x $BIN/kube-proxy ]] && "$BIN/kube-proxy" --cleanup >/dev/null 2>&1 || true
"$ROOT/hack/realnode/images.sh" stop-docker || true
api_up && kc delete -n kube-system service/kube-dns endpointslice/kube-dns-host \
  --ignore-not-found >/dev/null 2>&1 || true

# Mounts left by pods (secrets, projected tokens, shm, container root filesystems), deepest first.
for prefix in "$KUBELET_ROOT" /run/meshrun-containerd /run/meshrun-docker; do
  findmnt -rn -o TARGET | awk -v p="$prefix" '$0 == p || index($0, p "/") == 1' | sort -r | while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done
done
# Network namespaces of pods the kubelet could not stop (only this CRI makes cni-* ones here).
for ns in $(ip netns list 2>/dev/null | awk '/^cni-/ {print $1}'); do ip netns delete "$ns" || true; done
# Masquerade rules and chains the bridge plugin made for those pods (their comment names our
# network "meshrun"); -S prints rules shell-quoted, so eval replays them as deletions.
{ iptables -t nat -S POSTROUTING 2>/dev/null | grep -F 'name: \"meshrun\"' || true; } \
  | sed 's/^-A /-D /' | while read -r rule; do eval "iptables -t nat $rule" || true; done
for chain in $(iptables -t nat -S 2>/dev/null | awk '/^-N CNI-/ {print $2}'); do
  if iptables -t nat -S "$chain" | grep -qF 'name: \"meshrun\"'; then
    iptables -t nat -F "$chain" && iptables -t nat -X "$chain" || true
  fi
done
# The kubelet's own chains (its canary, its iptables-mode hint, KUBE-FIREWALL guarding 127/8).
for ipt in iptables ip6tables; do
  for chain in INPUT OUTPUT; do "$ipt" -D "$chain" -j KUBE-FIREWALL 2>/dev/null || true; done
  for table in filter nat mangle; do
    for chain in KUBE-FIREWALL KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT; do
      "$ipt" -t "$table" -F "$chain" 2>/dev/null && "$ipt" -t "$table" -X "$chain" 2>/dev/null || true
    done
  done
done
for dir in -i -o; do iptables -D FORWARD "$dir" "$BRIDGE" -j ACCEPT 2>/dev/null || true; done
ip link delete "$BRIDGE" 2>/dev/null || true
sed -i '/# meshrun real node$/d' /etc/hosts
rm -rf "$RN" "$KUBELET_ROOT" /run/meshrun-containerd /run/meshrun-cni /run/meshrun-docker
log "real node removed ($((SECONDS - t0)) s)"

#!/usr/bin/env bash
# Add a real node to the running local cluster (hack/cluster.sh up calls this when REAL_NODE=1):
# containerd with its CRI plugin, runc, the CNI bridge, kubelet, kube-proxy and CoreDNS, all as
# local root processes. The node is labelled and tainted meshrun.dev/real-node=true:NoSchedule,
# so only pods that tolerate the taint (and select the label) run for real; the rest keep going
# to the KWOK nodes. Idempotent: running parts are left alone.
set -euo pipefail
source "$(dirname "$0")/common.sh"

[[ $(id -u) == 0 ]] || { echo "the real node needs root (containerd, kubelet, iptables)" >&2; exit 1; }
[[ -s $KUBECONFIG_ADMIN ]] || { echo "no cluster at $STATE: run hack/cluster.sh up first" >&2; exit 1; }
# A real node left from an earlier control plane (its CA is gone) is removed and made afresh.
if [[ -s $RN/pki/kubelet.crt ]] && ! openssl verify -CAfile "$PKI/ca.crt" "$RN/pki/kubelet.crt" >/dev/null 2>&1; then
  log "the control plane was recreated: replacing the old real node"
  "$ROOT/hack/realnode/down.sh"
fi
"$ROOT/hack/realnode/deps.sh"
mkdir -p "$RN"/{logs,pids,pki,cni} "$KUBELET_ROOT" "$CONTAINERD_ROOT"
# The base root filesystem (debootstrap: network and disk) is made while Go builds (CPU).
"$ROOT/hack/realnode/images.sh" prepare >"$RN/logs/images-prepare.log" 2>&1 &
prepare_pid=$!
"$ROOT/hack/build-tools.sh" kubelet coredns registry
phase_done "packages and binaries ready"

# The API server's advertise address: what the `kubernetes` Service points at, and the host
# address pods reach (the serving certificate lists it).
HOST_IP=$(kc get endpointslices -n default -l kubernetes.io/service-name=kubernetes \
  -o jsonpath='{.items[0].endpoints[0].addresses[0]}')
API_PORT=$(kc get endpointslices -n default -l kubernetes.io/service-name=kubernetes \
  -o jsonpath='{.items[0].ports[0].port}')
SERVER=https://$HOST_IP:$API_PORT

# ---- kernel and firewall: forwarding on, bridge traffic through iptables, FORWARD accepts it
sysctl -qw net.ipv4.ip_forward=1
modprobe br_netfilter 2>/dev/null || true
sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true
for dir in -i -o; do
  iptables -C FORWARD "$dir" "$BRIDGE" -j ACCEPT 2>/dev/null \
    || iptables -I FORWARD 1 "$dir" "$BRIDGE" -j ACCEPT
done

# The API server reaches the kubelet (logs, exec) by the node's Hostname address first.
if ! grep -q "# meshrun real node$" /etc/hosts; then
  echo "$HOST_IP $NODE_NAME # meshrun real node" >>/etc/hosts
fi

# ---- client certificates signed by the cluster CA (kwokctl's pki), one identity per component
client_kubeconfig() {  # NAME CN ORG
  local name=$1 cn=$2 org=$3 key=$RN/pki/$1.key crt=$RN/pki/$1.crt
  if [[ ! -s $crt ]]; then
    openssl req -new -newkey rsa:2048 -nodes -keyout "$key" -subj "/O=$org/CN=$cn" \
      -out "$RN/pki/$name.csr" 2>/dev/null
    openssl x509 -req -in "$RN/pki/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" \
      -CAcreateserial -days 365 -out "$crt" 2>/dev/null
  fi
  cat >"$RN/$name.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- cluster: {certificate-authority: $PKI/ca.crt, server: "$SERVER"}
  name: local
users:
- name: $name
  user: {client-certificate: $crt, client-key: $key}
contexts:
- context: {cluster: local, user: $name}
  name: $name
current-context: $name
KC
}
client_kubeconfig kubelet "system:node:$NODE_NAME" system:nodes
client_kubeconfig kube-proxy system:kube-proxy system:node-proxier
client_kubeconfig coredns system:coredns system:coredns

# ---- containerd: its own socket and state; CRI with the local pause image and the CNI bridge
cat >"$RN/containerd.toml" <<TOML
version = 2
root = "$CONTAINERD_ROOT"
state = "/run/meshrun-containerd"
[grpc]
  address = "$CONTAINERD_SOCK"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # This machine withholds CAP_SYS_RESOURCE even from root, so no process may lower its
  # oom_score_adj; the kubelet asks -998 for sandboxes and runc then fails with "can't get final
  # child's PID from pipe". This clamps every request to containerd's own value instead.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$RN/cni"
TOML
# CNI: one bridge for the node's pods, host-local addresses, masquerade to the outside, portmap
# for hostPort. containerd adds the loopback plugin itself.
cat >"$RN/cni/10-meshrun.conflist" <<JSON
{"cniVersion": "1.0.0", "name": "meshrun", "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "/run/meshrun-cni",
            "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
JSON
start_daemon containerd containerd --config "$RN/containerd.toml"
wait_for "containerd's CRI plugin" 60 bash -c \
  "ctr --address $CONTAINERD_SOCK plugins ls | grep -E 'io.containerd.grpc.v1 +cri +.* ok'"
phase_done "containerd up"
wait "$prepare_pid" || { cat "$RN/logs/images-prepare.log"; exit 1; }
"$ROOT/hack/realnode/images.sh" node
phase_done "pause and base images in containerd"

# ---- CoreDNS: serves cluster.local from the API (headless Service names resolve to pod IPs),
# forwards the rest to the host's resolver. Runs on the host; the kube-dns Service (no selector)
# sends 10.0.0.10:53 to it through kube-proxy.
kc apply -f - >/dev/null <<YAML
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: "system:coredns"}
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: $DNS_SERVICE_IP
  ports:
  - {name: dns, port: 53, protocol: UDP, targetPort: 53}
  - {name: dns-tcp, port: 53, protocol: TCP, targetPort: 53}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kube-dns-host
  namespace: kube-system
  labels: {kubernetes.io/service-name: kube-dns, endpointslice.kubernetes.io/managed-by: meshrun-realnode}
addressType: IPv4
endpoints:
- addresses: ["$HOST_IP"]
  conditions: {ready: true}
ports:
- {name: dns, port: 53, protocol: UDP}
- {name: dns-tcp, port: 53, protocol: TCP}
YAML
# cache 5: short, so a pod's name resolves soon after it gets its IP (rendezvous races).
cat >"$RN/Corefile" <<COREFILE
cluster.local:53 in-addr.arpa:53 ip6.arpa:53 {
    bind $HOST_IP
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $RN/coredns.kubeconfig coredns
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 5
}
.:53 {
    bind $HOST_IP
    errors
    forward . /etc/resolv.conf
    cache 30
}
COREFILE
start_daemon coredns "$BIN/coredns" -conf "$RN/Corefile"

# ---- kube-proxy (iptables mode): Service ClusterIPs (kubernetes, kube-dns) work inside pods
start_daemon kube-proxy "$BIN/kube-proxy" --kubeconfig "$RN/kube-proxy.kubeconfig" \
  --hostname-override "$NODE_NAME" --proxy-mode iptables --cluster-cidr "$POD_CIDR" \
  --conntrack-max-per-core 0 --metrics-bind-address 127.0.0.1:10249 \
  --healthz-bind-address 127.0.0.1:10256

# ---- kubelet: cgroup v1 with the cgroupfs driver (no systemd here); kubelet 1.34 still runs on
# cgroup v1 (1.35 refuses it unless failCgroupV1: false). The API server reaches it without a
# client certificate (kwokctl sets none), so kubelet allows anonymous reads: `kubectl logs` and
# `exec` work. Acceptable on a single-user local machine only.
cat >"$RN/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failSwapOn: false
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: AlwaysAllow}
clusterDomain: cluster.local
clusterDNS: [$DNS_SERVICE_IP]
resolvConf: /etc/resolv.conf
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
serializeImagePulls: false
# Images are imported, never pulled: keep them however full the disk gets.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 2%, imagefs.available: 2%}
# A short dip (an image import) should not keep the disk-pressure taint for the default 5 min.
evictionPressureTransitionPeriod: 30s
registerWithTaints:
- {key: $REAL_NODE_LABEL, value: "true", effect: NoSchedule}
YAML
start_daemon kubelet "$BIN/kubelet" --config "$RN/kubelet.yaml" \
  --kubeconfig "$RN/kubelet.kubeconfig" --root-dir "$KUBELET_ROOT" \
  --cert-dir "$RN/pki/kubelet-serving" --hostname-override "$NODE_NAME" --node-ip "$HOST_IP" \
  --node-labels "$REAL_NODE_LABEL=true,type=real" --v 1
wait_for "node $NODE_NAME to be Ready" 120 bash -c \
  "'$BIN/kubectl' --kubeconfig '$KUBECONFIG_ADMIN' get node $NODE_NAME -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True" \
  || { tail -20 "$RN/logs/kubelet.log"; exit 1; }
phase_done "kubelet, kube-proxy and CoreDNS up; node $NODE_NAME Ready"
log "real node ready in $((SECONDS - SCRIPT_START)) s (logs in $RN/logs)"

#!/usr/bin/env bash
# Build kind's node image for KUBE_VERSION offline, once (cached in kind's engine and as tarballs
# under $CACHE): what kind's own `kind build node-image` makes, from what this project builds.
#
#   1. base image: debootstrap Debian bookworm with systemd, containerd, runc, the CNI plugins,
#      iptables and the other tools a kind node runs, plus kind's node files (its entrypoint,
#      systemd units, kubelet drop-ins: images/base/files of the kind module at KIND_VERSION)
#   2. component images under the names kubeadm asks for (`kubeadm config images list`):
#      kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, etcd, CoreDNS and
#      pause, each one of the project's binaries on the base image
#   3. node image: the base with kubeadm, kubelet and kubectl in /usr/bin, /kind/version, a CNI
#      config, and the component images imported into its containerd (system pods are
#      IfNotPresent, so nothing is pulled)
#
#   hack/kind/node-image.sh          print the node image's name, building what is missing
#   hack/kind/node-image.sh base     only the base image
set -euo pipefail
source "$(dirname "$0")/common.sh"

BASE_PACKAGES=systemd,systemd-sysv,containerd,runc,containernetworking-plugins,iptables,nftables,conntrack,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz,bash,ca-certificates,curl,jq,procps,socat
BASE_TARBALL=$CACHE/kind-base-bookworm.tar
KIND_MODULE_DIR=""

# kind_files: kind's node files, from its Go module (downloaded by `go mod download`, never
# copied into this repository).
kind_files() {
  [[ -n $KIND_MODULE_DIR ]] && return
  KIND_MODULE_DIR=$(GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kind@$KIND_VERSION" \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
}

build_base() {
  if kind_docker image inspect "$KIND_BASE_IMAGE" >/dev/null 2>&1; then return; fi
  local t0=$SECONDS work
  if [[ ! -s $BASE_TARBALL ]]; then
    log "debootstrap Debian bookworm for kind's base image; a few minutes"
    work=$(mktemp -d)
    debootstrap --variant=minbase --include="$BASE_PACKAGES" bookworm "$work/rootfs" \
      "$DEBIAN_MIRROR" >"$CACHE/kind-debootstrap.log" 2>&1 \
      || die "debootstrap failed, see $CACHE/kind-debootstrap.log"
    base_layout "$work/rootfs"
    chroot "$work/rootfs" apt-get clean
    rm -rf "$work/rootfs"/var/lib/apt/lists/* "$work/rootfs"/var/cache/apt/*.bin
    tar -C "$work/rootfs" --numeric-owner -cf "$BASE_TARBALL.partial" .
    mv "$BASE_TARBALL.partial" "$BASE_TARBALL"
    rm -rf "$work"
  fi
  kind_docker import \
    -c 'ENV container=docker' \
    -c 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' \
    "$BASE_TARBALL" "$KIND_BASE_IMAGE" >/dev/null
  log "base image $KIND_BASE_IMAGE ready ($((SECONDS - t0)) s)"
}

# base_layout ROOTFS: what kind's base image Dockerfile does after installing packages.
base_layout() {
  local r=$1 f=$KIND_MODULE_DIR/images/base/files
  kind_files
  f=$KIND_MODULE_DIR/images/base/files
  install -D -m 0755 -t "$r/usr/local/bin" "$f"/usr/local/bin/*
  install -D -m 0755 -t "$r/kind/bin" "$f"/kind/bin/*
  install -D -m 0644 -t "$r/etc/systemd/system" "$f"/etc/systemd/system/*.service "$f"/etc/systemd/system/*.slice
  install -D -m 0644 -t "$r/etc/systemd/system/kubelet.service.d" "$f"/etc/systemd/system/kubelet.service.d/*
  install -D -m 0644 -t "$r/etc/sysctl.d" "$f"/etc/sysctl.d/*
  install -D -m 0644 -t "$r/etc/default" "$f"/etc/default/*
  install -D -m 0644 "$f/etc/crictl.yaml" "$r/etc/crictl.yaml"
  # kind's units run containerd from /usr/local/bin and the CNI plugins from /opt/cni/bin;
  # Debian installs them under /usr.
  ln -sf /usr/bin/containerd "$r/usr/local/bin/containerd"
  mkdir -p "$r/opt/cni"
  ln -sfn /usr/lib/cni "$r/opt/cni/bin"
  # Only what a node needs starts at boot (kind's Dockerfile empties the same .wants folders).
  find "$r/lib/systemd/system/sysinit.target.wants/" -name systemd-tmpfiles-setup.service -delete
  rm -f "$r"/lib/systemd/system/multi-user.target.wants/* "$r"/etc/systemd/system/*.wants/* \
    "$r"/lib/systemd/system/local-fs.target.wants/* "$r"/lib/systemd/system/sockets.target.wants/*udev* \
    "$r"/lib/systemd/system/sockets.target.wants/*initctl* "$r"/lib/systemd/system/basic.target.wants/*
  echo "ReadKMsg=no" >>"$r/etc/systemd/journald.conf"
  chroot "$r" systemctl enable kubelet.service containerd.service undo-mount-hacks.service >/dev/null 2>&1
  chroot "$r" systemctl mask systemd-binfmt.service >/dev/null 2>&1
  mkdir -p "$r/etc/kubernetes/manifests" "$r/etc/cni/net.d"
}

# containerd_config SANDBOX_IMAGE: Debian's containerd 1.6 reads config version 2 (kind's file is for
# containerd 2). The systemd cgroup driver, as kind's nodes use it.
containerd_config() {
  cat <<TOML
version = 2
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$1"
  tolerate_missing_hugepages_controller = true
  # No process here may lower its oom_score_adj (CAP_SYS_RESOURCE is outside the bounding set);
  # the kubelet asks -998 for sandboxes, so requests are clamped to containerd's own value.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    discard_unpacked_layers = true
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = true
TOML
}

# The node's binaries: kubeadm from build-tools.sh kubeadm, kubelet from kubelet, the control
# plane from kube, CoreDNS from coredns (all cached under $CACHE by version).
NODE_BINARIES=(kubeadm kubelet kubectl)
IMAGE_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy etcd coredns)

# component_image REF WORK: the image kubeadm asks for as REF, from the project's binary.
component_image() {
  local ref=$1 work=$2 name
  name=$(basename "${ref%:*}")
  local dir=$work/img-$name
  mkdir -p "$dir"
  case $name in
    pause)
      gcc -static -Os -Wall -Wextra -o "$dir/pause" "$ROOT/hack/realnode/pause.c"
      tar -C "$dir" -c pause | kind_docker import -c 'ENTRYPOINT ["/pause"]' - "$ref" >/dev/null ;;
    coredns)
      cp "$BIN/coredns" "$dir/coredns"
      tar -C "$dir" -c coredns | kind_docker import -c 'ENTRYPOINT ["/coredns"]' - "$ref" >/dev/null ;;
    kube-proxy)
      # kube-proxy runs iptables and links glibc: it goes on the base image (Debian's iptables).
      cp "$BIN/kube-proxy" "$dir/"
      printf 'FROM %s\nCOPY kube-proxy /usr/local/bin/kube-proxy\n' "$KIND_BASE_IMAGE" >"$dir/Dockerfile"
      kind_docker build -q -t "$ref" "$dir" >/dev/null ;;
    *)
      # The static manifests kubeadm writes run the binary by name from PATH.
      mkdir -p "$dir/usr/local/bin"
      cp "$BIN/$name" "$dir/usr/local/bin/"
      tar -C "$dir" -c usr | kind_docker import -c 'ENV PATH=/usr/local/bin:/usr/bin:/bin' - "$ref" >/dev/null ;;
  esac
}

# node_files WORK SANDBOX: files the node image adds to the base.
node_files() {
  local work=$1 sandbox=$2
  mkdir -p "$work/files/kind/manifests" "$work/files/etc/containerd" "$work/files/etc/cni/net.d"
  echo "$KUBE_VERSION" >"$work/files/kind/version"
  containerd_config "$sandbox" >"$work/files/etc/containerd/config.toml"
  # One node, no kindnetd (a nested Go module with no tags, not buildable here): the node's pods
  # share one bridge with addresses from the node's slice of kind's pod subnet.
  cat >"$work/files/etc/cni/net.d/10-meshrun.conflist" <<JSON
{"cniVersion": "1.0.0", "name": "meshrun", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]],
            "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
JSON
  # kind applies this as the cluster's StorageClass; nothing here provisions volumes.
  cat >"$work/files/kind/manifests/default-storage.yaml" <<YAML
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
YAML
}

build_node() {
  if kind_docker image inspect "$KIND_NODE_IMAGE_LOCAL" >/dev/null 2>&1; then return; fi
  local b t0=$SECONDS work refs sandbox build=meshrun-kind-build-$$
  for b in "${NODE_BINARIES[@]}" "${IMAGE_BINARIES[@]}"; do
    [[ -x $BIN/$b ]] || die "missing $BIN/$b: run hack/build-tools.sh kube kubelet coredns etcd kubeadm"
  done
  log "building the node image $KIND_NODE_IMAGE_LOCAL"
  work=$(mktemp -d)
  mapfile -t refs < <("$BIN/kubeadm" config images list --kubernetes-version "$KUBE_VERSION")
  for ref in "${refs[@]}"; do
    component_image "$ref" "$work"
    [[ $ref == */pause:* ]] && sandbox=$ref
  done
  log "component images: ${refs[*]}"
  node_files "$work" "$sandbox"
  kind_docker rm -f "$build" >/dev/null 2>&1 || true
  kind_docker run -d --init --name "$build" --privileged --entrypoint sleep "$KIND_BASE_IMAGE" infinity >/dev/null
  for b in "${NODE_BINARIES[@]}"; do
    kind_docker cp -L "$BIN/$b" "$build:/usr/bin/$b"
  done
  tar -C "$work/files" -c . | kind_docker cp - "$build:/"
  # The images go into the node's containerd unpacked later (as kind's own build does).
  kind_docker exec "$build" bash -c 'nohup containerd >/var/log/containerd-build.log 2>&1 &
    for _ in $(seq 60); do [ -S /run/containerd/containerd.sock ] && break; sleep 0.5; done; ctr version >/dev/null'
  kind_docker save "${refs[@]}" | kind_docker exec -i "$build" \
    ctr --namespace=k8s.io images import --all-platforms --no-unpack --digests - >/dev/null
  kind_docker exec "$build" bash -c 'pkill containerd; while pgrep -x containerd >/dev/null; do sleep 0.2; done
    rm -rf /run/containerd /var/log/containerd-build.log /tmp/*'
  kind_docker commit \
    --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' \
    "$build" "$KIND_NODE_IMAGE_LOCAL" >/dev/null
  kind_docker rm -f "$build" >/dev/null
  kind_docker rmi "${refs[@]}" >/dev/null
  rm -rf "$work"
  log "node image $KIND_NODE_IMAGE_LOCAL ready ($((SECONDS - t0)) s)"
}

case ${1:-} in
  base) ensure_kind_docker; build_base ;;
  "") ensure_kind_docker; build_base; build_node; echo "$KIND_NODE_IMAGE_LOCAL" ;;
  *) echo "usage: $0 [base]" >&2; exit 2 ;;
esac

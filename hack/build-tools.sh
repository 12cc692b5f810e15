#!/usr/bin/env bash
# Build the local cluster's binaries from Go modules (no prebuilt downloads) into a cache
# outside the checkout, keyed by version, and link them into .cluster/bin. Each tool is built
# only when its cached binary is missing, so a fresh clone on the same machine reuses them.
#
#   hack/build-tools.sh            build whatever is missing
#   hack/build-tools.sh kube etcd  only these (kube, etcd, kwok, helm, kubelet, coredns, registry,
#                                  kueue, kubeadm, kind: the last two for make e2e-kind)
#   hack/build-tools.sh training-operator   opt-in, never built by default: the peer operator
#                                  that bench/operator_scale.py runs side by side with meshrun
#
# Kubernetes' binaries, etcd and helm build in one lane and the rest in another, side by side;
# MESHRUN_BUILD_LANES=1 builds everything one after the other (each build's own output then
# comes in order).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=versions.env
source "$ROOT/hack/versions.env"
CACHE=${MESHRUN_CACHE:-$HOME/.cache/meshrun}
BIN=$ROOT/.cluster/bin
mkdir -p "$CACHE" "$BIN"
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local
# Two cores: one link at a time keeps peak memory low; compile parallelism stays at 2.
export GOMAXPROCS=${GOMAXPROCS:-2}

LOG_TAG=build-tools
source "$ROOT/hack/lib.sh"

# build_in_wrapper DIR GOMOD LDFLAGS VERSION PKG... : build PKGs (at VERSION) inside a throwaway
# wrapper module so that replace directives (which `go install` refuses) can pin staging modules.
build_in_wrapper() {
  local dir=$1 gomod=$2 ldflags=$3 version=$4; shift 4
  local work t0=$SECONDS
  work=$(mktemp -d)
  printf '%s\n' "$gomod" >"$work/go.mod"
  printf 'package tools\n' >"$work/tools.go"
  (
    cd "$work"
    go mod download >/dev/null 2>&1 || true
    for pkg in "$@"; do
      go get "$pkg@$version" >/dev/null
    done
    mkdir -p "$dir.partial"
    log "  go build $*"
    # One invocation for every binary: the links of the first overlap the compiles of the rest.
    go build -trimpath -ldflags "$ldflags" -o "$dir.partial/" "$@"
  )
  rm -rf "$work" "$dir"
  mv "$dir.partial" "$dir"
  echo $((SECONDS - t0)) >"$dir/.build-seconds"
}

# kube_wrapper_gomod: print the wrapper go.mod for k8s.io/kubernetes $KUBE_VERSION (one replace per
# staging module, read from the release's own go.mod, with its go and godebug lines).
kube_wrapper_gomod() {
  local modfile staging ver=${KUBE_VERSION#v}
  go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" >/dev/null
  modfile=$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$KUBE_VERSION.mod
  # Staging modules are published as k8s.io/<name> v0.<minor>.<patch>.
  staging=$(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$modfile" | sort -u)
  echo "module meshrun.dev/kubebuild
$(grep -E '^go [0-9]' "$modfile" | head -1)
$(grep -E '^godebug default=' "$modfile" | head -1)
require k8s.io/kubernetes $KUBE_VERSION
$(for m in $staging; do echo "replace $m => $m v0.${ver#1.}"; done)"
}

# kube_ldflags: stamp the version so /version and `kubectl version` do not report v0.0.0.
kube_ldflags() {
  local minor
  minor=$(cut -d. -f2 <<<"${KUBE_VERSION#v}")
  local x="-X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z"
  x+=" -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor -X k8s.io/client-go/pkg/version.gitTreeState=clean"
  echo "-s -w $x"
}

build_kube() {
  local dir=$CACHE/kubernetes-$KUBE_VERSION
  [[ -x $dir/kube-apiserver && -x $dir/kubectl && -x $dir/kube-scheduler && -x $dir/kube-controller-manager ]] && return
  log "building Kubernetes $KUBE_VERSION (apiserver, controller-manager, scheduler, kubectl); ~15-25 min on 2 cores"
  build_in_wrapper "$dir" "$(kube_wrapper_gomod)" "$(kube_ldflags)" "$KUBE_VERSION" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kubectl
}

# The real node's Kubernetes parts (hack/realnode): kubelet, and kube-proxy so that pods reach
# Service ClusterIPs (the in-cluster operator finds the API server through the `kubernetes`
# Service). Upstream links kubelet with cgo; built without it (Go's own DNS resolver and
# /etc/passwd lookups, all the node here needs), it shares every compiled package with the
# control plane's build before it and takes a fraction of the time (measured in
# docs/development.md).
build_kubelet() {
  local dir=$CACHE/kubernetes-node-$KUBE_VERSION
  [[ -x $dir/kubelet && -x $dir/kube-proxy ]] && return
  log "building kubelet and kube-proxy $KUBE_VERSION; ~2-10 min on 2 cores"
  build_in_wrapper "$dir" "$(kube_wrapper_gomod)" "$(kube_ldflags)" "$KUBE_VERSION" \
    k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-proxy
}

# kubeadm for the kind node image (hack/kind/build-node-image.sh): kind runs `kubeadm init` inside
# the node container, so it must be the same Kubernetes version as the other binaries.
build_kubeadm() {
  local dir=$CACHE/kubeadm-$KUBE_VERSION
  [[ -x $dir/kubeadm ]] && return
  log "building kubeadm $KUBE_VERSION; ~10 min on 2 cores"
  build_in_wrapper "$dir" "$(kube_wrapper_gomod)" "$(kube_ldflags)" "$KUBE_VERSION" \
    k8s.io/kubernetes/cmd/kubeadm
}

# kind's module has no replace directives; `go install` builds it at the pinned tag.
build_kind() {
  build_go_install kind "$KIND_VERSION" sigs.k8s.io/kind
}

# CoreDNS answers the headless Service names (<pod>.<svc>.<ns>.svc.cluster.local) from the API
# server, exactly as in kubeadm and kind clusters; it is one static Go binary.
build_coredns() {
  build_go_install coredns "$COREDNS_VERSION" github.com/coredns/coredns
}

build_etcd() {
  local dir=$CACHE/etcd-$ETCD_VERSION
  [[ -x $dir/etcd ]] && return
  log "building etcd $ETCD_VERSION"
  local gomod="module meshrun.dev/etcdbuild
go 1.24
require go.etcd.io/etcd/server/v3 $ETCD_VERSION"
  build_in_wrapper "$dir" "$gomod" "-s -w" "$ETCD_VERSION" go.etcd.io/etcd/server/v3
  # The main package is the module root, so go names the binary after "server".
  mv "$dir/server" "$dir/etcd"
}

build_go_install() {  # NAME VERSION PKG... (GO_LDFLAGS overrides "-s -w")
  local name=$1 version=$2; shift 2
  local dir=$CACHE/$name-$version
  local missing=0
  for pkg in "$@"; do [[ -x $dir/$(basename "$pkg") ]] || missing=1; done
  ((missing)) || return 0
  # Two scripts may want the same tool at once (up.sh and images.sh both need the registry):
  # one builds, the other waits and finds it built.
  local lock
  exec {lock}>"$CACHE/.$name-$version.lock"
  flock "$lock"
  missing=0
  for pkg in "$@"; do [[ -x $dir/$(basename "$pkg") ]] || missing=1; done
  if ((!missing)); then
    flock -u "$lock"
    return 0
  fi
  log "building $name $version"
  local t0=$SECONDS
  mkdir -p "$dir.partial"
  for pkg in "$@"; do
    GOBIN=$dir.partial go install -trimpath -ldflags "${GO_LDFLAGS:--s -w}" "$pkg@$version"
  done
  rm -rf "$dir"; mv "$dir.partial" "$dir"
  echo $((SECONDS - t0)) >"$dir/.build-seconds"
  flock -u "$lock"
}

build_kwok() {
  build_go_install kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl
}
build_helm() {
  build_go_install helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm
}
# The image registry (CNCF distribution) the real node's images are pushed to and pulled from.
# Its own cmd/registry links the Azure, GCS and S3 storage drivers and their SDKs; this main links
# the filesystem driver alone (the same registry.RootCmd: serve, garbage-collect), which builds in
# about half the time.
build_registry() {
  local dir=$CACHE/registry-$REGISTRY_VERSION
  [[ -x $dir/registry ]] && return 0
  local lock work t0=$SECONDS
  exec {lock}>"$CACHE/.registry-$REGISTRY_VERSION.lock"
  flock "$lock"
  if [[ -x $dir/registry ]]; then flock -u "$lock"; return 0; fi
  log "building registry $REGISTRY_VERSION (filesystem storage only)"
  work=$(mktemp -d)
  cat >"$work/main.go" <<'GO'
package main

import (
	"github.com/distribution/distribution/v3/registry"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
)

func main() { _ = registry.RootCmd.Execute() }
GO
  (
    cd "$work"
    go mod init meshrun.dev/registrybuild >/dev/null 2>&1
    go get "github.com/distribution/distribution/v3@$REGISTRY_VERSION" >/dev/null
    mkdir -p "$dir.partial"
    go build -trimpath -ldflags "-s -w" -o "$dir.partial/registry" .
  )
  rm -rf "$work" "$dir"
  mv "$dir.partial" "$dir"
  echo $((SECONDS - t0)) >"$dir/.build-seconds"
  flock -u "$lock"
}

# Kueue's manager (hack/kueue/up.sh runs it next to the control plane; KUEUE=1). Its module has
# no replace directives, so `go install` builds it; the version is stamped so its log reports
# the release instead of v0.0.0-main.
build_kueue() {
  GO_LDFLAGS="-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
    build_go_install kueue "$KUEUE_VERSION" sigs.k8s.io/kueue/cmd/kueue
}

# Kubeflow's training-operator, the peer in bench/operator_scale.py. Its module has no replace
# directives, so a plain `go install` builds it; its CRDs are read from the module cache at bench
# time (manifests/base/crds), never copied into this repository.
build_training_operator() {
  build_go_install training-operator "$TRAINING_OPERATOR_VERSION" \
    github.com/kubeflow/training-operator/cmd/training-operator.v1
}

link_all() {
  local k=$CACHE/kubernetes-$KUBE_VERSION
  for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    [[ -x $k/$b ]] && ln -sfn "$k/$b" "$BIN/$b"
  done
  [[ -x $CACHE/etcd-$ETCD_VERSION/etcd ]] && ln -sfn "$CACHE/etcd-$ETCD_VERSION/etcd" "$BIN/etcd"
  for b in kwok kwokctl; do
    [[ -x $CACHE/kwok-$KWOK_VERSION/$b ]] && ln -sfn "$CACHE/kwok-$KWOK_VERSION/$b" "$BIN/$b"
  done
  [[ -x $CACHE/helm-$HELM_VERSION/helm ]] && ln -sfn "$CACHE/helm-$HELM_VERSION/helm" "$BIN/helm"
  for b in kubelet kube-proxy; do
    [[ -x $CACHE/kubernetes-node-$KUBE_VERSION/$b ]] && ln -sfn "$CACHE/kubernetes-node-$KUBE_VERSION/$b" "$BIN/$b"
  done
  [[ -x $CACHE/registry-$REGISTRY_VERSION/registry ]] && ln -sfn "$CACHE/registry-$REGISTRY_VERSION/registry" "$BIN/registry"
  [[ -x $CACHE/coredns-$COREDNS_VERSION/coredns ]] && ln -sfn "$CACHE/coredns-$COREDNS_VERSION/coredns" "$BIN/coredns"
  local peer=$CACHE/training-operator-$TRAINING_OPERATOR_VERSION/training-operator.v1
  [[ -x $peer ]] && ln -sfn "$peer" "$BIN/training-operator"
  [[ -x $CACHE/kubeadm-$KUBE_VERSION/kubeadm ]] && ln -sfn "$CACHE/kubeadm-$KUBE_VERSION/kubeadm" "$BIN/kubeadm"
  [[ -x $CACHE/kind-$KIND_VERSION/kind ]] && ln -sfn "$CACHE/kind-$KIND_VERSION/kind" "$BIN/kind"
  [[ -x $CACHE/kueue-$KUEUE_VERSION/kueue ]] && ln -sfn "$CACHE/kueue-$KUEUE_VERSION/kueue" "$BIN/kueue"
  return 0
}

build_lane() {  # TARGET...: build these one after the other (run it where set -e holds)
  local t start
  for t in "$@"; do
    start=$SECONDS
    "build_${t//-/_}"
    ((SECONDS - start > 1)) && log "$t built ($((SECONDS - start)) s)"
  done
  return 0
}

# Two lanes side by side. One `go build` leaves a core idle much of the time (module downloads,
# links, the tail of the package graph): built one after the other, the tools spend about 0.8
# CPU-seconds per second of wall time on this 2-core machine. Kubernetes' own binaries share a
# lane, one after the other, so that each reuses the packages the one before compiled; helm and
# etcd follow them, which balances the lanes by the build times measured here (kube 9 min,
# kubelet 2 after it, helm and etcd 2 each; Kueue 6, KWOK 3, CoreDNS 2.5, the registry 0.5).
targets=("$@")
((${#targets[@]})) || targets=(etcd kwok helm kube)
kube_lane=() other_lane=()
for t in "${targets[@]}"; do
  case $t in
    kube | kubelet | kubeadm | helm | etcd) kube_lane+=("$t") ;;
    *) other_lane+=("$t") ;;
  esac
done
if ((${#kube_lane[@]} && ${#other_lane[@]})) && [[ ${MESHRUN_BUILD_LANES:-2} != 1 ]]; then
  # Each lane in its own background shell, where set -e still stops it at its first failure.
  build_lane "${kube_lane[@]}" &
  kube_pid=$!
  build_lane "${other_lane[@]}" &
  other_pid=$!
  rc=0
  wait "$kube_pid" || { rc=1; log "building ${kube_lane[*]} failed"; }
  wait "$other_pid" || { rc=1; log "building ${other_lane[*]} failed"; }
  ((rc == 0)) || exit 1
else
  build_lane "${kube_lane[@]}" "${other_lane[@]}"
fi
log "tools ready in $CACHE"
link_all

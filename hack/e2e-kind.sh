#!/usr/bin/env bash
# End-to-end test on a kind cluster: the chart's operator runs every example (shrunk to CPU by
# hack/e2e_kind_jobs.py) to phase Succeeded on a kubeadm-made cluster in Docker.
#
# Two ways to the node image:
#   offline (default): hack/kind/node-image.sh builds it once from Debian's archive and the
#     project's own Kubernetes binaries (cached; no registry is asked for anything), and the
#     cluster runs in a Docker engine of its own; the operator and trainer images are built as
#     for the real node (hack/realnode/images.sh) and moved in with `kind load image-archive`
#   published: KIND_NODE_IMAGE=kindest/node:v1.34.x@sha256:... (from kind's release notes, for
#     KIND_VERSION) on the default Docker engine, with the images built by `docker build` there
#     and moved in with `kind load docker-image`; needs internet
#
#   1. create (or reuse) a single-node kind cluster
#   2. build the operator and trainer images (Dockerfile targets) and load them into kind
#   3. helm install the chart (CRDs from helm/meshrun/crds)
#   4. apply every example, one at a time, and wait for phase Succeeded; a Failed job or a
#      timeout fails the run with diagnostics; a table of each job's time at the end
#
# Environment: KIND_CLUSTER (meshrun-e2e), KIND_NODE_IMAGE (empty: built offline), KEEP_CLUSTER=1
# to keep the cluster afterwards (`make e2e-kind-down` removes it), JOB_TIMEOUT seconds per job
# (900), EXAMPLES (examples/*.yaml), TORCH_INDEX (an extra package index for torch, e.g.
# PyTorch's CPU wheels), PYTHON (python3, with pyyaml), KIND, KUBECTL, HELM, DOCKER.
#
#   hack/e2e-kind.sh        the run
#   hack/e2e-kind.sh down   delete the cluster and stop kind's Docker engine (the cached node
#                           image stays; E2E_KIND_PURGE=1 removes it too)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
LOG_TAG=e2e-kind
source "$ROOT/hack/kind/common.sh"

CLUSTER=${KIND_CLUSTER:-meshrun-e2e}
OFFLINE=1
[[ -n ${KIND_NODE_IMAGE:-} ]] && OFFLINE=0
if ((OFFLINE)); then
  # The project's own builds (hack/build-tools.sh), unless the caller names others.
  KIND=${KIND:-$BIN/kind} KUBECTL=${KUBECTL:-$BIN/kubectl} HELM=${HELM:-$BIN/helm}
  export DOCKER_HOST=unix://$KIND_DOCKER_SOCK
else
  KIND=${KIND:-kind} KUBECTL=${KUBECTL:-kubectl} HELM=${HELM:-helm}
fi
DOCKER=${DOCKER:-docker}
PYTHON=${PYTHON:-python3}
JOB_TIMEOUT=${JOB_TIMEOUT:-900}
NAMESPACE=meshrun-system
JOBS_NAMESPACE=meshrun-e2e
STATE=$ROOT/.cluster/kind
KUBECONFIG_FILE=$STATE/kubeconfig
read -r -a EXAMPLE_FILES <<<"${EXAMPLES:-$(echo examples/*.yaml)}"

down() {
  if [[ -x $KIND ]] || command -v "$KIND" >/dev/null; then
    if ((OFFLINE)) && ! kind_docker version >/dev/null 2>&1; then
      ensure_kind_docker  # a node container left from a stopped engine is deleted through it
    fi
    "$KIND" delete cluster --name "$CLUSTER" --kubeconfig "$KUBECONFIG_FILE" 2>&1 | sed 's/^/  /' || true
  fi
  rm -rf "$STATE"
  if ((OFFLINE)); then
    kind_docker network rm kind >/dev/null 2>&1 || true
    stop_kind_docker
    rm -rf "$KIND_DOCKER_DIR"
    if [[ ${E2E_KIND_PURGE:-0} == 1 ]]; then
      rm -rf "$KIND_DOCKER_ROOT" "$CACHE/kind-base-bookworm.tar"
      log "removed the cached kind images"
    fi
  fi
  log "kind cluster $CLUSTER removed"
}
[[ ${1:-} == down ]] && { down; exit 0; }
[[ -z ${1:-} ]] || { echo "usage: $0 [down]" >&2; exit 2; }

phase_begin "tools and node image"
if ((OFFLINE)); then
  [[ $(id -u) == 0 ]] || die "the offline build runs a Docker engine and debootstrap: it needs root"
  "$ROOT/hack/realnode/deps.sh"
  "$ROOT/hack/build-tools.sh" etcd helm kube kubelet coredns kubeadm kind
  NODE_IMAGE=$("$ROOT/hack/kind/node-image.sh" | tail -1)
else
  NODE_IMAGE=$KIND_NODE_IMAGE
fi
for tool in "$KIND" "$KUBECTL" "$HELM" "$DOCKER" "$PYTHON"; do
  command -v "$tool" >/dev/null || die "$tool not found (this script needs Docker, kind, kubectl, helm and python3)"
done
"$DOCKER" info >/dev/null 2>&1 || die "the Docker daemon is not reachable"
"$PYTHON" -c 'import yaml' 2>/dev/null || die "$PYTHON lacks pyyaml (pip install pyyaml)"
phase_end "$NODE_IMAGE"

VERSION=$("$PYTHON" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
OPERATOR_IMAGE=meshrun/operator:$VERSION
TRAINER_IMAGE=meshrun/trainer:$VERSION

diagnose() {
  log "diagnostics"
  kc get nodes -o wide || true
  kc get paralleltrainingjobs,pods,services -A -o wide || true
  kc -n "$NAMESPACE" logs "deployment/meshrun" --tail=200 || true
  kc -n "$JOBS_NAMESPACE" describe paralleltrainingjobs || true
  for pod in $(kc -n "$JOBS_NAMESPACE" get pods -o name 2>/dev/null); do
    echo "--- $pod"; kc -n "$JOBS_NAMESPACE" logs "$pod" --tail=60 || true
  done
}

cleanup() {
  local rc=$?
  ((rc == 0)) || diagnose
  if [[ ${KEEP_CLUSTER:-0} == 1 ]]; then
    log "keeping cluster $CLUSTER (KUBECONFIG=$KUBECONFIG_FILE; make e2e-kind-down removes it)"
  else
    down
  fi
  exit $rc
}
trap cleanup EXIT

phase_begin "kind cluster"
mkdir -p "$STATE"
# One node. The offline image has no kindnetd: its CNI config is a plain bridge (built in).
# The kubelet keeps the imported images however full the disk gets (nothing can be pulled).
# kubelet 1.35+ refuses cgroup v1 unless failCgroupV1 is false; 1.34 accepts it either way.
cat >"$STATE/config.yaml" <<YAML
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
networking:
  disableDefaultCNI: $( ((OFFLINE)) && echo true || echo false)
nodes:
- role: control-plane
kubeadmConfigPatches:
- |
  kind: KubeletConfiguration
  failCgroupV1: false
  imageGCHighThresholdPercent: 100
  imageGCLowThresholdPercent: 99
  evictionHard: {memory.available: 100Mi, nodefs.available: 2%, imagefs.available: 2%}
YAML
if "$KIND" get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  log "reusing kind cluster $CLUSTER"
  "$KIND" export kubeconfig --name "$CLUSTER" --kubeconfig "$KUBECONFIG_FILE" >/dev/null
else
  log "creating kind cluster $CLUSTER from $NODE_IMAGE"
  "$KIND" create cluster --name "$CLUSTER" --image "$NODE_IMAGE" --config "$STATE/config.yaml" \
    --kubeconfig "$KUBECONFIG_FILE" --wait 300s
fi
kc get nodes -o wide
phase_end

phase_begin "operator and trainer images into kind"
if ((OFFLINE)); then
  # Built in the real node's engine (Debian's python stands in for python:3.11-slim there);
  # a warm run reuses them. `docker save` from that engine feeds kind load.
  "$ROOT/hack/realnode/images.sh" build operator "$OPERATOR_IMAGE" --no-import
  "$ROOT/hack/realnode/images.sh" build trainer "$TRAINER_IMAGE" --no-import
  for image in "$OPERATOR_IMAGE" "$TRAINER_IMAGE"; do
    log "kind load $image"
    DOCKER_HOST=$REALNODE_DOCKER_HOST "$DOCKER" save "$image" >"$STATE/image.tar"
    "$KIND" load image-archive --name "$CLUSTER" "$STATE/image.tar"
    rm -f "$STATE/image.tar"
  done
else
  "$DOCKER" build --target operator -t "$OPERATOR_IMAGE" .
  "$DOCKER" build --target trainer -t "$TRAINER_IMAGE" ${TORCH_INDEX:+--build-arg "TORCH_INDEX=$TORCH_INDEX"} .
  "$KIND" load docker-image --name "$CLUSTER" "$OPERATOR_IMAGE" "$TRAINER_IMAGE"
fi
phase_end

phase_begin "helm install"
"$HELM" --kubeconfig "$KUBECONFIG_FILE" upgrade --install meshrun helm/meshrun \
  --namespace "$NAMESPACE" --create-namespace \
  --set image.tag="$VERSION" --set image.pullPolicy=Never \
  --set trainerImage="$TRAINER_IMAGE" \
  --wait --timeout 300s
kc create namespace "$JOBS_NAMESPACE" --dry-run=client -o yaml | kc apply -f -
phase_end

jobs_file=$STATE/jobs.yaml
"$PYTHON" hack/e2e_kind_jobs.py "$TRAINER_IMAGE" "${EXAMPLE_FILES[@]}" >"$jobs_file"
mapfile -t names < <("$PYTHON" -c 'import sys, yaml; [print(d["metadata"]["name"]) for d in yaml.safe_load_all(open(sys.argv[1])) if d]' "$jobs_file")
log "${#names[@]} jobs: ${names[*]}"

for name in "${names[@]}"; do
  phase_begin "job $name"
  "$PYTHON" -c 'import sys, yaml; yaml.safe_dump([d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["metadata"]["name"] == sys.argv[2]][0], sys.stdout)' \
    "$jobs_file" "$name" | kc -n "$JOBS_NAMESPACE" apply -f -
  start=$SECONDS phase=""
  while ((SECONDS - start < JOB_TIMEOUT)); do
    phase=$(kc -n "$JOBS_NAMESPACE" get paralleltrainingjob "$name" -o jsonpath='{.status.phase}' 2>/dev/null || true)
    [[ $phase == Succeeded || $phase == Failed ]] && break
    sleep 5
  done
  [[ $phase == Succeeded ]] || die "job $name ended in phase '${phase:-none}' after $((SECONDS - start)) s"
  loss=$(kc -n "$JOBS_NAMESPACE" get paralleltrainingjob "$name" -o jsonpath='{.status.progress.loss}')
  log "job $name Succeeded in $((SECONDS - start)) s (final loss $loss)"
  kc -n "$JOBS_NAMESPACE" delete paralleltrainingjob "$name" --wait=true --timeout=120s
  phase_end "Succeeded, loss $loss"
done
log "all ${#names[@]} jobs Succeeded"
phase_summary

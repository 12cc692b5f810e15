#!/usr/bin/env bash
# End-to-end test on a kind cluster, for machines with Docker and internet access (a laptop, or
# the CI workflow .github/workflows/e2e-kind.yaml). It cannot run on the project's build
# machines, which have neither an image registry nor kind's node image; there the same chart
# is tested against a real API server with fake KWOK nodes (tests/helm/).
#
#   1. create (or reuse) a kind cluster
#   2. build the operator and trainer images (Dockerfile targets) and load them into kind
#   3. helm install the chart (CRDs from helm/meshrun/crds)
#   4. apply every example, shrunk to CPU (hack/e2e_kind_jobs.py), one at a time, and wait
#      for phase Succeeded; a Failed job or a timeout fails the run with diagnostics
#
# Environment: KIND_CLUSTER (meshrun-e2e), KIND_NODE_IMAGE (kind's default), KEEP_CLUSTER=1 to
# keep the cluster afterwards, JOB_TIMEOUT seconds per job (900), EXAMPLES (examples/*.yaml),
# TORCH_INDEX (an extra package index for torch, e.g. PyTorch's CPU wheels), PYTHON (python3,
# with pyyaml), KIND, KUBECTL, HELM, DOCKER (the binaries).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

CLUSTER=${KIND_CLUSTER:-meshrun-e2e}
KIND=${KIND:-kind}
KUBECTL=${KUBECTL:-kubectl}
HELM=${HELM:-helm}
DOCKER=${DOCKER:-docker}
PYTHON=${PYTHON:-python3}
JOB_TIMEOUT=${JOB_TIMEOUT:-900}
NAMESPACE=meshrun-system
JOBS_NAMESPACE=meshrun-e2e
read -r -a EXAMPLE_FILES <<<"${EXAMPLES:-$(echo examples/*.yaml)}"

LOG_TAG=e2e-kind
source "$ROOT/hack/lib.sh"

for tool in "$KIND" "$KUBECTL" "$HELM" "$DOCKER" "$PYTHON"; do
  command -v "$tool" >/dev/null || die "$tool not found (this script needs Docker, kind, kubectl, helm and python3)"
done
"$DOCKER" info >/dev/null 2>&1 || die "the Docker daemon is not reachable"
"$PYTHON" -c 'import yaml' 2>/dev/null || die "$PYTHON lacks pyyaml (pip install pyyaml)"

VERSION=$("$PYTHON" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
OPERATOR_IMAGE=meshrun/operator:$VERSION
TRAINER_IMAGE=meshrun/trainer:$VERSION
CONTEXT=kind-$CLUSTER
KUBE_CONTEXT=$CONTEXT

diagnose() {
  log "diagnostics"
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
    log "keeping cluster $CLUSTER (kind delete cluster --name $CLUSTER)"
  else
    "$KIND" delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
  fi
  exit $rc
}
trap cleanup EXIT

if "$KIND" get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  log "reusing kind cluster $CLUSTER"
else
  log "creating kind cluster $CLUSTER"
  "$KIND" create cluster --name "$CLUSTER" --wait 180s ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"}
fi

log "building $OPERATOR_IMAGE and $TRAINER_IMAGE"
"$DOCKER" build --target operator -t "$OPERATOR_IMAGE" .
"$DOCKER" build --target trainer -t "$TRAINER_IMAGE" ${TORCH_INDEX:+--build-arg "TORCH_INDEX=$TORCH_INDEX"} .
"$KIND" load docker-image --name "$CLUSTER" "$OPERATOR_IMAGE" "$TRAINER_IMAGE"

log "installing the chart"
"$HELM" --kube-context "$CONTEXT" upgrade --install meshrun helm/meshrun \
  --namespace "$NAMESPACE" --create-namespace \
  --set image.tag="$VERSION" --set image.pullPolicy=Never \
  --set trainerImage="$TRAINER_IMAGE" \
  --wait --timeout 180s
kc create namespace "$JOBS_NAMESPACE" --dry-run=client -o yaml | kc apply -f -

jobs_file=$(mktemp)
"$PYTHON" hack/e2e_kind_jobs.py "$TRAINER_IMAGE" "${EXAMPLE_FILES[@]}" >"$jobs_file"
mapfile -t names < <("$PYTHON" -c 'import sys, yaml; [print(d["metadata"]["name"]) for d in yaml.safe_load_all(open(sys.argv[1])) if d]' "$jobs_file")
log "${#names[@]} jobs: ${names[*]}"

for name in "${names[@]}"; do
  "$PYTHON" -c 'import sys, yaml; yaml.safe_dump([d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["metadata"]["name"] == sys.argv[2]][0], sys.stdout)' \
    "$jobs_file" "$name" | kc -n "$JOBS_NAMESPACE" apply -f -
  start=$SECONDS phase=""
  while ((SECONDS - start < JOB_TIMEOUT)); do
    phase=$(kc -n "$JOBS_NAMESPACE" get paralleltrainingjob "$name" -o jsonpath='{.status.phase}' 2>/dev/null || true)
    [[ $phase == Succeeded || $phase == Failed ]] && break
    sleep 5
  done
  [[ $phase == Succeeded ]] || die "job $name ended in phase '${phase:-none}' after $((SECONDS - start)) s"
  log "job $name Succeeded in $((SECONDS - start)) s"
  kc -n "$JOBS_NAMESPACE" delete paralleltrainingjob "$name" --wait=true --timeout=120s
done
log "all ${#names[@]} jobs Succeeded"

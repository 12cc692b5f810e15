#!/usr/bin/env bash
# `make demo`: train the demo job (examples/demo-3d-cpu.yaml: a tiny model in 3D, dp 2 x pp 2 x
# tp 2, on 2 pods x 4 CPU processes) for real on the local cluster's real node. The Makefile has
# started the cluster (make cluster-up); this adds the real node if missing, builds and imports
# the images, installs the chart (the operator runs in the cluster), applies the job, follows it
# with live status, and prints the final status, the final loss and the placement picture.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
KUBECONFIG=${KUBECONFIG_LOCAL:-$ROOT/.cluster/kubeconfig}
BIN=$ROOT/.cluster/bin
PY=$ROOT/.venv/bin/python
NS=${DEMO_NAMESPACE:-meshrun-demo}
JOB_FILE=${DEMO_JOB:-$ROOT/examples/demo-3d-cpu.yaml}
OUT=$ROOT/out/demo
CHECKPOINTS=/var/lib/meshrun-checkpoints/$NS
KUBECTL=$BIN/kubectl KUBECONFIG_FILE=$KUBECONFIG
source "$ROOT/hack/lib.sh"

phase_begin "real node and images (built side by side)"
# Image builds (network, disk) run while the real node's Go builds (CPU) do; both print progress.
mkdir -p "$OUT"
(
  "$ROOT/hack/realnode/images.sh" build operator meshrun/operator:0.1.0 --no-import
  "$ROOT/hack/realnode/images.sh" build trainer meshrun/trainer:0.1.0 --no-import
) > >(tee "$OUT/images.log") 2>&1 &
images_pid=$!
"$ROOT/hack/realnode/up.sh"
wait "$images_pid" || { echo "image build failed, see $OUT/images.log" >&2; exit 1; }
phase_end

phase_begin "images into the node's containerd"
"$ROOT/hack/realnode/images.sh" build operator meshrun/operator:0.1.0 | { grep -v '^  \[' || true; }
"$ROOT/hack/realnode/images.sh" build trainer meshrun/trainer:0.1.0 | { grep -v '^  \[' || true; }
phase_end

phase_begin "helm install (operator in the cluster)"
kc create namespace "$NS" --dry-run=client -o yaml | kc apply -f - >/dev/null
# The image id as a pod annotation: a rebuilt operator image (same tag) rolls the operator pod.
operator_id=$(DOCKER_HOST=unix:///run/meshrun-docker/docker.sock docker image inspect \
  -f '{{.Id}}' meshrun/operator:0.1.0 | cut -c8-19)
"$BIN/helm" upgrade --install meshrun "$ROOT/helm/meshrun" --kubeconfig "$KUBECONFIG" -n "$NS" \
  -f "$ROOT/hack/realnode/operator-values.yaml" --set "watchNamespaces={$NS}" \
  --set-string "podAnnotations.meshrun\\.dev/operator-image-id=$operator_id" \
  --wait --timeout 180s >/dev/null
kc get pods -n "$NS" -l app.kubernetes.io/name=meshrun -o wide
phase_end

phase_begin "apply the job"
objects=$("$PY" "$ROOT/hack/realnode/demo_job.py" "$NS" "$CHECKPOINTS" "$JOB_FILE")
read -r JOB PV < <("$PY" -c 'import json, sys
items = json.load(sys.stdin)["items"]
print(items[-1]["metadata"]["name"], items[0]["metadata"]["name"])' <<<"$objects")
# A fresh run each time: the previous job, its pods and its checkpoints go first.
kc delete paralleltrainingjob "$JOB" -n "$NS" --ignore-not-found --wait=true >/dev/null
kc delete pvc "$JOB-checkpoints" -n "$NS" --ignore-not-found --wait=true >/dev/null
kc delete pv "$PV" --ignore-not-found >/dev/null
rm -rf "$CHECKPOINTS"
mkdir -p "$CHECKPOINTS" && chmod 0777 "$CHECKPOINTS"  # the trainer runs as uid 1000
kc apply -f - <<<"$objects"
phase_end

phase_begin "train (live status from the job's .status)"
last=""
while :; do
  status=$(kc get paralleltrainingjob "$JOB" -n "$NS" -o json | "$PY" -c '
import json, sys
s = json.load(sys.stdin).get("status") or {}
p = s.get("progress") or {}
loss = p.get("loss")
eta = p.get("etaSeconds")
print(s.get("phase", "Pending"), p.get("step", 0), p.get("totalSteps", "?"),
      "-" if loss is None else f"{loss:.4f}", round(p.get("tokensPerSecond") or 0),
      "-" if eta is None else f"{eta:.0f}s", s.get("restarts", 0))')
  read -r ph step total loss tps eta restarts <<<"$status"
  line=$(printf '%-10s step %3s/%-3s loss %-8s %6s tok/s  eta %-5s restarts %s' \
    "$ph" "$step" "$total" "$loss" "$tps" "$eta" "$restarts")
  [[ $line != "$last" ]] && printf '  [%4d s] %s\n' $((SECONDS - PHASE_START)) "$line"
  last=$line
  [[ $ph == Succeeded || $ph == Failed ]] && break
  sleep 2
done
phase_end

phase_begin "result"
kc get paralleltrainingjob "$JOB" -n "$NS" -o wide
kc get pods -n "$NS" -l "meshrun.dev/job-name=$JOB" -o wide
kc get paralleltrainingjob "$JOB" -n "$NS" -o json >"$OUT/status.json"
"$PY" -m meshrun plan "$JOB_FILE" --picture "$OUT/placement.svg" >/dev/null
final=$("$PY" -c 'import json,sys; print(json.load(sys.stdin)["status"]["progress"]["loss"])' <"$OUT/status.json")
echo
echo "phase:            $ph"
echo "final loss:       $final"
echo "status:           $OUT/status.json"
echo "placement:        $OUT/placement.svg"
phase_end

phase_summary
[[ $ph == Succeeded ]]

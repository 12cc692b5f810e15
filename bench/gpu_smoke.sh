#!/usr/bin/env bash
# One-GPU smoke test of the trainer: bf16 autocast, the ~1B preset, tokens/s and MFU.
#
#   bench/gpu_smoke.sh                 # on an H200 (or any CUDA GPU): 1b preset, 20 steps
#   PRESET=tiny STEPS=3 PRECISION=fp32 ACCELERATOR=cpu bench/gpu_smoke.sh   # dry run on a CPU
#
# MFU = achieved model FLOP/s / peak, with model FLOPs per token ~ 6*psi + 12*L*h*s (Narayanan
# et al. 2021, arXiv 2104.04473) and the H100/H200 dense bf16 peak of 989 TFLOP/s.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
PRESET=${PRESET:-1b}
STEPS=${STEPS:-20}
BATCH=${BATCH:-8}
PRECISION=${PRECISION:-bf16}
ACCELERATOR=${ACCELERATOR:-nvidia.com/gpu}
PEAK_TFLOPS=${PEAK_TFLOPS:-989}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$PY" - <<PYEOF
import torch
print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "(no GPU)")
PYEOF

cat > "$work/job.yaml" <<YAML
apiVersion: meshrun.dev/v1alpha1
kind: ParallelTrainingJob
metadata:
  name: gpu-smoke
spec:
  image: meshrun/trainer:0.1.0
  resources:
    numNodes: 1
    numProcPerNode: 1
    accelerator: ${ACCELERATOR}
    acceleratorMemoryGiB: 141
  strategy:
    type: ddp
  model:
    preset: ${PRESET}
  training:
    steps: ${STEPS}
    globalBatchSize: ${BATCH}
    microBatchSize: ${BATCH}
    precision: ${PRECISION}
    learningRate: 0.0003
YAML

"$PY" -m meshrun run "$work/job.yaml" --local --quiet --summary-json "$work/summary.json"

"$PY" - "$work/summary.json" "$PRESET" "$PEAK_TFLOPS" <<'PYEOF'
import json, sys
from meshrun.presets import PRESETS
summary = json.load(open(sys.argv[1]))
shape, peak = PRESETS[sys.argv[2]], float(sys.argv[3]) * 1e12
psi = shape.parameters()
flops_per_token = 6 * psi + 12 * shape.layers * shape.hidden * shape.seq_len
tps = summary["tokensPerSecond"]
print(f"preset {sys.argv[2]}: {psi / 1e9:.3f}B parameters, seq {shape.seq_len}, "
      f"{summary['steps']} steps, losses {summary['losses'][0]:.3f} -> {summary['finalLoss']:.3f}")
print(f"tokens/s: {tps:,.0f}")
print(f"model TFLOP/s: {tps * flops_per_token / 1e12:.1f}")
print(f"MFU vs {peak / 1e12:.0f} TFLOP/s: {100 * tps * flops_per_token / peak:.1f}%")
print(f"peak memory: {max(summary['peakMemoryBytes']) / 2**30:.1f} GiB ({summary['peakMemoryKind']})")
PYEOF

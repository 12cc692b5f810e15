#!/usr/bin/env bash
# One-GPU smoke test of the trainer on CUDA: the 1b preset in bf16 through `meshrun run --local`,
# tokens/s and MFU beside the plan's estimate for the same job, the job's matrix multiplies timed
# against the step-time model (`meshrun calibrate`), peak memory beside the planner's estimate,
# the attention kernel torch picks, and a checkpoint saved and resumed on the GPU. Fails (exit 1) unless everything ran on CUDA.
#
#   bench/gpu_smoke.sh                  # on an H100/H200 (or any CUDA GPU); about 3-5 minutes
#   PRESET=small STEPS=10 bench/gpu_smoke.sh
#   SMOKE_ALLOW_CPU=1 PRESET=tiny RESUME_PRESET=tiny STEPS=4 bench/gpu_smoke.sh
#                                       # a dry run of the script on a CPU: still exits 1
#
# FLOPs per token (Narayanan et al. 2021; Kaplan et al. 2020): 6 x the parameters that do matrix
# work, so without the input embedding (a lookup), plus 12 x layers x hidden x seqLen for the
# attention scores and their use. MFU = achieved FLOP/s / PEAK_TFLOPS (989: H100/H200 dense
# bf16). Tokens/s leaves out the first step (compilation and warm-up).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
PRESET=${PRESET:-1b}
STEPS=${STEPS:-20}
BATCH=${BATCH:-8}
COMPILE=${COMPILE:-true}
RESUME_PRESET=${RESUME_PRESET:-small}
PEAK_TFLOPS=${PEAK_TFLOPS:-989}
LIMIT_S=${LIMIT_S:-480}
started=$(date +%s)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

job() {  # job NAME PRESET STEPS BATCH EVERY > yaml
  cat <<YAML
apiVersion: meshrun.dev/v1alpha1
kind: ParallelTrainingJob
metadata:
  name: $1
spec:
  image: meshrun/trainer:0.1.0
  resources: {numNodes: 1, numProcPerNode: 1, accelerator: nvidia.com/gpu${PRODUCT:+, acceleratorProduct: $PRODUCT}}
  strategy: {type: ddp}
  model: {preset: $2}
  training:
    steps: $3
    globalBatchSize: $4
    microBatchSize: $4
    precision: bf16
    compile: ${COMPILE}
    learningRate: 0.0003
    dataset: synthetic
    checkpoint: {everySteps: $5}
YAML
}

"$PY" - <<'PYEOF'
import os, sys, torch
print("torch", torch.__version__, "CUDA", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0))
else:
    print("FAIL: no CUDA device; this smoke test measures a GPU", file=sys.stderr)
    sys.exit(0 if os.environ.get("SMOKE_ALLOW_CPU") == "1" else 1)
PYEOF

# The GPU's product label (as GPU Feature Discovery writes it), so the plan's estimate uses its
# profile; unset when it is not a built-in product (the estimate then assumes an H100).
PRODUCT=${PRODUCT:-$("$PY" - <<'PYEOF'
import torch
from meshrun.api.hardware import PROFILES
name = torch.cuda.get_device_name(0).replace(" ", "-") if torch.cuda.is_available() else ""
print(name if name in PROFILES else "")
PYEOF
)}
export PRODUCT

# 1. Throughput, MFU and memory on the preset, beside the plan's estimate; the matrix multiplies
# of the same job timed against the step-time model (meshrun calibrate).
job gpu-smoke "$PRESET" "$STEPS" "$BATCH" 0 > "$work/perf.yaml"
"$PY" -m meshrun plan "$work/perf.yaml" -o json > "$work/plan.json"
"$PY" -m meshrun run "$work/perf.yaml" --local --quiet --summary-json "$work/perf.json"
"$PY" -m meshrun calibrate "$work/perf.yaml" -o json > "$work/calibrate.json"

# 2. The attention kernel torch's scaled_dot_product_attention picks for the model's shapes.
"$PY" - "$PRESET" "$BATCH" > "$work/sdpa.txt" <<'PYEOF'
import sys, torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
from meshrun.api.presets import PRESETS
shape, batch = PRESETS[sys.argv[1]], int(sys.argv[2])
device = "cuda" if torch.cuda.is_available() else "cpu"
q = torch.randn(batch, shape.heads, shape.seq_len, shape.head_dim, device=device, dtype=torch.bfloat16)
activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
with profile(activities=activities) as prof:
    F.scaled_dot_product_attention(q, q, q, is_causal=True)
    if device == "cuda":
        torch.cuda.synchronize()
names = {e.name for e in prof.events()}
kinds = [k for k in ("flash", "efficient", "cudnn", "math") if any(k in n.lower() for n in names)]
print(kinds[0] if kinds else "unknown: " + ", ".join(sorted(n for n in names if "attention" in n.lower())))
PYEOF

# 3. Save on the GPU, resume on the GPU: the resumed steps equal an uninterrupted run's.
half=$((STEPS / 2))
job resume-straight "$RESUME_PRESET" "$STEPS" 4 "$half" > "$work/straight.yaml"
job resume-cut "$RESUME_PRESET" "$half" 4 "$half" > "$work/cut.yaml"
job resume-cut "$RESUME_PRESET" "$STEPS" 4 "$half" > "$work/rest.yaml"
"$PY" -m meshrun run "$work/straight.yaml" --local --quiet --checkpoint-dir "$work/ck-straight" \
  --summary-json "$work/straight.json"
"$PY" -m meshrun run "$work/cut.yaml" --local --quiet --checkpoint-dir "$work/ck-cut" \
  --summary-json "$work/cut.json"
"$PY" -m meshrun run "$work/rest.yaml" --local --quiet --checkpoint-dir "$work/ck-cut" \
  --summary-json "$work/rest.json"

"$PY" - "$work" "$PRESET" "$PEAK_TFLOPS" "$half" "$started" "$LIMIT_S" "$COMPILE" <<'PYEOF'
import json, os, sys, time
from pathlib import Path
from meshrun.api.presets import PRESETS
work, preset, peak = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3]) * 1e12
half, started, limit, compiled = int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]), sys.argv[7]
perf = json.loads((work / "perf.json").read_text())
plan = json.loads((work / "plan.json").read_text())
shape = PRESETS[preset]
failures = []
kind = perf.get("peakMemoryKind")
if kind != "cuda.max_memory_allocated":
    failures.append(f"the trainer did not run on CUDA (peak memory kind {kind})")
psi = shape.parameters()
dense = psi - shape.vocab * shape.hidden  # the input embedding is a lookup, no matmul
flops_per_token = 6 * dense + 12 * shape.layers * shape.hidden * shape.seq_len
tps = perf["tokensPerSecond"]
measured, estimate = max(perf["peakMemoryBytes"]), plan["memory"]["perGpuBytes"]["total"]
print(f"preset {preset}: {psi / 1e9:.3f}B parameters ({dense / 1e9:.3f}B without the input "
      f"embedding), seq {shape.seq_len}, {perf['steps']} steps, "
      f"loss {perf['losses'][0]:.3f} -> {perf['finalLoss']:.3f}")
print(f"activation checkpointing {plan['layout']['activationCheckpointing']}, compile {compiled}")
print(f"tokens/s: {tps:,.0f}")
print(f"FLOPs per token: {flops_per_token / 1e9:.2f} GFLOP (6 x {dense / 1e9:.3f}B + 12 L h s)")
print(f"model TFLOP/s: {tps * flops_per_token / 1e12:.1f}")
print(f"MFU vs {peak / 1e12:.0f} TFLOP/s: {100 * tps * flops_per_token / peak:.1f}%")
speed = plan.get("estimate")
if speed:
    predicted = speed["tokensPerSecondPerGpu"]
    print(f"plan's estimate on {os.environ.get('PRODUCT') or 'the default profile (H100)'}: "
          f"{predicted:,.0f} tokens/s, MFU {100 * speed['mfu']:.1f}%, "
          f"step {speed['stepSeconds'] * 1e3:.3g} ms; measured / predicted "
          f"{tps / predicted:.2f}")
    parts = ", ".join(f"{k} {v * 1e3:.3g} ms" for k, v in speed["breakdown"].items() if v)
    print(f"  predicted step by part: {parts}")
else:
    failures.append("the plan carries no estimate")
cal = json.loads((work / "calibrate.json").read_text())
print(f"matrix multiplies of one block (meshrun calibrate, {cal['dtype']}): "
      f"{cal['measuredTflops']:.0f} TFLOP/s, {100 * cal['measuredEfficiency']:.0f}% of "
      f"{cal['peakTflops']:.0f}; the model assumes {100 * cal['predictedEfficiency']:.0f}% "
      f"(measured speed / model {cal['speedVsModel']:.2f}, implied peak "
      f"{cal['impliedPeakTflops']:.0f} TFLOP/s)")
print(f"peak memory: {measured / 2**30:.2f} GiB measured ({kind}), planner "
      f"{estimate / 2**30:.2f} GiB, ratio {measured / estimate:.2f}")
print(f"attention kernel (scaled_dot_product_attention): {(work / 'sdpa.txt').read_text().strip()}")
straight = json.loads((work / "straight.json").read_text())
cut = json.loads((work / "cut.json").read_text())
rest = json.loads((work / "rest.json").read_text())
for name, run in (("straight", straight), ("cut", cut), ("resumed", rest)):
    if run.get("peakMemoryKind") != "cuda.max_memory_allocated":
        failures.append(f"the {name} resume run did not run on CUDA")
if rest.get("resumedFromStep") != half:
    failures.append(f"resumed from step {rest.get('resumedFromStep')}, expected {half}")
want, got = straight["losses"][half:], rest["losses"]
gap = max((abs(g - w) / abs(w) for g, w in zip(got, want, strict=True)), default=1.0)
ok = len(got) == len(want) and gap <= 2e-2  # bf16 on a GPU: not bit-exact
print(f"save/resume on CUDA: resumed from step {rest.get('resumedFromStep')}, steps "
      f"{half + 1}-{len(straight['losses'])} within {gap:.1e} of the uninterrupted run: "
      f"{'ok' if ok else 'MISMATCH'}")
if not ok:
    failures.append("the resumed run does not continue the uninterrupted one")
elapsed = time.time() - started
print(f"elapsed: {elapsed:.0f} s (limit {limit:.0f} s)")
if elapsed > limit:
    failures.append(f"took {elapsed:.0f} s, over the {limit:.0f} s limit")
for failure in failures:
    print(f"FAIL: {failure}", file=sys.stderr)
sys.exit(1 if failures else 0)
PYEOF

"""``meshrun calibrate``: time the matrix multiplies of a job's layers on this machine's
accelerator and compare them with the step-time model's efficiency curve.

The step-time model (docs/planner.md) prices every matrix multiply at the product's dense peak
times :func:`meshrun.planner.steptime.gemm_efficiency` of its shape. This measures the same
products (the four of a block, on one tensor-parallel rank, for one micro-batch, each with its
two backward products) and prints, per product, the TFLOP/s reached, its share of the peak, and
the share the model assumes. The FLOP-weighted ratio says how far the profile is off for this
job on this hardware, and the peak that would make the model match.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from meshrun.api.errors import SpecError
from meshrun.api.read import read_spec
from meshrun.files.checks import mount, plan_checked
from meshrun.files.mountflag import add_mount_flag
from meshrun.planner.steptime import gemm_efficiency, gemm_passes, layer_gemms
from meshrun_trainer.local.run import UsageError, pick_job

FP32_PEAK_SHARE = 8
"""The step-time model prices fp32 matrix multiplies at an eighth of the bf16 peak (TF32 is off
by default in torch); the same divisor applies here so the comparison is like for like."""


PRODUCT_WORDS = {
    "forward": "forward",
    "inputGradient": "input grad",
    "weightGradient": "weight grad",
}


@dataclass(frozen=True)
class Measured:
    """One timed matrix multiply."""

    weights: str
    """The block's weights it multiplies by (``wq,wk,wv``, ``wo``, ``w1,w3``, ``w2``)."""
    product: str
    """forward, inputGradient or weightGradient."""
    m: int
    n: int
    k: int
    seconds: float
    """Median wall time of one multiply."""
    tflops: float
    """Achieved TFLOP/s (2 m n k per multiply)."""
    efficiency: float
    """Achieved share of the peak."""
    predicted_efficiency: float
    """The share the step-time model assumes for this shape."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="meshrun calibrate",
        description="Time a job's matrix multiplies here and compare them with the plan's "
        "step-time model.",
    )
    parser.add_argument("file", help="YAML file with a ParallelTrainingJob")
    parser.add_argument("--job", help="name of the job when the file holds several")
    parser.add_argument(
        "--device", choices=("auto", "cuda", "cpu"), default="auto", help="where to multiply"
    )
    parser.add_argument(
        "--repeat", type=int, default=20, help="timed multiplies per product (median taken)"
    )
    parser.add_argument(
        "--peak-tflops",
        type=float,
        help="the dense bf16 peak to compare with (default: the job's accelerator profile)",
    )
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")
    add_mount_flag(parser, "so its files are read")
    return parser


def _time_multiply(
    torch: Any, m: int, n: int, k: int, dtype: Any, device: str, repeat: int
) -> float:
    """Median seconds of one (m x k) @ (k x n) multiply, after a warm-up."""
    a = torch.randn(m, k, dtype=dtype, device=device)
    b = torch.randn(k, n, dtype=dtype, device=device)
    out = torch.empty(m, n, dtype=dtype, device=device)
    cuda = device == "cuda"
    for _ in range(3):
        torch.matmul(a, b, out=out)
    times = []
    for _ in range(repeat):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.matmul(a, b, out=out)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            began = time.perf_counter()
            torch.matmul(a, b, out=out)
            times.append(time.perf_counter() - began)
    times.sort()
    return float(times[len(times) // 2])


def calibrate(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    job = pick_job(args.file, args.job)
    spec = read_spec(mount(job.get("spec", {}), args.mount))
    plan = plan_checked(spec, str(job.get("metadata", {}).get("name", "job")))
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise SpecError("--device", "cuda: torch sees no CUDA device here")
    bf16 = spec.training.precision == "bf16"
    dtype = torch.bfloat16 if bf16 else torch.float32
    profile = spec.resources.profile
    peak_tflops = args.peak_tflops or profile.peak_tflops
    peak = peak_tflops if bf16 else peak_tflops / FP32_PEAK_SHARE
    tokens = plan.layout.micro_batch_size * plan.model.seq_len
    shapes = [
        (weights, product, (int(a), int(b), int(c)))
        for weights, (m, n, k) in layer_gemms(plan.model, tokens, plan.layout.tp).items()
        for product, (a, b, c) in gemm_passes(m, n, k).items()
    ]
    rows: list[Measured] = []
    quiet = args.output != "text" or not sys.stderr.isatty()
    with Progress(console=Console(stderr=True), transient=True, disable=quiet) as progress:
        task = progress.add_task("timing matrix multiplies", total=len(shapes))
        for weights, product, (m, n, k) in shapes:
            seconds = _time_multiply(torch, m, n, k, dtype, device, max(args.repeat, 1))
            tflops = 2 * m * n * k / seconds / 1e12
            predicted = gemm_efficiency(m, n, k)
            row = Measured(weights, product, m, n, k, seconds, tflops, tflops / peak, predicted)
            rows.append(row)
            progress.advance(task)
    flops = [2 * r.m * r.n * r.k for r in rows]
    measured_seconds = sum(r.seconds for r in rows)
    predicted_seconds = sum(
        f / (peak * 1e12 * r.predicted_efficiency) for f, r in zip(flops, rows, strict=True)
    )
    ratio = predicted_seconds / measured_seconds
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    return {
        "job": plan.name,
        "device": name,
        "dtype": "bf16" if bf16 else "fp32",
        "product": profile.product,
        "peakTflops": peak_tflops,
        "tensorParallel": plan.layout.tp,
        "tokensPerMicroBatch": tokens,
        "multiplies": [_camel(asdict(r)) for r in rows],
        "measuredTflops": sum(flops) / measured_seconds / 1e12,
        "measuredEfficiency": sum(flops) / measured_seconds / 1e12 / peak,
        "predictedEfficiency": sum(flops) / predicted_seconds / 1e12 / peak,
        "speedVsModel": ratio,
        "impliedPeakTflops": peak_tflops * ratio,
    }


def _camel(row: dict[str, Any]) -> dict[str, Any]:
    def key(name: str) -> str:
        head, *rest = name.split("_")
        return head + "".join(part.title() for part in rest)

    return {key(k): v for k, v in row.items()}


def _print(result: dict[str, Any]) -> None:
    console = Console()
    table = Table(title=f"{result['job']}: one block's matrix multiplies on {result['device']}")
    for column in ("weights", "product", "m x n x k", "ms", "TFLOP/s", "of peak", "model"):
        table.add_column(column, justify="left" if column in ("weights", "product") else "right")
    for row in result["multiplies"]:
        table.add_row(
            row["weights"], PRODUCT_WORDS[row["product"]], f"{row['m']}x{row['n']}x{row['k']}",
            f"{row['seconds'] * 1e3:.3f}", f"{row['tflops']:.1f}", f"{row['efficiency']:.1%}",
            f"{row['predictedEfficiency']:.0%}",
        )  # fmt: skip
    console.print(table)
    if result["device"] == "cpu" and result["product"] != "cpu":
        console.print(
            f"This machine has no {result['product']}: the figures below compare a CPU with a "
            "GPU profile. Run it where the job's GPUs are."
        )
    console.print(
        f"{result['dtype']} against {result['product']}'s {result['peakTflops']:.0f} TFLOP/s "
        f"peak: measured {result['measuredTflops']:.1f} TFLOP/s "
        f"({result['measuredEfficiency']:.0%} of it), the model assumes "
        f"{result['predictedEfficiency']:.0%}: these multiplies run "
        f"{result['speedVsModel']:.2f}x the model's speed here; a peak of "
        f"{result['impliedPeakTflops']:.0f} TFLOP/s would make the model match."
    )


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        result = calibrate(args)
    except (UsageError, SpecError, OSError) as error:
        print(f"meshrun calibrate: {error}", file=sys.stderr)
        return 2
    if args.output == "json":
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print(result)
    return 0

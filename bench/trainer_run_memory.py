"""Whole-run peak resident memory of each rank, checkpoint save included, beside the planner's
per-rank estimate, for every layout family at 2, 4 and 8 CPU ranks, and for a mixture of experts
under expert parallelism (a table of its own).

Run: .venv/bin/python bench/trainer_run_memory.py [--ranks 2 4 8] [--families ddp zero3 cp ...]
     [--moe-families moe-ddp ...] [--layers 8 --hidden 768] [--steps 2] [--json rows.json]
     [--write-docs]   (--families or --moe-families with no name: none of those rows)
     .venv/bin/python bench/trainer_run_memory.py --from-json rows.json   (no runs: re-estimate)
(each row is two real ``meshrun run --local`` jobs, fp32, seq 64, with a checkpoint at the end;
a few minutes per rank count on a 2-core machine; a row is skipped with a message when
MemAvailable is short of what its ranks need)

The context-parallel rows (``cp``: every rank of one data-parallel replica splitting each
sequence, cp = ranks) train a model of their own with a long sequence (--cp-seq, 8,192 tokens;
4 layers of width 256, 8 heads over 2 KV heads), one sequence per step, so that the
activations of a rank's share of the sequence and the gathered keys and values, not the
parameters, are most of what is measured; they get a table of their own.

"Measured" is a rank's resident high-water mark over the whole run (ru_maxrss, which every rank
reports in the run summary, taken after the final checkpoint save) less the same rank's in a run
of the same layout with a model of width 64: the process's fixed part (torch, gloo, the
interpreter) cancels, what the model adds stays. The estimate is the planner's
``memory.perGpuBytes.total`` for the job less its estimate for the narrow model. The table
shows the most loaded rank (pipeline stages differ) and the ratio measured / estimate; the
target is within 15% (0.85 to 1.15).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from _docsection import write_section

from meshrun.planner.plan import plan_job

GIB = 2**30
Row = dict[str, Any]
"""One measured (ranks, layout): its layout name, both jobs and the per-rank bytes above."""
LABELS = {
    "ddp": "DDP",
    "zero1": "ZeRO-1",
    "zero2": "ZeRO-2",
    "zero3": "ZeRO-3",
    "pipeline": "pipeline",
    "tensor": "tensor",
    "3d": "3D",
    "cp": "CP",
}
TOLERANCE = 0.15
FAMILIES = ("ddp", "zero1", "zero2", "zero3", "pipeline", "tensor", "3d", "cp")
NARROW = {"hidden": 64, "heads": 8, "vocab": 256, "ffnHidden": 256}
"""The baseline model: the same layers and layout, almost no parameters."""


def strategy(family: str, world: int) -> dict[str, Any] | None:
    """The strategy of ``family`` on ``world`` ranks, None where it needs more ranks."""
    if family == "ddp":
        return {"type": "ddp"}
    if family.startswith("zero"):
        return {"type": "zero", "zeroStage": int(family[-1])}
    if family == "pipeline":
        return {
            "type": "pipeline",
            "pipelineParallel": world,
            "pipelineSchedule": "1f1b",
            "microBatches": world,
        }
    if family == "tensor":
        return {"type": "tensor", "tensorParallel": world}
    if family == "cp":
        return {"type": "ddp", "contextParallel": world}
    if world < 8:
        return None  # 3D needs dp, pp and tp of 2 at least
    return {
        "type": "hybrid",
        "dataParallel": 2,
        "pipelineParallel": 2,
        "tensorParallel": world // 4,
        "zeroStage": 1,
        "pipelineSchedule": "1f1b",
        "microBatches": 2,
    }


def job(
    world: int, plan: dict[str, Any], model: dict[str, Any], steps: int, batch: int
) -> dict[str, Any]:
    return {
        "apiVersion": "meshrun.dev/v1alpha1",
        "kind": "ParallelTrainingJob",
        "metadata": {"name": "memory"},
        "spec": {
            "image": "bench",
            "resources": {"numNodes": 1, "numProcPerNode": world, "accelerator": "cpu"},
            "strategy": plan,
            "model": model,
            "training": {
                "steps": steps,
                "globalBatchSize": batch,
                "precision": "fp32",
                "dataset": "synthetic",
            },
        },
    }


def estimate(spec: dict[str, Any]) -> int:
    total: int = plan_job(spec["spec"]).memory.total
    return total


def available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def peaks(spec: dict[str, Any], workdir: Path) -> list[int]:
    """Each rank's whole-run peak resident bytes, from a real local run with a final save."""
    workdir.mkdir(parents=True)
    path = workdir / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    summary = workdir / "summary.json"
    cmd = [sys.executable, "-m", "meshrun", "run", str(path), "--local", "--quiet"]
    cmd += ["--summary-json", str(summary), "--checkpoint-dir", str(workdir / "checkpoints")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"run failed:\n{proc.stderr[-3000:]}")
    values: list[int] = json.loads(summary.read_text())["peakMemoryBytes"]
    return values


MOE_LABELS = {
    "moe-ddp": "DDP, ep = ranks",
    "moe-zero3": "ZeRO-3, ep 2",
    "moe-tensor": "tp 2, ep = ranks",
}
MOE_FAMILIES = tuple(MOE_LABELS)
MOE = {"experts": 8, "expertsPerToken": 2}
"""The mixture of every block of the MoE rows (their experts as wide as the model's hidden
size; the narrow baseline's as wide as its own)."""


def moe_strategy(family: str, world: int) -> dict[str, Any]:
    """The strategy of a MoE family on ``world`` ranks: EP over every rank under DDP, EP 2
    under ZeRO-3 (each expert's weights on world / 2 ranks, not sharded by ZeRO), and EP over
    every rank folded from dp x tp 2 (expertTensorParallel 1)."""
    if family == "moe-ddp":
        return {"type": "ddp", "expertParallel": world}
    if family == "moe-zero3":
        return {"type": "zero", "zeroStage": 3, "expertParallel": 2}
    return {
        "type": "hybrid",
        "dataParallel": world // 2,
        "pipelineParallel": 1,
        "tensorParallel": 2,
        "expertParallel": world,
        "expertTensorParallel": 1,
    }


def moe_jobs(
    model: dict[str, Any], world: int, family: str, steps: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The MoE family's job and its narrow baseline."""
    plan = moe_strategy(family, world)
    big = {**model, "moe": {**MOE, "expertFfnHidden": model["hidden"]}}
    narrow = {**model, **NARROW, "moe": {**MOE, "expertFfnHidden": NARROW["hidden"]}}
    batch = 2 * world
    return job(world, plan, big, steps, batch), job(world, plan, narrow, 1, batch)


def measure(
    args: argparse.Namespace, models: dict[bool, dict[str, Any]], out: Path | None
) -> list[Row]:
    """Run every (ranks, layout) pair asked for, the MoE families after the dense ones; each row
    also goes to ``out`` as it comes. ``models``: the model of the context-parallel rows (True)
    and of the others (False, the MoE rows' too)."""
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="meshrun-memory-") as tmp:
        for world in args.ranks:
            pairs = []
            for family in args.families:
                plan = strategy(family, world)
                if plan is None:
                    continue
                model = models[family == "cp"]
                narrow = {**model, **NARROW}
                batch = 1 if family == "cp" else 2 * world  # cp: one sequence over every rank
                big = job(world, plan, model, args.steps, batch)
                pairs.append((family, big, job(world, plan, narrow, 1, batch)))
            pairs += [
                (f, *moe_jobs(models[False], world, f, args.steps)) for f in args.moe_families
            ]
            for family, big, small in pairs:
                row = measure_row(family, big, small, Path(tmp) / f"{family}-{world}")
                if row is not None:
                    rows.append(row)
                if out is not None:
                    out.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return rows


def measure_row(family: str, big: dict[str, Any], small: dict[str, Any], run: Path) -> Row | None:
    """One row: each rank's peak in ``big`` less its peak in ``small`` (None: skipped for want
    of memory)."""
    world = big["spec"]["resources"]["numProcPerNode"]
    need = world * (estimate(big) + GIB)
    if available() < need:
        print(
            f"{family} on {world} ranks skipped: needs about {need / GIB:.1f} GiB, "
            f"MemAvailable {available() / GIB:.1f} GiB",
            flush=True,
        )
        return None
    measured = peaks(big, run / "model")
    fixed = peaks(small, run / "narrow")
    above = [b - s for b, s in zip(measured, fixed, strict=True)]
    print(f"measured {family} on {world} ranks", flush=True)
    return {"layout": family, "big": big, "small": small, "measured": above}


def render(rows: list[Row], labels: dict[str, str] = LABELS) -> list[str]:
    """The table (markdown) of measured peaks beside the current estimate, and a verdict: the
    rows whose layout ``labels`` names."""
    rows = [row for row in rows if row["layout"] in labels]
    lines = [
        "| layout | ranks | estimate GiB | measured GiB | ratio | per-rank measured GiB |",
        "|---|---:|---:|---:|---:|---|",
    ]
    ratios = []
    for row in rows:
        want = estimate(row["big"]) - estimate(row["small"])
        above: list[int] = row["measured"]
        worst = max(above)
        ratio = worst / want
        ratios.append(ratio)
        world = row["big"]["spec"]["resources"]["numProcPerNode"]
        spread = " ".join(f"{a / GIB:.2f}" for a in above)
        lines.append(
            f"| {labels[row['layout']]} | {world} | {want / GIB:.3f} | {worst / GIB:.3f} | "
            f"{ratio:.2f} | {spread} |"
        )
    if ratios:
        within = sum(abs(r - 1) <= TOLERANCE for r in ratios)
        lines += [
            "",
            f"{within} of {len(ratios)} within {TOLERANCE:.0%} (ratios {min(ratios):.2f} to "
            f"{max(ratios):.2f}).",
        ]
    return lines


def write_docs(lines: list[str], caption: str, context: bool = False) -> Path:
    """Replace (or add) this bench's section of docs/benchmarks.md (``context``: the section
    of the context-parallel rows)."""
    today = datetime.now(UTC).date().isoformat()
    which = " under context parallelism" if context else ""
    heading = f"## Whole-run peak memory per rank{which} beside the planner's estimate ({today})"
    key = "trainer_run_memory" + ("_cp" if context else "")
    command = "Produced by `python bench/trainer_run_memory.py --write-docs`: "
    return write_section(key, [heading, "", command + caption, "", *lines])


def write_moe_docs(lines: list[str], caption: str) -> Path:
    """Replace (or add) the MoE table's section of docs/benchmarks.md."""
    today = datetime.now(UTC).date().isoformat()
    heading = f"## Whole-run peak memory per rank of a mixture of experts ({today})"
    command = "Produced by `python bench/trainer_run_memory.py --write-docs`: "
    return write_section("trainer_run_memory_moe", [heading, "", command + caption, "", *lines])


def moe_caption(model: dict[str, Any]) -> str:
    return (
        f"the dense rows' model with every block's MLP a mixture of {MOE['experts']} experts "
        f"of width {model['hidden']} ({MOE['expertsPerToken']} per token, dropless); GiB per "
        f"rank above the same layout with the width-64 model whose experts are 64 wide. DDP "
        f"and tp 2 spread the experts over every rank (EP folded from dp, and from dp x tp with "
        f"expertTensorParallel 1); ZeRO-3 over the dense part keeps each expert whole on "
        f"world / 2 ranks (ep 2)."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--families", nargs="*", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument(
        "--moe-families", nargs="*", default=list(MOE_FAMILIES), choices=MOE_FAMILIES
    )
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--cp-seq", type=int, default=8192, help="the cp rows' sequence")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--json", metavar="PATH", help="write the measured rows here")
    parser.add_argument(
        "--from-json", metavar="PATH", help="no runs: the rows of an earlier --json, re-estimated"
    )
    parser.add_argument("--write-docs", action="store_true", help="write docs/benchmarks.md")
    args = parser.parse_args()
    if args.from_json:
        rows: list[Row] = json.loads(Path(args.from_json).read_text())
        steps = rows[0]["big"]["spec"]["training"]["steps"]
    else:
        models = {
            False: {
                "layers": args.layers,
                "hidden": args.hidden,
                "heads": args.heads,
                "vocab": args.vocab,
                "seqLen": 64,
            },
            True: {
                "layers": 4,
                "hidden": 256,
                "heads": 8,
                "kvHeads": 2,
                "vocab": args.vocab,
                "seqLen": args.cp_seq,
            },
        }
        steps = args.steps
        rows = measure(args, models, Path(args.json) if args.json else None)
    for context in (False, True):
        chosen = [r for r in rows if r["layout"] in LABELS and (r["layout"] == "cp") == context]
        if not chosen:
            continue
        model = chosen[0]["big"]["spec"]["model"]
        caption = (
            f"{model['layers']} layers of width {model['hidden']}, {model['heads']} heads, vocab "
            f"{model['vocab']}, seq {model['seqLen']}, fp32, {steps} steps and a checkpoint save "
            "on CPU ranks (gloo); GiB per rank above the same layout with a width-64 model. "
        )
        if context:
            caption += (
                f"{model['kvHeads']} KV heads; one sequence per step, split over every rank "
                "(dp 1 x cp = ranks): a rank holds 2 of its 2 x cp chunks and gathers the whole "
                "sequence's keys and values in every attention layer."
            )
        else:
            caption += (
                "3D is dp 2 x pp 2 x tp 2 with ZeRO-1 (it needs 8 ranks); pipeline is 1F1B "
                "over all ranks."
            )
        lines = render(chosen)
        print(caption)
        print("\n".join(lines))
        if args.write_docs:
            print(f"\nwrote {write_docs(lines, caption, context)}")
    moe_lines = render(rows, MOE_LABELS)
    moe_rows = [row for row in rows if row["layout"] in MOE_LABELS]
    if moe_rows:
        dense = {**moe_rows[0]["big"]["spec"]["model"]}
        caption = moe_caption(dense)
        print(f"\nMixture of experts: {caption}")
        print("\n".join(moe_lines))
        if args.write_docs:
            print(f"\nwrote {write_moe_docs(moe_lines, caption)}")


if __name__ == "__main__":
    main()

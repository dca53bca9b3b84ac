"""How well the cost model's predictions agree with public GPU measurements, without a GPU.

For every row of benchmarks/public_measurements.py, emmy compiles the same program for the
GPU it was measured on and predicts its time (the sum of its kernels' chosen rows). The report
gives, per class of op: how many rows, the median and spread of predicted / measured, the rank
correlation of predictions with measurements (do bigger problems get bigger predictions in the
same order), and each row's physical bound: its compulsory DRAM traffic (inputs read once,
outputs written once) at the GPU's bandwidth, or its matrix-product FLOPs at the GPU's peak,
whichever is longer. A prediction below the bound is flagged: no kernel can beat it.

A ratio above 1 says emmy predicts its own kernels slower than the public implementation ran;
the model is only wrong where the kernel emmy emits would in fact run at another speed, which
only a GPU can tell (benchmarks/gpu_session.py). The rows say where to look.

    .venv/bin/python benchmarks/fidelity.py [--out benchmarks/FIDELITY_REPORT.md]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch  # noqa: F401  imported up front: its import time is not emmy's

# Predictions need the inputs' shapes, not their values: inputs over 1 MB stay unmade (a fifth of
# the run went to torch.randn for gigabytes nobody reads)
os.environ.setdefault("EMMY_LAZY_INPUT_MB", "1")

import emmy
from emmy.extract.targets import get_target
from emmy.program import pricer_for
from emmy.tile_ir.build import build_tile_program

sys.path.insert(0, str(Path(__file__).resolve().parent))
from public_measurements import ROWS, SOURCES  # noqa: E402

MEASUREMENT_NOISE = 0.01  # a measurement within 1% under a bound is within its run-to-run spread


def physical_bound(program, target) -> float:
    """Seconds no kernel can beat: compulsory bytes at DRAM bandwidth, or matrix FLOPs at peak."""
    return _bound(program.loop_ir, program.tile_ir, target)


def _bound(loops, tile_program, target) -> float:
    types = dict(loops.inputs) | dict(loops.weights)
    read = sum(t.numel * t.dtype.itemsize for t in types.values())
    out_types = {k.output: k.type for k in loops.kernels}
    written = sum(out_types[name].numel * out_types[name].dtype.itemsize for name in loops.outputs)
    compute = 0.0
    for tile in tile_program.kernels:
        shape = tile.shape
        if shape.kind == "contraction":
            flops = 2.0 * shape.rows * shape.cols * shape.red * shape.batch
        elif shape.kind == "attention":
            flops = 2.0 * shape.rows * shape.red * (shape.inner + shape.cols) * shape.batch
        else:
            continue
        peak = {"f16": target.tensor_flops, "bf16": target.bf16_tensor_flops}.get(shape.mma, target.fp32_flops)
        compute += flops / peak
    return max((read + written) / target.dram_bandwidth, compute)


def predicted(program, target) -> float:
    return sum(k.seconds for k in program.tile_ir.kernels)


def evaluate() -> list[dict]:
    results = []
    compiled: dict[str, object] = {}

    def program_for(code: str, gpu: str):
        key = f"{gpu}\n{code}"
        if key not in compiled:
            compiled[key] = emmy.optimize(code, target=gpu)
        return compiled[key]

    for row in ROWS:
        target = get_target(row.gpu)
        if row.sizes:  # the source's best rate over the sizes against emmy's best predicted rate over them
            best = None
            for n in row.sizes:
                code = row.code.format(n=n)
                if code not in compiled:
                    compiled[code] = emmy.optimize(code)
                tile = build_tile_program(compiled[code].loop_ir, pricer_for(target))  # the same kernels, priced for this GPU
                seconds = sum(k.seconds for k in tile.kernels)
                flops = eval(row.flops, {"n": n})  # noqa: S307  (a formula of public_measurements.py)
                if best is None or flops / seconds > best[0] / best[1]:
                    best = (flops, seconds, _bound(compiled[code].loop_ir, tile, target), n)
            flops, seconds, bound, n = best
            results.append(dict(row=row, predicted_s=seconds, measured_s=flops / (row.tflops * 1e12), bound_s=bound,
                                note=f"n={n}"))
            continue
        program = program_for(row.code, row.gpu)
        results.append(dict(row=row, predicted_s=predicted(program, target), measured_s=row.ms / 1e3,
                            bound_s=physical_bound(program, target), note=""))
    return results


def spearman(xs: list[float], ys: list[float]) -> float:
    if len(xs) < 3:
        return float("nan")
    rank = lambda v: {i: r for r, i in enumerate(sorted(range(len(v)), key=lambda i: v[i]))}  # noqa: E731
    rx, ry = rank(xs), rank(ys)
    n = len(xs)
    d2 = sum((rx[i] - ry[i]) ** 2 for i in range(n))
    return 1 - 6 * d2 / (n * (n * n - 1))


def report(results: list[dict], seconds: float) -> str:
    lines = ["# Cost-model fidelity against public measurements", "",
             "Generated by `.venv/bin/python benchmarks/fidelity.py` (no GPU involved: predictions of emmy's "
             "cost model against published timings; benchmarks/public_measurements.py lists the rows and "
             f"their sources). {len(results)} rows, {seconds:.0f} s on this machine.", "",
             "predicted / measured above 1: emmy predicts its kernels slower than the public implementation "
             "ran. `below bound`: a prediction under the physical bound (compulsory DRAM bytes at bandwidth, "
             "or matrix FLOPs at peak), which no kernel can beat.", "",
             "## Per class", "",
             "| class | rows | median pred/meas | min | max | rank correlation | predictions below bound |",
             "|---|---|---|---|---|---|---|"]
    by_class = defaultdict(list)
    for r in results:
        by_class[r["row"].op_class].append(r)
    for name, rows in sorted(by_class.items()):
        ratios = [r["predicted_s"] / r["measured_s"] for r in rows]
        rho = spearman([r["predicted_s"] for r in rows], [r["measured_s"] for r in rows])
        below = sum(r["predicted_s"] < r["bound_s"] * (1 - 1e-9) for r in rows)
        lines.append(f"| {name} | {len(rows)} | {statistics.median(ratios):.2f} | {min(ratios):.2f} | "
                     f"{max(ratios):.2f} | {rho:.2f} | {below} |")
    lines += ["", "## Rows", "",
              "| class | case | GPU | timed | measured ms | predicted ms | pred/meas | bound ms | pred/bound | flag |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        row = r["row"]
        flags = []
        if r["predicted_s"] < r["bound_s"] * (1 - 1e-9):
            flags.append("prediction below bound")
        if r["measured_s"] < r["bound_s"] * (1 - MEASUREMENT_NOISE):
            flags.append("measurement below bound: a target figure is too low")
        lines.append(f"| {row.op_class} | {row.case} | {row.gpu} | {row.implementation} | {r['measured_s'] * 1e3:.4f} | "
                     f"{r['predicted_s'] * 1e3:.4f} | {r['predicted_s'] / r['measured_s']:.2f} | "
                     f"{r['bound_s'] * 1e3:.4f} | {r['predicted_s'] / r['bound_s']:.2f} | {'; '.join(flags)} |")
    lines += ["", "Rate rows (`best of n=...`) compare the best rate over the sizes: the measured row is the "
              "source's best, the prediction emmy's best over the same sizes, both as the time of one product "
              "at the size of emmy's best rate.", "", "## Sources", ""]
    lines += [f"- `{key}`: {text}" for key, text in SOURCES.items()]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "FIDELITY_REPORT.md"))
    args = parser.parse_args(argv)
    start = time.perf_counter()
    results = evaluate()
    text = report(results, time.perf_counter() - start)
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

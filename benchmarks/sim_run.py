"""Simulator benchmarks on this machine: build time, the second load of the same source (the
cache), and the time to simulate a block reduction of 32 blocks x 256 threads, per build mode; and
a whole program (a 4-layer GPT-like decoder, 30 kernels) called on CPU tensors, plain and ASan.

    .venv/bin/python benchmarks/sim_run.py [--out benchmarks/SIM_REPORT.md]

Exit status 1 when the plain reduction takes 1 s or more, or a second load compiles again.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import emmy.sim as sim

KERNEL = Path(__file__).resolve().parent.parent / "tests" / "sim_kernels" / "block_reduce.cu"
REPEATS = 5


def measure(mode: str, cache: Path) -> dict:
    source = KERNEL.read_text()
    start = time.perf_counter()
    first = sim.load(source, KERNEL.name, mode=mode, cache_dir=cache)
    built = time.perf_counter() - start
    start = time.perf_counter()
    second = sim.load(source, KERNEL.name, mode=mode, cache_dir=cache)
    reloaded = time.perf_counter() - start
    x = np.random.default_rng(0).standard_normal((32, 4096)).astype(np.float32)
    out = np.zeros(32, np.float32)
    runs = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        second.launch("row_sum", grid=32, block=256, args=[x, out, 4096])
        runs.append(time.perf_counter() - start)
    error = float(np.abs(out - x.astype(np.float64).sum(1)).max())
    return {"mode": mode, "build": built, "compiled": first.compiled, "reload": reloaded,
            "recompiled": second.compiled, "run": min(runs), "error": error}


def decoder_program():
    """A 4-layer GPT-like decoder (width 256, 8 heads, 128 tokens, vocabulary 1000) and its token ids."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    import emmy

    torch.manual_seed(0)
    width, heads, tokens = 256, 8, 128

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(c, -1))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
            x = x + self.out(y)
            return x + self.down(F.gelu(self.up(self.ln2(x))))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.position = nn.Embedding(1000, width), nn.Embedding(tokens, width)
            self.blocks = nn.ModuleList(Block() for _ in range(4))
            self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, 1000, bias=False)

        def forward(self, ids):
            x = self.embed(ids) + self.position(torch.arange(ids.shape[1]))
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))

    model, ids = Decoder().eval(), torch.randint(0, 1000, (1, tokens))
    with torch.no_grad():
        want = model(ids)
    return emmy.optimize(model, ids), ids, want


def measure_program(program, ids, want, mode: str) -> dict:
    start = time.perf_counter()
    program(ids, sim_mode=mode)  # builds the simulator library (and starts ASan's worker)
    first = time.perf_counter() - start
    start = time.perf_counter()
    got = program(ids, sim_mode=mode)
    return {"mode": mode, "first": first, "run": time.perf_counter() - start,
            "error": float((got - want).abs().max())}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="benchmarks/SIM_REPORT.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:  # a cold cache: the first load compiles
        rows = [measure(mode, Path(cache)) for mode in sim.MODES]
        os.environ["EMMY_CACHE_DIR"] = cache
        program, ids, want = decoder_program()
        calls = [measure_program(program, ids, want, mode) for mode in ("plain", "asan")]
    lines = [
        "# Simulator benchmarks",
        "",
        "Command: `.venv/bin/python benchmarks/sim_run.py` (a fresh cache; best of "
        f"{REPEATS} launches). Machine: {platform.machine()}, "
        f"{len(os.sched_getaffinity(0))} cores, Python {platform.python_version()}.",
        "",
        "Kernel: `row_sum` of tests/sim_kernels/block_reduce.cu (warp shuffles, then a shared-memory "
        "tree), 32 blocks x 256 threads over f32[32, 4096].",
        "",
        "| mode | first load s (g++) | second load s | second load compiled | 32 x 256 launch s | max abs error |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['build']:.2f} | {r['reload']:.4f} | {'yes' if r['recompiled'] else 'no'} | "
                     f"{r['run']:.3f} | {r['error']:.2e} |")
    plain = next(r for r in rows if r["mode"] == "plain")
    lines += ["", f"Plain launch: {plain['run']:.3f} s (target: under 1 s). The first asan launch starts "
              "its worker process (the ASan runtime must be preloaded), which the best of the launches leaves out. The first load includes building "
              "the simulator's runtime for the mode (once per cache).", "",
              f"Program: a 4-layer GPT-like decoder (width 256, 128 tokens; {len(program.kernels)} kernels) called "
              "on CPU tensors, `program(ids, sim_mode=...)`: the first call builds, the second only runs.", "",
              "| mode | first call s | second call s | max abs error against torch |", "|---|---|---|---|"]
    lines += [f"| {c['mode']} | {c['first']:.1f} | {c['run']:.1f} | {c['error']:.2e} |" for c in calls]
    lines.append("")
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))
    ok = plain["run"] < 1.0 and not any(r["recompiled"] for r in rows) and all(r["compiled"] for r in rows) and \
        all(c["error"] < 1e-4 for c in calls)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

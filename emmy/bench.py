"""`emmy bench`: emmy against torch eager and torch.compile on the same program, inputs of the same
shapes, the same timing (emmy.measure: events around each launch or call, the L2 flushed before,
median with p10/p90). emmy's time sums its kernels; it is timed only after its outputs matched
torch's. Results as a table, JSON and a PNG (bench.json, bench.png)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class BenchRow:
    name: str
    emmy_s: float | None  # None: not correct, or not lowered (why)
    eager_s: float | None
    compiled_s: float | None
    why: str = ""  # what stopped a column

    def speedup(self, over: float | None) -> str:
        return "-" if self.emmy_s is None or over is None else f"{over / self.emmy_s:.2f}x"


def bench_one(name: str, code: str, target: str, device) -> BenchRow:
    """One program on the GPU: emmy's kernels (checked, then timed), torch eager, torch.compile."""
    import torch

    import emmy
    from emmy.capture.code import capture_code
    from emmy.checking import torch_comparison
    from emmy.measure import FLUSH_BYTES, time_torch

    program = emmy.optimize(code, target=target)
    inputs = program.example_inputs
    measured = device.measure(program, inputs, torch_comparison(program.captured, inputs, device="cuda"))
    emmy_s = sum(t.median_s for t in measured.times) if measured.correct else None
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    made = capture_code(code)
    module = made.module.to("cuda").eval()
    args = tuple(x.to("cuda") for x in made.example_inputs)
    why = [] if measured.correct else [f"emmy: {measured.why}"]
    with torch.device("cuda"):
        eager = time_torch(module, args, flush)[0]
        try:
            compiled = time_torch(torch.compile(module), args, flush)[0]
        except Exception as err:  # noqa: BLE001 - torch.compile's own failure is a row, not the end
            compiled = None
            why.append(f"torch.compile: {type(err).__name__}: {str(err)[:200]}")
    return BenchRow(name, emmy_s, eager, compiled, "; ".join(why))


def table_rows(rows: list[BenchRow]) -> list[list[str]]:
    def us(v):
        return "-" if v is None else f"{v * 1e6:.1f}"
    return [[r.name, us(r.emmy_s), us(r.eager_s), us(r.compiled_s), r.speedup(r.eager_s), r.speedup(r.compiled_s),
             r.why[:80]] for r in rows]


HEADER = ["program", "emmy us", "torch eager us", "torch.compile us", "vs eager", "vs compile", "note"]


def write(rows: list[BenchRow], folder: Path, gpu: str) -> None:
    """bench.json and bench.png (times per program, log scale) in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "bench.json").write_text(json.dumps({"gpu": gpu, "rows": [asdict(r) for r in rows]}, indent=1) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(rows) + 2), 4.5))
    width = 0.27
    for offset, (label, values) in enumerate((("emmy", [r.emmy_s for r in rows]), ("torch eager", [r.eager_s for r in rows]),
                                              ("torch.compile", [r.compiled_s for r in rows]))):
        xs = [i + (offset - 1) * width for i, v in enumerate(values) if v is not None]
        ax.bar(xs, [v * 1e6 for v in values if v is not None], width, label=label)
    ax.set_xticks(range(len(rows)), [r.name for r in rows], rotation=30, ha="right", fontsize=7)
    ax.set(yscale="log", ylabel="us (median, cold L2)", title=f"emmy vs torch on {gpu}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "bench.png", dpi=110)
    plt.close(fig)

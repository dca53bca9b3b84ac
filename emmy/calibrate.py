"""Fitting the cost model's free parameters for one GPU to measured rows.

The free parameters are factors on the target's figures (FREE: DRAM and L2 bandwidth, the FP32 and
tensor-core rates, the launch overhead, the latency a staged copy waits): what a datasheet states
and a kernel rarely reaches, or what no datasheet states. A fit
minimises the mean squared log error of the predictions (emmy.schedule.cost_model.predict, the very
model extraction prices with) over the measured rows, with a weak pull of each log factor toward 0
(PRIOR), so a figure the rows do not exercise stays at the datasheet's. Fidelity is reported on rows
held out of the fit (HOLD_OUT of the kernels' rows, chosen by a hash of the row): Spearman rank
correlation of predicted and measured time, top-1 regret (per kernel, the measured time of the
model's pick among its measured rows over the best measured) and mean absolute log error.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from emmy.extract.targets import CALIBRATED_FIELDS as FREE
from emmy.extract.targets import calibrated  # noqa: F401 - how a fit is applied: the target table's own

PRIOR = 0.02  # weight of sum(log factor^2) against the mean squared log error
HOLD_OUT = 0.25
LIMIT = math.log(20.0)  # a factor stays within 1/20 .. 20


_ATTENTION = ("q=torch.randn(4,16,4096,64,dtype=torch.float16); k=torch.randn(4,16,4096,64,dtype=torch.float16); "
              "v=torch.randn(4,16,4096,64,dtype=torch.float16); F.scaled_dot_product_attention(q,k,v,is_causal={})")
# (name, -c code) at GPU sizes (hundreds of MB, so a launch runs well past its overhead); the costliest to
# check first (a variant of a 64M-element program takes seconds to check against torch)
SUITES: dict[str, tuple[tuple[str, str], ...]] = {
    "small": (
        ("matmul_f16_4096", "a=torch.randn(4096,4096,dtype=torch.float16); b=torch.randn(4096,4096,dtype=torch.float16); a@b"),
        ("layer_norm_chw_16x64x256x256", "x=torch.randn(16,64,256,256); w=torch.randn(64,256,256); "
                                         "b=torch.randn(64,256,256); F.layer_norm(x,(64,256,256),w,b)"),
        ("sum_dim1_16x1024x1023", "x=torch.randn(16,1024,1023); x.sum(dim=1)"),
        ("attention_4x16x4096x64", _ATTENTION.format(False)),
        ("matmul_f32_4096", "a=torch.randn(4096,4096); b=torch.randn(4096,4096); a@b"),
        ("rmsnorm_16384x4096", "x=torch.randn(16384,4096); w=torch.randn(4096); F.rms_norm(x,(4096,),w,eps=1e-6)"),
        ("layernorm_16384x4096", "x=torch.randn(16384,4096); w=torch.randn(4096); b=torch.randn(4096); "
                                 "F.layer_norm(x,(4096,),w,b)"),
        ("gelu_linear_8192x4096x4096", "x=torch.randn(8192,4096,dtype=torch.float16); l=nn.Linear(4096,4096).half(); "
                                       "F.gelu(l(x))"),
        ("attention_causal_4x16x4096x64", _ATTENTION.format(True)),
        ("softmax_16384x4096", "x=torch.randn(16384,4096); torch.softmax(x,-1)"),
        ("layernorm_bf16_16384x4096", "x=torch.randn(16384,4096,dtype=torch.bfloat16); w=torch.randn(4096,dtype=torch.bfloat16); "
                                      "b=torch.randn(4096,dtype=torch.bfloat16); F.layer_norm(x,(4096,),w,b)"),
        ("conv_resnet_32x64x56x56_f16", "x=torch.randn(32,64,56,56,dtype=torch.float16); "
                                        "c=nn.Conv2d(64,64,3,padding=1,bias=False).half(); c(x)"),
    ),
}


@dataclass(frozen=True)
class Sample:
    """A measured row with what the model needs to price it again."""
    kernel: str
    signature: str
    shape: object  # emmy.schedule.shape.KernelShape
    cost: object  # the kernel's loop cost
    row: object  # emmy.schedule.knobs.Schedule
    measured_s: float


def samples(programs, rows) -> list[Sample]:
    """The measured rows (emmy.measure_db.MeasuredRow, correct ones) of the programs' kernels whose
    knob rows the kernel offers."""
    from emmy.schedule.choose import loop_cost
    from emmy.schedule.shape import kernel_shape

    by_key = {(r.signature, r.knobs): r for r in rows if r.correct}
    found = []
    for program in programs:
        types = program.buffer_types
        for tile in program.tile_ir.kernels:
            offered = {str(b.row): b.row for b in program.ranked_rows(tile.kernel)}
            for knobs, row in offered.items():
                measured = by_key.get((tile.signature, knobs))
                if measured is not None:
                    found.append(Sample(tile.kernel.name, tile.signature, kernel_shape(tile.kernel),
                                        loop_cost(tile.kernel, types), row, measured.median_s))
    return found


def predicted(sample: Sample, target) -> float:
    from emmy.schedule.cost_model import predict

    return predict(sample.shape, sample.row, target, sample.cost).total_s


def held_out(sample: Sample) -> bool:
    digest = hashlib.sha256(f"{sample.signature}|{sample.row}".encode()).digest()
    return digest[0] < 256 * HOLD_OUT


def fit(found: list[Sample], target) -> dict[str, float]:
    """The factors (FREE) that best predict the samples' measured times."""
    import numpy as np
    from scipy.optimize import minimize

    measured = np.log([s.measured_s for s in found])

    def loss(logs):
        guess = calibrated(target, dict(zip(FREE, np.exp(logs))))
        error = np.log([predicted(s, guess) for s in found]) - measured
        return float(np.mean(error ** 2) + PRIOR * np.sum(logs ** 2))

    best = minimize(loss, np.zeros(len(FREE)), method="Powell", bounds=[(-LIMIT, LIMIT)] * len(FREE),
                    options={"xtol": 1e-3, "ftol": 1e-6, "maxfev": 4000})
    return {name: float(math.exp(v)) for name, v in zip(FREE, best.x)}


@dataclass(frozen=True)
class Fidelity:
    rows: int
    spearman: float | None
    regret: float | None  # mean over kernels with two or more rows
    mean_abs_log_error: float

    def line(self) -> str:
        rho = "-" if self.spearman is None else f"{self.spearman:.2f}"
        regret = "-" if self.regret is None else f"{self.regret:.2f}"
        return (f"{self.rows} rows: Spearman {rho}, top-1 regret {regret}, mean |log error| "
                f"{self.mean_abs_log_error:.2f} (x{math.exp(self.mean_abs_log_error):.2f})")


def fidelity(found: list[Sample], target) -> Fidelity:
    from scipy.stats import spearmanr

    guesses = [predicted(s, target) for s in found]
    measured = [s.measured_s for s in found]
    rho = float(spearmanr(guesses, measured).statistic) if len(found) >= 3 else None
    regrets = []
    for signature in {s.signature for s in found}:
        mine = [(g, s.measured_s) for g, s in zip(guesses, found) if s.signature == signature]
        if len(mine) >= 2:
            regrets.append(min(mine)[1] / min(m for _, m in mine))
    male = sum(abs(math.log(g / m)) for g, m in zip(guesses, measured)) / max(1, len(found))
    return Fidelity(len(found), rho, sum(regrets) / len(regrets) if regrets else None, male)


def plot(path, found: list[Sample], before, after) -> None:
    """Predicted against measured time, before and after the fit (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 6))
    measured = [s.measured_s * 1e6 for s in found]
    for target, label, mark in ((before, "before", "o"), (after, "after", "x")):
        ax.scatter(measured, [predicted(s, target) * 1e6 for s in found], s=16, marker=mark, label=label)
    low, high = min(measured) / 2, max(measured) * 2
    ax.plot([low, high], [low, high], "k--", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel="measured us", ylabel="predicted us")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

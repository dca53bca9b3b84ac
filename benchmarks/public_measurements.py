"""Public GPU measurements emmy's cost model is checked against (benchmarks/fidelity.py).

Each row is a program (as `emmy -c` code), the GPU it ran on (an emmy target key), the
implementation that was timed and its time, and the source the figure comes from (SOURCES:
where, which software, which sizes, how it was timed). Figures are copied as published; nothing
here was measured by this project.

A row whose `sizes` holds several sizes gives the best rate over them (the source publishes only
its maximum): fidelity.py compares it with emmy's best predicted rate over the same sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

SOURCES = {
    "liger-h100": (
        "Liger-Kernel benchmark data, benchmark/data/h100_all_benchmark_data.csv (github.com/linkedin/"
        "Liger-Kernel, commit 3534d44, 2025-01-26): NVIDIA H100 NVL, liger-kernel 0.5.2; forward pass "
        "timed with triton.testing.do_bench (median of repeated runs, L2 flushed between runs); "
        "'huggingface' is PyTorch eager (nn.LayerNorm, LlamaRMSNorm, nn.CrossEntropyLoss), "
        "'torchcompile' the same module under torch.compile"),
    "torch-mm-db": (
        "torch-performance-test-data, database.md (github.com/zzc0721/torch-performance-test-data): "
        "torch.mm of two n x n matrices for n in 1024, 2048, 4096, 8192, 10240 (6 warm-up, 30 timed "
        "iterations, wall clock around torch.cuda.synchronize; TFLOPS = 2 n^3 / time); the table keeps "
        "each GPU's best rate over the sizes. PyTorch 2.8.0 unless noted; rows with TF32 enabled "
        "(an H100 fp32 row of 403 TFLOPS) are left out"),
    "torch-mm-5090": (
        "torch-performance-test-data pull request #15 (2025-09-24), the per-size output of the same "
        "script on an RTX 5090 32GB, PyTorch 2.8.0+cu128, Python 3.10.14"),
}


@dataclass(frozen=True)
class Measured:
    op_class: str  # norm | softmax-ce | matmul-f32 | matmul-f16 | ...
    case: str  # what was timed, briefly
    gpu: str  # emmy target key
    implementation: str  # torch eager | torch.compile | cuBLAS (torch.mm)
    code: str  # the program, as -c code; {n} stands for each of `sizes`
    source: str  # a key of SOURCES
    ms: float = 0.0  # the measured time (rows of one size)
    tflops: float = 0.0  # the best rate over `sizes` (rows of several)
    flops: str = ""  # the FLOP count as a Python expression of n (rate rows)
    sizes: tuple[int, ...] = ()


def _eager_and_compiled(op_class: str, case: str, code: str, eager_ms: float, compiled_ms: float) -> list[Measured]:
    """A Liger-Kernel H100 NVL case's two rows: PyTorch eager and torch.compile."""
    return [Measured(op_class, case, "h100nvl", impl, code, "liger-h100", ms)
            for impl, ms in (("torch eager", eager_ms), ("torch.compile", compiled_ms))]


# Each Liger-Kernel case: (op class, case name, emmy code, ((size, eager ms, torch.compile ms), ...)),
# the name and code formatted with the size.
_LIGER_CASES = (
    # M = 2048 rows, bf16, LlamaRMSNorm (f32 inside), hidden size n
    ("norm", "RMSNorm 2048 x {n} bf16",
     "x=torch.randn(2048,{n},dtype=torch.bfloat16); w=torch.randn({n},dtype=torch.bfloat16); "
     "h=x.float(); h=h*torch.rsqrt(h.pow(2).mean(-1,keepdim=True)+1e-6); w*h.to(torch.bfloat16)",
     ((1024, 0.060384, 0.009056), (2048, 0.090720, 0.014048), (4096, 0.179520, 0.020960),
      (8192, 0.326080, 0.034816), (16384, 0.609472, 0.067648), (32768, 1.219264, 0.155904))),
    # M = 4096 rows, f32, nn.LayerNorm(n, eps=1e-6)
    ("norm", "LayerNorm 4096 x {n} f32",
     "x=torch.randn(4096,{n}); w=torch.randn({n}); b=torch.randn({n}); "
     "torch.nn.functional.layer_norm(x,({n},),w,b,1e-6)",
     ((1024, 0.023872, 0.016032), (2048, 0.038272, 0.030656), (4096, 0.063008, 0.044736),
      (8192, 0.140896, 0.085024), (16384, 0.295168, 0.180864))),
    # 16384 rows of f32 logits over a vocabulary of n, mean cross entropy
    ("softmax-ce", "cross entropy 16384 x {n} f32",
     "x=torch.randn(16384,{n}); t=torch.randint(0,{n},(16384,)); torch.nn.functional.cross_entropy(x,t)",
     ((4096, 0.742431, 0.125824), (8192, 0.921151, 0.287616), (16384, 1.291343, 0.538688),
      (32768, 2.488831, 1.233952), (65536, 5.395376, 2.654096), (131072, 10.308220, 5.775392))),
)


def _liger() -> list[Measured]:
    return [row for op_class, case, code, table in _LIGER_CASES for n, eager, compiled in table
            for row in _eager_and_compiled(op_class, case.format(n=n), code.format(n=n), eager, compiled)]


_MM = "a=torch.randn({n},{n}{d}); b=torch.randn({n},{n}{d}); a@b"
_SIZES = (1024, 2048, 4096, 8192, 10240)


def _torch_mm() -> list[Measured]:
    rows = []
    dtypes = {"f32": "", "f16": ",dtype=torch.float16", "bf16": ",dtype=torch.bfloat16"}
    per_size = {"f32": (47.84, 69.16, 65.03, 66.34, 65.22), "f16": (142.29, 174.04, 218.79, 224.41, 219.10),
                "bf16": (93.60, 173.87, 183.71, 236.03, 235.27)}
    for dtype, rates in per_size.items():
        for n, rate in zip(_SIZES, rates):
            rows.append(Measured(f"matmul-{dtype}", f"torch.mm {n}^3 {dtype}", "rtx5090", "cuBLAS (torch.mm)",
                                 _MM.format(n=n, d=dtypes[dtype]), "torch-mm-5090", ms=2 * n ** 3 / rate / 1e9))
    best = {"h100": (52.11, 758.14, 783.66), "h200": (51.34, 759.40, 790.29), "a100": (19.18, 258.74, 264.53),
            "l40s": (46.88, 264.02, 269.15), "rtx4090": (55.01, 165.08, 170.06)}
    for gpu, rates in best.items():
        for dtype, rate in zip(dtypes, rates):
            rows.append(Measured(f"matmul-{dtype}", f"torch.mm best of n={_SIZES[0]}..{_SIZES[-1]} {dtype}", gpu,
                                 "cuBLAS (torch.mm)", _MM.replace("{d}", dtypes[dtype]), "torch-mm-db",
                                 tflops=rate, flops="2*n**3", sizes=_SIZES))
    return rows


ROWS: tuple[Measured, ...] = tuple(_liger() + _torch_mm())

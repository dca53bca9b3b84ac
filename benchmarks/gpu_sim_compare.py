"""On a machine with a GPU: run the simulator's test kernels (tests/sim_kernels/) on the GPU and
in the simulator with the same inputs, and compare the outputs bit for bit where the arithmetic is
the same (exact integer mma products, maxima, copies, sums in one fixed order), else within a
tolerance. nvcc builds each source with -fmad=false so that a*b+c rounds twice, as g++ does.

    .venv/bin/python benchmarks/gpu_sim_compare.py [--arch 90] [--out benchmarks/GPU_SIM_REPORT.md]

Exit status 1 on any mismatch. Needs nvcc, a CUDA driver and a GPU; nothing else beyond emmy.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import tempfile
from pathlib import Path

import numpy as np

import emmy.gpu
import emmy.sim as sim
from emmy.sim.source import kernels_of

KERNELS = Path(__file__).resolve().parent.parent / "tests" / "sim_kernels"

def bf16_bits(x):
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def cases(rng):
    """(source, kernel, grid, block, shared bytes, args, output positions, exact?)"""
    ints = lambda shape, dtype: rng.integers(-4, 5, shape).astype(dtype)  # noqa: E731
    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    yield "vector_add.cu", "vector_add", 4, 256, 0, [f32(1000), f32(1000), np.zeros(1000, np.float32), 1000], [2], True
    yield "block_reduce.cu", "row_sum", 32, 256, 0, [f32(32, 3000), np.zeros(32, np.float32), 3000], [1], True
    yield "block_reduce.cu", "row_max_tree", 32, 256, 0, [f32(32, 3000), np.zeros(32, np.float32), 3000], [1], True
    yield ("smem_matmul.cu", "smem_matmul", (2, 3), (16, 16), 0,
           [f32(37, 45), f32(45, 29), np.zeros((37, 29), np.float32), 37, 29, 45], [2], True)
    yield ("mma_matmul.cu", "mma_matmul_f16", (2, 2), 32, 0,
           [ints((32, 48), np.float16), ints((48, 16), np.float16), np.zeros((32, 16), np.float32), 16, 48], [2], True)
    yield ("mma_matmul.cu", "mma_matmul_bf16", (2, 2), 32, 0,
           [bf16_bits(ints((32, 48), np.float32)), bf16_bits(ints((48, 16), np.float32)),
            np.zeros((32, 16), np.float32), 16, 48], [2], True)
    yield ("mma_matmul.cu", "mma_matmul_f16", (2, 2), 32, 0,
           [f32(32, 48).astype(np.float16), f32(48, 16).astype(np.float16), np.zeros((32, 16), np.float32), 16, 48],
           [2], False)  # tensor cores add in their own order
    yield ("ldmatrix_forms.cu", "ldmatrix_forms", 1, 32, 0,
           [np.arange(256, dtype=np.uint16), np.zeros((7, 32, 4), np.uint32)], [1], True)
    yield ("cp_async_pipeline.cu", "pipelined_row_sum", 8, 64, 3 * 64 * 16,
           [f32(8, 1000), np.zeros(8, np.float32), 1000], [1], True)
    x = -rng.random(1 << 16).astype(np.float32) * 20  # rescale factors' arguments: m_old - m_new <= 0
    yield ("exp_forms.cu", "exp_forms", 256, 256, 0,
           [x, np.zeros_like(x), np.zeros_like(x), x.size], [1], True)  # fused multiply-adds: bit for bit
    a = np.arange(40 * 72, dtype=np.float32).reshape(40, 72)  # rows of a multiple of 16 bytes, as the driver needs
    yield ("tma_tile.cu", "tma_tile_double", (3, 3), 128, 0,
           [sim.TensorMap(a, box=(16, 32)), np.zeros_like(a), 40, 72], [1], True)


class Gpu(emmy.gpu.Gpu):
    """A test kernel source built by nvcc with a host launcher per kernel (emmy.gpu)."""

    def __init__(self, source: str | Path, arch: str, work: Path, fmad: bool = False):
        path = source if isinstance(source, Path) else KERNELS / source
        super().__init__(path, list(kernels_of(path.read_text(), path.name)), arch, work, fmad)

    def run(self, kernel, signature, grid, block, shared, args):
        storage, device, keep = [], [], []
        for param, value in zip(signature.params, args):
            if param.kind in ("pointer", "tensormap"):
                host = value.array if param.kind == "tensormap" else value
                ptr = self.upload(host)
                device.append((ptr, host))
                if param.kind == "tensormap":
                    buffer, view = self.tensor_map(ptr, host.shape, host.strides[0], value.box, host.itemsize)
                    keep.append(buffer)
                    storage.append(view.ctypes.data)
                else:
                    keep.append(ptr)
                    storage.append(ctypes.addressof(ptr))
            else:
                cell = np.array([value], dtype=param.kind)
                keep.append(cell)
                storage.append(cell.ctypes.data)
        self.launch(kernel, grid, block, shared, (ctypes.c_void_p * len(storage))(*storage))
        outputs = []
        for ptr, host in device:
            out = np.empty_like(host)
            self.download(ptr, out)
            self.free(ptr)
            outputs.append(out)
        return outputs


def _exp_lean_row(x: np.ndarray, got: np.ndarray) -> str:
    """A report row: the GPU's expf over x, its mean signed and largest error in ulps of the exact
    exp rounded to float32 (a mean that is not ~0 is a lean the one-pass softmax must not pile up)."""
    exact = np.exp(x.astype(np.float64))
    ulp = np.spacing(exact.astype(np.float32)).astype(np.float64)
    error = (got.astype(np.float64) - exact) / ulp
    return (f"| expf (special-function unit) | exp_forms.cu | lean against exp in float64 | mean {error.mean():+.3f} ulp, "
            f"largest {np.abs(error).max():.2f} ulp | measured |")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="90")
    parser.add_argument("--out", default="benchmarks/GPU_SIM_REPORT.md")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    lines = ["# Simulator vs GPU", "", f"Command: `.venv/bin/python benchmarks/gpu_sim_compare.py --arch {args.arch}`",
             "", "| kernel | source | compare | max abs difference | result |", "|---|---|---|---|---|"]
    failures = 0
    with tempfile.TemporaryDirectory() as work:
        gpus: dict[str, Gpu] = {}
        for source, kernel, grid, block, shared, kernel_args, outputs, exact in cases(rng):
            if source == "tma_tile.cu" and int(args.arch) < 90:
                continue
            try:  # one case's failure is its row, not the end of the report
                module = sim.load((KERNELS / source).read_text(), source)
                gpu = gpus.setdefault(source, Gpu(source, args.arch, Path(work)))
                on_gpu = gpu.run(kernel, module.kernels[kernel], grid, block, shared, kernel_args)
                simulated = module.launch(kernel, grid, block, [a.copy() if isinstance(a, np.ndarray) else a
                                                                for a in kernel_args], shared_bytes=shared)
            except Exception as err:  # noqa: BLE001
                failures += 1
                lines.append(f"| {kernel} | {source} | - | - | FAILED: {type(err).__name__}: {str(err)[:200]} |")
                continue
            if kernel == "exp_forms":  # the GPU's expf against exp in float64: its lean, in ulps
                lines.append(_exp_lean_row(kernel_args[0], on_gpu[2]))
            for position in outputs:
                g, s = on_gpu[position], simulated[position]
                same = np.array_equal(g.view(np.uint8), s.view(np.uint8)) if exact else np.allclose(g, s, 1e-3, 1e-3)
                diff = float(np.abs(g.astype(np.float64) - s.astype(np.float64)).max())
                failures += not same
                lines.append(f"| {kernel} | {source} | {'bitwise' if exact else 'rtol 1e-3'} | {diff:.3g} | "
                             f"{'ok' if same else 'MISMATCH'} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

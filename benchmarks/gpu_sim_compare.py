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
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import emmy.sim as sim
from emmy.sim.build import HEADERS
from emmy.sim.source import kernels_of

KERNELS = Path(__file__).resolve().parent.parent / "tests" / "sim_kernels"

WRAPPER = r"""
#include <cuda.h>
#include <cuda_runtime.h>
#include "{source}"
extern "C" int emmy_gpu_alloc(void** p, size_t n) {{ return (int)cudaMalloc(p, n); }}
extern "C" int emmy_gpu_free(void* p) {{ return (int)cudaFree(p); }}
extern "C" int emmy_gpu_put(void* d, const void* h, size_t n) {{ return (int)cudaMemcpy(d, h, n, cudaMemcpyHostToDevice); }}
extern "C" int emmy_gpu_get(void* h, const void* d, size_t n) {{ return (int)cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost); }}
extern "C" int emmy_gpu_tensormap(void* out, void* base, unsigned long rows, unsigned long cols,
                                  unsigned long row_bytes, unsigned box_rows, unsigned box_cols, unsigned element_bytes) {{
  cuuint64_t dims[2] = {{cols, rows}}, strides[1] = {{row_bytes}};
  cuuint32_t box[2] = {{box_cols, box_rows}}, unit[2] = {{1, 1}};
  // the driver's entry point through the runtime: no link against libcuda (absent where this is built)
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found;
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
      !fn)
    return -1;
  auto encode = reinterpret_cast<decltype(&cuTensorMapEncodeTiled)>(fn);
  // the copy is bitwise: only the element size matters (bf16 travels as 16-bit integers)
  const CUtensorMapDataType type = element_bytes == 2 ? CU_TENSOR_MAP_DATA_TYPE_UINT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  return (int)encode((CUtensorMap*)out, type, 2, base, dims, strides, box,
                     unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                     CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}}
{launchers}
"""
LAUNCHER = r"""
extern "C" int emmy_gpu_launch_{name}(const unsigned* g, const unsigned* b, unsigned long smem, void** argv) {{
  if (smem > 48 * 1024) cudaFuncSetAttribute((const void*){name}, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  cudaError_t e = cudaLaunchKernel((const void*){name}, dim3(g[0], g[1], g[2]), dim3(b[0], b[1], b[2]), argv, smem, 0);
  return (int)(e == cudaSuccess ? cudaDeviceSynchronize() : e);
}}
// `iters` back-to-back launches between two CUDA events; *ms: their total time
extern "C" int emmy_gpu_time_{name}(const unsigned* g, const unsigned* b, unsigned long smem, void** argv, int iters,
                                   float* ms) {{
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start);
  for (int i = 0; i < iters; ++i)
    cudaLaunchKernel((const void*){name}, dim3(g[0], g[1], g[2]), dim3(b[0], b[1], b[2]), argv, smem, 0);
  cudaEventRecord(stop);
  cudaError_t e = cudaEventSynchronize(stop);
  cudaEventElapsedTime(ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return (int)(e == cudaSuccess ? cudaGetLastError() : e);
}}
"""


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
    a = np.arange(40 * 70, dtype=np.float32).reshape(40, 70)
    yield ("tma_tile.cu", "tma_tile_double", (3, 3), 128, 0,
           [sim.TensorMap(a, box=(16, 32)), np.zeros_like(a), 40, 70], [1], True)


class Gpu:
    """A CUDA source built by nvcc into a library with a host launcher (and timer) per kernel."""

    def __init__(self, source: str | Path, arch: str, work: Path, fmad: bool = False):
        path = source if isinstance(source, Path) else KERNELS / source
        names = list(kernels_of(path.read_text(), path.name))
        wrapper = work / f"{path.name}.wrap.cu"
        wrapper.write_text(WRAPPER.format(source=path, launchers="".join(LAUNCHER.format(name=n) for n in names)))
        lib = work / f"{path.name}.so"
        subprocess.run(["nvcc", "-shared", "-Xcompiler", "-fPIC", "-O3", f"-fmad={'true' if fmad else 'false'}",
                        f"-arch=sm_{arch}", "-I", str(HEADERS), str(wrapper), "-o", str(lib)], check=True)
        self.lib = ctypes.CDLL(str(lib))

    def _check(self, rc, what):
        if rc:
            raise RuntimeError(f"{what}: CUDA error {rc}")

    def tensor_map(self, device_ptr, shape, row_bytes, box, element_bytes):
        """(owner, 128-byte view at a 64-byte boundary): the driver's CUtensorMap of a 2-D device array."""
        buffer = np.zeros(192, np.uint8)
        view = buffer[(-buffer.ctypes.data) % 64:][:128]
        rows, cols = shape
        self._check(self.lib.emmy_gpu_tensormap(
            view.ctypes.data_as(ctypes.c_void_p), device_ptr, ctypes.c_ulong(rows), ctypes.c_ulong(cols),
            ctypes.c_ulong(row_bytes), ctypes.c_uint(box[0]), ctypes.c_uint(box[1]), ctypes.c_uint(element_bytes)),
            "cuTensorMapEncodeTiled")
        return buffer, view

    def run(self, kernel, signature, grid, block, shared, args):
        storage, device, keep = [], [], []
        for param, value in zip(signature.params, args):
            if param.kind in ("pointer", "tensormap"):
                host = value.array if param.kind == "tensormap" else value
                ptr = ctypes.c_void_p()
                self._check(self.lib.emmy_gpu_alloc(ctypes.byref(ptr), ctypes.c_size_t(host.nbytes)), "cudaMalloc")
                self._check(self.lib.emmy_gpu_put(ptr, host.ctypes.data_as(ctypes.c_void_p),
                                                  ctypes.c_size_t(host.nbytes)), "copy in")
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
        argv = (ctypes.c_void_p * len(storage))(*storage)
        dims = lambda v: (ctypes.c_uint * 3)(*(((v,) if isinstance(v, int) else tuple(v)) + (1, 1))[:3])  # noqa: E731
        self._check(getattr(self.lib, f"emmy_gpu_launch_{kernel}")(dims(grid), dims(block), ctypes.c_ulong(shared),
                                                                     argv), f"launch {kernel}")
        outputs = []
        for ptr, host in device:
            out = np.empty_like(host)
            self._check(self.lib.emmy_gpu_get(out.ctypes.data_as(ctypes.c_void_p), ptr, ctypes.c_size_t(host.nbytes)),
                        "copy out")
            self.lib.emmy_gpu_free(ptr)
            outputs.append(out)
        return outputs


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
            module = sim.load((KERNELS / source).read_text(), source)
            gpu = gpus.setdefault(source, Gpu(source, args.arch, Path(work)))
            on_gpu = gpu.run(kernel, module.kernels[kernel], grid, block, shared, kernel_args)
            simulated = module.launch(kernel, grid, block, [a.copy() if isinstance(a, np.ndarray) else a
                                                            for a in kernel_args], shared_bytes=shared)
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

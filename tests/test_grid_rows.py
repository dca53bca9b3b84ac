"""Grid-synced rows (REDUCE=g<N>s): a cooperative grid of N blocks takes every row in turn, a slice
of it a block, and meets at a grid barrier after the row's fold, so a few long rows fold and sweep
in one kernel. The simulator runs grid barriers (blocks parked until every block arrives)."""

import re

import numpy as np
import pytest

import emmy
from emmy.errors import KernelFault

BARRIER_KERNELS = r'''
#include "emmy_rt.cuh"
// each row: every block sums its slice, leaves it in ws[row parity][block]; after the grid
// barrier every block reads all of them and divides its slice by the row's total
extern "C" __global__ void normalize_rows(const float* __restrict__ x, float* __restrict__ ws,
                                          float* __restrict__ out, int n) {
  __shared__ float part[64];
  for (int row = 0; row < 3; ++row) {
    float acc = 0.f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) acc += x[row * n + i];
    part[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
      float s = 0.f;
      for (int t = 0; t < blockDim.x; ++t) s += part[t];
      ws[(row & 1) * gridDim.x + blockIdx.x] = s;
    }
    __syncthreads();
    EMMY_GRID_SYNC();
    float total = 0.f;
    for (int b = 0; b < gridDim.x; ++b) total += ws[(row & 1) * gridDim.x + b];
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
      out[row * n + i] = x[row * n + i] / total;
  }
}
extern "C" __global__ void one_block_leaves(float* out) {
  if (blockIdx.x == 1) return;
  EMMY_GRID_SYNC();
  out[blockIdx.x] = 1.f;
}
extern "C" __global__ void first_block_leaves(float* out) {
  if (blockIdx.x == 0) return;
  EMMY_GRID_SYNC();
  out[blockIdx.x] = 1.f;
}
extern "C" __global__ void one_thread_leaves(float* out) {
  if (threadIdx.x == 3) return;
  EMMY_GRID_SYNC();
  out[blockIdx.x] = 1.f;
}
'''


@pytest.mark.parametrize("mode", ["plain", "asan"])
def test_the_simulator_runs_grid_barriers(mode):
    from emmy import sim

    module = sim.load(BARRIER_KERNELS, "barriers.cu", mode=mode)
    n = 1000
    x = np.random.default_rng(0).random((3, n), dtype=np.float32) + 0.5
    out = np.zeros_like(x)
    module.launch("normalize_rows", (4, 1, 1), (64, 1, 1), [x, np.zeros(8, np.float32), out, np.int32(n)])
    np.testing.assert_allclose(out, x / x.sum(axis=1, keepdims=True), rtol=1e-5)


@pytest.mark.parametrize("kernel,message", [
    ("one_block_leaves", "block (0,0,0) waits at it while block (1,0,0) ended without reaching it"),
    ("first_block_leaves", "block (1,0,0) waits at it while block (0,0,0) ended without reaching it"),
    ("one_thread_leaves", "a grid barrier reached by only part of the block"),
])
def test_a_grid_barrier_some_threads_never_reach_is_reported(kernel, message):
    from emmy import sim

    module = sim.load(BARRIER_KERNELS, "barriers.cu", mode="plain")
    with pytest.raises(KernelFault, match=re.escape(message)):
        module.launch(kernel, (3, 1, 1), (32, 1, 1), [np.zeros(3, np.float32)])


NORMS = {
    "layer norm (C,H,W)": "x=torch.randn(2,4,16,16); w=torch.randn(4,16,16); b=torch.randn(4,16,16); "
                          "torch.nn.functional.layer_norm(x, (4,16,16), w, b)",
    "group norm": "m=torch.nn.GroupNorm(4, 16); x=torch.randn(2,16,8,8); m(x)",
    "rms norm, ragged": "x=torch.randn(3,1000); w=torch.randn(1000); torch.nn.functional.rms_norm(x, (1000,), w)",
    # 8 rows: with 3, every output of a row shares its denominator's rounding, which the bias
    # check (independent errors assumed) reads as a lean under any schedule, coop too
    "softmax": "x=torch.randn(8,999); torch.softmax(x, dim=-1)",
}


@pytest.mark.parametrize("name,knobs", [(name, ["WORK=t32,REDUCE=g4s", "WORK=t32,TILE=f2,REDUCE=g3s"][i % 2])
                                        for i, name in enumerate(NORMS)])
def test_grid_synced_norms_run_right_in_the_simulator(name, knobs):
    """One cooperative kernel a norm, its rows taken in turn by every block (ASan on)."""
    from emmy.runtime import check_program

    program = emmy.optimize(NORMS[name], target="sm_90", knobs=knobs)
    assert [k.cooperative for k in program.kernel_ir] == [True]
    assert all(c.ok for c in check_program(program, mode="asan")), (name, knobs)


@pytest.mark.parametrize("code,knobs", [
    ("x=torch.randn(8,4000); torch.softmax(x, dim=-1)", "WORK=t32,TILE=f1,REDUCE=g40s"),
    ("x=torch.randn(3,4000); w=torch.randn(4000); b=torch.randn(4000); "
     "torch.nn.functional.layer_norm(x, (4000,), w, b)", "WORK=t32,TILE=f2/v2,REDUCE=g37s,STAGE=regs"),
])
def test_more_blocks_than_a_warp_has_lanes_merge_right(code, knobs):
    """Past 32 blocks each lane of the merging warp folds several blocks' partial states before
    the shuffles (an online softmax's (m, d) and a Welford state)."""
    from emmy.runtime import check_program

    program = emmy.optimize(code, target="sm_90", knobs=knobs)
    assert program.kernel_ir[0].grid[0] > 32
    assert all(c.ok for c in check_program(program, mode="asan")), knobs


def test_a_grid_synced_row_is_one_cooperative_launch_with_a_barrier_a_row():
    program = emmy.optimize(NORMS["layer norm (C,H,W)"], target="sm_90", knobs="WORK=t32,TILE=f4/v4,REDUCE=g4s")
    (kernel,) = program.kernel_ir
    assert kernel.grid == (4, 1, 1) and kernel.block == (32, 1, 1) and kernel.cooperative
    cuda = program.cuda_source
    assert cuda.count("EMMY_GRID_SYNC();") == 1 and "for (int row = 0; row < 2; ++row)" in cuda
    assert "emmy::load_fresh(" in cuda  # the other blocks' partial states, read past L1
    listing = program.ir("kernel")
    assert "for row in 0..2 (every block in turn; slice = blockIdx.x of 4)" in listing and "GridSync" in listing


def test_few_long_rows_with_a_sweep_choose_one_grid_synced_kernel():
    """LayerNorm over (C, H, W) of 16 samples of 4M elements: one kernel, a block an SM at most,
    its row's statistics and sweep in one launch; nvcc builds it without spills."""
    from emmy.nvcc import build_cubin

    code = ("x=torch.randn(16,64,256,256); w=torch.randn(64,256,256); b=torch.randn(64,256,256); "
            "torch.nn.functional.layer_norm(x, (64,256,256), w, b)")
    program = emmy.optimize(code, target="h100")
    (kernel,) = program.kernel_ir
    assert kernel.cooperative and kernel.grid[0] <= program.target.sms
    for arch in ("sm_80", "sm_90", "sm_120"):
        resources = build_cubin(program.cuda_source, arch).resources[kernel.name]
        assert resources.spill_stores == resources.spill_loads == 0, arch


def test_the_gpu_library_launches_grid_synced_kernels_cooperatively(tmp_path):
    """The launcher of a kernel with a grid barrier is a cooperative launch (which refuses a grid
    whose blocks cannot all be resident rather than deadlock); the library builds with nvcc here,
    where there is no GPU to run it."""
    import ctypes
    from pathlib import Path

    from emmy.gpu import Gpu, host_library_source

    program = emmy.optimize(NORMS["softmax"], target="sm_90", knobs="WORK=t32,REDUCE=g4s")
    source = tmp_path / "program.cu"
    source.write_text(program.cuda_source)
    names = [k.name for k in program.kernel_ir]
    text = host_library_source(Path(source), names, tuple(names))
    assert f"cudaLaunchCooperativeKernel((const void*){names[0]}" in text
    assert "cudaLaunchKernel((const void*)" not in text
    gpu = Gpu(source, names, "90", work=tmp_path / "lib", cooperative=tuple(names))
    assert isinstance(getattr(gpu.lib, f"emmy_gpu_launch_{names[0]}"), ctypes._CFuncPtr)


def test_a_row_the_grid_cannot_take_is_refused_with_the_reason():
    """Integer accumulators (argmax's index) do not travel through the f32 workspace: a pin asking
    for a grid-synced row says so in one line, exit status 2."""
    from tests.conftest import run_emmy

    result = run_emmy("compile", "-c", "x=torch.randn(3,5000); x.argmax(-1)", "--ir", "kernel",
                      "--knobs", "WORK=t32,REDUCE=g4s")
    assert result.returncode == 2
    assert "REDUCE=g4s: a grid-synced row needs f32 accumulators" in result.stderr
    assert "Traceback" not in result.stderr

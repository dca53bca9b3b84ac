"""The CPU simulator (emmy.sim, cuda_templates/emmy_sim.h, emmy_rt.cuh) on kernels written for
the tests (tests/sim_kernels/): results against numpy, the planted faults it must name, and
the same sources compiled by the real nvcc for each target."""

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

import emmy.sim as sim
from emmy.errors import EmmyError, KernelBuildError, KernelFault

KERNELS = Path(__file__).resolve().parent / "sim_kernels"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("sim-cache")


def load(name: str, cache: Path, mode: str = "plain", edit=None):
    source = (KERNELS / name).read_text()
    return sim.load(edit(source) if edit else source, name, mode=mode, cache_dir=cache)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (round to nearest even), as uint16."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_values(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("mode", ["plain", "asan"])
def test_vector_add_with_a_tail(cache, rng, mode):
    module = load("vector_add.cu", cache, mode)
    n = 1000  # 4 blocks of 256: the last has 24 idle threads
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    c = np.full(n + 8, 7.0, np.float32)  # elements past n must stay untouched
    module.launch("vector_add", grid=(n + 255) // 256, block=256, args=[a, b, c, n])
    np.testing.assert_array_equal(c[:n], a + b)
    assert (c[n:] == 7.0).all()


def test_block_reductions_by_shuffles_and_a_shared_memory_tree(cache, rng):
    module = load("block_reduce.cu", cache)
    x = rng.standard_normal((32, 3000)).astype(np.float32)
    out = np.zeros(32, np.float32)
    module.launch("row_sum", grid=32, block=256, args=[x, out, 3000])
    np.testing.assert_allclose(out, x.astype(np.float64).sum(1), rtol=1e-5, atol=1e-4)
    module.launch("row_max_tree", grid=32, block=256, args=[x, out, 3000])
    np.testing.assert_array_equal(out, x.max(1))


def test_tiled_shared_memory_matmul_with_ragged_edges(cache, rng):
    module = load("smem_matmul.cu", cache)
    m, n, k = 37, 29, 45
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    c = np.zeros((m, n), np.float32)
    module.launch("smem_matmul", grid=((n + 15) // 16, (m + 15) // 16), block=(16, 16), args=[a, b, c, m, n, k])
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-4)


def test_f16_and_bf16_mma_matmul_through_ldmatrix_follow_the_ptx_fragment_layouts(cache, rng):
    module = load("mma_matmul.cu", cache)
    m, n, k = 32, 16, 48
    c = np.zeros((m, n), np.float32)
    # small integers: every product and sum is exact, so the result must equal numpy's bit for bit
    a = rng.integers(-4, 5, (m, k)).astype(np.float16)
    b = rng.integers(-4, 5, (k, n)).astype(np.float16)
    module.launch("mma_matmul_f16", grid=(n // 8, m // 16), block=32, args=[a, b, c, n, k])
    np.testing.assert_array_equal(c, a.astype(np.float32) @ b.astype(np.float32))
    a16, b16 = rng.standard_normal((m, k)).astype(np.float16), rng.standard_normal((k, n)).astype(np.float16)
    module.launch("mma_matmul_f16", grid=(n // 8, m // 16), block=32, args=[a16, b16, c, n, k])
    np.testing.assert_allclose(c, a16.astype(np.float64) @ b16.astype(np.float64), rtol=1e-5, atol=1e-5)
    ab, bb = bf16_bits(rng.standard_normal((m, k))), bf16_bits(rng.standard_normal((k, n)))
    module.launch("mma_matmul_bf16", grid=(n // 8, m // 16), block=32, args=[ab, bb, c, n, k])
    np.testing.assert_allclose(c, bf16_values(ab).astype(np.float64) @ bf16_values(bb), rtol=1e-5, atol=1e-5)


def test_every_ldmatrix_form_hands_each_lane_the_ptx_layout(cache):
    module = load("ldmatrix_forms.cu", cache)
    m = np.arange(4 * 8 * 8, dtype=np.uint16)  # value = its index: matrix, row, column
    out = np.zeros((7, 32, 4), np.uint32)
    module.launch("ldmatrix_forms", grid=1, block=32, args=[m, out])
    mats = m.reshape(4, 8, 8).astype(np.uint32)
    for form, (count, trans) in enumerate([(1, False), (1, True), (2, False), (2, True), (4, False), (4, True)]):
        expected = np.zeros((32, 4), np.uint32)
        for lane in range(32):
            for j in range(count):
                # lane l: row l / 4, columns 2 (l % 4) + {0, 1}; transposed: rows 2 (l % 4) + {0, 1} of column l / 4
                mat = mats[j].T if trans else mats[j]
                lo, hi = mat[lane // 4, 2 * (lane % 4)], mat[lane // 4, 2 * (lane % 4) + 1]
                expected[lane, j] = lo | (hi << 16)
        np.testing.assert_array_equal(out[form], expected, err_msg=f"ldmatrix x{count}{' .trans' if trans else ''}")
    assert (out[6].reshape(-1)[:32] == 15).all()  # lane 5's 5 * 3, broadcast to all 32 lanes


def test_three_stage_cp_async_pipeline_and_its_waits(cache, rng):
    module = load("cp_async_pipeline.cu", cache)
    x = rng.standard_normal((8, 1000)).astype(np.float32)  # 1000 = 3 stages of 256 and a zero-filled tail
    out = np.zeros(8, np.float32)
    shared = 3 * 64 * 4 * 4
    module.launch("pipelined_row_sum", grid=8, block=64, args=[x, out, 1000], shared_bytes=shared)
    np.testing.assert_allclose(out, x.astype(np.float64).sum(1), rtol=1e-5, atol=1e-4)
    # waiting for one group too few reads stages whose copies have not landed (shared memory
    # starts as 0xff bytes: NaN): the twin completes copies at the wait, as a GPU may
    early = load("cp_async_pipeline.cu", cache, edit=lambda s: s.replace("cp_async_wait<2>", "cp_async_wait<3>"))
    early.launch("pipelined_row_sum", grid=8, block=64, args=[x, out, 1000], shared_bytes=shared)
    assert np.isnan(out).all()


def test_a_cp_async_copy_into_a_stage_other_threads_still_read_is_a_reported_race(cache, rng):
    """Without the barrier after a stage is read, the next refill of that stage is issued while slower
    threads still read it. The twin's copy lands only at its wait, two chunks later, so the values
    come out right: the race check sees the copy's write from its issue on, as a GPU may land it."""
    racy = load("cp_async_pipeline.cu", cache, "racecheck",
                edit=lambda s: s.replace("__syncthreads();  // stage t is read: it may be refilled", ""))
    x = rng.standard_normal((2, 1000)).astype(np.float32)
    with pytest.raises(KernelFault, match=r"race on shared memory in block \(0,0,0\)"):
        racy.launch("pipelined_row_sum", grid=2, block=64, args=[x, np.zeros(2, np.float32), 1000],
                    shared_bytes=3 * 64 * 4 * 4)


def test_tma_tile_load_completing_on_an_mbarrier(cache):
    module = load("tma_tile.cu", cache)
    a = np.arange(40 * 72, dtype=np.float32).reshape(40, 72)  # 3 x 3 tiles of 16 x 32, ragged at both edges
    out = np.zeros_like(a)
    module.launch("tma_tile_double", grid=(3, 3), block=128, args=[sim.TensorMap(a, box=(16, 32)), out, 40, 72])
    np.testing.assert_array_equal(out, 2 * a)


def test_tma_map_refuses_rows_the_driver_refuses():
    # 70 floats a row (280 bytes): cuTensorMapEncodeTiled said "invalid argument" on an H200 (2026-12-04)
    with pytest.raises(EmmyError, match="multiples of 16 bytes"):
        sim.TensorMap(np.zeros((40, 70), np.float32), box=(16, 32))


@pytest.mark.parametrize("name, kernel, grid, block, make_args", [
    ("block_reduce.cu", "row_sum", 4, 256, lambda: [np.ones((4, 600), np.float32), np.zeros(4, np.float32), 600]),
    ("smem_matmul.cu", "smem_matmul", (2, 2), (16, 16),
     lambda: [np.ones((20, 20), np.float32), np.ones((20, 20), np.float32), np.zeros((20, 20), np.float32), 20, 20, 20]),
    ("mma_matmul.cu", "mma_matmul_f16", (2, 2), 32,
     lambda: [np.ones((32, 32), np.float16), np.ones((32, 16), np.float16), np.zeros((32, 16), np.float32), 16, 32]),
    ("faults.cu", "reverse", 2, 128, lambda: [np.arange(256, dtype=np.float32), np.zeros(256, np.float32)]),
    ("tma_tile.cu", "tma_tile_double", (1, 1), 128,
     lambda: [sim.TensorMap(np.ones((16, 32), np.float32), box=(16, 32)), np.zeros((16, 32), np.float32), 16, 32]),
])
def test_the_race_check_passes_correctly_synchronised_kernels(cache, name, kernel, grid, block, make_args):
    load(name, cache, "racecheck").launch(kernel, grid=grid, block=block, args=make_args())


def test_a_planted_out_of_bounds_index_is_reported_with_kernel_and_line(cache):
    module = load("faults.cu", cache, "asan")
    a = np.ones(1000, np.float32)
    with pytest.raises(KernelFault) as fault:
        module.launch("add_no_tail_check", grid=4, block=256, args=[a, a, np.zeros(1000, np.float32), 1000])
    message = str(fault.value)
    assert "out-of-bounds read of 4 bytes" in message and "add_no_tail_check" in message
    assert message.endswith("at faults.cu:7")


def test_asan_launches_share_one_worker_and_a_fault_only_replaces_it(cache):
    from emmy.sim.build import asan_runtime
    from emmy.sim.runner import _workers

    module = load("faults.cu", cache, "asan")
    fits, out = np.arange(1024, dtype=np.float32), np.zeros(1024, np.float32)  # 4 blocks of 256: in bounds
    module.launch("add_no_tail_check", grid=4, block=256, args=[fits, fits, out, 1024])
    first = _workers[asan_runtime()].process.pid
    module.launch("add_no_tail_check", grid=4, block=256, args=[fits, fits, out, 1024])
    assert _workers[asan_runtime()].process.pid == first  # no new process per launch
    short = np.ones(1000, np.float32)
    with pytest.raises(KernelFault, match="out-of-bounds read"):
        module.launch("add_no_tail_check", grid=4, block=256, args=[short, short, np.zeros(1000, np.float32), 1000])
    out[:] = 0
    module.launch("add_no_tail_check", grid=4, block=256, args=[fits, fits, out, 1024])
    assert _workers[asan_runtime()].process.pid != first and np.array_equal(out, 2 * fits)


def test_a_missing_syncthreads_before_a_shared_read_is_a_reported_race(cache):
    module = load("faults.cu", cache, "racecheck")
    with pytest.raises(KernelFault) as fault:
        module.launch("reverse_missing_sync", grid=2, block=128,
                      args=[np.arange(256, dtype=np.float32), np.zeros(256, np.float32)])
    message = str(fault.value)
    assert "kernel reverse_missing_sync (faults.cu): race on shared memory in block (0,0,0)" in message
    # thread 63 reads tile[64] (line 15) before thread 64 writes it (line 14)
    assert "thread 63 reads at faults.cu:15, then thread 64 writes at faults.cu:14" in message


@pytest.mark.parametrize("mode", ["plain", "racecheck"])
@pytest.mark.parametrize("kernel, expected", [
    ("sync_in_branch", "__syncthreads reached by only part of the block (a barrier in a divergent branch, or after "
                       "an early return) in block (0,0,0); threads 0-15 wait at __syncthreads at line 29; "
                       "threads 16-31 have exited"),
    ("sync_in_both_arms", "__syncthreads in divergent code: the threads wait at different barriers"),
    ("shuffle_in_branch", "deadlock: a warp collective waits for lanes that never arrive in block (0,0,0); "
                          "threads 0-15 wait at __shfl_down_sync at line 47; threads 16-31 have exited"),
])
def test_barriers_and_collectives_in_divergent_code_are_reported_not_hung(cache, mode, kernel, expected):
    module = load("faults.cu", cache, mode)
    with pytest.raises(KernelFault) as fault:
        module.launch(kernel, grid=1, block=32, args=[np.zeros(32, np.float32)])
    assert expected in str(fault.value)
    if kernel == "sync_in_both_arms":
        assert "wait at __syncthreads at line 37" in str(fault.value)
        assert "wait at __syncthreads at line 39" in str(fault.value)


def test_a_source_is_compiled_once_per_content_and_mode(cache, rng):
    first = load("vector_add.cu", cache / "fresh")
    again = load("vector_add.cu", cache / "fresh")
    assert first.compiled and not again.compiled and again.library == first.library
    edited = load("vector_add.cu", cache / "fresh", edit=lambda s: s.replace("a[i] + b[i]", "a[i] - b[i]"))
    assert edited.compiled and edited.library != first.library
    a, b, c = np.ones(300, np.float32), np.full(300, 2.0, np.float32), np.zeros(300, np.float32)
    edited.launch("vector_add", grid=2, block=256, args=[a, b, c, 300])
    assert (c == -1.0).all()


def test_bad_arguments_and_sources_get_clear_errors(cache):
    module = load("vector_add.cu", cache)
    a = np.ones(8, np.float32)
    with pytest.raises(EmmyError, match=r"kernel vector_add takes 4 arguments \(a, b, c, n\), got 3"):
        module.launch("vector_add", grid=1, block=32, args=[a, a, a])
    with pytest.raises(EmmyError, match="argument b must be a C-contiguous numpy array"):
        module.launch("vector_add", grid=1, block=32, args=[a, np.ones((4, 4), np.float32).T, a, 8])
    with pytest.raises(EmmyError, match="has no kernel 'vector_sub'; kernels: vector_add"):
        module.launch("vector_sub", grid=1, block=32, args=[])
    with pytest.raises(KernelFault, match="bad launch: block of 2048 threads"):
        module.launch("vector_add", grid=1, block=2048, args=[a, a, a, 8])
    with pytest.raises(KernelBuildError, match="parameter s has type 'std::string'"):
        sim.load("__global__ void k(std::string s) {}", "k.cu", cache_dir=cache)
    with pytest.raises(KernelBuildError, match="g\\+\\+ could not build broken.cu"):
        sim.load('#include "emmy_rt.cuh"\n__global__ void k(float* x) { x[0] = undefined_name; }', "broken.cu",
                 cache_dir=cache)


@pytest.mark.parametrize("mode", ["plain", "asan", "racecheck"])
def test_a_plain_cuda_file_without_emmy_headers_runs_as_nvcc_would_build_it(cache, rng, mode):
    """Shuffles, dynamic shared memory, a 2-D block, atomics and __half2 from <cuda_fp16.h>."""
    module = load("plain_cuda.cu", cache, mode)
    rows, pairs = 1000, 3
    x = rng.standard_normal((rows, 2 * pairs)).astype(np.float16)
    sums = np.zeros(2 * pairs, np.float32)
    module.launch("column_pair_sums", grid=(pairs, 2), block=(32, 4), shared_bytes=4 * 2 * 4,
                  args=[x.view(np.uint32), sums, rows, pairs])
    # each product is 2x an f16 value, exact in f16; the float sums differ from numpy's only in order
    np.testing.assert_allclose(sums, 2 * x.astype(np.float64).sum(axis=0), rtol=1e-5, atol=1e-3)


def test_a_race_in_a_plain_cuda_file_is_reported_at_its_own_lines(cache):
    module = load("plain_cuda.cu", cache, "racecheck")
    with pytest.raises(KernelFault) as fault:
        module.launch("racy_meeting", grid=1, block=(32, 2), shared_bytes=8, args=[np.zeros(1, np.float32)])
    message = str(fault.value)
    assert "kernel racy_meeting (plain_cuda.cu): race on shared memory" in message
    # warp 1's lane 0 writes partial[1] at line 41; thread 0 reads it at line 44
    assert "plain_cuda.cu:41" in message and "plain_cuda.cu:44" in message, message


SOURCES = ["vector_add.cu", "block_reduce.cu", "smem_matmul.cu", "mma_matmul.cu", "ldmatrix_forms.cu",
           "cp_async_pipeline.cu", "faults.cu", "tma_tile.cu", "plain_cuda.cu"]


@pytest.mark.parametrize("name", SOURCES)
def test_the_same_sources_compile_with_nvcc_for_every_target_they_are_legal_on(name, tmp_path):
    from emmy.sim.build import HEADERS

    archs = ["90", "120"] if name == "tma_tile.cu" else ["80", "90", "120"]  # TMA is sm_90+
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    done = subprocess.run(["nvcc", "-fatbin", "-O3", "-Xptxas", "-v", *gencode, "-I", str(HEADERS),
                           str(KERNELS / name), "-o", str(tmp_path / "out.fatbin")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    compiled = [line for line in done.stderr.splitlines() if "Compiling entry function" in line]
    assert {a for a in archs if any(f"'sm_{a}'" in line for line in compiled)} == set(archs)
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", done.stderr)
    assert spills and all(s == ("0", "0") for s in spills)


def test_kernels_build_against_a_runtime_and_a_header_precompiled_once_per_mode(tmp_path, rng):
    from emmy.sim.build import COMMON_FLAGS, CUDA_HEADERS, HEADERS, MODE_FLAGS, RUNTIME_OBJECT
    from emmy.sim.source import simulator_source

    source = (KERNELS / "faults.cu").read_text()
    sim.load(source, "faults.cu", mode="asan", cache_dir=tmp_path)
    (folder,) = (tmp_path / "sim").glob("runtime-*-asan")
    assert not list((tmp_path / "sim").glob("runtime-build-*"))  # built aside, renamed into place
    built = (folder / RUNTIME_OBJECT).stat().st_mtime_ns
    # g++ -H marks a precompiled header it uses with "!": the kernel's build takes it, not the text
    kernel = tmp_path / "kernel.cpp"
    kernel.write_text(simulator_source(source, "faults.cu"))
    done = subprocess.run(["g++", "-I", str(folder), *COMMON_FLAGS, *MODE_FLAGS["asan"], "-I", str(HEADERS), "-I",
                           str(CUDA_HEADERS), "-H", "-fsyntax-only", str(kernel)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert f"! {folder / 'emmy_sim.h.gch'}" in done.stderr
    # a second source links the same runtime object (the scheduler is not compiled again) and runs
    module = load("vector_add.cu", tmp_path, "asan")
    a, b = rng.standard_normal(300).astype(np.float32), rng.standard_normal(300).astype(np.float32)
    c = np.zeros(300, np.float32)
    module.launch("vector_add", grid=2, block=256, args=[a, b, c, 300])
    np.testing.assert_array_equal(c, a + b)
    assert list((tmp_path / "sim").glob("runtime-*-asan")) == [folder]
    assert (folder / RUNTIME_OBJECT).stat().st_mtime_ns == built
    # a library exports its launchers and the launcher's entry points, not the simulator's state:
    # each library loaded into a process keeps its own
    (exports,) = [e for e in map(_exports, (tmp_path / "sim").glob("*-asan.so")) if "emmy_sim_launch_vector_add" in e]
    assert "emmy_sim_error" in exports
    assert not [name for name in exports if name.startswith("_ZN8emmy_sim")]


def _exports(library: Path) -> list[str]:
    done = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True)
    return [line.split()[-1] for line in done.stdout.splitlines()]
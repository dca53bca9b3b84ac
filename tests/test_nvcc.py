"""nvcc builds of emitted programs: the cache, the resource report and the SASS each row promises."""

from pathlib import Path

import pytest

import emmy
from emmy.kernel_ir.nodes import FlashMma, MmaTile
from emmy.nvcc import Resources, build_cubin, parse_ptxas, sass_mix
from emmy.workloads import WORKLOADS, get

from tests.conftest import compiled

RMSNORM = "x=torch.randn(1,32,2048); w=torch.randn(2048); F.rms_norm(x,(2048,),w,eps=1e-6)"
KERNELS = Path(__file__).resolve().parent / "sim_kernels"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cubins")


def test_a_build_reports_resources_per_kernel_and_the_second_is_cached(cache):
    source = emmy.optimize(RMSNORM, target="sm_90").cuda_source
    for target in ("sm_80", "sm_90", "sm_120"):
        first = build_cubin(source, target, cache)
        assert not first.cached and first.path.exists()
        (name, r), = first.resources.items()
        assert name == "k_rms_norm" and 8 <= r.registers <= 64 and not r.spills
        assert r.shared_bytes >= 32 * 4  # the per-warp partial sums
        again = build_cubin(source, target, cache)
        assert again.cached and again.path == first.path and again.resources == first.resources
    assert not build_cubin(source.replace("1e-06f", "1e-05f"), "sm_90", cache).cached


def test_ptxas_report_parsing_sees_spills():
    text = ("ptxas info    : Compiling entry function 'k' for 'sm_90'\n"
            "ptxas info    : Function properties for k\n"
            "    24 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
            "ptxas info    : Used 255 registers, used 1 barriers, 4096 bytes smem, 400 bytes cmem[0]\n")
    assert parse_ptxas(text) == {"k": Resources(255, 4096, 24, 8, 12)}
    assert parse_ptxas(text)["k"].spills


@pytest.mark.parametrize("knobs, wide", [("WORK=t256,TILE=f4/v4,REDUCE=coop", True),
                                         ("WORK=t256,TILE=f4,REDUCE=coop", False)])
def test_the_sass_has_what_the_row_promises(cache, knobs, wide):
    program = emmy.optimize(RMSNORM, target="sm_90", knobs=knobs)
    mix = sass_mix(build_cubin(program.cuda_source, "sm_90", cache).path)["k_rms_norm"]
    wide_loads = sum(n for op, n in mix.items() if op.startswith("LDG.E.128"))
    wide_stores = sum(n for op, n in mix.items() if op.startswith("STG.E.128"))
    assert (wide_loads > 0) == wide and (wide_stores > 0) == wide  # 4-wide f32 rows move 128 bits at once
    assert mix["SHFL.BFLY"] > 0 and any(op.startswith("BAR.SYNC") for op in mix)
    assert not any(op.startswith(("LDL", "STL")) for op in mix)  # nothing goes through local memory


def test_a_four_wide_map_moves_128_bits_per_load_and_store(cache):
    program = emmy.optimize("x=torch.randn(64,1024); y=torch.randn(64,1024); x*2+y", target="sm_90",
                            knobs="WORK=t256,TILE=f4/v4")
    (kernel,) = program.kernel_ir
    mix = sass_mix(build_cubin(program.cuda_source, "sm_90", cache).path)[kernel.name]
    assert any(op.startswith("LDG.E.128") for op in mix) and any(op.startswith("STG.E.128") for op in mix)
    assert not any(op.startswith(("LDL", "STL")) for op in mix)


def test_a_four_wide_contraction_stages_its_panels_by_128_bit_cp_async(cache):
    program = emmy.optimize("a=torch.randn(16,512); b=torch.randn(64,512); a @ b.t()", target="sm_90",
                            knobs="WORK=t256,TILE=f4/v4,REDUCE=g4a,STAGE=d2/smem-async")
    mix = sass_mix(build_cubin(program.cuda_source, "sm_90", cache).path)["k_mm"]
    assert any(op.startswith("LDGSTS") and op.endswith(".128") for op in mix), mix
    assert any(op.startswith("RED.E.ADD.F32") or op.startswith("REDG.E.ADD.F32") for op in mix), mix
    assert not any(op.startswith(("LDL", "STL")) for op in mix)


def test_mma_tiles_become_hmma_instructions(cache):
    mix = sass_mix(build_cubin((KERNELS / "mma_matmul.cu").read_text(), "sm_90", cache).path)
    for kernel in ("mma_matmul_f16", "mma_matmul_bf16"):
        assert any(op.startswith("HMMA.16816") for op in mix[kernel]), mix[kernel]
        assert any(op.startswith("LDSM") for op in mix[kernel])  # ldmatrix


@pytest.mark.parametrize("target, stage, copy", [("sm_80", "d3/smem-async", "LDGSTS.E.BYPASS.128"),
                                                 ("sm_90", "d3/smem-tma", "UTMALDG.2D"),
                                                 ("sm_120", "", "")])
def test_emitted_mma_tiles_have_hmma_ldmatrix_and_the_staging_their_row_names(cache, target, stage, copy):
    program = emmy.optimize(get("matmul_f16").code, target=target,
                            knobs=f"WORK=w2x2,TILE=mma_m16n8k16_f16_f32/f2x2/k2,REDUCE=,STAGE={stage},RASTER=")
    mix = sass_mix(build_cubin(program.cuda_source, target, cache).path)["k_mm_cast_2"]
    assert any(op.startswith("HMMA.16816.F32") for op in mix), mix
    assert any(op.startswith("LDSM") for op in mix) == bool(stage), mix  # ldmatrix from the staged panels
    assert not copy or copy in mix, mix
    assert not any(op.startswith(("LDL", "STL")) for op in mix)


def _calls_trigonometry(kernel, types) -> bool:
    from emmy.kernel_ir.cuda import kernel_source

    text = kernel_source(kernel, types, "")
    return "sinf(" in text or "cosf(" in text


@pytest.mark.parametrize("name", [w.name for w in WORKLOADS])
def test_sampled_rows_compile_for_every_target_they_are_legal_on_without_spills(cache, name):
    """The rows the simulator tests sample per kernel (default, the model's next 3, 5 at random), each
    built by nvcc for sm_80, sm_90 and sm_120 where that target offers it: one translation unit a target."""
    import dataclasses

    from emmy.errors import EmmyError
    from emmy.kernel_ir.cuda import program_source
    from tests.sampled_rows import sample_rows

    code = get(name).sim_code or get(name).code
    reference = compiled(code, "sm_90")
    sample = sample_rows(reference)
    # the chosen row comes first: tests/test_kernel_ir.py leaves a chosen program built here to this test
    assert {k: rows[0] for k, rows in sample.items()} == {t.kernel.name: t.row for t in reference.tile_ir.kernels}
    built = 0
    for target in ("sm_80", "sm_90", "sm_120"):
        base = compiled(code, target)
        kernels, types = [], base.buffer_types
        # extraction prices each target's own kernels, so its program may have other kernels
        same = {k.name for k in base.loop_ir.kernels} & {k.name for k in reference.loop_ir.kernels
                                                           if k in base.loop_ir.kernels}
        for kernel, rows in sample.items():
            if kernel not in same:
                continue
            for i, row in enumerate(rows):
                try:
                    lowered = base.with_rows({kernel: row}).kernel_ir
                except EmmyError:  # not offered here (TMA before sm_90, shared memory, another program form)
                    continue
                kernels += [dataclasses.replace(k, name=f"{k.name}_row{i}") for k in lowered
                            if k.name in (kernel, f"{kernel}_fill", f"{kernel}_finish")]
        cubin = build_cubin(program_source(kernels, types, {}), target, cache)
        assert set(cubin.resources) == {k.name for k in kernels}
        assert not [k for k, r in cubin.resources.items() if r.spills], cubin.resources
        mix = sass_mix(cubin.path)
        for k in kernels:  # what each row promises is in its SASS; nothing goes through local memory
            ops = mix[k.name]
            local = {op for op in ops if op.startswith(("LDL", "STL"))}
            if k.tensor_maps and target == "sm_120":
                # nvcc checks that a TMA descriptor's generic address lies in the parameter window and
                # calls an error handler otherwise, its arguments stored to an 8-byte stack: never run
                # for a __grid_constant__ descriptor, so only that store is allowed
                assert local <= {"STL.64"} and cubin.resources[k.name].stack_bytes <= 8, (k.name, local)
            elif _calls_trigonometry(k, types):
                # sinf/cosf reduce a huge argument (|x| > 1e5) through a 28-byte local array (Payne-Hanek):
                # that path's scratch, not a spill, which the resources above already rule out
                assert local <= {"LDL", "STL"} and cubin.resources[k.name].stack_bytes <= 32, (k.name, local)
            else:
                assert not local, (k.name, k.knobs, local)
            if isinstance(k.body[0], (MmaTile, FlashMma)):
                assert any(op.startswith("HMMA.16816") for op in ops), (k.name, k.knobs)
            if _wide_global_loads(k):
                assert any(op.startswith("LDG.E.128") for op in ops), (k.name, k.knobs, ops)
        built += len(kernels)
    assert built >= sum(len(rows) for rows in sample.values())


def _wide_global_loads(kernel) -> bool:
    """The kernel loads 16 bytes at once from global memory straight into registers (vector loads of
    element loops, maps and unstaged contractions)."""
    from emmy.kernel_ir.nodes import ContractionTile, ElementLoop, MapElements

    vectors = [v for n in kernel.body if isinstance(n, (ElementLoop, MapElements, ContractionTile))
               for v in getattr(n, "vectors", ())]
    return any(v.width * v.dtype.itemsize == 16 for v in vectors)


@pytest.mark.parametrize("code", [
    "x=torch.randint(-50,50,(6,33)); d=torch.randint(1,5,(6,33),dtype=torch.int32); "
    "(x // d, x % d, torch.fmod(x, d), torch.div(x, d, rounding_mode='trunc'), (x & 12) ^ ~x, "
    "d // 3, d % -3, torch.fmod(d, 2))",
    "x=torch.randn(3,40,dtype=torch.float16); y=torch.randn(3,40); (x // 0.3, x % 0.3, torch.round(x) + torch.sign(x), "
    "torch.lgamma(y.abs() + 0.2) + torch.atan2(y, y * 2) + torch.hypot(y, y) + torch.exp2(y) + torch.special.erfc(y), "
    "torch.isinf(y) ^ torch.signbit(y), torch.copysign(y, -y))",
    "y=torch.randn(3,40); (torch.special.erfinv(y.tanh()), torch.i0(y) + torch.special.i1(y), torch.digamma(y))",
    "y=torch.randn(3,40,dtype=torch.float64); x=torch.randn(3,40,dtype=torch.float16); "
    "(torch.special.i0e(y) + torch.special.i1e(x) + torch.special.erfcx(y) + torch.special.ndtri(y.sigmoid()), "
    "torch.special.zeta(x.abs() + 1.5, y) + torch.polygamma(1, y), "
    "torch.special.bessel_j0(x) + torch.special.bessel_y1(y))",
])
def test_the_runtime_header_s_division_and_the_math_library_build_for_every_target(cache, code):
    """emmy_rt.cuh's floor_divide, remainder and fmod overloads (float, long long, int) and the CUDA
    math functions the simulator's host build also names, built by nvcc without spills."""
    for target in ("sm_80", "sm_90", "sm_120"):
        cubin = build_cubin(emmy.optimize(code, target=target).cuda_source, target, cache)
        assert cubin.resources and not any(r.spills for r in cubin.resources.values())


def test_gathered_positions_are_32_bit_indices_that_do_not_spill(cache):
    """An embedding row read per output, eight outputs a thread (lm_step's loss kernel at TILE=f8): with
    64-bit positions from the index tensor, sm_120's ptxas spilled this kernel; positions are ints, as
    every other index emmy emits."""
    from emmy.kernel_ir.cuda import program_source

    base = emmy.optimize(get("lm_step").sim_code, target="sm_120")
    (row,) = [r for r in base.schedule_space().rows["k_div"] if str(r) == "WORK=t32,TILE=f8,REDUCE=,STAGE=,RASTER="]
    program = base.with_rows({"k_div": row})
    kernels = [k for k in program.kernel_ir if k.name == "k_div"]
    assert "emmy::gather_index(" in program.cuda_source
    cubin = build_cubin(program_source(kernels, program.buffer_types, {}), "sm_120", cache)
    assert not cubin.resources["k_div"].spills, cubin.resources


def test_the_host_library_template_builds_with_nvcc_and_says_when_there_is_no_gpu(tmp_path):
    """The host side of the GPU path (cuda_templates/host_library.cu.j2: copies, TMA descriptors, a
    launcher and a timer per kernel) compiles with nvcc around a program's CUDA; loaded on a machine
    without a GPU, the first call fails with the CUDA runtime's reason, not a crash."""
    import ctypes

    from emmy.gpu import Gpu, GpuError

    program = emmy.optimize("x=torch.randn(1000); x.exp() + 1", target="sm_90")
    source = tmp_path / "program.cu"
    source.write_text(program.cuda_source)
    names = [k.name for k in program.kernel_ir]
    gpu = Gpu(source, names, "90", work=tmp_path / "lib")
    for name in names:
        assert isinstance(getattr(gpu.lib, f"emmy_gpu_launch_{name}"), ctypes._CFuncPtr)
        assert isinstance(getattr(gpu.lib, f"emmy_gpu_time_{name}"), ctypes._CFuncPtr)
    try:
        arch = gpu.arch()
    except GpuError as err:  # no device here: the runtime says so
        assert "CUDA error" in str(err)
    else:
        assert arch.startswith("sm_")

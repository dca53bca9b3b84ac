"""Kernel IR and CUDA emission for map and row kernels: the listings, nvcc, and the emitted
kernels run in the simulator against torch (the chosen row and a sample of other legal rows)."""

import re
import subprocess

import pytest

import emmy
from emmy.runtime import check_program
from emmy.workloads import WORKLOADS, get
from tests.conftest import compiled, run_emmy
from tests.sampled_rows import check_sampled_rows

RMSNORM = get("rmsnorm").code
LOWERED = ["add3", "rmsnorm", "softmax", "layernorm", "layernorm_bf16",  # map and row kernels
           "matmul_small", "gelu_chain", "mlp",  # SIMT contractions staged through shared memory (mlp: split K)
           "matmul_f16",  # tensor cores: mma atoms fed by ldmatrix from a cp.async pipeline
           "attention", "attention_causal",  # flash attention: S = QK^T and O += PV on tensor cores, one pass
           "llama_decoder", "lm_step",  # whole models: RoPE and GQA attention; an embedding gather and a loss
           "resnet_block", "separable_block", "conv3d_pool"]  # convolutions: implicit GEMM, depthwise, 3-D + pooling
assert set(LOWERED) == {w.name for w in WORKLOADS}


def _simulated(name: str) -> str:
    """The code the simulator runs for a workload: its own, or the same program at a small shape."""
    return get(name).sim_code or get(name).code


def test_rmsnorm_kernel_ir_has_vector_loads_a_warp_shuffle_and_a_shared_memory_tree():
    result = run_emmy("compile", "-c", RMSNORM, "--ir", "kernel", "--target", "sm_90")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "Tile[row, col] (N=2048) // 32 rows, 1024 workers per row" in text
    assert re.search(r"f32 in\d+_v\[2\] = load\.v2 x\[2048 \* a0 \+ base\]", text)
    lines = [line.strip() for line in text.splitlines()]
    at = lines.index("WarpShuffle(sum, length=32) acc0 -> sum_partials[warp]")
    assert lines[at + 1:at + 4] == ["Smem f32 sum_partials[32]", "Sync",
                                    "TreeHalve(sum, length=32) sum_partials"]


def test_rmsnorm_cuda_carries_its_knob_row_and_calls_the_runtime_header(tmp_path):
    out = tmp_path / "rms.cu"
    result = run_emmy("compile", "-c", RMSNORM, "--ir", "cuda", "--target", "sm_90", "-o", str(out))
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    assert text.startswith('#include "emmy_rt.cuh"')
    assert "// knobs WORK=t1024,TILE=f2/v2,REDUCE=coop,STAGE=regs,RASTER=" in text
    assert "emmy::load_vec<2>(&g_x[2048 * a0 + base])" in text  # buffers are g_<name> in CUDA text
    assert "__shfl_xor_sync(0xffffffffu, acc0, offset)" in text and "__shared__ __align__(16) float sum_partials[32];" in text
    assert text.count("__syncthreads();") == 3


# the full-size programs the simulator runs at a smaller shape; every other workload's chosen kernels
# are the first of the rows tests/test_nvcc.py builds for each target (its sampled rows start with
# the chosen row), so nvcc builds them there
FULL_SIZE = [name for name in LOWERED if get(name).sim_code]


@pytest.mark.parametrize("name", FULL_SIZE)
def test_emitted_cuda_compiles_with_nvcc_for_every_target_without_spills(name, tmp_path):
    from emmy.sim.build import HEADERS

    source = tmp_path / f"{name}.cu"
    source.write_text(compiled(get(name).code, "sm_90").cuda_source)
    archs = ["80", "90", "120"]
    done = subprocess.run(["nvcc", "-fatbin", "-O3", "-Xptxas", "-v",
                           *(f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs), "-I", str(HEADERS),
                           str(source), "-o", str(tmp_path / "out.fatbin")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", done.stderr)
    assert len(spills) >= len(archs) and all(s == ("0", "0") for s in spills)


@pytest.mark.parametrize("name", LOWERED)
def test_the_chosen_kernels_run_in_the_simulator_and_match_torch(name):
    program = compiled(_simulated(name), "sm_90")
    if get(name).sim_code:  # the full-size program's chosen row, run at the small shape
        from emmy.suite import small_twin

        full = compiled(get(name).code, "sm_90")
        program = small_twin(emmy.optimize, get(name).sim_code, "sm_90", full)
        if len(full.tile_ir.kernels) == 1:  # a whole model's kernels differ in number by shape
            assert [k.row for k in program.tile_ir.kernels] == [k.row for k in full.tile_ir.kernels]
    checks = check_program(program)
    assert checks and all(c.ok for c in checks), checks


@pytest.mark.parametrize("name", LOWERED)
def test_a_sample_of_legal_rows_runs_right_in_the_simulator(name):
    """Each sampled row's kernels run inside the program in place of the chosen row's, and the
    program's outputs are checked against torch (tests.sampled_rows)."""
    check_sampled_rows(compiled(_simulated(name), "sm_90"))


@pytest.mark.parametrize("code, knobs", [
    ("a=torch.randn(40,70); b=torch.randn(70,24); torch.tanh(a @ b)", "WORK=t256,TILE=f1,REDUCE=,STAGE=d1/smem"),
    ("a=torch.randn(40,70); b=torch.randn(70,24); torch.tanh(a @ b)", "WORK=t64,TILE=f4,REDUCE=,STAGE=d2/smem-async"),
    ("a=torch.randn(40,70); b=torch.randn(70,24); torch.tanh(a @ b)", "WORK=t128,TILE=f2,REDUCE=,STAGE="),
    # split K with atomics; operands contiguous along K loaded 4 (2) at a time
    ("a=torch.randn(16,512); b=torch.randn(64,512); a @ b.t()", "WORK=t256,TILE=f4/v4,REDUCE=g4a,STAGE=d2/smem-async"),
    ("a=torch.randn(16,512); b=torch.randn(64,512); a @ b.t()", "WORK=t128,TILE=f2/v2,REDUCE=,STAGE=d1/smem"),
])
def test_staged_contractions_are_free_of_shared_memory_races(code, knobs):
    program = emmy.optimize(code, target="sm_90", knobs=knobs)
    assert all(c.ok for c in check_program(program, mode="racecheck"))


def test_a_workspace_split_writes_partials_then_a_finishing_kernel_applies_the_epilogue():
    program = emmy.optimize(get("gelu_chain").code, target="sm_90", knobs="WORK=t64,TILE=f8,REDUCE=g4k,STAGE=d1/smem")
    main, finish = program.kernel_ir
    assert finish.name == "k_gelu_finish" and main.grid[2] == 4
    (workspace,) = [p for p in main.params if p.scratch]
    assert workspace.scratch == 4 * 16 * 512  # one partial sum per split and output
    assert "each output: acc0 = sum over 4 partials in k_gelu_workspace" in program.ir("kernel")
    assert all(c.ok for c in check_program(program, mode="racecheck"))


def test_buffers_named_like_template_locals_do_not_clash():
    # b, c, e, r, s: names the templates use for their own variables
    code = "b=torch.randn(4,40); c=torch.randn(40,6); e=torch.randn(6); r=torch.relu(b @ c + e); s=r*2; s"
    assert all(c.ok for c in check_program(emmy.optimize(code, target="sm_90")))


def test_a_split_contraction_fills_its_output_then_adds_partials_atomically():
    program = emmy.optimize("a=torch.randn(16,512); b=torch.randn(64,512); a @ b.t()", target="sm_90",
                            knobs="WORK=t256,TILE=f4/v4,REDUCE=g4a,STAGE=d2/smem-async")
    fill, main = program.kernel_ir
    assert fill.name == "k_mm_fill" and main.grid[2] == 4
    text = program.ir("kernel")
    assert "split K 4 ways (grid z)" in text and "load.v4 along K" in text
    assert "emmy::atomic_sum(&g_mm[" in program.cuda_source
    assert all(c.ok for c in check_program(program, mode="asan"))


def test_rmsnorm_runs_clean_under_address_sanitizer():
    program = emmy.optimize("x=torch.randn(2,8,96); w=torch.randn(96); F.rms_norm(x,(96,),w,eps=1e-6)",
                            target="sm_90")
    assert all(c.ok for c in check_program(program, mode="asan"))


@pytest.mark.parametrize("name", LOWERED)
def test_every_workload_runs_clean_under_address_sanitizer_at_a_small_shape(name):
    # maps, rows, SIMT contractions, mma tiles with cp.async, flash attention on tensor cores (splits: above)
    program = compiled(_simulated(name), "sm_90")
    assert all(c.ok for c in check_program(program, mode="asan"))


def test_emmy_run_check_prints_the_errors_and_refuses_what_it_cannot_lower():
    result = run_emmy("run", "-c", RMSNORM, "--check")
    assert result.returncode == 0, result.stderr
    assert "k_rms_norm: grid 32 x block 1024  WORK=t1024,TILE=f2/v2,REDUCE=coop,STAGE=regs,RASTER=" in result.stdout
    row = next(line.split() for line in result.stdout.splitlines() if line.strip().startswith("out0"))
    assert row[1] == "f32" and float(row[2]) < 1e-5 and row[-1] == "ok"
    attention = run_emmy("run", "-c", get("attention").sim_code, "--check", "--knobs", "STAGE=d2/smem-tma",
                         "--target", "sm_90")
    assert attention.returncode == 2 and "TMA staging of the K and V tiles is not lowered yet" in attention.stderr
    device = run_emmy("run", "-c", RMSNORM, "--device", "gpu")
    assert device.returncode == 2 and "unknown --device 'gpu'" in device.stderr


@pytest.mark.parametrize("code", ["x=torch.randn(8,40000); x.sum(-1)", "x=torch.randn(8,40000); x.amax(-1)"])
def test_long_rows_split_over_blocks_that_combine_atomically(code):
    program = emmy.optimize(code, target="sm_90")
    rows = program.schedule_space().rows[program.loop_ir.kernels[0].name]
    atomic = [r for r in rows if r.REDUCE.endswith("a")]
    assert atomic
    for row in [atomic[0], atomic[len(atomic) // 2], atomic[-1]]:
        pinned = emmy.optimize(code, target="sm_90", knobs=str(row))
        fill, main = pinned.kernel_ir
        assert fill.name.endswith("_fill") and main.grid[0] == 8 * pinned.tile_ir.kernels[0].geometry.split
        assert all(c.ok for c in check_program(pinned)), row
    assert all(c.ok for c in check_program(emmy.optimize(code, target="sm_90", knobs=str(atomic[0])),
                                           mode="racecheck"))


def test_device_cuda_builds_a_host_library_and_runs_there_or_names_what_is_missing():
    # nvcc builds the program with a launcher per kernel; without a GPU the CUDA runtime's own reason
    # comes back as one line (exit 2); with one, the check must pass
    result = run_emmy("run", "-c", get("softmax").code, "--device", "cuda", "--check")
    if result.returncode == 0:
        assert result.stdout.splitlines()[-1].split()[-1] == "ok"
    else:
        assert result.returncode == 2, result.stderr
        assert re.search(r"emmy: error: (cudaMalloc|finding the GPU): CUDA error \d+ \(.+\)", result.stderr)
        assert "Traceback" not in result.stderr


def test_a_rounding_cast_before_the_product_keeps_tensor_cores_out():
    # f16 inputs rounded to bf16 before the product: mma atoms would take the f16 values as loaded
    program = emmy.optimize("a=torch.randn(48,32,dtype=torch.float16); b=torch.randn(32,40,dtype=torch.float16); "
                            "a.bfloat16() @ b.bfloat16()", target="sm_90")
    (kernel,) = program.loop_ir.kernels
    rows = program.schedule_space().rows[kernel.name]
    assert rows and not any(r.TILE.startswith("mma") for r in rows)
    assert all(c.ok for c in check_program(program))


@pytest.mark.parametrize("loss", ["F.mse_loss(p, t)", "F.huber_loss(p, t, delta=0.5)",
                                  "torch.clamp(1 - p * t, min=0).mean()", "torch.linalg.vector_norm(p - t, ord=3)"],
                         ids=["mse", "huber", "hinge", "norm3"])
def test_a_reduction_to_one_value_lowers_and_runs(loss):
    program = emmy.optimize(f"p=torch.randn(48,40); t=torch.randn(48,40); {loss}", target="sm_90")
    assert program.tile_ir.kernels[-1].kernel.type.numel == 1
    assert all(c.ok for c in check_program(program, mode="asan"))


_C_TEXT = ("threadIdx", "blockIdx", "blockDim", "gridDim", "==", "&&", "emmy::", "__shared__", "__restrict__")


def test_kernel_ir_node_definitions_hold_no_c_text():
    """No C in the node definitions (the strings lowered nodes hold are checked, for every row kind of
    every workload, beside the CUDA snapshot: tests/test_cuda_snapshot.py)."""
    from pathlib import Path

    source = (Path(__file__).resolve().parent.parent / "emmy" / "kernel_ir" / "nodes.py").read_text()
    assert not [t for t in _C_TEXT if t in source]


def test_every_kernel_ir_statement_has_one_renderer_one_template_and_one_listing():
    """One dispatch table per concern (CUDA, the --ir kernel listing), each covering every node type a
    kernel body holds, and a template per node type."""
    import typing
    from pathlib import Path

    from emmy.kernel_ir import cuda, printer
    from emmy.kernel_ir import nodes as K

    kinds = set(typing.get_args(K.Stmt)) | {K.WorkspaceMerge}
    templates = Path(__file__).resolve().parent.parent / "cuda_templates" / "kernel_ir"
    statements = kinds - {K.VecLoad, K.VecStore, K.Smem, K.Store}  # parts of other nodes, not body statements
    assert statements <= set(cuda._RENDERERS) and statements <= set(printer._LISTINGS)
    assert all((templates / f"{kind.__name__}.j2").exists() for kind in statements)


MMA_SMALL = "a=torch.randn(96,160,dtype=torch.float16); b=torch.randn(160,72,dtype=torch.float16); a@b"


@pytest.mark.parametrize("code, knobs", [
    (MMA_SMALL, "WORK=w2x2,TILE=mma_m16n8k16_f16_f32/f1x2/k2,REDUCE=,STAGE=d2/smem-async,RASTER="),
    (MMA_SMALL, "WORK=w2x2,TILE=mma_m16n8k16_f16_f32/f1x2/k1,REDUCE=,STAGE=d3/smem-tma,RASTER="),
    (get("attention").sim_code, "STAGE=d2/smem-async"),
])
def test_a_staged_loop_copies_the_next_chunk_under_this_chunk_s_compute_without_a_race(code, knobs):
    """The copy into the stage the last chunk used is issued right after the chunk's barrier, before
    its compute, so two stages overlap a copy with compute (issued after it, they never would). The
    simulator's race check sees a cp.async write from its issue on: a copy issued before that
    barrier, into a stage other warps still read, is reported (checked by hand against that order;
    a TMA box's write is not seen before its mbarrier completes, which the race check does not model)."""
    program = emmy.optimize(code, target="sm_90", knobs=knobs)
    source = program.cuda_source
    loop = source[source.index("for (int chunk = 0; chunk < chunks; ++chunk)"):]
    barrier, refill = loop.index("__syncthreads();"), loop.index("fill(")
    assert barrier < refill, loop[:600]
    assert "ldmatrix" not in loop[:refill] and "acc" not in loop[:refill]  # nothing computed before the copy
    assert all(c.ok for c in check_program(program, mode="racecheck"))


def _bank_groups(cols: int, rows: range, chunk: int, shift: int, mask: int) -> list[int]:
    """The 128-byte-line slot (of 8 16-byte chunks) each row's chunk `chunk` is stored in."""
    return [((r * cols * 2) // 16 + (chunk ^ ((r >> shift) & mask))) % 8 for r in rows]


@pytest.mark.parametrize("cols", [16, 32, 64, 128, 256])
def test_a_swizzled_panel_serves_every_ldmatrix_phase_without_a_bank_conflict(cols):
    """An 8x8 matrix of ldmatrix is one 16-byte chunk of 8 consecutive rows from a multiple of 8:
    with the panel's swizzle the 8 rows fall in 8 distinct chunks of a 128-byte line (32 banks);
    stored as they are, rows of 32 bytes or more collide (an 8-way conflict from 256 bytes)."""
    from emmy.kernel_ir.lower_mma import panel_swizzle

    shift, mask = panel_swizzle(cols)
    assert mask == min(cols // 8, 8) - 1
    for start in range(0, 64, 8):
        for chunk in range(cols // 8):
            assert len(set(_bank_groups(cols, range(start, start + 8), chunk, shift, mask))) == 8, (start, chunk)
    assert len(set(_bank_groups(cols, range(8), 0, 0, 0))) < 8  # unswizzled: a conflict


H16 = "dtype=torch.float16"


@pytest.mark.parametrize("code", [
    f"a=torch.randn(96,160,{H16}); b=torch.randn(160,72,{H16}); a@b",  # A along K, B transposed on load
    f"a=torch.randn(96,160,{H16}); b=torch.randn(72,160,{H16}); a@b.t()",  # both along K
    f"a=torch.randn(160,96,{H16}); b=torch.randn(160,72,{H16}); a.t()@b",  # A transposed on load
    "a=torch.randn(3,40,48,dtype=torch.bfloat16); b=torch.randn(3,48,56,dtype=torch.bfloat16); torch.bmm(a,b)",
    f"a=torch.randn(64,80,{H16}); b=torch.randn(80,64,{H16}); torch.relu(a)@b",  # a prologue on fragments
])
def test_swizzled_tensor_core_panels_fill_and_read_the_same_elements(code):
    """A staged (plain or cp.async) mma row offered for each K chunk (BK 16, 32, 64: the panel
    widths along K), the first two: the fill and the ldmatrix reads go through one swizzle,
    checked in the simulator (the race check on the first, ASan on the second)."""
    program = emmy.optimize(code, target="sm_90")
    (kernel,) = [k for k in program.loop_ir.kernels if "mm" in k.name]
    rows = [r for r in program.schedule_space().rows[kernel.name]
            if r.TILE.startswith("mma") and r.STAGE and "tma" not in r.STAGE]
    by_chunk = {}
    for row in rows:
        by_chunk.setdefault(row.TILE.rsplit("/", 1)[1], row)
    assert by_chunk
    for mode, row in zip(("racecheck", "asan"), by_chunk.values()):
        pinned = emmy.optimize(code, target="sm_90", knobs=str(row))
        (mma,) = [n for k in pinned.kernel_ir for n in k.body if type(n).__name__ == "MmaTile"]
        assert all(bool(o.swizzle_mask) == (o.cols >= 16) for o in mma.operands), [o.cols for o in mma.operands]
        assert all(c.ok for c in check_program(pinned, mode=mode)), str(row)


@pytest.mark.parametrize("name", ["attention_causal"])
def test_flash_attention_on_tensor_cores_reads_swizzled_q_k_v_panels_right(name):
    """Q, K and V panels (rows of 64 halves: 128 bytes, an 8-way conflict unswizzled) go through the
    same swizzle as a contraction's; staged rows of each form, the widest tile among them, run
    right in the simulator (the race check on the first)."""
    code = get(name).sim_code
    program = emmy.optimize(code, target="sm_90")
    (kernel,) = [k for k in program.loop_ir.kernels if "sdpa" in k.name]
    rows = [r for r in program.schedule_space().rows[kernel.name] if r.TILE.startswith("mma") and r.STAGE]
    picked = {r.STAGE: r for r in reversed(rows)}  # the first offered of each staging
    widest = max(rows, key=lambda r: (r.work.warps_m * r.tile.frag_m * r.tile.frag_n, str(r)))
    for index, row in enumerate([*list(picked.values())[:2], widest]):
        pinned = emmy.optimize(code, target="sm_90", knobs=str(row))
        (flash,) = [n for k in pinned.kernel_ir for n in k.body if type(n).__name__ == "FlashMma"]
        assert all(o.swizzle_mask for o in (flash.q, flash.k, flash.v)), str(row)
        assert all(c.ok for c in check_program(pinned, mode="racecheck" if index == 0 else "asan")), str(row)


def test_a_half_precision_load_is_not_rounded_again():
    """A value loaded from a bf16 buffer is a bf16 value: converting it to float is exact, and
    rounding it to bf16 again would cost a conversion an element (the SASS's F2F.BF16.F32)."""
    from emmy.nvcc import build_cubin, sass_mix

    program = emmy.optimize("x = torch.randn(64, 4096, dtype=torch.bfloat16); x.float().sum(-1)", target="sm_90")
    assert "round_bf16" not in program.cuda_source
    mix = sass_mix(build_cubin(program.cuda_source, "sm_90").path)
    assert not any(op.startswith("F2F") for kernel in mix.values() for op in kernel)
    # a result computed in bf16 is still rounded to it
    assert "round_bf16" in emmy.optimize("x = torch.randn(8, 64, dtype=torch.bfloat16); x * 3", target="sm_90").cuda_source


def test_index_quotients_and_remainders_keep_floor_semantics_in_c():
    """emmy.affine divides and takes remainders as Python does; C truncates toward zero, so an index
    that may be negative (a position before a concatenated piece's start) is spelt with the floor
    helpers, and one that cannot be keeps C's cheaper operators."""
    from emmy.affine import Affine
    from emmy.kernel_ir.scalar_c import affine_c

    before_start = Affine.dim(0) - 1
    assert affine_c(before_start.mod(2, (5,))) == "emmy::index_floor_mod(a0 - 1, 2)"
    assert affine_c(before_start.floordiv(2, (5,))) == "emmy::index_floor_div(a0 - 1, 2)"
    assert affine_c(Affine.dim(0).mod(2, (5,))) == "((a0) % 2)"
    assert affine_c((Affine.dim(0) + 3).floordiv(2, (5,))) == "((a0 + 3) / 2)"


def test_an_index_whose_digits_stand_side_by_side_spells_its_dividend_once():
    """a*(e % q) + b*(e // q) is emitted as emmy::index_digits(e, q, a, b): nested through a chain of
    views (e itself such a pair), spelling e twice per level doubled the C text per level."""
    from emmy.affine import Affine
    from emmy.kernel_ir.scalar_c import affine_c

    extents = (5, 7)
    e = Affine.dim(0) * 6 + Affine.dim(1) - 1
    assert affine_c(e.mod(7, extents) + e.floordiv(7, extents) * 6) == \
        "emmy::index_digits(6 * a0 + a1 - 1, 7, 1, 6)"
    extents = (1000, 7)  # wide enough that no level's quotient is one constant
    for _ in range(12):
        e = e.mod(7, extents) + e.floordiv(7, extents) * 6 + 1
    text = affine_c(e)
    assert text.count("emmy::index_digits(") == 12 and len(text) < 1000  # written out: 2**12 copies of the base


def test_a_grid_contraction_after_a_class_token_reads_inside_its_buffers():
    """The piece after a class token reads a mixing matrix at row (p - 1) % 2 of its reshaped grid;
    that index is inside the matrix by floor semantics, so its load keeps no guard, and at p = 0 C's
    truncating % read row -1 (ASan: heap-buffer-overflow)."""
    import torch

    class Tokens(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cls = torch.nn.Parameter(torch.randn(1, 1, 8))
            self.pos = torch.nn.Parameter(torch.randn(1, 4, 8))
            self.mix = torch.nn.Parameter(torch.randn(2, 2))

        def forward(self, x):
            mixed = torch.einsum("jq,biqc->bijc", self.mix, self.pos.view(1, 2, 2, 8)).reshape(1, 4, 8)
            return torch.cat([self.cls, x + mixed], dim=1)

    module, x = Tokens(), torch.randn(1, 4, 8)
    got = emmy.optimize(module, x)(x, sim_mode="asan")
    torch.testing.assert_close(got, module(x).detach())


def test_attention_with_a_second_sum_per_key_runs_right_without_the_flash_template():
    """Bottleneck attention (timm's SEBotNet) sums relative-position logits beside q.k in the same
    per-key loop: two sums, which the SIMT flash template (one warp sum per key) took and crashed
    on. Such a kernel is no flash row; another row computes it."""
    import torch

    class TwoLogits(torch.nn.Module):
        def forward(self, q, k, r, v):
            return torch.softmax(q @ k.transpose(-1, -2) + q @ r.transpose(-1, -2), -1) @ v

    xs = [torch.randn(1, 2, 16, 8, generator=torch.Generator().manual_seed(s)) for s in range(4)]
    got = emmy.optimize(TwoLogits(), *xs)(*xs, sim_mode="asan")
    torch.testing.assert_close(got, TwoLogits()(*xs))

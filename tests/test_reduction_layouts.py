"""Reductions over any set of axes, priced and emitted as they read memory.

Adjacent reduced axes fold as one row of their product (LayerNorm over (C, H, W), GroupNorm, a
spatial mean); a reduction over a strided axis is a column reduction whose threads go along the
contiguous outputs; a row whose knobs promise vectors emits them; a schedule whose lanes read a
stride apart is priced for the sectors it fetches; a row read again is priced by whether the
rows in flight fit the cache; -c inputs too large to keep are made only when a run needs them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import emmy
from emmy.affine import Affine, recombined
from emmy.schedule.cost_model import predict
from emmy.schedule.loop_cost import kernel_cost
from emmy.extract.targets import get_target
from emmy.runtime import check_program
from emmy.schedule.geometry import lane_access
from emmy.schedule.shape import kernel_shape


def _shapes(code: str, **kw):
    program = emmy.optimize(code, target="sm_90", **kw)
    return program, [kernel_shape(k) for k in program.loop_ir.kernels]


@pytest.mark.parametrize("code, length", [
    ("x=torch.randn(4,8,16,16); torch.nn.functional.layer_norm(x,(8,16,16))", 8 * 16 * 16),
    ("x=torch.randn(2,8,8,8); torch.nn.functional.group_norm(x,4)", 2 * 8 * 8),
    ("x=torch.randn(2,6,9,9); x.mean(dim=(2,3))", 81),
    ("x=torch.randn(3,5,6,7); x.sum(dim=(1,2,3))", 5 * 6 * 7),
])
def test_adjacent_reduced_axes_fold_as_one_contiguous_row(code, length):
    program, shapes = _shapes(code)
    folds = [s for s in shapes if s.kind == "row"]
    assert folds and all(s.red == length and s.fold_contiguous for s in folds), [s.describe() for s in shapes]
    checks = check_program(program)
    assert all(c.ok for c in checks), checks


def test_a_merged_rows_loads_read_one_contiguous_walk_and_take_vectors():
    program = emmy.optimize("x=torch.randn(4,8,16,16); x.sum(dim=(1,2,3))", target="sm_90", knobs="TILE=f4/v4")
    (tile,) = program.tile_ir.kernels
    assert tile.shape.describe() == "row reduction 4 x 2048" and tile.geometry.vec == 4
    assert "emmy::load_vec<4>(&g_x[2048 * a0 + base])" in program.cuda_source
    assert all(c.ok for c in check_program(program))


def test_recombined_puts_the_digits_of_a_reshape_back_together():
    r, n, ext = Affine.dim(1), Affine.dim(0), [16, 262144]
    digits = r.floordiv(4096, ext) * 4096 + r.floordiv(64, ext).mod(64, ext) * 64 + r.mod(64, ext)
    assert recombined(digits + n * 262144) == n * 262144 + r
    kept = r.floordiv(64, ext).mod(64, ext)  # no fewer atoms once expanded: left as it is
    assert recombined(kept) == kept


@pytest.mark.parametrize("code", [
    "x=torch.randn(3,40,70); x.sum(dim=1)",
    "x=torch.randn(3,40,70); x.amax(dim=1)",
    "x=torch.randn(3,40,70); x.var(dim=1)",
    "x=torch.randn(300,70); x.argmax(dim=0)",
    "x=torch.randn(6,50,33); x.softmax(dim=1)",
    "x=torch.randn(64,128,33); x.var(dim=(0,2))",
])
@pytest.mark.parametrize("knobs", ["REDUCE=coop", "REDUCE="])
def test_reductions_over_a_strided_axis_run_right_under_each_schedule(code, knobs):
    program = emmy.optimize(code, target="sm_90", knobs=knobs)
    checks = check_program(program)
    assert checks and all(c.ok for c in checks), checks


@pytest.mark.parametrize("code", [
    "x=torch.randn(2000,40); x.sum(dim=0)",
    "x=torch.randn(2000,40); x.amax(dim=0)",
    "x=torch.randn(4,1001,70); x.sum(dim=1)",  # a fold that no split divides evenly
])
@pytest.mark.parametrize("split", [2, 64])
def test_a_column_split_across_blocks_combines_atomically_and_runs_right(code, split):
    program = emmy.optimize(code, target="sm_90", knobs=f"REDUCE=g{split}a")
    (tile,) = program.tile_ir.kernels
    assert tile.shape.kind == "column" and tile.geometry.split == split
    assert f"const int slice = blockIdx.x % {split};" in program.cuda_source and "emmy::atomic_" in program.cuda_source
    for mode in ("asan", "racecheck"):
        checks = check_program(program, mode=mode)
        assert checks and all(c.ok for c in checks), (mode, checks)


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_few_outputs_split_their_folds_across_the_gpu_and_are_priced_near_the_bound(gpu):
    """64 outputs are two blocks of 32: without a split, two SMs would do all the work."""
    program = emmy.optimize("x=torch.randn(262144,64); x.sum(dim=0)", target=gpu)
    (tile,) = program.tile_ir.kernels
    target = get_target(gpu)
    assert tile.shape.kind == "column" and tile.geometry.split >= 16
    assert tile.geometry.blocks >= target.sms // 2
    bound = 262144 * 64 * 4 / target.dram_bandwidth
    assert bound <= tile.seconds <= 1.6 * bound, (tile.seconds, bound)


@pytest.mark.parametrize("code", [
    "x=torch.randn(8,5000); x.var(dim=-1)",  # a twisted (Welford) state merged across blocks
    "x=torch.randn(3,7001); x.mean(dim=-1)",  # an epilogue after the fold
    "x=torch.randn(4,3000); x.logsumexp(dim=-1)",
    "x=torch.randn(3,9000); w=torch.randn(3); x.mean(-1)*w",  # a load in the epilogue
    "x=torch.randn(3,9000); m=torch.randn(3,1); ((x-m)**2).sum(-1)",  # a row-level load before the fold
])
@pytest.mark.parametrize("split", [2, 64])
def test_a_row_split_through_a_workspace_merges_its_partial_states_and_runs_right(code, split):
    program = emmy.optimize(code, target="sm_90", knobs=f"REDUCE=g{split}k")
    names = [k.name for k in program.kernel_ir]
    assert all(f"{t.kernel.name}_finish" in names for t in program.tile_ir.kernels), names
    assert f"const int row = blockIdx.x / {split}, slice = blockIdx.x % {split};" in program.cuda_source
    for mode in ("asan", "racecheck"):
        checks = check_program(program, mode=mode)
        assert checks and all(c.ok for c in checks), (mode, checks)


def test_few_long_rows_with_an_epilogue_split_across_the_gpu_and_are_priced_near_the_bound():
    """8 rows of 1M: one block a row would leave 124 of the H100's 132 SMs idle (the variance's
    epilogue rules out atomics, so the blocks hand their Welford states on through a workspace)."""
    program = emmy.optimize("x=torch.randn(8,1<<20); x.var(dim=-1)", target="h100")
    (tile,) = program.tile_ir.kernels
    target = get_target("h100")
    assert tile.row.REDUCE.endswith("k") and tile.geometry.blocks >= target.sms
    bound = 8 * (1 << 20) * 4 / target.dram_bandwidth
    assert bound <= tile.seconds <= 1.8 * bound, (tile.seconds, bound)


def test_the_search_fuses_several_reductions_into_their_reader_at_once():
    """GroupNorm's sum and sum of squares each cost more fused alone than materialized (with
    split rows they are cheap kernels), but fused together into the normalizing sweep they save
    both kernels: one move that fuses every reduction a kernel reads finds it (128 rows of a group's
    32768 elements: enough rows for a block each)."""
    program = emmy.optimize("x=torch.randn(16,64,64,64); torch.nn.functional.group_norm(x,8)", target="h100")
    assert len(program.tile_ir.kernels) == 1
    decisions = program.explain().decisions
    singles = [d for d in decisions if d.kind == "boundary" and d.chosen == "fused"]
    assert singles and all(d.delta_seconds > 0 for d in singles)  # materializing any one back costs more


def test_a_middle_axis_sum_is_a_coalesced_column_reduction_priced_near_its_bound():
    code = "x=torch.randn(16,1024,1023); x.sum(dim=1)"
    for gpu in ("h100", "h200"):
        program = emmy.optimize(code, target=gpu)
        (tile,) = program.tile_ir.kernels
        assert tile.shape.kind == "column" and tile.shape.rows == 16 * 1023 and tile.shape.red == 1024
        assert lane_access(tile.shape, tile.row) == "coalesced" and tile.geometry.vec == 1
        target = get_target(gpu)
        bound = (16 * 1024 * 1023 + 16 * 1023) * 4 / target.dram_bandwidth
        assert bound <= tile.seconds <= 1.5 * bound, (gpu, tile.seconds, bound)
    # the emitted loop: lanes along the contiguous outputs, warps splitting the fold
    source = program.cuda_source
    assert "const int row_c = blockIdx.x * 32 + threadIdx.x % 32;" in source  # a lane an output
    assert "g_x[1047552 * a0 + a1 + 1023 * a2]" in source  # consecutive lanes, consecutive a1


def test_column_rows_never_promise_vectors_and_every_offered_row_is_coalesced():
    program = emmy.optimize("x=torch.randn(16,1024,1023); x.sum(dim=1)", target="sm_90")
    (kernel,) = program.loop_ir.kernels
    rows = program.schedule_space().rows[kernel.name]
    assert rows and {r.REDUCE for r in rows} == {"", "coop"}
    assert all("/v" not in r.TILE for r in rows)
    assert all(lane_access(kernel_shape(kernel), r) == "coalesced" for r in rows)


def test_strided_lanes_are_priced_for_the_sectors_they_fetch():
    """A transpose's map reads a stride apart along the lanes: priced above the same copy read in
    order, by the sectors each lane's element costs through L2."""
    target = get_target("h100")
    prices = {}
    for name, code in (("copy", "x=torch.randn(4096,4096); x*2.0"), ("transpose", "x=torch.randn(4096,4096); x.t()*2.0")):
        program = emmy.optimize(code, target="h100")
        (tile,) = program.tile_ir.kernels
        prices[name] = (tile.seconds, lane_access(tile.shape, tile.row))
    assert prices["copy"][1] == "coalesced" and prices["transpose"][1] == "strided"
    extra = 4096 * 4096 * 4 * (32 // 4 - 1) / target.l2_bandwidth
    assert prices["transpose"][0] >= prices["copy"][0] + 0.9 * extra


def test_a_row_read_again_is_priced_by_whether_the_rows_in_flight_fit_the_cache():
    """Softmax reads its row again after the fold. 1024 columns: the rows in flight fit in L1/L2,
    the re-read is not DRAM traffic. 393,216 columns (1.5 MB a row): the rows on all SMs do not fit
    the L2, so the second read comes from DRAM again."""
    target = get_target("h100")

    def dram_bytes(code: str) -> tuple[float, float]:
        program = emmy.optimize(code, target="h100")
        types = program.buffer_types
        sizes = {n: (t.numel, t.dtype.itemsize) for n, t in types.items()}
        priced = []
        for kernel in program.loop_ir.kernels:
            shape = kernel_shape(kernel)
            best = program.ranked_rows(kernel)[0]
            priced.append(predict(shape, best.row, target, kernel_cost(kernel, sizes)).bytes)
        x = program.loop_ir.inputs[0][1]
        return sum(priced), x.numel * x.dtype.itemsize

    short, size = dram_bytes("x=torch.randn(4096,1024); x.softmax(dim=-1)")
    assert short == pytest.approx(2 * size, rel=0.01)  # read once, written once
    long, size = dram_bytes("x=torch.randn(64,393216); x.softmax(dim=-1)")
    assert long >= 2.9 * size  # read, read again from DRAM, written


def test_inputs_over_the_lazy_size_are_made_only_when_a_run_needs_them(monkeypatch):
    monkeypatch.setenv("EMMY_LAZY_INPUT_MB", "1")
    code = "x=torch.randn(512,1024); t=torch.randint(0,1024,(512,)); torch.nn.functional.cross_entropy(x,t)"
    program = emmy.optimize(code, target="sm_90")
    inputs = program.example_inputs
    assert inputs.pending == 1 and len(inputs) == 2  # the 2 MB logits wait; the ids were made
    assert all(c.ok for c in check_program(program))
    assert inputs.pending == 0
    again = emmy.optimize(code, target="sm_90").example_inputs
    np.testing.assert_array_equal(again[0].numpy(), inputs[0].numpy())  # made the same way each time
    monkeypatch.setenv("EMMY_LAZY_INPUT_MB", "64")
    assert emmy.optimize(code, target="sm_90").example_inputs.pending == 0


def test_the_simulator_counts_the_bytes_a_launch_reads_and_writes(tmp_path):
    import emmy.sim as sim
    from emmy.errors import EmmyError

    source = (Path(__file__).resolve().parent / "sim_kernels" / "vector_add.cu").read_text()
    module = sim.load(source, "vector_add.cu", mode="racecheck", cache_dir=tmp_path)
    n = 1000
    a, b, c = (np.ones(n, np.float32) for _ in range(3))
    assert module.count("vector_add", grid=4, block=256, args=[a, b, c, n]) == [(4 * n, 0), (4 * n, 0), (0, 4 * n)]
    plain = sim.load(source, "vector_add.cu", mode="plain", cache_dir=tmp_path)
    with pytest.raises(EmmyError, match="racecheck build"):
        plain.count("vector_add", grid=4, block=256, args=[a, b, c, n])


def test_the_reductions_fused_into_a_kernel_can_be_cut_out_of_it_together():
    """The inverse of fusing every reduction a kernel reads: cutting them all out at once (each
    where it ends or where its kernel would end) is a move the search prices, and `explain` shows
    what it would cost. For GroupNorm with enough rows, keeping them fused is cheaper."""
    program = emmy.optimize("x=torch.randn(16,64,64,64); torch.nn.functional.group_norm(x,8)", target="h100")
    outs = [d for d in program.explain().decisions if d.subject.endswith("cut out of it")]
    assert outs and all(d.chosen == "cut at neither" and d.delta_seconds > 0 for d in outs)
    assert all(d.alternative.startswith("cut at ") and "," in d.alternative for d in outs)  # two cuts at once

"""Sanity properties of the analytic cost model and `emmy explain`."""

import pytest

import emmy
from emmy.egraph import optimize_loops
from emmy.egraph.driver import Budget
from emmy.extract.targets import get_target
from emmy.program import pricer_for
from emmy.rules import builtin_groups
from emmy.tile_ir.build import build_tile_program
from emmy.workloads import WORKLOADS
from tests.conftest import compiled, run_emmy

RMSNORM = "x=torch.randn(1,{rows},2048); w=torch.randn(2048); F.rms_norm(x,(2048,),w,eps=1e-6)"
MATMUL = "a=torch.randn({n},{n},dtype=torch.float16); b=torch.randn({n},{n},dtype=torch.float16); a@b"
ATTENTION = next(w.code for w in WORKLOADS if w.name == "attention")


def _chosen(code, target="sm_90"):
    return compiled(code, target).tile_ir.kernels


def _program_seconds(code, groups, target="sm_90"):
    graph = emmy.optimize(code).tensor_ir
    loops = optimize_loops(graph, groups, Budget(), pricer_for(get_target(target))).program
    return sum(k.seconds for k in build_tile_program(loops, pricer_for(get_target(target))).kernels), len(loops.kernels)


def test_predicted_time_grows_with_problem_size():
    rms = [_chosen(RMSNORM.format(rows=rows))[0].seconds for rows in (32, 1024, 16384)]
    mm = [_chosen(MATMUL.format(n=n))[0].seconds for n in (256, 1024, 4096)]
    assert rms == sorted(rms) and rms[0] < rms[-1]
    assert mm == sorted(mm) and mm[0] < mm[-1]


@pytest.mark.parametrize("gpu", ["h100", "h200", "a100", "l40s", "rtx4090", "rtx5090"])
@pytest.mark.parametrize("name", ["rmsnorm", "softmax", "layernorm", "gelu_chain"])
def test_memory_bound_rows_take_at_least_bytes_over_bandwidth(name, gpu):
    """No offered row of a memory-bound kernel is predicted below its GPU's physical bound."""
    program = compiled(next(w.code for w in WORKLOADS if w.name == name), gpu)
    bandwidth = program.target.dram_bandwidth
    for kernel in program.explain(top=1000).kernels:
        for b in kernel.ranked:
            assert b.total_s >= b.bytes / bandwidth
            assert b.total_s == pytest.approx(b.launch_s + b.body_s + b.sync_s + b.extra_s)


def test_fused_rmsnorm_beats_its_unfused_form():
    code = RMSNORM.format(rows=4096)
    fused, fused_kernels = _program_seconds(code, builtin_groups())
    unfused, unfused_kernels = _program_seconds(code, [g for g in builtin_groups() if g.phase == "algebra"])
    assert fused_kernels == 1 < unfused_kernels
    assert fused < unfused


def test_one_pass_attention_beats_the_three_pass_form_at_1024():
    one_pass, one_kernels = _program_seconds(ATTENTION, builtin_groups())
    multi_pass, multi_kernels = _program_seconds(ATTENTION, [g for g in builtin_groups() if g.name != "twist"])
    assert one_kernels == 1 < multi_kernels
    assert one_pass < multi_pass


@pytest.mark.parametrize("target", ["sm_80", "sm_90", "sm_120"])
def test_chosen_rows_never_spill_or_overflow_shared_memory_and_tma_only_where_it_exists(target):
    t = get_target(target)
    for workload in WORKLOADS:
        for tk in _chosen(workload.code, target):
            assert not tk.breakdown.spills and tk.breakdown.registers <= t.regs_per_thread, workload.name
            assert tk.geometry.smem_bytes <= t.smem_per_block, workload.name
            if not t.has_tma:
                assert not tk.row.STAGE.endswith("smem-tma"), workload.name


def test_tensor_cores_for_a_large_f16_matmul_and_vector_loads_for_rmsnorm():
    (mm,) = _chosen(MATMUL.format(n=4096))
    assert mm.row.TILE.startswith("mma_m16n8k16_f16_f32/") and mm.row.WORK.startswith("w")
    (rms,) = _chosen(RMSNORM.format(rows=32))
    assert "/v" in rms.row.TILE


def test_explain_prints_a_breakdown_whose_terms_sum_to_the_total():
    result = run_emmy("explain", "-c", RMSNORM.format(rows=32), "--target", "sm_90", "--top", "2")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # the extraction's decisions come first: each alternative's whole-program price, closest first
    assert lines[1].startswith("=== extraction: 1 kernels, predicted ")
    assert lines[2].startswith("decisions: what the program would cost with the other choice")
    decisions = [line.split() for line in lines[4:] if line.startswith("  boundary")]
    assert decisions and all(d[-1].startswith("+") for d in decisions)
    deltas = [float(d[-1]) for d in decisions]
    assert deltas == sorted(deltas)
    assert any(d[1] == "rms_norm_sum" and d[2:4] == ["fused", "materialized"] for d in decisions)
    predicted = float(lines[1].split("predicted ")[1].split()[0])
    for d in decisions:  # the alternative's program price is the chosen one plus its delta
        assert float(d[-2]) == pytest.approx(predicted + float(d[-1]), abs=0.011)
    start = next(i for i, line in enumerate(lines) if line.startswith("=== 0: "))
    lines = lines[start:]
    assert lines[0].startswith("=== 0: k_rms_norm on H200 (sm_90) (signature ")
    header = lines[1].split()
    rows = [line.split() for line in lines[2:5]]
    assert float(rows[0][2]) == pytest.approx(predicted, abs=0.011)
    assert [r[0] for r in rows] == ["chosen", "alt", "alt"]
    for r in rows:
        cells = r[2:] if r[0] == "chosen" else r[3:]
        total, launch, body, sync, extra = (float(c) for c in cells[:5])
        assert total == pytest.approx(launch + body + sync + extra, abs=0.011)
    assert "total" in header and "measured" in header


def test_a_measured_row_overrides_the_prediction_and_changes_the_choice(tmp_path):
    import json

    code = RMSNORM.format(rows=32)
    program = emmy.optimize(code, target="sm_90")
    (kernel,) = program.explain(top=5).kernels
    chosen, other = kernel.ranked[0], kernel.ranked[5]
    signature = kernel.signature
    assert signature == program.tile_ir.kernels[0].signature
    measured = tmp_path / "measured.json"
    # two rows measured (the model right about its pick, the other ten times faster than the pick):
    # the rows not measured keep their predictions (the median measured/predicted ratio is 1)
    measured.write_text(json.dumps([
        {"target": "sm_90", "kernel": signature, "knobs": str(other.row), "seconds": chosen.total_s / 10},
        {"target": "sm_90", "kernel": signature, "knobs": str(chosen.row), "seconds": chosen.total_s},
        {"target": "sm_90", "kernel": signature, "knobs": str(kernel.ranked[1].row)},  # malformed: no seconds
        "not a row",
    ]))
    result = run_emmy("explain", "-c", code, "--target", "sm_90", "--top", "1",
                      env={"EMMY_MEASUREMENTS": str(measured)})
    assert result.returncode == 0, result.stderr
    kernel_table = result.stdout.split("=== 0: ")[1]
    chosen_line = next(line for line in kernel_table.splitlines() if line.strip().startswith("chosen"))
    assert str(other.row) in chosen_line and chosen_line.rstrip().endswith("yes")
    assert f"{chosen.total_s / 10 * 1e6:.2f}" in chosen_line
    assert "row 2 skipped" in result.stderr and "row 3 skipped" in result.stderr
    tile = run_emmy("compile", "-c", code, "--target", "sm_90", "--ir", "tile",
                    env={"EMMY_MEASUREMENTS": str(measured)})
    assert f"knobs {other.row}  (" in tile.stdout
    # the same measurement for another GPU changes nothing here
    measured.write_text(json.dumps([{"target": "sm_80", "kernel": signature, "knobs": str(other.row),
                                     "seconds": 1e-9}]))
    unchanged = run_emmy("compile", "-c", code, "--target", "sm_90", "--ir", "tile",
                         env={"EMMY_MEASUREMENTS": str(measured)})
    assert f"knobs {chosen.row}  (" in unchanged.stdout


def test_extraction_weighs_the_one_pass_and_multi_pass_forms_with_the_model():
    result = emmy.optimize(ATTENTION, target="sm_90").loop_result
    forms = [d for d in result.decisions if d.kind == "form"]
    assert forms and all(d.chosen == "one-pass fold" and d.alternative.startswith("the multi-pass fold")
                         for d in forms)
    assert all(d.delta_seconds > 0 for d in forms)
    assert len(result.program.kernels) == 1
    multi = result.alternative(forms[0])
    assert len(multi.kernels) >= 1 and multi != result.program


def test_extraction_weighs_each_reduction_boundary_with_the_model(tmp_path, monkeypatch):
    """Every boundary's alternative is priced: measured rows that make RMSNorm's two-kernel form
    (the sum of squares materialized) fastest make extraction choose that boundary."""
    import json

    program = emmy.optimize(RMSNORM.format(rows=32), target="sm_90")
    decision = next(d for d in program.loop_result.decisions if d.subject == "rms_norm_sum")
    assert (decision.chosen, decision.alternative) == ("fused", "materialized") and decision.delta_seconds > 0
    split = program.loop_result.alternative(decision)
    assert len(split.kernels) == 2
    tiles = build_tile_program(split, pricer_for(get_target("sm_90"))).kernels
    measured = tmp_path / "measured.json"
    measured.write_text(json.dumps([{"target": "sm_90", "kernel": k.signature, "knobs": str(k.row),
                                     "seconds": 1e-9} for k in tiles]))
    monkeypatch.setenv("EMMY_MEASUREMENTS", str(measured))
    again = emmy.optimize(RMSNORM.format(rows=32), target="sm_90")
    assert again.loop_ir == split
    assert again.loop_result.predicted_seconds == pytest.approx(2e-9)
    assert [k.row for k in again.tile_ir.kernels] == [k.row for k in tiles]
    flipped = next(d for d in again.loop_result.decisions if d.subject == "rms_norm_sum")
    assert (flipped.chosen, flipped.alternative) == ("materialized", "fused") and flipped.delta_seconds > 0


@pytest.mark.parametrize("workload", WORKLOADS, ids=[w.name for w in WORKLOADS])
def test_explain_covers_every_workload_and_its_terms_add_up(workload):
    program = compiled(workload.code, "sm_90")
    explained = program.explain(top=2)
    assert [k.name for k in explained.kernels] == [k.name for k in program.loop_ir.kernels]
    for kernel, chosen in zip(explained.kernels, program.tile_ir.kernels):
        ranked = kernel.ranked
        assert ranked[0].row == chosen.row and ranked[0].total_s == chosen.seconds
        assert [b.total_s for b in ranked] == sorted(b.total_s for b in ranked)
        for b in ranked:
            assert b.total_s == pytest.approx(b.launch_s + b.body_s + b.sync_s + b.extra_s)
            assert b.compute_s == max(b.arith_s, b.tensor_s, b.special_s, b.issue_s)


@pytest.mark.parametrize("target", ["sm_80", "sm_90"])
def test_an_fp32_matmul_is_priced_at_one_fma_per_multiply_add(target):
    """A SIMT contraction's FMA-pipe time is its 2*M*N*K FLOP at the FP32 peak (which counts an FMA
    as 2): the multiply and the add a sum accumulates are one instruction, not two."""
    program = emmy.optimize("a=torch.randn(4096,4096); b=torch.randn(4096,4096); a @ b", target=target)
    best = program.explain().kernels[0].ranked[0]
    bound = 2 * 4096 ** 3 / get_target(target).fp32_flops
    assert bound <= best.arith_s < 1.1 * bound, (best.arith_s, bound)



@pytest.mark.parametrize("target, fraction", [("sm_90", 1 / 2), ("sm_120", 1 / 64)])
def test_an_f64_matmul_runs_on_the_fp64_pipes_at_their_rate(target, fraction):
    """The same multiply-adds in f64 take the FP64 pipes, at the CUDA guide's fraction of the fp32
    rate: half on Hopper, a 64th on a GeForce Blackwell."""
    f32, f64 = (emmy.optimize(f"a=torch.randn(2048,2048{d}); b=torch.randn(2048,2048{d}); a @ b", target=target)
                .explain().kernels[0].ranked[0] for d in ("", ",dtype=torch.float64"))
    bound = 2 * 2048 ** 3 / (get_target(target).fp32_flops * fraction)
    assert bound <= f64.arith_s < 1.1 * bound, (f64.arith_s, bound)
    assert f64.arith_s > 1.8 * f32.arith_s


def test_index_math_is_counted_where_it_runs_and_shares_the_issue_with_the_fma_work():
    """A floor division or modulo in an index runs once per iteration of the loops down to the
    innermost one it walks (2 and 3 integer instructions), and the model issues it beside the
    kernel's FMA-pipe work; a plain elementwise kernel has none."""
    from emmy.schedule.loop_cost import INDEX_DIVIDE_OPS, INDEX_MODULO_OPS, buffer_sizes, kernel_cost

    permuted = emmy.optimize("x=torch.randn(30,100,99); x.permute(2,0,1).reshape(99,3000) + 1", target="h100")
    (kernel,) = permuted.loop_ir.kernels
    cost = kernel_cost(kernel, buffer_sizes(permuted.loop_ir))
    assert cost.index_ops == 99 * 3000 * (INDEX_DIVIDE_OPS + INDEX_MODULO_OPS)  # a1 // 100, a1 % 100 per element
    best = permuted.explain().kernels[0].ranked[0]
    assert best.issue_s == pytest.approx((cost.arith_ops + cost.index_ops) / get_target("h100").issue_rate)
    plain = emmy.optimize("x=torch.randn(30,100,99); x + 1", target="h100")
    (kernel,) = plain.loop_ir.kernels
    assert kernel_cost(kernel, buffer_sizes(plain.loop_ir)).index_ops == 0
    # a division by an outer loop only is hoisted: once per row, not per element
    rows = emmy.optimize("x=torch.randn(600,64); w=torch.randn(6); x * w.repeat_interleave(100).unsqueeze(1)",
                         target="h100")
    (kernel,) = rows.loop_ir.kernels  # w[a0 // 100] loads once per row a0
    assert kernel_cost(kernel, buffer_sizes(rows.loop_ir)).index_ops == 600 * INDEX_DIVIDE_OPS


@pytest.mark.parametrize("target, fed_slower", [("h100", True), ("a100", False)])
def test_an_mma_tile_is_priced_at_the_slower_of_the_tensor_cores_and_their_fragment_feed(target, fed_slower):
    """f16 4096^3 with 4x4 atoms a warp and 4x4 warps: each warp's K step of 16 reads 3072 fragment
    bytes (4 A of 16x16, 4 B of 16x8) for 16 atoms. An A100's shared memory (32 banks x 4 bytes a
    clock an SM) feeds that faster than its tensor cores multiply; an H100's, at 2.3x the A100's
    peak and 1.7x its shared-memory rate, does not."""
    code = "a=torch.randn(4096,4096,dtype=torch.float16); b=torch.randn(4096,4096,dtype=torch.float16); a @ b"
    pins = "WORK=w4x4,TILE=mma_m16n8k16_f16_f32/f4x4/k1,REDUCE=,STAGE=d2/smem-async,RASTER="
    program = emmy.optimize(code, target=target, knobs=pins)
    (tile,) = [k for k in program.tile_ir.kernels if k.row.tile.mma]
    chosen = get_target(target)
    peak = 2 * 4096 ** 3 / chosen.tensor_flops
    blocks = (4096 // 256) * (4096 // 128)  # 16*4*4 rows, 8*4*4 columns a block
    fed = blocks * (4096 // 16) * 16 * (4 * 512 + 4 * 256) / (128 * chosen.sms * chosen.clock_hz)
    assert tile.breakdown.tensor_s == pytest.approx(max(peak, fed))
    assert (fed > peak) == fed_slower


@pytest.mark.parametrize("frags", ["f2x2/k2", "f4x2/k1", "f1x4/k2"])
def test_the_fragment_bytes_the_model_prices_are_the_ldmatrix_bytes_in_the_sass(frags):
    """Per HMMA the SASS loads (LDSM .4: 512 bytes a warp, .2: 256) what the model's fragment
    bytes say per atom."""
    from emmy.nvcc import build_cubin, sass_mix
    from emmy.schedule.cost_model import mma_fragment_bytes
    from emmy.workloads import get

    program = emmy.optimize(get("matmul_f16").code, target="sm_90",
                            knobs=f"WORK=w2x2,TILE=mma_m16n8k16_f16_f32/{frags},REDUCE=,STAGE=d2/smem-async,RASTER=")
    (tile,) = [k for k in program.tile_ir.kernels if k.row.tile.mma]
    mix = sass_mix(build_cubin(program.cuda_source, "sm_90").path)[tile.kernel.name]
    wide, narrow = (sum(n for op, n in mix.items() if op.startswith("LDSM") and op.endswith(s)) for s in (".4", ".2"))
    per_hmma = (wide * 512 + narrow * 256) / mix["HMMA.16816.F32"]
    shape = tile.shape
    atoms = shape.rows * shape.cols * shape.red * shape.batch / (16 * 8 * 16)
    assert per_hmma == pytest.approx(mma_fragment_bytes(shape, tile.row, tile.geometry) / atoms)


MM_F16_4096 = "a=torch.randn(4096,4096,dtype=torch.float16); b=torch.randn(4096,4096,dtype=torch.float16); a @ b"


def _mma_breakdown(target: str, k: str, stage: str):
    pins = f"WORK=w4x4,TILE=mma_m16n8k16_f16_f32/f4x4/{k},REDUCE=,STAGE={stage},RASTER="
    (tile,) = [t for t in emmy.optimize(MM_F16_4096, target=target, knobs=pins).tile_ir.kernels if t.row.tile.mma]
    return tile.breakdown


def test_a_staged_k_loop_with_one_chunk_in_flight_pays_the_copy_latency_every_chunk():
    """f16 4096^3, 256x128 tiles on an H200: 512 blocks, 4 waves of one block an SM. With two stages
    (one chunk in flight) and chunks of 16, each chunk waits for a copy's latency plus its own
    transfer, which one chunk's compute does not cover (the H200 measured this row far slower than
    its throughput price); three stages spread it over two chunks and cover it."""
    from emmy.schedule.cost_model import SYNC_STEP

    h200 = get_target("h200")
    shallow, staged = _mma_breakdown("h200", "k1", "d2/smem-async"), _mma_breakdown("h200", "k1", "d3/smem-async")
    blocks, chunks, waves = 512, 4096 // 16, 4
    transfer = staged.memory_s * h200.sms / (blocks * chunks)
    assert shallow.body_s == pytest.approx(waves * chunks * (h200.memory_latency_s + transfer))
    assert staged.body_s < shallow.body_s / 1.5
    assert staged.sync_s == pytest.approx(waves * chunks * SYNC_STEP)  # a barrier a chunk


def test_deeper_k_chunks_and_more_stages_never_cost_more(target="h200"):
    prices = {(k, d): _mma_breakdown(target, k, f"d{d}/smem-async").total_s for k in ("k1", "k2", "k4")
              for d in (2, 3, 4)}
    for (k, d), seconds in prices.items():
        deeper = [prices[(k2, d)] for k2 in ("k1", "k2", "k4") if int(k2[1]) > int(k[1])]
        more = [prices[(k, d2)] for d2 in (2, 3, 4) if d2 > d]
        assert all(s <= seconds * (1 + 1e-9) for s in deeper + more), (k, d)
    chosen = emmy.optimize(MM_F16_4096, target=target).tile_ir.kernels[0].row
    assert chosen.tile.k_chunks > 1 and chosen.stage.depth > 2  # never the shallow loop


def test_an_unstaged_k_loop_takes_at_least_its_chain_of_l1_hits():
    """fp32 128x264x4096 unstaged, a thread an output: each warp walks K=4096 with four steps'
    loads in flight, so a wave takes at least a first L2 round trip and 1024 L1 hits; with an L1
    ten times slower the chain is what the kernel takes, however little it computes."""
    from dataclasses import replace
    from math import ceil

    from emmy.schedule.cost_model import UNSTAGED_LOADS_IN_FLIGHT, predict
    from emmy.schedule.choose import loop_cost

    program = emmy.optimize("a=torch.randn(128,4096); b=torch.randn(4096,264); a @ b", target="h200",
                            knobs="WORK=t256,TILE=f1,REDUCE=,STAGE=,RASTER=")
    (tile,) = program.tile_ir.kernels
    cost = loop_cost(tile.kernel, program.buffer_types)
    for l1_cycles in (33.0, 330.0):
        gpu = replace(get_target("h200"), l1_latency_cycles=l1_cycles)
        chain = gpu.memory_latency_s + ceil(4096 / UNSTAGED_LOADS_IN_FLIGHT) * gpu.l1_latency_s
        body = predict(tile.shape, tile.row, gpu, cost).body_s
        assert body >= tile.breakdown.waves * chain * (1 - 1e-9)
    assert body == pytest.approx(tile.breakdown.waves * chain)

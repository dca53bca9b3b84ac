"""Sanity properties of the analytic cost model (DESIGN.md section 4) and `emmy explain`."""

import pytest

import emmy
from emmy.egraph import optimize_loops
from emmy.egraph.driver import Budget
from emmy.extract.targets import get_target
from emmy.rules import builtin_groups
from emmy.tile_ir.build import build_tile_program
from emmy.workloads import WORKLOADS
from tests.conftest import run_emmy

RMSNORM = "x=torch.randn(1,{rows},2048); w=torch.randn(2048); F.rms_norm(x,(2048,),w,eps=1e-6)"
MATMUL = "a=torch.randn({n},{n},dtype=torch.float16); b=torch.randn({n},{n},dtype=torch.float16); a@b"
ATTENTION = next(w.code for w in WORKLOADS if w.name == "attention")


def _chosen(code, target="sm_90"):
    return emmy.optimize(code, target=target).tile_ir.kernels


def _program_seconds(code, groups, target="sm_90"):
    graph = emmy.optimize(code).tensor_ir
    loops = optimize_loops(graph, groups, Budget()).program
    return sum(k.seconds for k in build_tile_program(loops, get_target(target)).kernels), len(loops.kernels)


def test_predicted_time_grows_with_problem_size():
    rms = [_chosen(RMSNORM.format(rows=rows))[0].seconds for rows in (32, 1024, 16384)]
    mm = [_chosen(MATMUL.format(n=n))[0].seconds for n in (256, 1024, 4096)]
    assert rms == sorted(rms) and rms[0] < rms[-1]
    assert mm == sorted(mm) and mm[0] < mm[-1]


@pytest.mark.parametrize("name", ["rmsnorm", "softmax", "layernorm", "gelu_chain"])
def test_memory_bound_rows_take_at_least_bytes_over_bandwidth(name):
    program = emmy.optimize(next(w.code for w in WORKLOADS if w.name == name), target="sm_90")
    bandwidth = program.target.dram_bandwidth
    for _, ranked in program.explain(top=1000):
        for b in ranked:
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
    # the program forms extraction weighed come first, the chosen one (one kernel) at the top
    assert lines[1].startswith("=== program forms: the chosen one and the 2 next cheapest of ")
    assert lines[3].split()[:4] == ["chosen", "one-pass", "folds", "1"]
    assert lines[4].split()[0] == "alt" and "materialized" in lines[4]
    forms_total = [float(line.split()[-1]) for line in lines[3:6]]
    assert forms_total == sorted(forms_total)
    lines = lines[6:]
    assert lines[0] == "=== 0: k_rms_norm on sm_90 ==="
    header = lines[1].split()
    rows = [line.split() for line in lines[2:5]]
    assert float(rows[0][2]) == forms_total[0]
    assert [r[0] for r in rows] == ["chosen", "alt", "alt"]
    for r in rows:
        cells = r[2:] if r[0] == "chosen" else r[3:]
        total, launch, body, sync, extra = (float(c) for c in cells[:5])
        assert total == pytest.approx(launch + body + sync + extra, abs=0.011)
    assert "total" in header and "measured" in header


def test_a_measured_row_overrides_the_prediction_and_changes_the_choice(tmp_path):
    import json

    from emmy.tile_ir.shape import kernel_shape

    code = RMSNORM.format(rows=32)
    program = emmy.optimize(code, target="sm_90")
    (kernel,) = program.loop_ir.kernels
    [(_, ranked)] = program.explain(top=5)
    chosen, other = ranked[0], ranked[5]
    signature = kernel_shape(kernel).signature()
    measured = tmp_path / "measured.json"
    measured.write_text(json.dumps([
        {"target": "sm_90", "kernel": signature, "knobs": str(other.row), "seconds": chosen.total_s / 10},
        {"target": "sm_90", "kernel": signature, "knobs": str(chosen.row)},  # malformed: no seconds
        "not a row",
    ]))
    result = run_emmy("explain", "-c", code, "--target", "sm_90", "--top", "1",
                      env={"EMMY_MEASUREMENTS": str(measured)})
    assert result.returncode == 0, result.stderr
    kernel_table = result.stdout.split("=== 0: ")[1]
    chosen_line = next(line for line in kernel_table.splitlines() if line.strip().startswith("chosen"))
    assert str(other.row) in chosen_line and chosen_line.rstrip().endswith("yes")
    assert f"{chosen.total_s / 10 * 1e6:.2f}" in chosen_line
    assert "row 1 skipped" in result.stderr and "row 2 skipped" in result.stderr
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
    seconds = {form.label: form.seconds for form in result.alternatives}
    assert result.alternatives[0].label == "one-pass folds"
    assert seconds["one-pass folds"] < seconds["multi-pass folds"]
    assert [f.seconds for f in result.alternatives] == sorted(f.seconds for f in result.alternatives)
    assert len(result.program.kernels) == 1


def test_extraction_weighs_each_reduction_boundary_with_the_model(tmp_path, monkeypatch):
    """The programs one boundary away are priced too: measured rows that make RMSNorm's two-kernel
    form (the sum of squares materialized) fastest make extraction choose those boundaries."""
    import json

    program = emmy.optimize(RMSNORM.format(rows=32), target="sm_90")
    forms = {form.label: form for form in program.loop_result.alternatives}
    split = forms["one-pass folds, rms_norm_sum materialized"]
    assert len(split.program.kernels) == 2 and split.seconds > forms["one-pass folds"].seconds
    tiles = build_tile_program(split.program, get_target("sm_90")).kernels
    measured = tmp_path / "measured.json"
    measured.write_text(json.dumps([{"target": "sm_90", "kernel": k.shape.signature(), "knobs": str(k.row),
                                     "seconds": 1e-9} for k in tiles]))
    monkeypatch.setenv("EMMY_MEASUREMENTS", str(measured))
    again = emmy.optimize(RMSNORM.format(rows=32), target="sm_90")
    assert again.loop_ir == split.program
    assert again.loop_result.alternatives[0].seconds == pytest.approx(2e-9)
    assert [k.row for k in again.tile_ir.kernels] == [k.row for k in tiles]


@pytest.mark.parametrize("workload", WORKLOADS, ids=[w.name for w in WORKLOADS])
def test_explain_covers_every_workload_and_its_terms_add_up(workload):
    program = emmy.optimize(workload.code, target="sm_90")
    explained = program.explain(top=2)
    assert [name for name, _ in explained] == [k.name for k in program.loop_ir.kernels]
    for (_, ranked), chosen in zip(explained, program.tile_ir.kernels):
        assert ranked[0].row == chosen.row and ranked[0].total_s == chosen.seconds
        assert [b.total_s for b in ranked] == sorted(b.total_s for b in ranked)
        for b in ranked:
            assert b.total_s == pytest.approx(b.launch_s + b.body_s + b.sync_s + b.extra_s)
            assert b.compute_s == max(b.arith_s, b.tensor_s, b.special_s)

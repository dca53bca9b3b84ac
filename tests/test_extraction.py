"""Extraction by the kernel cost: boundaries and fold forms chosen by price, at the scale of whole
models, with every choice explained."""

import json

import pytest
import torch

import emmy
from emmy.capture.cache import CachedCapture
from emmy.decompose.from_aten import TensorProgram
from emmy.dtypes import DType
from emmy.egraph import optimize_loops
from emmy.egraph.driver import Budget
from emmy.extract.targets import get_target
from emmy.loop_ir.nodes import Assign, Load, Loop
from emmy.program import Program, pricer_for
from emmy.rules import builtin_groups
from emmy.tensor_ir.builder import GraphBuilder
from emmy.tensor_ir.nodes import TensorType
from emmy.tile_ir.build import build_tile_program
from emmy.schedule.shape import kernel_shape
from emmy.workloads import block_stack, decoder_stack
from tests.conftest import run_emmy


def _stack(blocks: int, dim: int = 64, tokens: int = 16, target: str = "sm_90"):
    model, x = block_stack(blocks, dim, tokens)
    return emmy.optimize(model, x, target=target, stop_after="tensor")


def _chain(ops: int, shape=(64, 64)) -> Program:
    """x * 1.0001 + 0.001, `ops` operations deep, built as Tensor IR (no capture)."""
    b = GraphBuilder()
    x = b.input("x", TensorType(shape, DType.F32))
    for i in range(ops // 2):
        x = b.elementwise("add", b.elementwise("multiply", x, 1.0001), 0.001)
    graph = b.finish([x])
    capture = CachedCapture("", TensorProgram(graph, {}), (), "")
    return Program(capture, get_target("sm_90"), tuple(builtin_groups()), Budget())


def _walk(body):
    stack = list(body)
    while stack:
        stmt = stack.pop()
        yield stmt
        if isinstance(stmt, Loop):
            stack.extend(stmt.body)


def test_search_work_grows_linearly_with_depth_and_repeated_layers_share_prices():
    work = {}
    for blocks in (2, 4, 8):
        program = _stack(blocks)
        pricer = pricer_for(program.target)
        result = optimize_loops(program.tensor_ir, list(program.rule_groups), program.budget, pricer)
        work[blocks] = (result.search.kernels_lowered, result.search.moves_priced, pricer.priced,
                        len(result.program.kernels))
    (low2, moves2, priced2, kernels2), (low4, moves4, priced4, _), (low8, moves8, priced8, kernels8) = \
        work[2], work[4], work[8]
    assert kernels8 >= 3 * kernels2  # a few kernels a block, not one fused monolith
    # doubling the depth about doubles the work (not four times it)
    assert low8 <= 2.8 * low4 and low4 <= 2.8 * low2, work
    assert moves8 <= 2.8 * moves4 and moves4 <= 2.8 * moves2, work
    assert priced8 <= 2.8 * priced4, work
    # the kernels of the middle blocks are the same kernels: one signature for each of them
    tiles = build_tile_program(optimize_loops(_stack(8).tensor_ir, builtin_groups(), Budget(),
                                              pricer_for(get_target("sm_90"))).program, pricer_for(get_target("sm_90")))
    signatures = [k.signature for k in tiles.kernels]
    assert len(set(signatures)) <= len(signatures) // 2


def test_a_softmax_and_a_layernorm_of_the_same_extents_have_different_signatures():
    softmax = emmy.optimize("x=torch.randn(32,256); torch.softmax(x, -1)", target="sm_90")
    layernorm = emmy.optimize("x=torch.randn(32,256); F.layer_norm(x, (256,))", target="sm_90")
    (a,), (b,) = softmax.tile_ir.kernels, layernorm.tile_ir.kernels
    assert a.shape.describe() == b.shape.describe() == "row reduction 32 x 256 with sweep"
    assert a.signature != b.signature
    # the signature is what the search priced: the same as the chosen kernel's
    assert softmax.loop_result.kernel_prices[0].signature == a.signature


def test_relu_before_a_matmul_keeps_tensor_cores_and_costs_no_more_than_unfused():
    code = ("x=torch.randn(512,512,dtype=torch.float16); w=torch.randn(512,512,dtype=torch.float16); "
            "torch.relu(x) @ w")
    program = emmy.optimize(code, target="sm_90")
    (kernel,) = program.tile_ir.kernels  # relu is the contraction's prologue, applied on its fragments
    assert kernel.shape.kind == "contraction" and kernel.shape.prologue and kernel.shape.mma == "f16"
    assert kernel.row.TILE.startswith("mma_")
    relu = next(d for d in program.loop_result.decisions if d.subject == "relu")
    assert (relu.chosen, relu.alternative) == ("fused", "materialized") and relu.delta_seconds > 0
    unfused = build_tile_program(program.loop_result.alternative(relu), program.pricer).kernels
    assert len(unfused) == 2 and any(k.row.TILE.startswith("mma_") for k in unfused)
    assert kernel.seconds <= sum(k.seconds for k in unfused)


MMA_ROW = "WORK=w1x2,TILE=mma_m16n8k16_{dtype}_f32/f1x1/k1,REDUCE=,STAGE={stage},RASTER="


@pytest.mark.parametrize("dtype, prologue, stage", [
    ("f16", "torch.relu(x)", "d2/smem-async"),
    ("bf16", "F.gelu(x)", "d2/smem"),
    ("f16", "x * 0.5 - 1.0", ""),
], ids=["relu-f16-async", "gelu-bf16-staged", "affine-f16-unstaged"])
def test_an_elementwise_prologue_runs_on_tensor_core_fragments(dtype, prologue, stage):
    """The prologue is applied by each warp to its fragments in registers: the program is one mma
    kernel, right in the simulator (ragged M and N), and its SASS has HMMA."""
    from emmy.nvcc import build_cubin, sass_mix
    from emmy.runtime import check_program

    torch_dtype = {"f16": "torch.float16", "bf16": "torch.bfloat16"}[dtype]
    code = (f"x=torch.randn(40,64,dtype={torch_dtype}); w=torch.randn(64,36,dtype={torch_dtype}); "
            f"({prologue}) @ w")
    program = emmy.optimize(code, target="sm_90", knobs=MMA_ROW.format(dtype=dtype, stage=stage))
    (kernel,) = program.tile_ir.kernels
    assert kernel.shape.prologue and kernel.row.TILE.startswith("mma_")
    assert "_prologue = [&](float" in program.cuda_source and "emmy::map_pair<" in program.cuda_source
    assert all(c.ok for c in check_program(program))
    mix = sass_mix(build_cubin(program.cuda_source, "sm_90").path)[kernel.kernel.name]
    assert any(op.startswith("HMMA.16816") for op in mix), mix


def test_a_prologue_reading_two_tensors_is_not_put_on_tensor_cores():
    code = ("x=torch.randn(64,64,dtype=torch.float16); y=torch.randn(64,64,dtype=torch.float16); "
            "w=torch.randn(64,64,dtype=torch.float16); (x * y) @ w")
    program = emmy.optimize(code, target="sm_90")
    fused = [k for k in program.tile_ir.kernels if k.shape.prologue]
    assert all(k.shape.mma == "" and not k.row.TILE.startswith("mma_") for k in fused)
    # extraction weighs materializing the product, which lets the matmul take tensor cores
    assert any(d.subject == "mul" for d in program.loop_result.decisions)


def test_a_bias_and_gelu_epilogue_after_a_matmul_stays_in_its_tensor_core_kernel():
    code = ("x=torch.randn(256,256,dtype=torch.float16); w=torch.randn(256,512,dtype=torch.float16); "
            "b=torch.randn(512,dtype=torch.float16); F.gelu(x @ w + b)")
    program = emmy.optimize(code, target="sm_90")
    (kernel,) = program.tile_ir.kernels
    assert kernel.shape.kind == "contraction" and kernel.shape.epilogue
    assert kernel.row.TILE.startswith("mma_")


def test_the_four_block_stack_recomputes_no_contraction_inside_another_kernel():
    """With re-reads counted, recomputing a matmul inside a norm's row kernel (its weight re-read per
    row) costs more than materializing it: every kernel that reads a Linear's weight is a contraction."""
    program = _stack(4, dim=256, tokens=64)
    result = program.loop_result
    weights = {name for name, t in result.program.weights if name.endswith("_weight") and len(t.shape) == 2}
    assert weights
    for kernel in result.program.kernels:
        read = {s.expr.buffer for s in _walk(kernel.body) if isinstance(s, Assign) and isinstance(s.expr, Load)}
        if read & weights:
            assert kernel_shape(kernel).kind == "contraction", kernel.name
            assert len(read & weights) == 1, kernel.name  # one matmul per kernel
    # fusing a matmul's result into its readers was priced, and dearer
    assert any(d.kind == "boundary" and d.chosen == "materialized" and d.delta_seconds > 0
               for d in result.decisions)


def test_a_5000_op_chain_is_one_kernel_and_a_20000_op_chain_lowers():
    five = _chain(5000)
    assert len(five.loop_ir.kernels) == 1
    assert "k_" in five.cuda_source
    assert not five.warnings, five.warnings
    twenty = _chain(20000)
    (kernel,) = twenty.loop_ir.kernels
    assert sum(1 for _ in _walk(kernel.body)) > 20000
    # Known open: in about one full-suite run in four (never alone), a round-3 phase of the 20000-op
    # chain keeps changing the e-graph for all 30 iterations at 80006 e-nodes; the program is still
    # one correct kernel. The e-node and time budgets must never run out.
    assert all("iterations budget" in w for w in twenty.warnings), twenty.warnings


def test_a_rule_with_more_matches_than_its_limit_still_fires_after_its_bans():
    program = _chain(90)
    result = optimize_loops(program.tensor_ir, builtin_groups(), Budget(match_limit=40))
    assert len(result.program.kernels) == 1
    fusion = next(r for r in result.reports if r.phase == "fusion")
    assert fusion.saturated and fusion.bans.get("fusion.inline_elementwise", 0) >= 1
    assert fusion.matches["fusion.inline_elementwise"] >= 88


def test_a_budget_that_runs_out_is_reported_in_the_program_and_by_explain():
    code = "x=torch.randn(1,32,2048); w=torch.randn(2048); F.rms_norm(x,(2048,),w,eps=1e-6)"
    program = emmy.optimize(code, target="sm_90", budget=Budget(iterations=1))
    assert program.warnings and all("stopped by its iterations budget" in w for w in program.warnings)
    assert program.explain().warnings == tuple(program.warnings)
    result = run_emmy("explain", "-c", code, "--max-iterations", "1")
    assert result.returncode == 0, result.stderr
    assert "warning: saturation phase algebra stopped by its iterations budget" in result.stdout
    verbose = run_emmy("compile", "-c", code, "--ir", "loop", "--max-iterations", "1", "-v")
    assert "stopped by its iterations budget" in verbose.stderr and "boundary search:" in verbose.stderr


def test_a_tie_in_time_goes_to_the_program_that_moves_fewer_bytes(tmp_path, monkeypatch):
    """Measured times make RMSNorm's one-kernel and two-kernel forms cost the same: the one-kernel
    form moves fewer bytes and is kept, and the explanation says it was a tie."""
    code = "x=torch.randn(1,32,2048); w=torch.randn(2048); F.rms_norm(x,(2048,),w,eps=1e-6)"
    program = emmy.optimize(code, target="sm_90")
    decision = next(d for d in program.loop_result.decisions if d.subject == "rms_norm_sum")
    split = build_tile_program(program.loop_result.alternative(decision), program.pricer).kernels
    (fused,) = program.tile_ir.kernels
    # measured below any prediction (each includes a launch), so these rows are the kernels' best
    rows = [{"target": "sm_90", "kernel": fused.signature, "knobs": str(fused.row), "seconds": 2e-6}]
    rows += [{"target": "sm_90", "kernel": k.signature, "knobs": str(k.row), "seconds": 1e-6} for k in split]
    measured = tmp_path / "measured.json"
    measured.write_text(json.dumps(rows))
    monkeypatch.setenv("EMMY_MEASUREMENTS", str(measured))
    again = emmy.optimize(code, target="sm_90")
    assert again.loop_ir == program.loop_ir
    tie = next(d for d in again.loop_result.decisions if d.subject == "rms_norm_sum")
    assert tie.delta_seconds == pytest.approx(0.0, abs=1e-12) and tie.delta_bytes > 0
    assert "a tie" in tie.render()


def test_a_twelve_layer_decoder_compiles_to_cuda(monkeypatch):
    """GPT-2-like blocks (LayerNorm, causal attention over 12 heads, GELU MLP, residuals), deep enough
    that any walk recursing per op would overflow. The iteration and e-node budgets must suffice;
    the wall-clock one is widened, as two test workers on two cores can slow a phase past 0.5 s."""
    monkeypatch.setenv("EMMY_EGRAPH_SECONDS", "10")
    model, x = decoder_stack(12, dim=96, heads=12, tokens=16)
    program = emmy.optimize(model, x, target="sm_90", stop_after="tensor")
    assert len(program.tensor_ir.nodes) > 1500
    assert program.cuda_source.count("__global__") >= 12 * 4
    assert not program.warnings
    ours, = program.interpret(stage="loop")
    torch.testing.assert_close(ours, model(x), rtol=1e-3, atol=1e-3)


def test_an_unrolled_lstm_refuses_moves_that_recompute_a_step_per_slice_and_runs_right():
    """nn.LSTM unrolls into one gate matmul per step, read by the next at four slices: a move fusing
    steps into one kernel recomputes each earlier step fourfold, so kernels grow exponentially with
    the steps fused (six steps took over a minute, eight past five). Such kernels stop at the
    statement budget and are priced as unpriceable; the program is the same and runs right."""
    from emmy.egraph.kernels import STATEMENTS_BASE, STATEMENTS_PER_CLASS
    from emmy.runtime import check_program

    torch.manual_seed(0)
    model = torch.nn.LSTM(6, 8, batch_first=True).eval()
    x = torch.randn(2, 6, 6)
    program = emmy.optimize(model, x)
    report = program.loop_result.search
    assert report.kernels_refused > 0, report.render()
    assert "refused as too large" in report.render()
    for kernel in program.loop_ir.kernels:  # the chosen kernels are far inside the budget
        assert sum(1 for _ in _walk(kernel.body)) < STATEMENTS_BASE + STATEMENTS_PER_CLASS * 8
    assert all(c.ok for c in check_program(program, (x,)))
    out, (h, c) = program(x)
    want, (h_want, c_want) = model(x)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(c, c_want, rtol=1e-4, atol=1e-5)

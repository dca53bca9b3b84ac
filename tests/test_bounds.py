"""Kernels never touch memory outside their buffers: guarded loads, and an interval proof over
every access of every kernel that is lowered."""

import pytest
import torch
import torch.nn as nn

import emmy
from emmy.affine import Affine, Gathered, Guard
from emmy.dtypes import DType
from emmy.loop_ir.bounds import out_of_bounds
from emmy.loop_ir.nodes import Assign, Kernel, Load, Loop, Store
from emmy.runtime import check_program
from emmy.tensor_ir.nodes import TensorType

from tests.conftest import compiled

ROTATE = "x=torch.randn(2,8,32); c=torch.randn(8,32); s=torch.randn(8,32); " \
         "x*c + torch.cat((-x[..., 16:], x[..., :16]), -1)*s"


def _kernel(index, guards=()):
    """for a0 in 0..32: out[a0] = x[index] (guarded by `guards`)."""
    load = Assign("in0", DType.F32, Load("x", (index,), tuple(guards)))
    body = (Loop(0, 32, (load, Store("out", (Affine.dim(0),), "in0"))),)
    return Kernel("k", "out", TensorType((32,), DType.F32), body)


def test_the_proof_finds_a_load_that_leaves_its_buffer_and_accepts_it_under_its_guard():
    shapes = {"x": (16,), "out": (32,)}
    shifted = Affine.dim(0) - 16
    (problem,) = out_of_bounds(_kernel(shifted), shapes)
    assert "load in0 = x" in problem and "reaches -16..15, outside 0..15" in problem
    assert out_of_bounds(_kernel(shifted, [Guard(Affine.dim(0), 16, None)]), shapes) == []
    assert out_of_bounds(_kernel(shifted, [Guard(Affine.dim(0) * 2, 32, None)]), shapes) == []  # a0 >= 16
    # a guard the proof cannot narrow a variable by (a floor division) proves nothing
    assert out_of_bounds(_kernel(shifted, [Guard(Affine.dim(0).floordiv(2, [32]), 8, None)]), shapes)
    assert out_of_bounds(_kernel(Affine.dim(0)), {"x": (16,), "out": (32,)})  # 0..31 in 16


def test_a_long_index_is_shortened_in_the_report():
    long = sum(((Affine.dim(0) + i).mod(7 + i, (32,)) for i in range(40)), Affine.constant(-1000))
    (problem,) = out_of_bounds(_kernel(long), {"x": (16,), "out": (32,)})
    assert len(str(long)) > 600 and len(problem) < 300 and " ... " in problem, problem


def test_a_flipped_read_is_bounded_by_its_guard_from_below():
    # A blocked scan of a flipped row reads x[n - 1 - position] under the guard position < n. The proof took only index = guard + rest, refused the kernel (a
    # NotLoweredError for x.flip(-1).cumsum(-1).flip(-1)) and would refuse every row of it.
    shapes = {"x": (16,), "out": (32,)}
    flipped = Affine.constant(15) - Affine.dim(0)
    (problem,) = out_of_bounds(_kernel(flipped), shapes)
    assert "reaches -16..15" in problem
    assert out_of_bounds(_kernel(flipped, [Guard(Affine.dim(0), None, 16)]), shapes) == []
    assert out_of_bounds(_kernel(Affine.constant(40) - Affine.dim(0), [Guard(Affine.dim(0), 25, None)]), shapes) == []
    assert out_of_bounds(_kernel(flipped, [Guard(Affine.dim(0), None, 17)]), shapes)  # one too many


def test_an_index_made_of_guarded_parts_is_bounded_by_their_guards():
    """F.fold reads column block (row * 6 + column), each part guarded inside [0, 6) while the
    variables alone range wider: the index is bounded through a multiple of one guard plus the
    other, and a guard one too wide (or a part left unguarded) is still caught."""
    d = Affine.dim
    body_vars = {0: 8, 1: 8, 2: 9}
    row = d(0) + 1 - d(2).floordiv(3, [8, 8, 9])
    column = d(1) + 1 - d(2).mod(3, [8, 8, 9])
    index = row * 6 + column

    def kernel(guards):
        load = Assign("in0", DType.F32, Load("c", (index,), tuple(guards)))
        inner = Loop(2, body_vars[2], (load, Store("out", (d(0), d(1), d(2)), "in0")))
        body = (Loop(0, 8, (Loop(1, 8, (inner,)),)),)
        return Kernel("k", "out", TensorType((8, 8, 9), DType.F32), body)

    shapes = {"c": (36,), "out": (8, 8, 9)}
    inside = [Guard(row, 0, 6), Guard(column, 0, 6)]
    assert out_of_bounds(kernel(inside), shapes) == []
    (problem,) = out_of_bounds(kernel([]), shapes)
    assert "outside 0..35" in problem
    assert out_of_bounds(kernel([Guard(row, 0, 6), Guard(column, 0, 7)]), shapes)
    assert out_of_bounds(kernel([Guard(row, 0, 6)]), shapes)


def test_the_proof_checks_where_an_index_tensor_is_read():
    """x[ids[a0 - 16]]: whatever ids holds, compiled code clamps it into x; its own position
    a0 - 16 must stay inside ids (0..15), which only a guard a0 >= 16 proves."""
    shapes = {"x": (16,), "out": (32,), "ids": (16,)}
    gathered = Affine(((Gathered("ids", (Affine.dim(0) - 16,), (16,), 16), 1),), 0)
    (problem,) = out_of_bounds(_kernel(gathered), shapes)
    assert "its index tensor ids" in problem and "reaches -16..15, outside 0..15" in problem
    assert out_of_bounds(_kernel(gathered, [Guard(Affine.dim(0), 16, None)]), shapes) == []


@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_an_upsampling_read_by_a_padded_convolution_reads_its_tables_only_inside(mode):
    """An FPN's `conv(c1 + interpolate(p2))`: the upsampling's position tables were read at the
    padded convolution's coordinates -1 and n, outside the tables (ASan: heap-buffer-overflow)."""
    import torch.nn.functional as F

    conv = torch.nn.Conv2d(8, 4, 3, padding=1).eval()
    options = {} if mode == "nearest" else {"align_corners": False}

    def fpn_level(p2, c1):
        return conv(c1 + F.interpolate(p2, size=c1.shape[-2:], mode=mode, **options))

    program = emmy.optimize(fpn_level, torch.randn(1, 8, 4, 4), torch.randn(1, 8, 8, 8), target="sm_90")
    assert all(c.ok for c in check_program(program, mode="asan"))


def test_f_fold_sums_its_windows_in_bounds():
    import torch.nn.functional as F

    for size, kernel_size, dilation, padding, stride in [((6, 6), 3, 1, 1, 1), ((7, 9), (2, 3), (1, 2), (0, 1), (2, 1))]:
        torch.manual_seed(0)
        cols = F.unfold(torch.randn(2, 3, *size), kernel_size, dilation=dilation, padding=padding, stride=stride)

        def fold(c):
            return F.fold(c, size, kernel_size, dilation=dilation, padding=padding, stride=stride)

        program = emmy.optimize(fold, cols, target="sm_90")
        assert "aten.col2im.default" in program.ir("torch")
        assert all(c.ok for c in check_program(program, [cols], mode="asan"))


def test_a_reversed_scan_compiles_and_runs_in_bounds():
    program = emmy.optimize("x=torch.randn(5,300); x.flip(-1).cumsum(-1).flip(-1) + x.cumsum(0)", target="sm_90")
    assert all(c.ok for c in check_program(program, mode="asan"))


def test_a_concatenation_loads_each_half_only_where_it_is_read():
    program = emmy.optimize(ROTATE, target="sm_90")
    text = program.ir("loop")
    assert "load x[a0, a1, a2 - 16] where 16 <= a2 < 32" in text
    assert "load x[a0, a1, a2 + 16] where 0 <= a2 < 16" in text
    assert "? emmy::to_reg(g_x[" in program.cuda_source  # a conditional load, not a load then a select
    assert all(c.ok for c in check_program(program, mode="asan"))


CLASS_TOKEN = "t=torch.randn(2,16,8); c=torch.randn(1,1,8); x=torch.cat([c.expand(2,-1,-1), t], 1); "


@pytest.mark.parametrize("tail", ["x[:, 0] * 2", "F.layer_norm(x, (8,))[:, 0]",
                                  "w=torch.randn(8,8); (x @ w)[:, 0].softmax(-1)"])
def test_a_concatenation_part_read_nowhere_is_not_loaded(tail):
    # The class token's row of [cls, patches]: its patches part sits under a guard `1 <= 0` that
    # holds nowhere. The cost model met a guard naming no loop (ValueError: max() of an empty
    # sequence, a crash in every such program); now the element is the fill, and t is not read.
    program = emmy.optimize(CLASS_TOKEN + tail, target="sm_90")
    assert "load t[" not in program.ir("loop")
    assert all(c.ok for c in check_program(program, mode="asan"))


def test_a_guard_holds_never_only_where_its_bounds_exclude_it():
    extents = [4, 8]
    assert Guard(Affine.constant(0), lo=1).never(extents)
    assert Guard(Affine.dim(0) + 4, hi=4).never(extents)
    assert not Guard(Affine.dim(0) + 3, hi=4).never(extents)  # holds at a0 = 0
    assert not Guard(Affine.dim(1), lo=1, hi=2).never(extents)


@pytest.mark.parametrize("heads, kv_heads, tokens", [(2, 2, 24), (7, 1, 23)], ids=["mha", "gqa7-odd"])
def test_rotary_attention_runs_clean_under_address_sanitizer(heads, kv_heads, tokens):
    """Rotary embeddings (rotate_half = cat(-x2, x1)) on q and k, fused into causal attention."""
    code = (f"q=torch.randn(1,{heads},{tokens},16); k=torch.randn(1,{kv_heads},{tokens},16); "
            f"v=torch.randn(1,{kv_heads},{tokens},16); cos=torch.randn({tokens},16); sin=torch.randn({tokens},16); "
            "rot=lambda t: torch.cat((-t[..., 8:], t[..., :8]), -1); "
            "F.scaled_dot_product_attention(q*cos + rot(q)*sin, k*cos + rot(k)*sin, v, is_causal=True, "
            f"enable_gqa={heads != kv_heads})")
    program = emmy.optimize(code, target="sm_90")
    assert any(k.shape.kind == "attention" for k in program.tile_ir.kernels)
    assert all(c.ok for c in check_program(program, mode="asan"))


def test_every_reference_workload_s_kernels_are_proven_in_bounds():
    from emmy.workloads import WORKLOADS

    for workload in WORKLOADS:
        program = compiled(workload.code, "sm_90")
        shapes = {name: t.shape for name, t in program.buffer_types.items()}
        for kernel in program.loop_ir.kernels:
            assert out_of_bounds(kernel, shapes) == [], (workload.name, kernel.name)


RMS = "x=torch.randn(1,16,128); w=torch.randn(128); F.rms_norm(x,(128,),w,eps=1e-6)"


@pytest.mark.parametrize("given, message", [
    (lambda: torch.randn(1, 32, 128), "input 0 (x): expected shape [1, 16, 128], got [1, 32, 128]"),
    (lambda: torch.randn(1, 8, 128), "input 0 (x): expected shape [1, 16, 128], got [1, 8, 128]"),
    (lambda: torch.randn(1, 16, 128, dtype=torch.float16), "input 0 (x): expected dtype f32"),
    (lambda: torch.randn(1, 16, 128).numpy(), "input 0 (x): expected a torch tensor f32[1, 16, 128], got ndarray"),
], ids=["larger", "smaller", "f16", "numpy"])
def test_a_compiled_program_refuses_inputs_it_was_not_compiled_for(given, message):
    from emmy.errors import EmmyError
    from emmy.runtime import run_program

    program = emmy.optimize(RMS, target="sm_90")
    w = program.example_inputs[1]
    for run in (lambda: run_program(program, [given(), w]), lambda: program.interpret(given(), w)):
        with pytest.raises(EmmyError) as err:
            run()
        assert message in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(EmmyError, match="the program takes 2 inputs \\(x, w\\), got 1"):
        run_program(program, [w])


def test_a_strided_view_is_read_as_the_values_it_shows():
    from emmy.runtime import run_program

    program = emmy.optimize(RMS, target="sm_90")
    w = program.example_inputs[1]
    view = torch.randn(1, 128, 16).transpose(1, 2)  # f32[1, 16, 128], not contiguous
    assert not view.is_contiguous()
    (out,) = run_program(program, [view, w]).values()
    expected = torch.nn.functional.rms_norm(view, (128,), w, eps=1e-6)
    torch.testing.assert_close(torch.from_numpy(out), expected, rtol=1e-5, atol=1e-5)


def test_programs_run_in_the_simulator_build_emmy_sim_mode_names(tmp_path, monkeypatch):
    """EMMY_SIM_MODE picks the build every simulated program runs in (asan: every program the tests
    simulate is checked for out-of-bounds accesses); a bad value is one clear error."""
    from emmy.config import settings
    from emmy.errors import EmmyError
    from emmy.runtime import run_program

    program = emmy.optimize(RMS, target="sm_90")
    monkeypatch.setenv("EMMY_CACHE_DIR", str(tmp_path))
    for mode in ("plain", "asan"):
        monkeypatch.setenv("EMMY_SIM_MODE", mode)
        run_program(program)
        assert [p.name.split("-")[-1] for p in (tmp_path / "sim").glob(f"*-{mode}.so")] == [f"{mode}.so"]
    monkeypatch.setenv("EMMY_SIM_MODE", "fast")
    with pytest.raises(EmmyError, match="EMMY_SIM_MODE='fast' is not one of plain, asan, racecheck"):
        settings()


def _relative_shifts(levels: int, padded: bool) -> str:
    """Transformer-XL's relative shift (reshape to (k, q), drop a row, reshape to (q, k - 1)), applied
    to its own output `levels` times; `padded`: a key column concatenated back each time."""
    code = "x=torch.randn(2,2,5,7 if %s else 12)\n" % padded
    for _ in range(levels):
        code += ("b, h, q, k = x.shape\n"
                 "x = x.reshape(b, h, k, q)[:, :, 1:, :].reshape(b, h, q, k - 1)\n")
        code += "x = torch.cat([x, x[..., :1]], -1) * 1.5\n" if padded else "x = x * 1.5\n"
    return code + "x.softmax(-1)"


def _deepest_load(program) -> int:
    from emmy.loop_ir.nodes import statements

    return max(e.division_depth() for k in program.loop_ir.kernels for s in statements(k.body)
               if isinstance(s, Assign) and isinstance(s.expr, Load) for e in s.expr.index)


def test_a_chain_of_relative_shifts_reads_its_input_one_division_deep():
    """Each level's merge undoes the split below it (emmy.affine: c*(e % q) + c*q*(e // q) == c*e),
    so five levels fuse into one kernel reading x by a shallow index (it nested nine deep, and
    Funnel Transformer's attention took longer than fifteen minutes to compile)."""
    program = emmy.optimize(_relative_shifts(5, padded=False))
    assert _deepest_load(program) <= 2
    assert all(c.ok for c in check_program(program, mode="asan"))


def test_an_access_the_proof_cannot_bound_is_guarded_at_run_time():
    """After a concatenation the guards of the pieces carry what keeps a relative shift's row inside;
    intervals do not see it, so the load gets a run-time guard on that axis (never failing) instead
    of the kernel being refused, which failed the whole program."""
    program = emmy.optimize(_relative_shifts(3, padded=True))
    assert all(not out_of_bounds(k, {n: t.shape for n, t in _types(program).items()})
               for k in program.loop_ir.kernels)
    assert all(c.ok for c in check_program(program, mode="asan"))


def _types(program) -> dict:
    from emmy.loop_ir.nodes import buffer_types

    return buffer_types(program.loop_ir)


class PairwiseInteractions(nn.Module):
    """DLRM's feature interaction: the dense features beside the lower triangle of every pair's dot
    product, read through torch.tril_indices, then the top layer (bf16, as the model is served)."""

    def __init__(self):
        super().__init__()
        self.bottom = nn.Linear(5, 8)
        self.top = nn.Linear(8 + 6, 1)

    def forward(self, dense, a, b, c):
        features = torch.stack([self.bottom(dense), a, b, c], 1)
        products = torch.bmm(features, features.transpose(1, 2))
        rows, cols = torch.tril_indices(4, 4, -1)
        return torch.sigmoid(self.top(torch.cat([self.bottom(dense), products[:, rows, cols]], 1)))


def test_an_index_tensor_read_under_a_guard_that_fails_stays_inside_it():
    """The concatenation's second piece selects among the stacked features by the value of
    tril_indices at column - 8; that selector was evaluated for the first piece's columns too, reading
    the index tensor at -8..-1 (ASan: heap-buffer-overflow). Compiled code now reads an index tensor
    only inside it (emmy_rt.cuh's gather_index), the lanes outside being ones whose value is dropped."""
    torch.manual_seed(0)
    model = PairwiseInteractions().to(torch.bfloat16)
    inputs = [torch.randn(3, n, dtype=torch.bfloat16) for n in (5, 8, 8, 8)]
    program = emmy.optimize(model, *inputs)
    assert "tril_indices" in program.ir("tensor")
    torch.testing.assert_close(program(*inputs, sim_mode="asan"), model(*inputs))

"""Kernels never touch memory outside their buffers: guarded loads, and an interval proof over
every access of every kernel that is lowered."""

import pytest

import emmy
from emmy.affine import Affine, Guard
from emmy.dtypes import DType
from emmy.loop_ir.bounds import out_of_bounds
from emmy.loop_ir.nodes import Assign, Kernel, Load, Loop, Store
from emmy.runtime import check_program
from emmy.tensor_ir.nodes import TensorType

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


def test_a_concatenation_loads_each_half_only_where_it_is_read():
    program = emmy.optimize(ROTATE, target="sm_90")
    text = program.ir("loop")
    assert "load x[a0, a1, a2 - 16] where 16 <= a2 < 32" in text
    assert "load x[a0, a1, a2 + 16] where 0 <= a2 < 16" in text
    assert "? emmy::to_reg(g_x[" in program.cuda_source  # a conditional load, not a load then a select
    assert all(c.ok for c in check_program(program, mode="asan"))


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
        program = emmy.optimize(workload.code, target="sm_90")
        shapes = {name: t.shape for name, t in program.buffer_types.items()}
        for kernel in program.loop_ir.kernels:
            assert out_of_bounds(kernel, shapes) == [], (workload.name, kernel.name)

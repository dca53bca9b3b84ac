"""float64 programs: double registers and buffers, double math functions and literals, f64 partial
results, arg-reductions that tell apart values one f32 cannot, and a tolerance of f64's own size."""

import numpy as np
import pytest
import torch

import emmy
from emmy.checking import compare
from emmy.dtypes import DType
from emmy.kernel_ir.scalar_c import literal, statement
from emmy.loop_ir import nodes as L
from emmy.nvcc import build_cubin
from emmy.runtime import check_program
from tests.sampled_rows import check_sampled_rows

D = "dtype=torch.float64"
PROGRAMS = {
    "softmax_long_rows": f"x=torch.randn(8,3000,{D}); torch.softmax(x,-1)",
    "layernorm": f"x=torch.randn(16,96,{D}); w=torch.randn(96,{D}); b=torch.randn(96,{D}); F.layer_norm(x,(96,),w,b)",
    "matmul_bias_gelu": f"a=torch.randn(64,96,{D}); w=torch.randn(96,80,{D}); b=torch.randn(80,{D}); F.gelu(a @ w + b)",
    "attention_causal": f"q=torch.randn(1,2,40,16,{D}); k=torch.randn(1,2,40,16,{D}); v=torch.randn(1,2,40,16,{D}); "
                        "F.scaled_dot_product_attention(q,k,v,is_causal=True)",
    "conv_pool": f"x=torch.randn(2,3,12,12,{D}); w=torch.randn(8,3,3,3,{D}); F.max_pool2d(F.conv2d(x,w,padding=1),2)",
    "promoted": f"x=torch.randn(8,64,{D}); y=torch.randn(8,64); (x * y + 0.1).sum(-1)",
    "widened_inside": "x=torch.randn(8,64); x.double().exp().sum(-1).float()",
    "special_functions": f"x=torch.randn(256,{D}); torch.digamma(x.abs()+0.1) + torch.erfinv(x.tanh()*0.99) + "
                         "torch.special.i0(x) + torch.lgamma(x.abs()+0.5) + torch.rsqrt(x.abs()+0.1) + x.exp2() + torch.angle(x)",
    "floor_division": f"a=torch.randn(256,{D})*10; b=torch.randn(256,{D}); (a // b) + (a % b) + torch.fmod(a, b)",
    "long_cumsum": f"x=torch.randn(4,3000,{D}); x.cumsum(-1)",
    "variance": f"x=torch.randn(8,4000,{D}); torch.var_mean(x,-1)",
}


@pytest.mark.parametrize("name", PROGRAMS)
def test_f64_programs_run_right_in_the_simulator(name):
    """Each runs in the simulator (ASan) and meets the f64 tolerance (about 1e-12 of each value's
    scale): one step computed in float anywhere would miss it by five orders of magnitude."""
    program = emmy.optimize(PROGRAMS[name])
    checks = check_program(program, mode="asan")
    assert checks and all(c.ok for c in checks), checks
    assert "double" in program.cuda_source


def test_a_sample_of_f64_rows_runs_right_and_split_partial_results_stay_f64():
    """Coop and chunked rows, micro-tiles (their shared-memory reads move f64 in pairs) and split-K
    rows, whose partial results pass through a workspace of the accumulators' type: an f32
    workspace would round every partial sum to 1e-7."""
    program = emmy.optimize(f"a=torch.randn(24,2048,{D}); b=torch.randn(2048,16,{D}); c=torch.randn(64,96,{D}); "
                            f"d=torch.randn(96,80,{D}); x=torch.randn(8,5000,{D}); (a @ b, c @ d, torch.softmax(x, -1))")
    check_sampled_rows(program)
    chosen = {}
    for kernel in program.loop_ir.kernels:
        ranked = [b.row for b in program.ranked_rows(kernel)]
        chosen[kernel.name] = ([r for r in ranked if r.reduce.split > 1 and not r.reduce.atomic][:2]
                               + [r for r in ranked if r.tile.is_micro][:2])
    assert sum(r.tile.is_micro for rows in chosen.values() for r in rows) >= 2
    split_k = [(k, r) for k, rows in chosen.items() for r in rows if r.reduce.split > 1 and "mm" in k]
    assert split_k
    check_sampled_rows(program, {k: rows for k, rows in chosen.items() if rows})
    kernel, row = split_k[0]
    workspace = [p for k in program.with_rows({kernel: row}).kernel_ir for p in k.params if p.scratch]
    assert workspace and all(p.dtype is DType.F64 for p in workspace)


def test_f64_arg_reductions_tell_apart_values_one_f32_holds_as_equal():
    """argmax, max with indices, topk, argmin and max pooling of values that differ only past f32's
    precision: a (value, position) key of f32 bits would call them ties and take the first."""
    x = torch.zeros(3, 70, dtype=torch.float64)
    x[:, 10], x[:, 50] = 1.0, 1.0 + 1e-12
    x[1, 60] = 1.0 + 2e-12
    x[2] = -x[2]

    class Args(torch.nn.Module):
        def forward(self, x):
            return x.argmax(-1), x.max(-1).indices, torch.topk(x, 1, -1).indices, x.argmin(-1)

    got, want = emmy.optimize(Args(), x)(x, sim_mode="asan"), Args()(x)
    for g, w in zip(got, want):
        assert torch.equal(g, w), (g, w)
    assert want[0].tolist() == [50, 60, 0] and want[3].tolist() == [0, 0, 50]

    y = torch.zeros(1, 1, 4, 4, dtype=torch.float64)
    y[0, 0, 0, 0], y[0, 0, 1, 1] = 1.0, 1.0 + 1e-12
    y[0, 0, 2, 3] = float("nan")

    class Pool(torch.nn.Module):
        def forward(self, y):
            return torch.nn.functional.max_pool2d(y, 2, return_indices=True)

    values, indices = emmy.optimize(Pool(), y)(y, sim_mode="asan")
    want_values, want_indices = Pool()(y)
    assert torch.equal(indices, want_indices) and indices[0, 0, 0, 0] == 5 and indices[0, 0, 1, 1] == 11
    assert torch.equal(values.nan_to_num(), want_values.nan_to_num())


def test_f64_literals_and_casts_keep_double_precision():
    assert literal(0.1, DType.F64) == "0.1" and literal(2.0, DType.F64) == "2.0" and literal(0.1, DType.F32) == "0.1f"
    text = statement(L.Assign("v", DType.F64, L.Op("exp", ("x",))), None, {})
    assert text == "const double v = exp(x);"
    assert "expf" in statement(L.Assign("v", DType.F32, L.Op("exp", ("x",))), None, {})

    class Scale(torch.nn.Module):
        def forward(self, x, i):
            return x * 0.1 + 1e-300, i.double()

    x = torch.randn(1000, dtype=torch.float64)
    i = torch.arange(8) + 2 ** 40 + 1  # past f32's 24 bits: an int64 -> f64 cast through f32 loses the 1
    program = emmy.optimize(Scale(), x, i)
    for device in ("sim", "interpret"):
        scaled, widened = program(x, i, sim_mode="asan") if device == "sim" else program(x, i, device="interpret")
        assert torch.allclose(scaled, x * 0.1 + 1e-300, rtol=1e-15, atol=0)  # 0.1f would be 1.5e-9 off
        assert torch.equal(widened, i.double())


def test_the_f64_tolerance_passes_f64_rounding_and_fails_an_f32_step():
    rng = np.random.default_rng(0)
    expected = rng.standard_normal(4096)
    nudged = expected * (1 + rng.choice([-1, 0, 1], expected.shape) * 2.0 ** -52)
    assert compare(nudged, expected, DType.F64).ok
    assert not compare(expected.astype(np.float32).astype(np.float64), expected, DType.F64).ok


def test_f64_kernels_compile_with_nvcc_without_spills(tmp_path):
    """Real nvcc for sm_80 and sm_90: double registers, the double forms of the math functions, the
    runtime header's double overloads (merges of twisted states, floor division, digamma)."""
    program = emmy.optimize(f"x=torch.randn(16,300,{D}); a=torch.randn(64,96,{D}); b=torch.randn(96,80,{D}); "
                            f"y=torch.randn(256,{D}); (F.layer_norm(x,(300,)), torch.softmax(x,-1), a @ b, "
                            "torch.digamma(y.abs()+0.1) + (y // 0.3))")
    for target in ("sm_80", "sm_90"):
        cubin = build_cubin(program.cuda_source, target, cache_dir=tmp_path)
        assert cubin.resources and not any(r.spills for r in cubin.resources.values()), cubin.resources

"""A causal attention's blocks stop at their last unmasked key, and a sliding window's start at
their first (emmy.schedule.key_bounds): the bounds are sound over every box of rows, the emitted
kernels give the same results as walking every key (ASan-clean, SIMT and tensor-core rows, staged
or not), a row that saw no unmasked key still walks them all, and the cost model prices the keys
a block walks."""

import dataclasses
import math
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import emmy
from emmy.affine import Affine, Guard
from emmy.extract.targets import get_target
from emmy.loop_ir import nodes as L
from emmy.schedule.choose import loop_cost
from emmy.schedule.cost_model import predict
from emmy.schedule.key_bounds import block_ranges, live_fraction, live_key_end, live_key_start
from emmy.schedule.knobs import parse_pins
from emmy.schedule.shape import kernel_shape

KEY = 3


def _guard(coefficients: dict, const: int, lo=None, hi=None) -> Guard:
    expr = Affine.constant(const)
    for var, c in coefficients.items():
        expr = expr + Affine.dim(var) * c
    return Guard(expr, lo, hi)


def _random_cases(seed: int, upper: bool):
    """300 (guard, box, holds) cases: a random linear guard bounding the key from above (`upper`)
    or below, a box of rows and a batch index, and whether the guard holds at (key, row)."""
    rng = random.Random(seed)
    for _ in range(300):
        ck = rng.choice([-3, -2, -1, 1, 2, 3])
        cr, cb, const = rng.randint(-3, 3), rng.randint(-2, 2), rng.randint(-20, 20)
        side = "hi" if (ck > 0) == upper else "lo"
        guard = _guard({KEY: ck, 1: cr, 0: cb}, const, **{side: rng.randint(-5, 5)})
        box = {1: tuple(sorted((rng.randint(0, 40), rng.randint(0, 40)))), 0: (b := rng.randint(0, 3), b)}
        rows = [{1: r, 0: box[0][0]} for r in range(box[1][0], box[1][1] + 1)]

        def holds(key, row, guard=guard):
            return bool(guard.holds([np.int64(row[0]), np.int64(row[1]), 0, np.int64(key)]))

        yield guard, box, rows, holds


def test_the_live_key_end_is_sound_for_every_box_of_rows():
    """Every key at or past the end fails a guard in every row of the box (checked by enumeration
    over random linear guards and boxes), and for one guard the key before it holds in some row."""
    keys = 48
    for guard, box, rows, holds in _random_cases(7, upper=True):
        end = live_key_end((guard,), KEY, box, keys)
        assert all(not holds(key, row) for key in range(end, keys) for row in rows), (guard, box, end)
        if 0 < end < keys:
            assert any(holds(end - 1, row) for row in rows), (guard, box, end)


def test_the_live_key_start_is_sound_for_every_box_of_rows():
    """Every key before the start fails a guard in every row of the box, and for one guard the
    start key holds in some row."""
    for guard, box, rows, holds in _random_cases(8, upper=False):
        start = live_key_start((guard,), KEY, box)
        assert all(not holds(key, row) for key in range(0, start) for row in rows), (guard, box, start)
        if start > 0:
            assert any(holds(start, row) for row in rows), (guard, box, start)


def test_block_ranges_follow_the_rows_digits():
    # rows over (a0: 3, a1: 10): flat rows 8..12 wrap a1, so a1 takes its whole range, a0 0..1
    assert block_ranges(((0, 3), (1, 10)), 8, 12) == {1: (0, 9), 0: (0, 1)}
    assert block_ranges(((0, 3), (1, 10)), 10, 14) == {1: (0, 4), 0: (1, 1)}


def test_a_causal_block_walks_about_half_the_keys():
    causal = _guard({KEY: 1, 1: -1}, 0, hi=1)  # key - row < 1
    # 512 rows in blocks of 64, keys in steps of 64: block b walks b + 1 of 8 steps
    assert live_fraction((causal,), KEY, 512, ((1, 512),), (), 64, 64) == pytest.approx(36 / 64)
    assert live_fraction((), KEY, 512, ((1, 512),), (), 64, 64) == 1.0


def _attention(queries: int, keys: int, seed: int = 0):
    torch.manual_seed(seed)
    q = torch.randn(1, 2, queries, 16, dtype=torch.float16)
    k, v = (torch.randn(1, 2, keys, 16, dtype=torch.float16) for _ in range(2))
    return q, k, v


def _causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


ROWS = {  # SIMT unstaged and cp.async-staged, tensor cores unstaged, plain- and cp.async-staged
    "simt": "WORK=t64,TILE=f2,REDUCE=,STAGE=,RASTER=",
    "simt_async": "WORK=t64,TILE=f2,REDUCE=,STAGE=d2/smem-async,RASTER=",
    "mma": "WORK=w1x1,TILE=mma_m16n8k16_f16_f32/f1x2/k1,REDUCE=,STAGE=,RASTER=",
    "mma_smem": "WORK=w1x1,TILE=mma_m16n8k16_f16_f32/f2x4/k1,REDUCE=,STAGE=d1/smem,RASTER=",
    "mma_async": "WORK=w2x1,TILE=mma_m16n8k16_f16_f32/f1x2/k1,REDUCE=,STAGE=d2/smem-async,RASTER=",
}


@pytest.fixture(scope="module", params=[(70, 70), (40, 70)], ids=["square", "fewer_queries"])
def causal_program(request):
    inputs = _attention(*request.param)
    return emmy.optimize(_causal, *inputs), inputs


def _attention_kernel(program):
    (kernel,) = [k for k in program.loop_ir.kernels if kernel_shape(k).kind == "attention"]
    return kernel


@pytest.mark.parametrize("row", ROWS, ids=list(ROWS))
def test_causal_attention_kernels_walk_the_live_keys_and_match_torch(causal_program, row):
    program, inputs = causal_program
    _bounded_row_matches(program, inputs, row, "live_chunks", _causal)


def _bounded_row_matches(program, inputs, row: str, marker: str, reference):
    """The attention kernel has key bounds; on `row` its CUDA walks them (`marker`) and, under
    ASan, matches `reference` in f32."""
    kernel = _attention_kernel(program)
    assert kernel_shape(kernel).key_bound is not None
    variant = program.with_rows({kernel.name: parse_pins(ROWS[row])})
    assert marker in variant.cuda_source
    out = variant(*inputs, sim_mode="asan")
    expected = reference(*(t.float() for t in inputs))
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)


def _blind_program(program):
    """The program with the attention epilogue's NaN term for a row without an unmasked key,
    m - m, made d - d (0): such a row's output is then z / d over every key, so walking fewer
    keys for it would show."""
    kernel = _attention_kernel(program)
    state = [s.acc for s in L.statements(kernel.body) if isinstance(s, L.Init)]
    m, d = state[0], state[1]

    def mend(stmts):
        out = []
        for s in stmts:
            if isinstance(s, L.Loop):
                s = dataclasses.replace(s, body=tuple(mend(s.body)))
            elif isinstance(s, L.Assign) and isinstance(s.expr, L.Op) and s.expr.op == "subtract" \
                    and s.expr.args == (m, m):
                s = dataclasses.replace(s, expr=L.Op("subtract", (d, d)))
            out.append(s)
        return out

    mended = dataclasses.replace(kernel, body=tuple(mend(kernel.body)))
    assert mended != kernel, "the epilogue has no m - m term"
    loops = program.loop_ir
    loops = dataclasses.replace(loops, kernels=tuple(mended if k is kernel else k for k in loops.kernels))
    blind = dataclasses.replace(program)
    blind.__dict__["loop_result"] = dataclasses.replace(program.loop_result, program=loops)
    return blind


@pytest.mark.parametrize("row", ["simt_async", "mma_async"])
def test_a_row_without_an_unmasked_key_still_walks_every_key(row):
    q, k, v = _attention(70, 70, seed=1)
    q[0, 0, 5] = float("-inf")  # every score of query 5 is -inf: its keys all count (weight 1)
    k = k.abs()
    program = _blind_program(emmy.optimize(_causal, q, k, v))
    variant = program.with_rows({_attention_kernel(program).name: parse_pins(ROWS[row])})
    (expected,) = variant.interpret(q, k, v, stage="loop")
    out = variant(q, k, v, sim_mode="asan")
    torch.testing.assert_close(out[0, 0, 5].float(), v[0, 0].float().mean(0), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(out.float(), expected.float(), rtol=2e-2, atol=2e-2, equal_nan=True)


def test_the_cost_model_prices_the_keys_a_causal_block_walks():
    inputs = [torch.randn(1, 8, 512, 64, dtype=torch.float16) for _ in range(3)]
    target = get_target("sm_90")
    priced = {}
    for causal in (False, True):
        program = emmy.optimize(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                                *inputs, stop_after="loop")
        kernel = _attention_kernel(program)
        shape = kernel_shape(kernel)
        assert (shape.key_bound is not None) == causal
        row = parse_pins("WORK=w2x1,TILE=mma_m16n8k16_f16_f32/f2x4/k4,REDUCE=,STAGE=d2/smem-async,RASTER=")
        priced[causal] = predict(shape, row, target, loop_cost(kernel, program.buffer_types))
    # blocks of 64 rows, steps of 32 keys: block b walks 2b + 2 of 16 steps, 17/32 of the work
    ratio = priced[True].tensor_s / priced[False].tensor_s
    assert ratio == pytest.approx(sum(2 * b + 2 for b in range(8)) / (8 * 16))
    assert priced[True].bytes < priced[False].bytes and priced[True].total_s < priced[False].total_s


@pytest.mark.parametrize("queries, keys", [(33, 33), (17, 50)])
def test_the_chosen_row_of_an_odd_causal_shape_is_asan_clean(queries, keys):
    """Blocks that straddle the diagonal at odd places (rows and keys not multiples of a block),
    on the row the model picks."""
    inputs = _attention(queries, keys, seed=queries)
    program = emmy.optimize(_causal, *inputs)
    assert "live_chunks" in program.cuda_source
    out = program(*inputs, sim_mode="asan")
    torch.testing.assert_close(out.float(), _causal(*(t.float() for t in inputs)), rtol=2e-2, atol=2e-2)


WINDOW = 16


def _window(q, k, v):
    """Mistral's sliding window, written out: a query sees itself and the 15 keys before it."""
    rows, keys = torch.arange(q.size(-2), device=q.device), torch.arange(k.size(-2), device=q.device)
    hidden = (keys[None, :] > rows[:, None]) | (rows[:, None] - keys[None, :] >= WINDOW)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    return F.softmax(att.masked_fill(hidden, float("-inf")), dim=-1) @ v


@pytest.fixture(scope="module")
def window_program():
    inputs = _attention(150, 150, seed=2)
    return emmy.optimize(_window, *inputs), inputs


@pytest.mark.parametrize("row", ROWS, ids=list(ROWS))
def test_a_sliding_window_s_blocks_walk_only_the_window_and_match_torch(window_program, row):
    program, inputs = window_program
    _bounded_row_matches(program, inputs, row, "first_live", _window)


@pytest.mark.parametrize("row", ["simt", "mma_smem"])
def test_a_window_row_without_an_unmasked_key_still_walks_every_key(row):
    q, k, v = _attention(150, 150, seed=3)
    q[0, 0, 100] = float("-inf")  # every score of query 100 is -inf: keys before and past its window count
    k = k.abs()
    program = _blind_program(emmy.optimize(_window, q, k, v))
    variant = program.with_rows({_attention_kernel(program).name: parse_pins(ROWS[row])})
    out = variant(q, k, v, sim_mode="asan")
    torch.testing.assert_close(out[0, 0, 100].float(), v[0, 0].float().mean(0), rtol=2e-2, atol=2e-2)


def test_the_cost_model_prices_the_steps_of_a_window():
    """512 rows in blocks of 64, steps of 32 keys, a window of 64 keys: block b > 0 walks steps
    2b - 2 .. 2b + 1, block 0 its first two: 30 of 128 (block, step) pairs."""
    window = (_guard({KEY: 1, 1: -1}, 0, hi=1), _guard({KEY: 1, 1: -1}, 0, lo=-63))  # row - 63 <= key <= row
    assert live_fraction(window, KEY, 512, ((1, 512),), (), 64, 32) == pytest.approx(30 / 128)


@pytest.mark.parametrize("row", ["simt_async", "mma_async"])
def test_window_kernels_compile_with_nvcc_without_spills(window_program, row, tmp_path):
    from emmy.nvcc import build_cubin

    program, _ = window_program
    variant = program.with_rows({_attention_kernel(program).name: parse_pins(ROWS[row])})
    cubin = build_cubin(variant.cuda_source, "sm_90", tmp_path)
    assert cubin.resources and not any(r.spills for r in cubin.resources.values())

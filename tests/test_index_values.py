"""Masks and index tensors made of aranges become index guards and affine indices
(emmy.tensor_ir.index_values): the rewrite keeps every value (random graphs, evaluated by the
Tensor IR interpreter before and after), a hand-written or buffered causal mask loads nothing and
gives the attention kernel its causal bound, and a gather by positions reads no index tensor."""

import math
import random

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import emmy
from emmy.affine import Affine, gathered_buffers
from emmy.dtypes import DType, to_storage
from emmy.schedule.shape import kernel_shape
from emmy.tensor_ir.builder import GraphBuilder
from emmy.tensor_ir.index_values import fold_index_values
from emmy.tensor_ir.interpreter import evaluate
from emmy.tensor_ir.nodes import Constant, IndexMap, TensorType, Weight

INTEGERS = (DType.I64, DType.I32, DType.F32, DType.F16)
COMPARES = ("less", "less_equal", "greater", "greater_equal", "equal", "not_equal")


def _random_program(rng: random.Random):
    """Aranges over the rows and columns of a small grid, combined by integer arithmetic, casts,
    comparisons, logical ops, selects of scalars and max/min over an axis; the outputs are masks,
    numbers and a where that reads an input through a mask."""
    b, weights = GraphBuilder(), {}
    rows, cols = rng.randint(1, 6), rng.randint(1, 6)
    shape = (rows, cols)
    numbers, masks = [], []
    for axis in (0, 1):
        n, dtype = shape[axis], rng.choice(INTEGERS)
        name = b.weight(f"arange{axis}", TensorType((n,), dtype))
        weights[name] = to_storage(np.arange(n) * rng.choice([1, 2, -1, 3]) + rng.randint(-3, 3), dtype)
        numbers.append(b.index_map(name, shape, [Affine.dim(axis)]))
    tri = b.weight("tri", TensorType(shape, DType.F32))  # a lower triangle of ones: a fitted mask
    weights[tri] = np.tril(np.ones(shape, dtype=np.float32), rng.randint(-2, 2))
    numbers.append(tri)
    x = b.input("x", TensorType(shape, DType.F32))
    for _ in range(rng.randint(2, 8)):
        kind = rng.choice(["arith", "compare", "compare", "logic", "select", "cast", "reduce"])
        if kind == "arith" and len(numbers) >= 2:
            a, c = rng.sample(numbers, 2)
            dtype = b.dtype(a)
            op = rng.choice(["add", "subtract", "multiply", "negative", "floor_divide", "remainder"])
            if op in ("floor_divide", "remainder"):
                numbers.append(b.elementwise(op, b.cast(a, DType.I64), rng.randint(1, 4)))
            elif op == "negative":
                numbers.append(b.elementwise(op, a))
            elif op == "multiply":
                numbers.append(b.elementwise(op, a, rng.randint(-3, 3)))
            else:
                numbers.append(b.elementwise(op, a, b.cast(c, dtype)))
        elif kind == "compare" and numbers:
            a = rng.choice(numbers)
            other = b.cast(rng.choice(numbers), b.dtype(a)) if rng.random() < 0.7 else rng.randint(-3, 3)
            masks.append(b.elementwise(rng.choice(COMPARES), a, other, dtype=DType.BOOL))
        elif kind == "logic" and masks:
            if rng.random() < 0.3:
                masks.append(b.elementwise("logical_not", rng.choice(masks)))
            else:
                masks.append(b.elementwise(rng.choice(["logical_and", "logical_or"]), rng.choice(masks),
                                           rng.choice(masks)))
        elif kind == "select" and masks:
            numbers.append(b.elementwise("where", rng.choice(masks), float(rng.randint(-2, 2)),
                                         rng.choice([0.0, 1.0, float("-inf")]), dtype=DType.F32))
        elif kind == "cast" and masks:
            numbers.append(b.cast(rng.choice(masks), rng.choice(INTEGERS)))
        elif kind == "reduce" and (masks or numbers):
            axis = rng.randint(0, 1)
            value = b.cast(rng.choice(masks), DType.I32) if masks and rng.random() < 0.6 else rng.choice(numbers)
            folded = b.reduce(rng.choice(["max", "min"]), value, axis)
            index = [Affine.dim(0), Affine.constant(0)] if axis == 1 else [Affine.constant(0), Affine.dim(1)]
            numbers.append(b.index_map(folded, shape, index))
    outputs = [*masks[-2:], *numbers[-2:]]
    if masks:
        outputs.append(b.elementwise("where", masks[-1], x, float("-inf")))
    return b.finish(outputs), weights


def test_the_rewrite_keeps_every_value_of_random_index_programs():
    rng = random.Random(11)
    rewritten = 0
    for case in range(300):
        graph, weights = _random_program(rng)
        folded, kept = fold_index_values(graph, weights, set(weights))
        inputs = {"x": np.random.default_rng(case).standard_normal(graph["x"].type.shape).astype(np.float32)}
        before = evaluate(graph, inputs, weights)
        after = evaluate(folded, inputs, kept)
        for name, a, b in zip(graph.outputs, before, after):
            assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True), (case, name, folded)
        rewritten += folded is not graph
    assert rewritten > 150  # most programs had a mask to rewrite (184 of 300 when written)


def test_a_changed_weight_is_not_taken_for_a_constant():
    b = GraphBuilder()
    ar = b.weight("positions", TensorType((5,), DType.I64))
    rows = b.index_map(ar, (5, 5), [Affine.dim(0)])
    cols = b.index_map(ar, (5, 5), [Affine.dim(1)])
    graph = b.finish([b.elementwise("less_equal", cols, rows, dtype=DType.BOOL)])
    weights = {ar: np.arange(5)}
    assert fold_index_values(graph, weights, set())[0] is graph  # changed in place by the program
    folded, kept = fold_index_values(graph, weights, {ar})
    assert "positions" not in kept and not folded.weights
    (mask,) = [n for n in folded.nodes if isinstance(n, IndexMap)]
    assert [str(g) for g in mask.guards] == ["d1 - d0 < 1"] and mask.fill is False


class HandWrittenCausal(nn.Module):
    """The mask built in forward from a triangle of ones, masked where it is 0."""

    def forward(self, q, k, v):
        tokens = q.size(-2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        mask = torch.tril(torch.ones(tokens, tokens, device=q.device))
        att = att.masked_fill(mask == 0, float("-inf"))
        return F.softmax(att, dim=-1) @ v


class BufferedCausal(nn.Module):
    """minGPT's: a lower-triangular buffer of ones, sliced to the tokens."""

    def __init__(self, tokens: int):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(tokens, tokens)).view(1, 1, tokens, tokens))

    def forward(self, q, k, v):
        tokens = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :tokens, :tokens] == 0, float("-inf"))
        return F.softmax(att, dim=-1) @ v


def _arange_mask_sdpa(q, k, v):
    positions = torch.arange(q.size(-2), device=q.device)
    allowed = positions[:, None] >= positions[None, :]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)


def _upper_triangle_filled(q, k, v):
    """The mask says where to hide: masked_fill(triu(ones, 1).bool(), -inf)."""
    tokens = q.size(-2)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
    hidden = torch.triu(torch.ones(tokens, tokens, device=q.device), diagonal=1).bool()
    return F.softmax(att.masked_fill(hidden, float("-inf")), dim=-1) @ v


def _sliding_window(q, k, v):
    """Mistral's: hide keys ahead of the query or more than 8 behind it (an or of two comparisons)."""
    positions = torch.arange(q.size(-2), device=q.device)
    ahead = positions[None, :] > positions[:, None]
    far = positions[:, None] - positions[None, :] >= 8
    att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
    return F.softmax(att.masked_fill(ahead | far, float("-inf")), dim=-1) @ v


CAUSAL = {"hand_written": HandWrittenCausal, "buffered": lambda: BufferedCausal(96),
          "arange_sdpa": lambda: _arange_mask_sdpa, "upper_triangle_filled": lambda: _upper_triangle_filled,
          "sliding_window": lambda: _sliding_window}


@pytest.mark.parametrize("form", list(CAUSAL))
def test_a_causal_mask_of_aranges_or_a_triangle_loads_nothing_and_bounds_the_keys(form):
    torch.manual_seed(0)
    inputs = [torch.randn(1, 2, 70, 16, dtype=torch.float16) for _ in range(3)]
    model = CAUSAL[form]()
    program = emmy.optimize(model, *inputs)
    assert not program.tensor_ir.weights  # no mask, no arange in memory
    (attention,) = [k for k in program.loop_ir.kernels if kernel_shape(k).kind == "attention"]
    shape = kernel_shape(attention)
    assert shape.key_bound is not None and shape.score_bytes == 0
    out = program(*inputs, sim_mode="asan")
    expected = model(*(t.float() for t in inputs))
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)


def test_a_gather_by_positions_reads_no_index_tensor():
    """GPT-2's position embedding: wpe(arange(T)) is rows 0..T-1 of the table."""
    wpe = nn.Embedding(32, 8)

    def embed(tokens):
        return tokens + wpe(torch.arange(tokens.size(1), device=tokens.device))

    x = torch.randn(2, 12, 8)
    program = emmy.optimize(embed, x)
    graph = program.tensor_ir
    maps = [n for n in graph.nodes if isinstance(n, IndexMap)]
    assert not any(gathered_buffers(n.index) for n in maps)
    assert [n.type.shape for n in graph.weights] == [(32, 8)]  # the table; no positions
    torch.testing.assert_close(program(x, sim_mode="asan"), embed(x))


def test_a_mask_that_is_no_triangle_stays_a_loaded_weight():
    band = torch.zeros(6, 6, dtype=torch.bool)
    for i in range(6):
        band[i, max(0, i - 1):i + 2] = True  # a band: two diagonals bound it, not one
    program = emmy.optimize(lambda x: x.masked_fill(~band, 0.0), torch.randn(6, 6), stop_after="tensor")
    assert any(isinstance(n, Weight) for n in program.tensor_ir.nodes)
    assert not any(isinstance(n, Constant) and n.name.endswith("_inside") for n in program.tensor_ir.nodes)


def test_sdpa_with_a_float_causal_mask_needs_no_row_test():
    """sdpa zeroes a query whose mask hides every key; with -inf above the diagonal every query
    sees one (the max over the keys of a mask is a guard of the rest), so no kernel tests it."""
    torch.manual_seed(0)
    inputs = [torch.randn(1, 2, 40, 16) for _ in range(3)]

    def attend(q, k, v):
        hidden = torch.full((q.size(-2), q.size(-2)), float("-inf"), device=q.device).triu(1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=hidden)

    program = emmy.optimize(attend, *inputs)
    assert [kernel_shape(k).kind for k in program.loop_ir.kernels] == ["attention"]
    torch.testing.assert_close(program(*inputs, sim_mode="asan"), attend(*inputs), rtol=1e-4, atol=1e-4)


def _diagonal_fit(mask: np.ndarray):
    """By brute force: ("hi", k + 1) where mask is column - row <= k, ("lo", k) where >= k; None
    where no diagonal splits it."""
    diagonal = np.arange(mask.shape[1])[None, :] - np.arange(mask.shape[0])[:, None]
    taken, left = diagonal[mask], diagonal[~mask]
    if not taken.size or not left.size:
        return None
    if taken.max() < left.min():
        return "hi", int(taken.max()) + 1
    if taken.min() > left.max():
        return "lo", int(taken.min())
    return None


def test_a_triangle_weight_is_found_whenever_one_diagonal_splits_it():
    """Triangles at every offset (rows and columns of 1 to 7), and random masks, against a brute
    force fit over the diagonals: each split mask is found, and what is found gives its values."""
    rng = np.random.default_rng(5)
    found = 0
    for case in range(1500):
        rows, cols = rng.integers(1, 8, size=2)
        pick = case % 3
        split = (np.tril if pick == 0 else np.triu)(np.ones((rows, cols), dtype=bool), rng.integers(-8, 8))
        mask = split if pick < 2 else rng.random((rows, cols)) < 0.5
        values = np.where(mask, 2.0, -1.0).astype(np.float32)
        b = GraphBuilder()
        weight = b.weight("mask", TensorType((int(rows), int(cols)), DType.F32))
        out = b.elementwise("equal", weight, 2.0, dtype=DType.BOOL)
        graph, kept = fold_index_values(b.finish([out]), {weight: values}, {weight})
        (after,) = evaluate(graph, {}, kept)
        assert np.array_equal(after, mask)
        if _diagonal_fit(values == values[0, 0]) is None:
            continue  # (a mask a column or row of aranges describes may still be found: then values agree)
        assert not kept, mask  # found: the weight is read no more
        found += 1
    assert found > 300  # 418 of 1500 when written (the rest: one value only, or random)

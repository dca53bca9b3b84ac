"""The reference interpreter: its shortcuts change nothing, and its rounding is torch's."""

import numpy as np
import pytest
import torch

import emmy
from emmy.dtypes import DType, round_to_bf16, to_numpy
from emmy.tensor_ir.interpreter import evaluate

PROGRAMS = [
    "a=torch.randn(3,5,7); b=torch.randn(3,7,2); torch.bmm(a, b)",
    "q=torch.randn(1,4,6,8); k=torch.randn(1,2,6,8); F.scaled_dot_product_attention(q,k,k,is_causal=True,enable_gqa=True)",
    "x=torch.randn(4,6,5); x.permute(2,0,1)[1:, ::2, -3:].reshape(2, 12) * 2",
    "x=torch.randn(4,6); torch.cat([x[:, :2], x.t()[:2].t() * 3, x], 1).sum(0)",
    # windows and guards read as strided views of the padded operand; products through a merge of
    # window axes, their half factors unwidened, summed as einsums
    "x=torch.randn(2,3,9,9); w=torch.randn(3,1,3,3); F.conv2d(x, w, padding=1, stride=2, groups=3)",
    "x=torch.randn(2,8,5,5,dtype=torch.float16); w=torch.randn(4,8,1,1,dtype=torch.float16); F.conv2d(x, w)",
    "x=torch.randn(2,4,7); F.pad(x, (2, 3), value=2.5).unfold(-1, 3, 2) * x.flip(-1)[..., :1, None]",
    "x=torch.randn(5,5); torch.diagonal(x) + x.flip(0).diagonal(1).sum() + x.triu(1).sum(0)",
]


@pytest.mark.parametrize("code", PROGRAMS)
def test_shortcuts_agree_with_plain_evaluation(code):
    program = emmy.optimize(code)
    graph = program.tensor_ir
    inputs = {n.name: to_numpy(t)[0] for n, t in zip(graph.inputs, program.example_inputs)}
    fast = evaluate(graph, inputs, program.weights)
    plain = evaluate(graph, inputs, program.weights, use_shortcuts=False)
    for a, b in zip(fast, plain):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_bf16_rounding_is_torchs():
    rng = np.random.default_rng(1)
    values = np.concatenate([
        rng.standard_normal(10000).astype(np.float32) * 100,
        np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1.00390625, 1.01171875, 3.4e38], dtype=np.float32),
    ])
    ours = round_to_bf16(values)
    theirs = torch.from_numpy(values).to(torch.bfloat16).float().numpy()
    assert np.array_equal(ours, theirs, equal_nan=True)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_elementwise_rounds_once_per_op_like_torch(dtype):
    code = f"x=torch.randn(64,dtype=torch.{dtype}); y=torch.randn(64,dtype=torch.{dtype}); (x * y + x) / (y.abs() + 1)"
    program = emmy.optimize(code)
    (ours,) = program.interpret()
    x, y = program.example_inputs
    theirs = (x * y + x) / (y.abs() + 1)
    assert ours.dtype == theirs.dtype
    assert torch.equal(ours, theirs)


def test_missing_and_misshapen_inputs_are_reported():
    program = emmy.optimize("x=torch.randn(2,3); x + 1")
    with pytest.raises(KeyError, match="input x"):
        evaluate(program.tensor_ir, {})
    with pytest.raises(ValueError, match="expected shape"):
        evaluate(program.tensor_ir, {"x": np.zeros((3, 2), np.float32)})
    with pytest.raises(emmy.EmmyError, match="takes 1 inputs"):
        program.interpret(torch.zeros(2, 3), torch.zeros(2, 3))


def test_dtype_names_round_trip():
    assert all(DType.parse(d.value) is d for d in DType)
    with pytest.raises(emmy.EmmyError, match="unknown dtype"):
        DType.parse("f8")

"""The shape of Tensor IR: what the printer shows and what validation rejects."""

import pytest
import torch

import emmy
from emmy.affine import Affine
from emmy.dtypes import DType
from emmy.tensor_ir.builder import GraphBuilder
from emmy.tensor_ir.nodes import Elementwise, IndexMap, Input, Reduce, TensorGraph, TensorIRError, TensorType


def lets(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("let ")]


def test_matmul_example_broadcasts_multiplies_and_sums():
    text = emmy.optimize("x=torch.randn(4,3); w=torch.randn(3,2); x @ w").ir("tensor")
    assert lets(text) == [
        "let mm_a: f32[4,3,2] = x[d0, d1];",
        "let mm_b: f32[4,3,2] = w[d1, d2];",
        "let mm_prod: f32[4,3,2] = multiply(mm_a, mm_b);",
        "let mm_sum: f32[4,1,2] = sum(mm_prod, axis=-2);",
        "let mm: f32[4,2] = mm_sum[d0, 0, d1];",
    ]
    assert text.startswith("input x: f32[4,3];\ninput w: f32[3,2];\n")
    assert text.rstrip().endswith("return mm;")


def test_linear_weight_is_loaded_and_transposed_by_an_index_map():
    lin = torch.nn.Linear(8, 16)
    program = emmy.optimize(lin, torch.randn(4, 8))
    graph = program.tensor_ir
    weight = graph["weight"]
    assert weight.type == TensorType((16, 8), DType.F32)
    transposes = [n for n in graph.nodes if isinstance(n, IndexMap) and n.operand == "weight"]
    assert len(transposes) == 1
    assert transposes[0].type.shape == (8, 16)
    assert [str(e) for e in transposes[0].index] == ["d1", "d0"]
    assert "weight weight: f32[16,8];" in program.ir("tensor")
    np_weight = program.weights["weight"]
    assert (np_weight == lin.weight.detach().numpy()).all()


def test_every_node_carries_its_aten_origin():
    graph = emmy.optimize("x=torch.randn(2,8); F.rms_norm(x, (8,))").tensor_ir
    computed = [n for n in graph.nodes if not isinstance(n, Input) and n.type.rank > 0]
    assert computed and all("aten.rms_norm.default" in n.origin for n in computed)


def test_half_matmul_accumulates_in_f32_and_rounds_once():
    graph = emmy.optimize(
        "a=torch.randn(8,8,dtype=torch.float16); b=torch.randn(8,8,dtype=torch.float16); a @ b"
    ).tensor_ir
    sums = [n for n in graph.nodes if isinstance(n, Reduce)]
    assert [s.type.dtype for s in sums] == [DType.F32]
    out = graph[graph.outputs[0]]
    assert isinstance(out, Elementwise) and out.op == "cast" and out.type.dtype is DType.F16


def test_causal_mask_is_a_guarded_index_map():
    graph = emmy.optimize(
        "q=torch.randn(1,2,6,8); F.scaled_dot_product_attention(q,q,q,is_causal=True)"
    ).tensor_ir
    masks = [n for n in graph.nodes if isinstance(n, IndexMap) and n.guards]
    assert len(masks) == 1
    assert str(masks[0].guards[0]) == "d3 - d2 < 1" and masks[0].fill is False


def _graph(*nodes, outputs):
    return TensorGraph(tuple(nodes), tuple(outputs))


def test_validation_rejects_malformed_graphs():
    x = Input("x", TensorType((4, 3), DType.F32))
    with pytest.raises(TensorIRError, match="not defined before use"):
        _graph(Elementwise("y", x.type, "exp", ("x",)), x, outputs=["y"]).validate()
    with pytest.raises(TensorIRError, match="shape"):
        _graph(x, Elementwise("y", TensorType((4,), DType.F32), "exp", ("x",)), outputs=["y"]).validate()
    with pytest.raises(TensorIRError, match="reduce"):
        _graph(x, Reduce("r", TensorType((4, 3), DType.F32), "sum", "x", 1), outputs=["r"]).validate()
    with pytest.raises(TensorIRError, match="outside axis"):
        bad = IndexMap("m", TensorType((4, 4), DType.F32), "x", (Affine.dim(0), Affine.dim(1)))
        _graph(x, bad, outputs=["m"]).validate()
    with pytest.raises(TensorIRError, match="defined twice"):
        _graph(x, x, outputs=["x"]).validate()


def test_builder_skips_identity_maps_and_reuses_constants():
    b = GraphBuilder()
    x = b.input("x", TensorType((2, 3), DType.F32))
    assert b.permute(x, [0, 1]) == x
    assert b.reshape(x, [2, 3]) == x
    assert b.const(1.0, DType.F32) == b.const(1, DType.F32)
    assert b.reshape(x, [3, 2]) != x


def test_reshape_indices_are_grouped_not_linearised():
    b = GraphBuilder()
    x = b.input("x", TensorType((2, 3, 4), DType.F32))
    merged = b.reshape(x, [6, 4])
    split = b.reshape(merged, [2, 3, 4])
    graph = b.finish([split])
    assert [str(e) for e in graph[merged].index] == ["d0 // 3", "d0 % 3", "d1"]
    assert [str(e) for e in graph[split].index] == ["3*d0 + d1", "d2"]

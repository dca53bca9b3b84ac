"""PyTorch's fused inference fast paths (emmy.capture.fast_paths): an encoder layer in eval mode
under no_grad is one op, `_transformer_encoder_layer_fwd`, which emmy decomposes and compiles
instead of leaving the whole layer to eager."""

import itertools
import logging

import pytest
import torch
import torch.nn as nn

import emmy
import emmy.dynamo
from emmy.capture.fast_paths import native_multi_head_attention, transformer_encoder_layer

B, L, E, H = 2, 5, 8, 2


def _masks():
    causal = nn.Transformer.generate_square_subsequent_mask(L)
    padding = torch.tensor([[False] * L, [False, False, False, True, True]])
    return {"none": {}, "causal": {"src_mask": causal}, "padding": {"src_key_padding_mask": padding},
            "both": {"src_mask": causal, "src_key_padding_mask": torch.zeros(B, L).masked_fill(padding, float("-inf"))},
            "both_bool": {"src_mask": causal.isinf(), "src_key_padding_mask": padding},
            "bool_attention_mask": {"src_mask": torch.ones(L, L, dtype=torch.bool).triu(1)},
            "masked_row": {"src_mask": torch.ones(L, L, dtype=torch.bool).triu(0)}}


def _fused_call(layer, x, masks):
    """The arguments the layer hands torch._transformer_encoder_layer_fwd, and what it returns."""
    calls, fused = [], torch._transformer_encoder_layer_fwd

    def spy(*args):
        calls.append(args)
        return fused(*args)

    torch._transformer_encoder_layer_fwd = spy
    try:
        with torch.no_grad():
            out = layer(x, **masks)
    finally:
        torch._transformer_encoder_layer_fwd = fused
    assert len(calls) == 1, "the layer did not take its fast path"
    return calls[0], out


@pytest.mark.parametrize("norm_first, activation, mask", list(itertools.product(
    [False, True], ["relu", "gelu"], list(_masks()))))
def test_the_decomposed_encoder_layer_computes_what_torch_s_fused_op_does(norm_first, activation, mask):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(E, H, 16, dropout=0.0, batch_first=True, norm_first=norm_first,
                                       activation=activation).eval()
    args, want = _fused_call(layer, torch.randn(B, L, E), _masks()[mask])
    got = transformer_encoder_layer(*args)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, equal_nan=True)  # a fully masked row: NaN


@pytest.mark.parametrize("mask_type, kind", list(itertools.product([None, 0, 1, 2], ["bool", "float"])))
@pytest.mark.parametrize("need_weights, average", [(True, True), (True, False), (False, True)])
def test_the_decomposed_native_attention_computes_what_torch_s_op_does(mask_type, kind, need_weights, average):
    torch.manual_seed(0)
    q = torch.randn(B, L, E)
    weights = (torch.randn(3 * E, E) * 0.3, torch.randn(3 * E), torch.randn(E, E), torch.randn(E))
    shape = {None: None, 0: (L, L), 1: (B, L), 2: (B, H, L, L)}[mask_type]
    mask = None
    if shape:  # a float mask masks where nonzero, whatever the value: torch reads it as bool
        hit = torch.rand(shape) > 0.7
        mask = hit if kind == "bool" else torch.randn(shape) * hit
    want = torch.ops.aten._native_multi_head_attention(q, q, q, E, H, *weights, mask, need_weights, average, mask_type)
    got = native_multi_head_attention(q, q, q, E, H, *weights, mask, need_weights, average, mask_type)
    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5, equal_nan=True)
    if need_weights:
        torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=1e-5, equal_nan=True)


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("model, masks", [
    ("post_norm_relu", "padding"), ("pre_norm_gelu_stack", "both_bool")])
def test_torch_compile_of_an_encoder_in_eval_compiles_the_fused_layers_with_emmy(model, masks, caplog, monkeypatch):
    # Before, the layer reached the backend as one unsupported op and ran eagerly whole.
    monkeypatch.setattr(emmy.dynamo, "_REPORTED", set())
    torch.manual_seed(0)
    if model == "post_norm_relu":
        net = nn.TransformerEncoderLayer(E, H, 16, dropout=0.0, batch_first=True)
    else:
        net = nn.TransformerEncoder(nn.TransformerEncoderLayer(E, H, 16, dropout=0.0, batch_first=True, norm_first=True,
                                                               activation="gelu"), 2, enable_nested_tensor=False)
    net.eval()
    x, keywords = torch.randn(B, L, E), _masks()[masks]
    if model != "post_norm_relu":  # is_causal given: else the encoder tests the mask by value (a graph break)
        keywords = {"mask": keywords["src_mask"], "src_key_padding_mask": keywords["src_key_padding_mask"],
                    "is_causal": False}
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="emmy"):
        want = net(x, **keywords)
        got = torch.compile(net, backend="emmy", dynamic=False, options={"simulate": True})(x, **keywords)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "not supported" in m or "falls back" in m or "fell back" in m]
    assert any("emmy: compiled fused_" in m for m in messages)


def test_a_captured_graph_holding_the_fused_ops_compiles():
    def fused(x, qkv_w, qkv_b, proj_w, proj_b, padding):
        out, _ = torch._native_multi_head_attention(x, x, x, E, H, qkv_w, qkv_b, proj_w, proj_b, padding, False,
                                                    True, 1)
        return out

    torch.manual_seed(0)
    inputs = (torch.randn(B, L, E), torch.randn(3 * E, E), torch.randn(3 * E), torch.randn(E, E), torch.randn(E),
              torch.tensor([[False] * L, [False, True, False, True, False]]))
    program = emmy.optimize(fused, *inputs)
    torch.testing.assert_close(program(*inputs, sim_mode="asan"), fused(*inputs), atol=2e-5, rtol=1e-4)

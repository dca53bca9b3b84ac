"""scaled_dot_product_attention's CUDA kernels as graphs of CUDA tensors hold them
(emmy.capture.cuda_attention): each decomposition computes what the kernel returns (checked against
torch's math on the CPU, where the kernels do not run), and a model calling them compiles with emmy,
forward and backward (their fake-tensor shapes work on the CPU, so Dynamo and AOTAutograd trace
them here as they would on a GPU)."""

import logging

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from emmy.capture import cuda_attention

aten = torch.ops.aten


def _inputs(heads=4, key_heads=4, queries=10, keys=12, dtype=torch.float64):
    torch.manual_seed(0)
    return (torch.randn(2, heads, queries, 8, dtype=dtype), torch.randn(2, key_heads, keys, 8, dtype=dtype),
            torch.randn(2, key_heads, keys, 8, dtype=dtype))


def _reference(q, k, v, bias=None, is_causal=False, scale=None):
    """torch's math: output and log-sum-exp (both 0 where a query sees no key)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) * (scale or q.shape[-1] ** -0.5)
    if is_causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    if bias is not None:
        s = s.masked_fill(~bias, float("-inf")) if bias.dtype == torch.bool else s + bias
    lse = torch.logsumexp(s, -1, keepdim=True)
    blind = lse == float("-inf")  # a query that sees no key: 0, as F.scaled_dot_product_attention gives
    return torch.where(blind, 0.0, torch.softmax(s, -1) @ v), torch.where(blind, 0.0, lse).squeeze(-1)


@pytest.mark.parametrize("case", ["plain", "causal_rectangular", "grouped_heads", "scaled"])
def test_flash_attention_gives_the_output_and_log_sum_exp(case):
    q, k, v = _inputs(key_heads=2 if case == "grouped_heads" else 4)
    causal, scale = case == "causal_rectangular", 0.3 if case == "scaled" else None
    got = cuda_attention.flash_attention(q, k, v, 0.0, causal, scale=scale)
    want_out, want_lse = _reference(q, k, v, is_causal=causal, scale=scale)
    torch.testing.assert_close(got[0], want_out)
    torch.testing.assert_close(got[1], want_lse.float())
    assert got[4:6] == (10, 12)


@pytest.mark.parametrize("bias_kind", ["none", "float", "bool_with_a_blind_query"])
@pytest.mark.parametrize("op", ["efficient", "cudnn"])
def test_efficient_and_cudnn_attention_take_a_bias_and_pad_their_log_sum_exp_as_torch_does(op, bias_kind):
    q, k, v = _inputs(queries=40)
    bias = None
    if bias_kind == "float":
        bias = torch.randn(2, 1, 40, 12, dtype=torch.float64)
    elif bias_kind == "bool_with_a_blind_query":
        bias = torch.rand(40, 12) > 0.3
        bias[3] = False  # query 3 sees no key: output and log-sum-exp 0
    decomposed = cuda_attention.efficient_attention if op == "efficient" else cuda_attention.cudnn_attention
    got = decomposed(q, k, v, bias, True, 0.0, True)
    want_out, want_lse = _reference(q, k, v, bias, is_causal=True)
    torch.testing.assert_close(got[0], want_out)
    with torch._subclasses.FakeTensorMode() as mode:  # the shapes torch's kernel returns
        fake = [mode.from_tensor(t) if t is not None else None for t in (q, k, v, bias)]
        op_shapes = [tuple(t.shape) for t in getattr(aten, f"_scaled_dot_product_{op}_attention")(
            *fake, True, 0.0, True)[:2]]
    assert [tuple(t.shape) for t in got[:2]] == op_shapes
    lse = got[1][..., :40] if op == "efficient" else got[1].squeeze(-1)
    torch.testing.assert_close(lse, want_lse.float())


@pytest.mark.parametrize("op", ["flash", "efficient", "cudnn"])
def test_the_backward_ops_give_torch_s_gradients(op):
    q, k, v = (t.requires_grad_() for t in _inputs(heads=4, key_heads=2 if op == "flash" else 4))
    bias = None if op == "flash" else torch.randn(1, 4, 10, 12, dtype=torch.float64, requires_grad=True)
    out, lse = _reference(q, k, v, bias, is_causal=True)
    grad = torch.randn_like(out)
    wanted = torch.autograd.grad(out, [q, k, v] + ([bias] if bias is not None else []), grad)
    with torch.no_grad():
        if op == "flash":
            got = cuda_attention.flash_attention_backward(grad, q, k, v, out, lse, None, None, 10, 12, 0.0, True,
                                                          None, None)
        elif op == "efficient":
            padded = F.pad(lse, (0, 22))
            got = cuda_attention.efficient_attention_backward(grad, q, k, v, bias, out, padded, None, None, 0.0,
                                                              [True, True, True, True], True)
        else:
            got = cuda_attention.cudnn_attention_backward(grad, q, k, v, out, lse.unsqueeze(-1), None, None,
                                                          bias, None, None, 10, 12, 0.0, True)
    for g, w in zip(got, wanted):
        torch.testing.assert_close(g, w)


class CudaAttention(nn.Module):
    """Calls the kernel a CUDA graph holds, as torch.compile traces F.scaled_dot_product_attention
    on a GPU."""

    def __init__(self, op):
        super().__init__()
        self.op, self.qkv = op, nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.qkv(x).view(2, 6, 3, 2, 8).permute(2, 0, 3, 1, 4)
        if self.op == "flash":
            y = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)[0]
        else:
            y = getattr(aten, f"_scaled_dot_product_{self.op}_attention")(q, k, v, None, True, 0.0, True)[0]
        return y.transpose(1, 2).reshape(2, 6, 16)


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("op", ["flash", "efficient", "cudnn"])
def test_a_model_whose_graph_holds_a_cuda_attention_kernel_trains_with_emmy(op, caplog):
    torch.manual_seed(0)
    model = CudaAttention(op)
    x = torch.randn(2, 6, 16)
    with caplog.at_level(logging.INFO, logger="emmy"):
        out = torch.compile(model, backend="emmy", dynamic=False, options={"simulate": True, "sim_mode": "asan"})(x)
        out.square().sum().backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    q, k, v = model.qkv(x).view(2, 6, 3, 2, 8).permute(2, 0, 3, 1, 4)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 6, 16)
    want.square().sum().backward()
    torch.testing.assert_close(out, want, atol=2e-5, rtol=1e-4)
    for g, p in zip(got, model.parameters()):
        torch.testing.assert_close(g, p.grad, atol=2e-5, rtol=1e-4)
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "not supported" in m]
    assert sum(m.startswith("emmy: compiled fused_") for m in messages) == 2  # forward and backward


def test_a_value_head_narrower_than_the_query_s_takes_the_math_with_torch_s_blind_rows():
    # the CPU attention op needs equal head widths; the efficient kernel does not
    q, k, _ = _inputs(queries=6)
    v = torch.randn(2, 4, 12, 5, dtype=torch.float64)
    bias = torch.rand(6, 12) > 0.3
    bias[2] = False
    got = cuda_attention.efficient_attention(q, k, v, bias, True, 0.0, False)
    want_out, want_lse = _reference(q, k, v, bias)
    torch.testing.assert_close(got[0], want_out)
    torch.testing.assert_close(got[1][..., :6], want_lse.float())


def test_the_decomposed_kernel_compiles_to_one_flash_attention_kernel():
    # spelled as scores, a loaded causal triangle and a softmax, the e-graph kept three kernels
    # (the scores materialised); the CPU attention op is lowered whole, its causal mask a bound
    import emmy
    from emmy.schedule.shape import kernel_shape

    q, k, v = (torch.randn(1, 2, 64, 16, dtype=torch.float16) for _ in range(3))
    program = emmy.optimize(lambda q, k, v: cuda_attention.flash_attention(q, k, v, 0.0, True)[0], q, k, v)
    assert [kernel_shape(kernel).kind for kernel in program.loop_ir.kernels] == ["attention"]
    torch.testing.assert_close(program(q, k, v), F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                                                is_causal=True).half(),
                               atol=2e-3, rtol=2e-3)

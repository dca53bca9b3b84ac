"""scaled_dot_product_attention as a graph of CUDA tensors holds it.

`F.scaled_dot_product_attention` picks its kernel as it is traced: on CUDA tensors torch.compile's
graphs hold `_scaled_dot_product_flash_attention`, `_scaled_dot_product_efficient_attention` or
`_scaled_dot_product_cudnn_attention` (each returning the output, the log-sum-exp a backward reads,
and the random-number state of its dropout), and a training graph their backward ops. emmy has no
lowering of those kernels: each is decomposed here into the CPU attention op, which emmy lowers
whole as one flash-attention kernel (or, where the value head is narrower than the query's, which
that op does not take, into the math), with its log-sum-exp in the shape the kernel returns; their
backward ops into emmy.capture.backward_ops'. Dropout inside attention (training with
dropout_p > 0) stays torch's.

Conventions shared with the CPU attention op and scaled_dot_product_attention: causal masks are
top-left aligned (query l sees keys s <= l); a query that sees no key gives 0 and has log-sum-exp
0; query heads may share key heads in groups.
"""

from __future__ import annotations

import math

import torch

from emmy.capture import backward_ops

aten = torch.ops.aten


def _scores(query, key, bias, is_causal: bool, scale):
    """The masked, scaled scores [.., L, S] in f32 (f64 for f64 inputs), key repeated to the
    query's heads."""
    acc = torch.float64 if query.dtype == torch.float64 else torch.float32
    group = query.shape[-3] // key.shape[-3]
    if group > 1:
        key = key.repeat_interleave(group, dim=-3)
    return backward_ops.masked_scores(query.to(acc), key.to(acc), bias, is_causal, scale)


def _attention(query, key, value, bias, is_causal: bool, scale):
    """(output in the query's dtype, log-sum-exp [.., L] in f32, 0 where a query sees no key). Where
    the value head is as wide as the query's, as the CPU attention op needs, that op computes both
    (emmy lowers it whole: one flash kernel, a causal mask as a bound on the keys, not a loaded
    triangle); otherwise the math, which the e-graph fuses where it can."""
    group = query.shape[-3] // value.shape[-3]
    if group > 1:
        key, value = key.repeat_interleave(group, dim=-3), value.repeat_interleave(group, dim=-3)
    if value.shape[-1] == query.shape[-1] and query.dim() == 4:
        if bias is not None:  # the op takes an additive mask of the query's dtype
            bias = torch.zeros(bias.shape, dtype=query.dtype, device=bias.device).masked_fill(~bias, float("-inf")) \
                if bias.dtype == torch.bool else bias.to(query.dtype)
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, 0.0, is_causal,
                                                                   attn_mask=bias, scale=scale)
        return out, lse.to(torch.float32)
    scores = _scores(query, key, bias, is_causal, scale)
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    blind = lse == float("-inf")  # a query that sees no key gives 0, as scaled_dot_product_attention does
    out = torch.matmul(torch.softmax(scores, dim=-1), value.to(scores.dtype))
    out = torch.where(blind, 0.0, out).to(query.dtype)
    return out, torch.where(blind, 0.0, lse).squeeze(-1).to(torch.float32)


def _seed():
    return torch.zeros((), dtype=torch.int64)


def flash_attention(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    if dropout_p:
        return NotImplemented  # its random mask is torch's
    out, lse = _attention(query, key, value, None, is_causal, scale)
    return (out, lse, None, None, query.shape[-2], key.shape[-2], torch.zeros(2, dtype=torch.int64), _seed(),
            torch.empty(0, dtype=query.dtype))


def efficient_attention(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *,
                        scale=None):
    if dropout_p:
        return NotImplemented
    out, lse = _attention(query, key, value, attn_bias, is_causal, scale)
    # the kernel's log-sum-exp has its queries padded to a multiple of 32 (none when not asked for)
    padded = math.ceil(query.shape[-2] / 32) * 32 if compute_log_sumexp else 0
    lse = torch.nn.functional.pad(lse, (0, padded - lse.shape[-1])) if padded else lse[..., :0]
    return out, lse, _seed(), _seed()


def cudnn_attention(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False,
                    return_debug_mask=False, *, scale=None):
    if dropout_p:
        return NotImplemented
    out, lse = _attention(query, key, value, attn_bias, is_causal, scale)
    return out, lse.unsqueeze(-1), None, None, query.shape[-2], key.shape[-2], _seed(), _seed(), None


def flash_attention_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
                             dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    return backward_ops.flash_attention_backward(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal,
                                                 scale=scale)


def efficient_attention_backward(grad_out, query, key, value, attn_bias, out, logsumexp, philox_seed,
                                 philox_offset, dropout_p, grad_input_mask, is_causal=False, *, scale=None):
    if dropout_p:
        return NotImplemented
    lse = logsumexp[..., :query.shape[-2]]
    grads = backward_ops.flash_attention_backward(grad_out, query, key, value, out, lse, dropout_p, is_causal,
                                                  attn_mask=attn_bias, scale=scale)
    grad_bias = None
    if grad_input_mask[3] and attn_bias is not None:
        grad_bias = _score_gradient(grad_out, query, key, value, out, lse, attn_bias, is_causal, scale)
    return (*grads, grad_bias)


def cudnn_attention_backward(grad_out, query, key, value, out, logsumexp, philox_seed, philox_offset, attn_bias,
                             cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, *, scale=None):
    return backward_ops.flash_attention_backward(grad_out, query, key, value, out, logsumexp.squeeze(-1), dropout_p,
                                                 is_causal, attn_mask=attn_bias, scale=scale)


def _score_gradient(grad_out, query, key, value, out, lse, bias, is_causal, scale):
    """The gradient of an additive bias: that of the scores before scaling, dS = P * (dO V^T -
    rowsum(dO * O)), summed over the axes the bias was broadcast along."""
    scores = _scores(query, key, bias, is_causal, scale)
    acc = scores.dtype
    group = query.shape[-3] // value.shape[-3]
    if group > 1:
        value = value.repeat_interleave(group, dim=-3)
    g, o = grad_out.to(acc), out.to(acc)
    probs = torch.exp(scores - lse.to(acc).unsqueeze(-1))
    grad = probs * (torch.matmul(g, value.to(acc).transpose(-2, -1)) - (g * o).sum(dim=-1, keepdim=True))
    while grad.dim() > bias.dim():
        grad = grad.sum(0)
    broadcast = [a for a in range(bias.dim()) if bias.shape[a] == 1 and grad.shape[a] != 1]
    if broadcast:
        grad = grad.sum(broadcast, keepdim=True)
    return grad.to(bias.dtype)


def cuda_attention_decompositions() -> dict:
    return {aten._scaled_dot_product_flash_attention.default: flash_attention,
            aten._scaled_dot_product_efficient_attention.default: efficient_attention,
            aten._scaled_dot_product_cudnn_attention.default: cudnn_attention,
            aten._scaled_dot_product_flash_attention_backward.default: flash_attention_backward,
            aten._scaled_dot_product_efficient_attention_backward.default: efficient_attention_backward,
            aten._scaled_dot_product_cudnn_attention_backward.default: cudnn_attention_backward}

"""The ops kept whole through export: softmax, log-softmax, layer norm,
RMS norm and scaled dot-product attention, spelled out in primitives.

These are written in their textbook multi-pass forms (max, then the sum of
exponentials, then the division); turning them into one-pass folds is the
optimizer's job, not the decomposition's.
"""

from __future__ import annotations

import math

from emmy.affine import Affine, Guard
from emmy.decompose.reductions import mean_of, variance_of
from emmy.decompose.registry import Context, lowers, scalars_as_vectors
from emmy.dtypes import DType
from emmy.errors import UnsupportedOpError


def _softmax_parts(ctx: Context, xf: str, axis: int) -> tuple[str, str, str, str]:
    """(max, shifted = x - max, exp(shifted), sum of exp) over `axis`."""
    b = ctx.b
    shape = b.shape(xf)
    peak = b.reduce("max", xf, axis, suffix="max")
    shifted = b.elementwise("subtract", xf, b.broadcast_to(peak, shape), suffix="shifted")
    e = b.elementwise("exp", shifted, suffix="exp")
    total = b.reduce("sum", e, axis, suffix="sum")
    return peak, shifted, e, total


def softmax_of(ctx: Context, xf: str, axis: int, name: str | None = None) -> str:
    _, shifted, e, total = _softmax_parts(ctx, xf, axis)
    return ctx.b.elementwise("divide", e, ctx.b.broadcast_to(total, ctx.b.shape(xf)), name=name)


@lowers("aten._softmax.default", "aten._log_softmax.default")
@scalars_as_vectors
def softmax(ctx: Context, x, dim, half_to_float=False):
    out = ctx.out_type()
    acc = out.dtype.accumulator
    b = ctx.b
    xf = ctx.tensor(x, acc)
    axis = dim % len(b.shape(xf))
    final = ctx.name if acc is out.dtype else None
    if "_log_softmax" in str(ctx.node.target):
        _, shifted, _, total = _softmax_parts(ctx, xf, axis)
        log_total = b.elementwise("log", total, suffix="logsum")
        y = b.elementwise("subtract", shifted, b.broadcast_to(log_total, b.shape(xf)), name=final)
    else:
        y = softmax_of(ctx, xf, axis, name=final)
    return b.cast(y, out.dtype)


def _trailing_axes(rank: int, normalized_shape) -> list[int]:
    return list(range(rank - len(normalized_shape), rank))


@lowers("aten.native_layer_norm.default")
def layer_norm(ctx: Context, x, normalized_shape, weight, bias, eps):
    out = ctx.out_type(0)
    acc = out.dtype.accumulator
    b = ctx.b
    xf = ctx.tensor(x, acc)
    shape = b.shape(xf)
    axes = _trailing_axes(len(shape), normalized_shape)
    m = mean_of(ctx, xf, axes, keepdim=True)
    v = variance_of(ctx, xf, axes, 0.0, keepdim=True)
    rstd = b.elementwise("rsqrt", b.elementwise("add", v, float(eps), suffix="var_eps"), suffix="rstd")
    centred = b.elementwise("subtract", xf, b.broadcast_to(m, shape), suffix="xc")
    y = b.elementwise("multiply", centred, b.broadcast_to(rstd, shape), suffix="normed")
    if weight is not None:
        y = b.elementwise("multiply", y, ctx.tensor(weight, acc, shape), suffix="scaled")
    if bias is not None:
        y = b.elementwise("add", y, ctx.tensor(bias, acc, shape), suffix="shifted")
    y = b.cast(y, out.dtype)
    mean_type, rstd_type = ctx.out_type(1), ctx.out_type(2)
    return (y, b.cast(m, mean_type.dtype), b.cast(rstd, rstd_type.dtype))


@lowers("aten.rms_norm.default")
def rms_norm(ctx: Context, x, normalized_shape, weight=None, eps=None):
    out = ctx.out_type()
    b = ctx.b
    in_dtype = b.dtype(x)
    acc = in_dtype.accumulator
    if eps is None:  # ATen's default: the epsilon of the type it computes in (float32 for f16 and bf16 too)
        eps = 2.0**-23
    xf = ctx.tensor(x, acc)
    shape = b.shape(xf)
    squares = b.elementwise("multiply", xf, xf, suffix="sq")
    ms = mean_of(ctx, squares, _trailing_axes(len(shape), normalized_shape), keepdim=True)
    r = b.elementwise("rsqrt", b.elementwise("add", ms, float(eps), suffix="eps"), suffix="rsqrt")
    # PyTorch rounds the normalised value to the input's type before the weight.
    y = b.cast(b.elementwise("multiply", xf, b.broadcast_to(r, shape), suffix="normed"), in_dtype)
    if weight is not None:
        y = b.elementwise("multiply", ctx.tensor(y, out.dtype), ctx.tensor(weight, out.dtype, shape), name=ctx.name)
    return b.cast(y, out.dtype)


@lowers("aten.scaled_dot_product_attention.default")
def attention(ctx: Context, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    out = ctx.out_type()
    last = out.dtype.accumulator is out.dtype
    result, _ = _attend(ctx, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                        name=ctx.name if last else None)
    return ctx.b.cast(result, out.dtype)


@lowers("aten._scaled_dot_product_flash_attention_for_cpu.default")
def attention_with_logsumexp(ctx: Context, q, k, v, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
    """Attention as a training graph's forward holds it (torch.compile of a CPU model): the output
    and, for the backward, each query's log-sum-exp of its scaled scores [N, H, L] (0 for a query that
    sees no key, as torch's kernel gives)."""
    out, lse_type = ctx.out_type(0), ctx.out_type(1)
    b = ctx.b
    heads_differ = b.shape(q)[-3] != b.shape(k)[-3]
    result, scores = _attend(ctx, q, k, v, attn_mask, dropout_p, is_causal, scale, heads_differ, name=None)
    rows = b.shape(scores)[:-1]
    peak, _, _, total = _softmax_parts(ctx, scores, len(rows))
    lse = b.elementwise("add", peak, b.elementwise("log", total, suffix="log_sum"), suffix="lse")
    seen = b.elementwise("not_equal", peak, float("-inf"), dtype=DType.BOOL, suffix="sees_a_key")
    lse = b.reshape(b.elementwise("where", seen, lse, 0.0, dtype=b.dtype(lse), suffix="lse_safe"), rows)
    return (b.cast(result, out.dtype), b.cast(lse, lse_type.dtype))


def _attend(ctx: Context, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa,
            name: str | None) -> tuple[str, str]:
    """(softmax(q k^T * scale + masks) v in the accumulator type, the masked scores)."""
    if dropout_p:
        raise UnsupportedOpError(f"unsupported op {ctx.where}: dropout_p={dropout_p} (its random mask is "
                                 "torch's to draw; it runs eagerly under torch.compile)")
    acc = ctx.out_type(0).dtype.accumulator
    b = ctx.b
    q_shape, k_shape, v_shape = b.shape(q), b.shape(k), b.shape(v)
    if len(q_shape) < 2 or len(k_shape) != len(q_shape) or len(v_shape) != len(q_shape):
        raise UnsupportedOpError(f"unsupported op {ctx.where}: q, k and v must have the same rank (at least 2)")
    *batch, L, E = q_shape
    S, Ev = k_shape[-2], v_shape[-1]
    nb = len(batch)
    # Grouped heads: query head h reads key/value head h // group (axis -3).
    group = 1
    if nb >= 1 and k_shape[-3] != q_shape[-3]:
        if not enable_gqa or q_shape[-3] % k_shape[-3]:
            raise UnsupportedOpError(f"unsupported op {ctx.where}: {q_shape[-3]} query heads for {k_shape[-3]} key heads")
        group = q_shape[-3] // k_shape[-3]
    head_axis = nb - 1
    scale = 1.0 / math.sqrt(E) if scale is None else float(scale)

    def batch_index() -> list[Affine]:
        idx = [Affine.dim(i) for i in range(nb)]
        if group > 1:
            idx[head_axis] = Affine.dim(head_axis).floordiv(group, [*batch, L, S, max(E, Ev)])
        return idx

    # scores[.., l, s] = sum_e q[.., l, e] * k[.., s, e]
    score_space = (*batch, L, S, E)
    q_b = b.index_map(ctx.tensor(q, acc), score_space, [Affine.dim(i) for i in range(nb)] +
                      [Affine.dim(nb), Affine.dim(nb + 2)], suffix="q")
    k_b = b.index_map(ctx.tensor(k, acc), score_space, batch_index() + [Affine.dim(nb + 1), Affine.dim(nb + 2)],
                      suffix="k")
    qk = b.elementwise("multiply", q_b, k_b, suffix="qk")
    dots = b.keep_axes(b.reduce("sum", qk, nb + 2, suffix="dots"), list(range(nb + 2)), suffix="scores_raw")
    scores = b.elementwise("multiply", dots, scale, suffix="scores")
    score_shape = (*batch, L, S)
    neg_inf = float("-inf")
    if is_causal:
        # Query l sees keys s <= l (top-left aligned, as torch's is_causal).
        visible = b.index_map(b.const(True, DType.BOOL), score_shape, (),
                              guards=(Guard(Affine.dim(nb + 1) - Affine.dim(nb), hi=1),), fill=False, suffix="causal")
        scores = b.elementwise("where", visible, scores, neg_inf, dtype=acc, suffix="masked")
    allowed = visible if is_causal else None  # where a key may be attended to, when a mask says
    if attn_mask is not None:
        if b.dtype(attn_mask) is DType.BOOL:
            kept = b.broadcast_to(attn_mask, score_shape)
            scores = b.elementwise("where", kept, scores, neg_inf, dtype=acc, suffix="masked")
        else:
            bias = ctx.tensor(attn_mask, acc, score_shape)
            kept = b.elementwise("not_equal", bias, neg_inf, dtype=DType.BOOL, suffix="finite_bias")
            scores = b.elementwise("add", scores, bias, suffix="biased")
        allowed = kept if allowed is None else b.elementwise("logical_and", allowed, kept, dtype=DType.BOOL,
                                                             suffix="allowed")
    probs = softmax_of(ctx, scores, nb + 1)
    # out[.., l, e] = sum_s p[.., l, s] * v[.., s, e]
    pv_space = (*batch, L, S, Ev)
    p_b = b.index_map(probs, pv_space, [Affine.dim(i) for i in range(nb)] + [Affine.dim(nb), Affine.dim(nb + 1)],
                      suffix="p")
    v_b = b.index_map(ctx.tensor(v, acc), pv_space, batch_index() + [Affine.dim(nb + 1), Affine.dim(nb + 2)],
                      suffix="v")
    pv = b.elementwise("multiply", p_b, v_b, suffix="pv")
    total = b.reduce("sum", pv, nb + 1, suffix="pv_sum")
    result = b.keep_axes(total, [i for i in range(nb + 3) if i != nb + 1], name=name if attn_mask is None else None)
    if attn_mask is not None:
        result = _zero_where_all_masked(ctx, result, allowed, nb, name=name)
    return result, scores


def _zero_where_all_masked(ctx: Context, result: str, allowed: str, nb: int, name: str | None) -> str:
    """torch's attention gives 0 for a query its mask lets see no key (a padded position of a
    left-padded batch), where a softmax over nothing but -inf gives NaN: its rows are zeroed after
    the sum over the keys, so the softmax and the sum keep the form the one-pass rewrite matches
    (the row test is a reduction of its own: extraction fuses the scores into one flash kernel,
    the test into a kernel before it, and the where into the flash kernel's epilogue; see
    docs/ARCHITECTURE.md)."""
    b = ctx.b
    seen = b.reduce("max", b.cast(allowed, DType.I32), nb + 1, suffix="sees_a_key")  # (.., L, 1)
    shape = b.shape(result)
    any_key = b.index_map(seen, shape, [Affine.dim(i) for i in range(nb + 1)] + [Affine.constant(0)],
                          suffix="sees_a_key_bcast")
    visible_row = b.elementwise("not_equal", any_key, 0, dtype=DType.BOOL, suffix="sees_any")
    return b.elementwise("where", visible_row, result, 0.0, dtype=b.dtype(result), name=name, suffix="safe")


def _per_channel(ctx: Context, value: str, shape: tuple[int, ...], dtype) -> str:
    """A per-channel vector [C] broadcast over an NC... tensor (channels on axis 1)."""
    from emmy.affine import Affine

    return ctx.b.index_map(ctx.tensor(value, dtype), shape, [Affine.dim(1)], suffix="channel")


def _normalize(ctx: Context, xf: str, mean: str, rstd: str, weight, bias, acc) -> str:
    """(x - mean) * rstd, then the per-channel weight and bias (mean, rstd already broadcast)."""
    b = ctx.b
    shape = b.shape(xf)
    y = b.elementwise("multiply", b.elementwise("subtract", xf, mean, suffix="xc"), rstd, suffix="normed")
    if weight is not None:
        y = b.elementwise("multiply", y, _per_channel(ctx, weight, shape, acc), suffix="scaled")
    if bias is not None:
        y = b.elementwise("add", y, _per_channel(ctx, bias, shape, acc), suffix="shifted")
    return y


@lowers("aten._native_batch_norm_legit_no_training.default")
def batch_norm_inference(ctx: Context, x, weight, bias, running_mean, running_var, momentum, eps):
    """Batch norm with its running statistics (inference): a per-channel affine map."""
    out = ctx.out_type(0)
    acc = out.dtype.accumulator
    b = ctx.b
    xf = ctx.tensor(x, acc)
    shape = b.shape(xf)
    rstd = b.elementwise("rsqrt", b.elementwise("add", ctx.tensor(running_var, acc), float(eps), suffix="var_eps"),
                         suffix="rstd")
    y = _normalize(ctx, xf, _per_channel(ctx, running_mean, shape, acc), _per_channel(ctx, rstd, shape, acc),
                   weight, bias, acc)
    empty = ctx.out_type(1)
    return (b.cast(y, out.dtype), b.fill(0, empty.shape, empty.dtype), b.fill(0, empty.shape, empty.dtype))


@lowers("aten._native_batch_norm_legit.no_stats")
def batch_norm_statistics(ctx: Context, x, weight, bias, training, momentum, eps):
    """Batch (and instance) norm from the batch's own statistics: per channel, over every other axis
    (biased variance)."""
    out = ctx.out_type(0)
    acc = out.dtype.accumulator
    b = ctx.b
    xf = ctx.tensor(x, acc)
    shape = b.shape(xf)
    axes = [a for a in range(len(shape)) if a != 1]
    m = mean_of(ctx, xf, axes, keepdim=True)
    v = variance_of(ctx, xf, axes, 0.0, keepdim=True)
    rstd = b.elementwise("rsqrt", b.elementwise("add", v, float(eps), suffix="var_eps"), suffix="rstd")
    y = _normalize(ctx, xf, b.broadcast_to(m, shape), b.broadcast_to(rstd, shape), weight, bias, acc)
    stats = ctx.out_type(1)
    return (b.cast(y, out.dtype), b.cast(b.reshape(m, stats.shape), stats.dtype),
            b.cast(b.reshape(rstd, stats.shape), stats.dtype))


@lowers("aten.native_group_norm.default")
def group_norm(ctx: Context, x, weight, bias, n, c, hw, groups, eps):
    """Statistics per (sample, group of C/G channels) over the group's channels and positions, then
    the per-channel weight and bias."""
    out = ctx.out_type(0)
    acc = out.dtype.accumulator
    b = ctx.b
    xf = ctx.tensor(x, acc)
    shape = b.shape(xf)
    grouped = b.reshape(xf, (n, groups, (c // groups) * hw), suffix="grouped")
    m = mean_of(ctx, grouped, [2], keepdim=True)
    v = variance_of(ctx, grouped, [2], 0.0, keepdim=True)
    rstd = b.elementwise("rsqrt", b.elementwise("add", v, float(eps), suffix="var_eps"), suffix="rstd")
    per_element = (n, groups, (c // groups) * hw)
    normed = b.elementwise("multiply", b.elementwise("subtract", grouped, b.broadcast_to(m, per_element), suffix="xc"),
                           b.broadcast_to(rstd, per_element), suffix="normed")
    y = b.reshape(normed, shape, suffix="ungrouped")
    if weight is not None:
        y = b.elementwise("multiply", y, _per_channel(ctx, weight, shape, acc), suffix="scaled")
    if bias is not None:
        y = b.elementwise("add", y, _per_channel(ctx, bias, shape, acc), suffix="shifted")
    stats = ctx.out_type(1)
    return (b.cast(y, out.dtype), b.cast(b.reshape(m, stats.shape), stats.dtype),
            b.cast(b.reshape(rstd, stats.shape), stats.dtype))

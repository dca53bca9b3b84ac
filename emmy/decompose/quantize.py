"""Fake quantization (quantization-aware training's ops) as float arithmetic: per tensor and per
channel, with scalar or tensor parameters, learnable (LSQ) parameters, and torch.ao's fused
moving-average observer (the default QAT qconfig's FusedMovingAvgObsFakeQuantize).

Each follows torch's CPU kernel step for step, so the bits agree: q = zero_point +
nearbyint(x * (1.0f / scale)) in f32 (a half input computed in f32, as torch promotes it), the
output (clamp(q, qmin, qmax) - zero_point) * scale, the mask (what the backward passes the
gradient through) qmin <= q <= qmax. The observer's parameters follow quant_utils'
ChooseQuantizationParams (which torch keeps identical to FBGEMM's), its double-precision steps in
f64. Switches held in tensors (fake_quant_enabled, observer_enabled) become selects, so one
program serves either setting.
"""

from __future__ import annotations

import numpy as np

from emmy.decompose.registry import Context, lowers
from emmy.dtypes import DType
from emmy.errors import UnsupportedOpError

SMALL_SCALE = float(np.float32(6.1e-5))  # quant_utils' SMALL_SCALE_THRESHOLD, an f32: scales below it are raised to it


def _per_axis(ctx: Context, value, shape, axis: int | None, dtype: DType):
    """A parameter broadcast over `shape`: a Python number as it is; a tensor of one element
    everywhere; a (C,) tensor along `axis`."""
    if not isinstance(value, str):
        return value
    b = ctx.b
    if axis is None:
        value = b.reshape(value, (), suffix="scalar")
    else:
        spread = [1] * len(shape)
        spread[axis] = b.shape(value)[0]
        value = b.reshape(value, spread, suffix="channel")
    return ctx.tensor(value, dtype, shape)


def _f32(value):
    return float(np.float32(value)) if not isinstance(value, str) else value


def fake_quantized(ctx: Context, x: str, scale, zero_point, qmin: int, qmax: int, axis: int | None = None,
                   round_after_zero: bool = False):
    """(output in x's dtype, bool mask) of x fake-quantized by `scale` and `zero_point` (numbers,
    one-element tensors, or (C,) tensors along `axis`). `round_after_zero`: torch's per-channel form
    with a float zero point, which rounds zero_point + x / scale (an integer one is added after)."""
    b = ctx.b
    shape = b.shape(x)
    value = ctx.tensor(x, DType.F32)
    scale = _per_axis(ctx, _f32(scale), shape, axis, DType.F32)
    zero = _per_axis(ctx, zero_point if isinstance(zero_point, str) else float(int(zero_point)), shape, axis, DType.F32)
    if isinstance(scale, str):
        inverse = b.elementwise("divide", 1.0, scale, suffix="inverse_scale")
    else:
        inverse = float(np.float32(1.0) / np.float32(scale))
    scaled = b.elementwise("multiply", value, inverse, suffix="scaled")
    if round_after_zero:
        q = b.elementwise("round", b.elementwise("add", zero, scaled), suffix="q")
    else:
        q = b.elementwise("add", b.elementwise("round", scaled, suffix="rounded"), zero, suffix="q")
    clamped = b.elementwise("minimum", b.elementwise("maximum", q, float(qmin), suffix="q_low"), float(qmax),
                            suffix="q_clamped")
    if round_after_zero:  # torch computes (q - zero_point) * scale in double there: a fractional zero point
        wide = [b.cast(t, DType.F64) if isinstance(t, str) else t for t in (clamped, zero, scale)]
        output = b.elementwise("multiply", b.elementwise("subtract", wide[0], wide[1], suffix="q_centered"), wide[2],
                               suffix="fake_quantized")
    else:  # an integer zero point: q - zero_point is exact, and so is its product's one rounding in f32
        output = b.elementwise("multiply", b.elementwise("subtract", clamped, zero, suffix="q_centered"), scale,
                               suffix="fake_quantized")
    inside = b.elementwise("logical_and", b.elementwise("greater_equal", q, float(qmin)),
                           b.elementwise("less_equal", q, float(qmax)), suffix="quant_mask")
    return b.cast(output, b.dtype(x)), inside


@lowers("aten.fake_quantize_per_tensor_affine_cachemask.default")
def per_tensor(ctx: Context, x, scale, zero_point, quant_min, quant_max):
    return fake_quantized(ctx, x, scale, zero_point, quant_min, quant_max)


@lowers("aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams.default")
def per_tensor_tensor_qparams(ctx: Context, x, scale, zero_point, fake_quant_enabled, quant_min, quant_max):
    """As per_tensor, with the parameters in tensors; where fake_quant_enabled holds 0, x and an
    all-true mask."""
    b = ctx.b
    if b.dtype(zero_point).is_float:  # torch reads the zero point as an integer (item().toInt(): truncated)
        zero_point = b.elementwise("trunc", zero_point, suffix="zero_point")
    return _switched(ctx, x, *fake_quantized(ctx, x, scale, zero_point, quant_min, quant_max), fake_quant_enabled)


def _switched(ctx: Context, x: str, output: str, mask: str, enabled: str) -> tuple[str, str]:
    """(output, mask) where the one-element switch `enabled` is nonzero; else x and an all-true mask."""
    b = ctx.b
    on = _per_axis(ctx, b.elementwise("not_equal", enabled, 0), b.shape(x), None, DType.BOOL)
    output = b.elementwise("where", on, output, x, dtype=b.dtype(x), suffix="fake_quant_on")
    return output, b.elementwise("logical_or", mask, b.elementwise("logical_not", on), suffix="quant_mask")


@lowers("aten.fake_quantize_per_channel_affine_cachemask.default")
def per_channel(ctx: Context, x, scale, zero_point, axis, quant_min, quant_max):
    return fake_quantized(ctx, x, scale, zero_point, quant_min, quant_max, axis % max(len(ctx.b.shape(x)), 1),
                          round_after_zero=ctx.b.dtype(zero_point).is_float)


def _learned_zero_point(ctx: Context, zero_point: str, quant_min: int, quant_max: int) -> str:
    """torch rounds a learned zero point to the nearest integer and clamps it into the range."""
    b = ctx.b
    rounded = b.elementwise("round", ctx.tensor(zero_point, DType.F32), suffix="zero_point")
    return b.elementwise("minimum", b.elementwise("maximum", rounded, float(quant_min)), float(quant_max),
                         suffix="zero_point")


@lowers("aten._fake_quantize_learnable_per_tensor_affine.default")
def learnable_per_tensor(ctx: Context, x, scale, zero_point, quant_min, quant_max, grad_factor=1.0):
    """LSQ's fake quantization (the parameters' first elements); the gradients are its backward's."""
    first = [ctx.b.reshape(ctx.b.slice(t, 0, 0, 1), (), suffix="first") for t in (scale, zero_point)]
    zero = _learned_zero_point(ctx, first[1], quant_min, quant_max)
    return fake_quantized(ctx, x, ctx.tensor(first[0], DType.F32), zero, quant_min, quant_max)[0]


@lowers("aten._fake_quantize_learnable_per_channel_affine.default")
def learnable_per_channel(ctx: Context, x, scale, zero_point, axis, quant_min, quant_max, grad_factor=1.0):
    zero = _learned_zero_point(ctx, zero_point, quant_min, quant_max)
    return fake_quantized(ctx, x, scale, zero, quant_min, quant_max, axis % max(len(ctx.b.shape(x)), 1))[0]


def _learnable_gradients(ctx: Context, grad: str, x: str, scale, zero, quant_min: int, quant_max: int,
                         grad_factor: float, axis: int | None):
    """Per element (dX, dScale, dZeroPoint) of LSQ's fake quantization, as torch's CPU kernel
    computes them in f32: q = nearbyint(zero + x / scale) (rounded after the zero point is added);
    dX passes the gradient where q is in range; out of range dScale is the gradient times
    (qmin or qmax) - zero and dZeroPoint minus the gradient times scale, in range dScale is the
    gradient times (fake-quantized x - x) / scale and dZeroPoint 0; both times grad_factor."""
    b = ctx.b
    shape = b.shape(x)
    f32 = DType.F32
    value, dy = ctx.tensor(x, f32), ctx.tensor(grad, f32, shape)
    scale, zero = (_per_axis(ctx, t, shape, axis, f32) for t in (scale, zero))
    inverse = b.elementwise("divide", 1.0, scale, suffix="inverse_scale")
    q = b.elementwise("round", b.elementwise("add", zero, b.elementwise("multiply", value, inverse)), suffix="q")
    below, above = b.elementwise("less", q, float(quant_min)), b.elementwise("greater", q, float(quant_max))
    outside = b.elementwise("logical_or", below, above)
    dx = b.elementwise("multiply", dy, b.cast(b.elementwise("logical_not", outside), f32), suffix="dx")
    clamped = b.elementwise("minimum", b.elementwise("maximum", q, float(quant_min)), float(quant_max))
    fake = b.elementwise("multiply", b.elementwise("subtract", clamped, zero), scale, suffix="fake_quantized")
    factor = float(np.float32(grad_factor))
    inside_scale = b.elementwise("multiply", b.elementwise("multiply", b.elementwise(
        "multiply", dy, b.elementwise("subtract", fake, value)), inverse), factor)
    edge = b.elementwise("where", below, b.elementwise("subtract", float(quant_min), zero),
                         b.elementwise("subtract", float(quant_max), zero), dtype=f32)
    outside_scale = b.elementwise("multiply", b.elementwise("multiply", dy, edge), factor)
    d_scale = b.elementwise("where", outside, outside_scale, inside_scale, dtype=f32, suffix="d_scale")
    outside_zero = b.elementwise("multiply", b.elementwise("multiply", b.elementwise("multiply", dy, -1.0), scale),
                                 factor)
    d_zero = b.elementwise("where", outside, outside_zero, 0.0, dtype=f32, suffix="d_zero_point")
    return dx, d_scale, d_zero


@lowers("aten._fake_quantize_learnable_per_tensor_affine_backward.default")
def learnable_per_tensor_backward(ctx: Context, grad, x, scale, zero_point, quant_min, quant_max, grad_factor=1.0):
    """LSQ's gradients; the backward reads the zero point as trunc(clamp(zero_point + 0.5)), as torch."""
    b = ctx.b
    first = [b.reshape(b.slice(t, 0, 0, 1), (), suffix="first") for t in (scale, zero_point)]
    shifted = b.elementwise("add", ctx.tensor(first[1], DType.F32), 0.5)
    zero = b.elementwise("trunc", b.elementwise("minimum", b.elementwise("maximum", shifted, float(quant_min)),
                                                float(quant_max)), suffix="zero_point")
    dx, d_scale, d_zero = _learnable_gradients(ctx, grad, x, ctx.tensor(first[0], DType.F32), zero, quant_min,
                                               quant_max, grad_factor, None)
    rank = len(b.shape(x))
    totals = [b.reshape(b.reduce_axes("sum", t, list(range(rank)), False), (1,)) if rank else b.reshape(t, (1,))
              for t in (d_scale, d_zero)]
    return dx, totals[0], totals[1]


@lowers("aten._fake_quantize_learnable_per_channel_affine_backward.default")
def learnable_per_channel_backward(ctx: Context, grad, x, scale, zero_point, axis, quant_min, quant_max,
                                   grad_factor=1.0):
    """LSQ's gradients per channel: the zero points rounded and clamped (as the forward reads them),
    dScale and dZeroPoint summed over every axis but the channel's."""
    b = ctx.b
    rank = len(b.shape(x))
    axis %= max(rank, 1)
    zero = _learned_zero_point(ctx, zero_point, quant_min, quant_max)
    dx, d_scale, d_zero = _learnable_gradients(ctx, grad, x, ctx.tensor(scale, DType.F32), zero, quant_min,
                                               quant_max, grad_factor, axis)
    others = [k for k in range(rank) if k != axis]
    totals = [b.reduce_axes("sum", t, others, False) if others else t for t in (d_scale, d_zero)]
    return dx, totals[0], totals[1]


def choose_qparams(ctx: Context, low: str, high: str, qmin: int, qmax: int, symmetric: bool) -> tuple[str, str]:
    """(scale f32, zero point i32) for observed ranges [low, high] (f32 tensors of one shape), as
    quant_utils::ChooseQuantizationParams computes them: f32 where it reads floats, f64 where it
    computes in double, the small-scale cut and the zero point's nudge included."""
    b = ctx.b
    f32, f64 = DType.F32, DType.F64
    span = qmax - qmin

    def where(cond, a, c, dtype):
        return b.elementwise("where", cond, a, c, dtype=dtype)

    def to(value, dtype):
        return b.cast(value, dtype)

    straddles = b.elementwise("logical_and", b.elementwise("less", low, 0.0), b.elementwise("greater", high, 0.0))
    if symmetric:  # the range made symmetric about 0 where it straddles it (preserve_sparsity)
        sym_min, sym_max = -(span // 2 + 1), span // 2
        widest = b.elementwise("maximum", b.elementwise("abs", b.elementwise("divide", low, float(sym_min))),
                               b.elementwise("abs", b.elementwise("divide", high, float(sym_max))))
        widest = to(widest, f64)
        low = where(straddles, to(b.elementwise("multiply", widest, float(sym_min)), f32), low, f32)
        high = where(straddles, to(b.elementwise("multiply", widest, float(sym_max)), f32), high, f32)
    low = b.elementwise("minimum", low, 0.0, suffix="range_low")
    high = b.elementwise("maximum", high, 0.0, suffix="range_high")
    scale = b.elementwise("divide", b.elementwise("subtract", to(high, f64), to(low, f64)), float(span), suffix="scale")
    narrow = to(scale, f32)
    unusable = b.elementwise("logical_or", b.elementwise("equal", narrow, 0.0),
                             b.elementwise("isinf", b.elementwise("divide", 1.0, narrow)))
    scale = where(unusable, 0.1, scale, f64)
    # Scales below the cut are raised to it, the range widened alike (kept at 0 on a side it touches)
    small = b.elementwise("less", scale, SMALL_SCALE)
    amplifier = b.elementwise("divide", SMALL_SCALE, to(scale, f32))
    full = float(np.float32(SMALL_SCALE) * np.float32(span))
    at_zero_low, at_zero_high = b.elementwise("equal", low, 0.0), b.elementwise("equal", high, 0.0)
    widened_high = where(at_zero_low, full, b.elementwise("multiply", high, amplifier), f32)
    widened_high = where(b.elementwise("logical_and", b.elementwise("logical_not", at_zero_low), at_zero_high),
                         high, widened_high, f32)
    widened_low = where(at_zero_low, low, where(at_zero_high, -full, b.elementwise("multiply", low, amplifier), f32),
                        f32)
    low, high = where(small, widened_low, low, f32), where(small, widened_high, high, f32)
    scale = where(small, SMALL_SCALE, scale, f64)
    # The zero point from whichever end adds the smaller terms, then nudged to an integer in range
    low_steps = b.elementwise("divide", to(low, f64), scale)
    high_steps = b.elementwise("divide", to(high, f64), scale)
    from_low = b.elementwise("subtract", float(qmin), low_steps)
    from_high = b.elementwise("subtract", float(qmax), high_steps)
    low_error = b.elementwise("subtract", float(abs(qmin)), b.elementwise("abs", low_steps))
    high_error = b.elementwise("subtract", float(abs(qmax)), b.elementwise("abs", high_steps))
    initial = where(b.elementwise("less", low_error, high_error), from_low, from_high, f64)
    if symmetric:
        straddles = b.elementwise("logical_and", b.elementwise("less", low, 0.0), b.elementwise("greater", high, 0.0))
        initial = where(straddles, (qmin + qmax) / 2, initial, f64)
    nudged = where(b.elementwise("less", initial, float(qmin)), float(qmin),
                   where(b.elementwise("greater", initial, float(qmax)), float(qmax), b.elementwise("round", initial),
                         f64), f64)
    return to(scale, f32), to(nudged, DType.I32)


@lowers("aten._fused_moving_avg_obs_fq_helper_functional.default")
def fused_moving_average_observer(ctx: Context, x, observer_on, fake_quant_on, running_min, running_max, scale,
                                  zero_point, averaging_const, quant_min, quant_max, ch_axis,
                                  per_row_fake_quant=False, symmetric_quant=False):
    """torch.ao's FusedMovingAvgObsFakeQuantize in one op: where observer_on, the running range
    moves toward x's (per row of axis 0 where per_row_fake_quant) by averaging_const (taken as
    x's own range while it is still infinite); where fake_quant_on, the parameters are chosen from
    it and x is fake-quantized by them, else x passes with an all-true mask and the parameters
    stay. (output, mask, running_min, running_max, scale, zero_point)."""
    b = ctx.b
    shape = b.shape(x)
    if b.type(x).numel == 0:
        raise UnsupportedOpError(f"unsupported op {ctx.where}: an empty input (torch returns it unobserved)")
    if per_row_fake_quant:
        if ch_axis % len(shape) != 0 or b.shape(running_min) != (shape[0],):
            raise UnsupportedOpError(
                f"unsupported op {ctx.where}: per-row observation along axis {ch_axis} with a running range of "
                f"shape {list(b.shape(running_min))} (emmy takes axis 0 and a range per row, as torch once the "
                "observer has run)")
        rows = ctx.tensor(b.reshape(x, (shape[0], -1), suffix="rows"), DType.F32)
        seen_low = b.reduce_axes("min", rows, [1], False, suffix="seen_min")
        seen_high = b.reduce_axes("max", rows, [1], False, suffix="seen_max")
    else:
        flat = ctx.tensor(b.reshape(x, (-1,), suffix="flat"), DType.F32)
        range_shape = b.shape(running_min)
        seen_low = b.reshape(b.reduce_axes("min", flat, [0], False, suffix="seen_min"), range_shape)
        seen_high = b.reshape(b.reduce_axes("max", flat, [0], False, suffix="seen_max"), range_shape)
    rate = float(np.float32(averaging_const))
    observe = _per_axis(ctx, b.elementwise("not_equal", observer_on, 0), b.shape(running_min), None, DType.BOOL)

    def moved(running, seen):
        step = b.elementwise("multiply", b.elementwise("subtract", seen, running), rate, suffix="step")
        average = b.elementwise("where", b.elementwise("isinf", running), seen, b.elementwise("add", running, step),
                                dtype=DType.F32, suffix="moving_average")
        return b.elementwise("where", observe, average, running, dtype=DType.F32, suffix="observed")

    low, high = moved(running_min, seen_low), moved(running_max, seen_high)
    new_scale, new_zero = choose_qparams(ctx, low, high, quant_min, quant_max, symmetric_quant)
    quantized = fake_quantized(ctx, x, new_scale, new_zero, quant_min, quant_max, 0 if per_row_fake_quant else None)
    output, mask = _switched(ctx, x, *quantized, fake_quant_on)
    on = b.elementwise("not_equal", fake_quant_on, 0)
    per_parameter = _per_axis(ctx, on, b.shape(scale), None, DType.BOOL)
    # a per-tensor observer's range is 0-d, its parameters (1,)
    new_scale, new_zero = (b.reshape(t, b.shape(scale), suffix="parameter") for t in (new_scale, new_zero))
    scale_out = b.elementwise("where", per_parameter, new_scale, ctx.tensor(scale, DType.F32), dtype=DType.F32)
    zero_dtype = b.dtype(zero_point)
    zero_out = b.elementwise("where", per_parameter, b.cast(new_zero, zero_dtype), zero_point, dtype=zero_dtype)
    return output, mask, low, high, scale_out, zero_out

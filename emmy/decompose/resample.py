"""Antialiased resizing (`F.interpolate(..., antialias=True)`, bilinear and bicubic), which torch
has no decomposition for: timm's ViTs with `dynamic_img_size` resample their position embeddings
with it in every forward, and torchvision's Resize does it to images.

Such a resize is linear and separable, and its weights depend on the sizes alone: out = Wh @ x @
Ww^T per image and channel, with Wh (out_h x in_h) and Ww (out_w x in_w) constants. Each matrix is
torch's own op applied, at compile time, to one-hot columns along its axis (the other axis kept at
size 1, where every mode is the identity), so the weights are torch's to the last rounding of their
float64 computation. A random probe checks the factorisation against torch before it is used.
"""

from __future__ import annotations

import numpy as np

from emmy.affine import Affine
from emmy.decompose.registry import Context, lowers
from emmy.errors import UnsupportedOpError

LARGEST_BASIS = 20_000_000  # elements of the one-hot input torch resizes for one axis's weights


@lowers("aten._upsample_bilinear2d_aa.default", "aten._upsample_bicubic2d_aa.default")
def antialiased(ctx: Context, x, output_size, align_corners, scales_h=None, scales_w=None):
    return _separable(ctx, x, align_corners, scales_h, scales_w)


@lowers("aten._upsample_bilinear2d_aa.vec", "aten._upsample_bicubic2d_aa.vec")
def antialiased_vec(ctx: Context, x, output_size, align_corners, scale_factors=None):
    scales_h, scales_w = scale_factors if scale_factors else (None, None)
    return _separable(ctx, x, align_corners, scales_h, scales_w)


def _separable(ctx: Context, x: str, align_corners: bool, scales_h, scales_w) -> str:
    import torch

    op = ctx.node.target.overloadpacket.default
    out = ctx.out_type()
    in_h, in_w = ctx.b.shape(x)[-2:]
    out_h, out_w = out.shape[-2:]
    # torch's weights along one axis depend on whether the other has one element or more (its CPU
    # kernel takes another path for a single column), so the other axis keeps its own extent (at
    # most 2 where that is large: a probe of the full shape checks the result below)
    other_w = in_w if in_h * in_h * in_w <= LARGEST_BASIS else min(in_w, 2)
    other_h = in_h if in_w * in_w * in_h <= LARGEST_BASIS else min(in_h, 2)
    rows = op(torch.eye(in_h, dtype=torch.float64).view(in_h, 1, in_h, 1).expand(in_h, 1, in_h, other_w).contiguous(),
              [out_h, other_w], align_corners, scales_h, None)
    cols = op(torch.eye(in_w, dtype=torch.float64).view(in_w, 1, 1, in_w).expand(in_w, 1, other_h, in_w).contiguous(),
              [other_h, out_w], align_corners, None, scales_w)
    along_h = rows[:, 0, :, 0].T.numpy()  # (out_h, in_h)
    along_w = cols[:, 0, 0, :].T.numpy()  # (out_w, in_w)
    probe = torch.randn(1, 1, in_h, in_w, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    expected = op(probe, [out_h, out_w], align_corners, scales_h, scales_w)[0, 0].numpy()
    if not np.allclose(along_h @ probe[0, 0].numpy() @ along_w.T, expected, rtol=1e-9, atol=1e-12):
        raise UnsupportedOpError(f"unsupported op {ctx.where}: this resize is not the separable weighting "
                                 "emmy computes it as")
    acc = out.dtype.accumulator
    value = ctx.tensor(x, acc)
    value = _weighted_along(ctx, value, -2, ctx.constant(along_h, acc), "rows")
    value = _weighted_along(ctx, value, -1, ctx.constant(along_w, acc), "cols")
    return ctx.b.cast(value, out.dtype)


def _weighted_along(ctx: Context, x: str, axis: int, weights: str, suffix: str) -> str:
    """y[.., i, ..] = sum_p weights[i, p] * x[.., p, ..] along `axis`: the product spans x's axes
    with the output's extent beside the summed one."""
    b = ctx.b
    shape = b.shape(x)
    axis %= len(shape)
    size = b.shape(weights)[0]
    space = (*shape[:axis], size, *shape[axis:])  # the output's axis, then x's (summed)
    x_index = [Affine.dim(k) if k < axis else Affine.dim(k + 1) for k in range(len(shape))]
    spread = b.index_map(x, space, x_index, suffix=f"{suffix}_x")
    weight = b.index_map(weights, space, [Affine.dim(axis), Affine.dim(axis + 1)], suffix=f"{suffix}_w")
    total = b.reduce("sum", b.elementwise("multiply", spread, weight, suffix=f"{suffix}_prod"), axis + 1,
                     suffix=f"{suffix}_sum")
    return b.keep_axes(total, [k for k in range(len(space)) if k != axis + 1], suffix=suffix)

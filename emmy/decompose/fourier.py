"""Discrete Fourier transforms of complex pairs (emmy.decompose.complex_pairs) as dense products.

Along each transformed axis of length n, Y_k = sum_j X_j exp(sign 2 pi i jk / n) is a contraction
with constant cos and sin matrices computed in float64 (sign -1 forward, +1 inverse):
Y_re = X_re C - sign X_im S, Y_im = X_im C + sign X_re S. That is O(n^2) work an axis where an FFT
is O(n log n), but it is one matrix product a kernel computes at full rate (FNet's own TPU
implementation uses DFT matrices for the same reason), and it needs nothing emmy lacks. ATen's
three entries are taken: _fft_r2c (rfft, stft: a real input, the last axis onesided), _fft_c2c
(fft, ifft, fftn) and _fft_c2r (irfft: a Hermitian half spectrum back to real). The normalization
(0: none, 1: 1/sqrt(n), 2: 1/n, n the product of the signal lengths) is folded into the first
axis's matrices.
"""

from __future__ import annotations

import math

import numpy as np

from emmy.affine import Affine
from emmy.decompose.complex_pairs import _pair, _part, _shape, complex_op, parts_of
from emmy.decompose.registry import lowers
from emmy.errors import UnsupportedOpError

LONGEST_AXIS = 4096  # a dense n x n matrix beyond this costs more memory and time than it is worth


@complex_op("aten._fft_r2c.default")
def real_to_complex(ctx, x, dim, normalization, onesided):
    dims = _axes(ctx, x, dim, ctx.b.shape(x))
    scale = _scale(normalization, [ctx.b.shape(x)[d] for d in dims])
    parts = parts_of(ctx, x)
    last = dims[-1]
    n = ctx.b.shape(x)[last]
    parts = _along(ctx, parts, last, n, n // 2 + 1 if onesided else n, -1, scale)
    for d in dims[:-1]:
        parts = _along(ctx, parts, d, ctx.b.shape(x)[d], ctx.b.shape(x)[d], -1, 1.0)
    return _pair(ctx, *parts, _shape(ctx))


@complex_op("aten._fft_c2c.default")
def complex_to_complex(ctx, x, dim, normalization, forward):
    shape = ctx.b.shape(x)[:-1]
    dims = _axes(ctx, x, dim, shape)
    scale = _scale(normalization, [shape[d] for d in dims])
    parts = parts_of(ctx, x)
    for k, d in enumerate(dims):
        parts = _along(ctx, parts, d, shape[d], shape[d], -1 if forward else 1, scale if k == 0 else 1.0)
    return _pair(ctx, *parts, _shape(ctx))


@complex_op("aten._fft_c2r.default")
def complex_to_real(ctx, x, dim, normalization, last_dim_size):
    """The inverse over every axis but the last, then the last's half spectrum X_0..X_{n/2} read as
    the whole Hermitian one: each X_k for 0 < k < n/2 stands for itself and its conjugate X_{n-k}
    (weight 2), and only the real part is kept (the imaginary parts of X_0 and X_{n/2} meet sin 0)."""
    shape = ctx.b.shape(x)[:-1]
    dims = _axes(ctx, x, dim, shape)
    n = int(last_dim_size)
    if shape[dims[-1]] != n // 2 + 1:
        raise UnsupportedOpError(f"unsupported op {ctx.where}: a half spectrum of {shape[dims[-1]]} for a signal "
                                 f"of {n} (n // 2 + 1 expected)")
    scale = _scale(normalization, [shape[d] for d in dims[:-1]] + [n])
    parts = parts_of(ctx, x)
    for d in dims[:-1]:
        parts = _along(ctx, parts, d, shape[d], shape[d], 1, 1.0)
    weights = np.array([1.0 if k == 0 or 2 * k == n else 2.0 for k in range(n // 2 + 1)])
    return _along(ctx, parts, dims[-1], n, n, 1, scale, weights=weights, real_only=True)[0]


@lowers("aten.fft_rfftfreq.default", "aten.fft_fftfreq.default")
def frequencies(ctx, n, d=1.0, **kwargs):
    """The sample frequencies of a transform of n (numpy's, the same values as torch's): a constant."""
    values = (np.fft.rfftfreq if "rfftfreq" in str(ctx.node.target) else np.fft.fftfreq)(int(n), float(d))
    return ctx.constant(values, ctx.out_type().dtype)


def _axes(ctx, x, dim, shape) -> list[int]:
    dims = [d % len(shape) for d in dim]
    for d in dims:
        if shape[d] > LONGEST_AXIS:
            raise UnsupportedOpError(f"unsupported op {ctx.where}: a Fourier transform along an axis of {shape[d]} "
                                     f"(emmy computes it as a dense product, for axes up to {LONGEST_AXIS})")
    return dims


def _scale(normalization: int, lengths: list[int]) -> float:
    n = math.prod(lengths)
    return {0: 1.0, 1: 1.0 / math.sqrt(n), 2: 1.0 / n}[int(normalization)]


def _along(ctx, parts, axis: int, n: int, count: int, sign: int, scale: float, weights=None,
           real_only: bool = False) -> tuple:
    """(re, im) transformed along `axis`: the first `count` of the n outputs (a onesided transform:
    n // 2 + 1), the inputs along it weighted by `weights` (default 1); im None for a real input."""
    re, im = parts
    length = ctx.b.shape(re)[axis]
    j = np.arange(length)[:, None]
    k = np.arange(count)[None, :]
    turn = (j * k) % n  # the product reduced mod n first: exact angles for long axes
    cosine, sine = np.cos(2.0 * np.pi * turn / n), np.sin(2.0 * np.pi * turn / n)
    # quarter turns exactly (sin(pi) is 1.2e-16 in floating point): a Nyquist bin's imaginary part is
    # then 0, not a rounding of either sign that flips its angle between pi and -pi
    quarter = (4 * turn) % n == 0
    steps = (4 * turn) // n % 4
    cosine = np.where(quarter, np.array([1.0, 0.0, -1.0, 0.0])[steps], cosine)
    sine = np.where(quarter, np.array([0.0, 1.0, 0.0, -1.0])[steps], sine)
    w = (np.ones(length) if weights is None else weights)[:, None] * scale
    cos, sin = ctx.constant(w * cosine, _part(ctx)), ctx.constant(w * sine, _part(ctx))
    b = ctx.b

    def times(x, m):
        return _contract(ctx, x, axis, m)

    real = times(re, cos)
    if im is not None:  # Y_re = X_re C - sign X_im S
        real = b.elementwise("subtract" if sign > 0 else "add", real, times(im, sin), suffix="dft_re")
    if real_only:
        return real, None
    # 0 - s, not -s: a bin whose sines are all 0 (the mean, Nyquist) keeps an imaginary part of +0, as
    # an FFT gives it, so its angle is pi, not -pi, where the real part is negative
    imag = times(re, sin) if sign > 0 else b.elementwise("subtract", 0.0, times(re, sin))
    if im is not None:  # Y_im = X_im C + sign X_re S
        imag = b.elementwise("add", times(im, cos), imag, suffix="dft_im")
    return real, imag


def _contract(ctx, x: str, axis: int, matrix: str) -> str:
    """x (.., n_in at `axis`, ..) by matrix (n_in, n_out) -> (.., n_out at `axis`, ..): a product in a
    space with n_in last, summed over it."""
    b = ctx.b
    shape = b.shape(x)
    n_in, n_out = b.shape(matrix)
    rank = len(shape)
    space = (*shape[:axis], n_out, *shape[axis + 1:], n_in)
    spread = b.index_map(x, space, [Affine.dim(rank) if d == axis else Affine.dim(d) for d in range(rank)],
                         suffix="dft_x")
    entries = b.index_map(matrix, space, [Affine.dim(rank), Affine.dim(axis)], suffix="dft_w")
    return b.reduce_axes("sum", b.elementwise("multiply", spread, entries), [rank], False, suffix="dft")

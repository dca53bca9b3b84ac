"""F.grid_sample in 2-D and 3-D, forward and backward, spelled as gathers and scatter-adds.

torch decomposes the 2-D forward itself (emmy.capture.exporting takes that decomposition) but keeps
the 3-D forward and both backwards whole. Here the input is read at the 2^d corners around each
sample's source position (d = 2 or 3 spatial dimensions), weighted by the linear interpolation
weights (or at the one rounded position for mode "nearest"), as torch's CPU kernels compute them.
Grid coordinate k indexes spatial dimension d-1-k: x the width, y the height, z the depth.
Bicubic sampling (2-D only in torch) returns NotImplemented, so torch keeps the op.
"""

from __future__ import annotations

import itertools
import math

import torch

_LINEAR, _NEAREST = 0, 1  # torch's GridSamplerInterpolation (2 is bicubic)
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2  # torch's GridSamplerPadding


def _source_coordinate(coordinate, size: int, padding_mode: int, align_corners: bool):
    """(the pixel coordinate a normalised grid coordinate reads, its derivative by the grid's): torch's
    grid_sampler_compute_source_index_set_grad."""
    if align_corners:
        pixel, slope = (coordinate + 1) / 2 * (size - 1), (size - 1) / 2
    else:
        pixel, slope = ((coordinate + 1) * size - 1) / 2, size / 2
    slope = torch.full_like(coordinate, slope)
    if padding_mode == _REFLECTION:  # reflection about the edges (pixel centres, or the image's borders)
        low, high = (0, 2 * (size - 1)) if align_corners else (-1, 2 * size - 1)
        if low == high:
            pixel, slope = torch.zeros_like(pixel), torch.zeros_like(slope)
        else:
            least, span = low / 2, (high - low) / 2
            shifted = pixel - least
            sign = torch.where(shifted < 0, -1.0, 1.0).to(coordinate.dtype)
            shifted = shifted.abs()
            extra, flips = torch.fmod(shifted, span), torch.floor(shifted / span)
            even = torch.remainder(flips, 2) == 0
            pixel = torch.where(even, extra + least, span - extra + least)
            slope = slope * torch.where(even, sign, -sign)
    if padding_mode in (_BORDER, _REFLECTION):  # clipped to the image: no slope where clipped
        inside = (pixel > 0) & (pixel < size - 1)
        pixel = pixel.clamp(0, size - 1)
        slope = slope * inside
    return pixel, slope


class _Samples:
    """Where each output sample of a grid_sample reads: per grid coordinate k its source pixel and
    the pixel's derivative by the grid coordinate, and the input flattened over its spatial axes."""

    def __init__(self, input, grid, padding_mode: int, align_corners: bool):
        self.n, self.channels = input.shape[:2]
        self.sizes = tuple(input.shape[2:])  # (H, W) or (D, H, W)
        self.dims = len(self.sizes)
        self.out_shape = (self.n, self.channels) + tuple(grid.shape[1:-1])
        self.flat = input.reshape(self.n, self.channels, math.prod(self.sizes))
        self.pixels, self.slopes = zip(*(_source_coordinate(grid[..., k], self.sizes[-1 - k], padding_mode,
                                                           align_corners) for k in range(self.dims)))

    def corner(self, coords):
        """(flat index [n, 1, P] (0 outside), inside [n, 1, P] in the input's dtype, the values read
        there [n, C, P]) of the integer positions coords[k] for grid coordinate k."""
        inside = torch.ones_like(coords[0], dtype=torch.bool)
        index = torch.zeros_like(coords[0])
        stride = 1
        for k, c in enumerate(coords):
            size = self.sizes[-1 - k]
            inside = inside & (c >= 0) & (c < size)
            index = index + c.clamp(0, size - 1) * stride
            stride *= size
        inside = inside.reshape(self.n, 1, -1).to(self.flat.dtype)
        index = index.to(torch.int64).reshape(self.n, 1, -1)
        values = torch.gather(self.flat, 2, index.expand(self.n, self.channels, -1)) * inside
        return index, inside, values

    def linear_corners(self):
        """Each of the 2^d corners around the samples as (corner(...), its weight [n, 1, P], the
        low/high choice per coordinate), with the fractions t[k] [n, 1, P] past the low corner."""
        lows = [torch.floor(p) for p in self.pixels]
        fractions = [(p - low).reshape(self.n, 1, -1) for p, low in zip(self.pixels, lows)]
        corners = []
        for high in itertools.product((0, 1), repeat=self.dims):
            weight = math.prod(t if h else 1 - t for t, h in zip(fractions, high))
            corners.append((self.corner([low + h for low, h in zip(lows, high)]), weight, high))
        return corners, fractions

    def nearest(self):
        return self.corner([torch.round(p) for p in self.pixels])  # half to even, as torch's nearbyint


def grid_sampler(input, grid, interpolation_mode: int, padding_mode: int, align_corners: bool):
    """aten.grid_sampler_2d / grid_sampler_3d, linear (bi- or trilinear) or nearest."""
    if interpolation_mode not in (_LINEAR, _NEAREST):
        return NotImplemented
    samples = _Samples(input, grid, padding_mode, align_corners)
    if interpolation_mode == _NEAREST:
        return samples.nearest()[2].reshape(samples.out_shape)
    corners, _ = samples.linear_corners()
    return sum(values * weight for (_, _, values), weight, _ in corners).reshape(samples.out_shape)


def grid_sampler_backward(grad_output, input, grid, interpolation_mode: int, padding_mode: int,
                          align_corners: bool, output_mask):
    """(grad_input, grad_grid) of grid_sampler_2d / grid_sampler_3d: each output sample's gradient
    added onto the input positions it read (a scatter_add over the flattened input), and the grid's
    as the sampled value's slope along each coordinate between its corners times the coordinate's
    derivative (unnormalising, clipping, reflecting), as torch's kernel computes them."""
    if interpolation_mode not in (_LINEAR, _NEAREST):
        return NotImplemented
    samples = _Samples(input, grid, padding_mode, align_corners)
    n, channels = samples.n, samples.channels
    go = grad_output.reshape(n, channels, -1)
    grad_input = torch.zeros_like(samples.flat)
    if interpolation_mode == _NEAREST:
        index, inside, _ = samples.nearest()
        grad_input = grad_input.scatter_add(2, index.expand(n, channels, -1), go * inside)
        return (grad_input.reshape(input.shape) if output_mask[0] else None), torch.zeros_like(grid)
    corners, fractions = samples.linear_corners()
    along = [0] * samples.dims  # d(sampled value)/d(pixel k), summed over channels: [n, 1, P] each
    for (index, inside, values), weight, high in corners:
        grad_input = grad_input.scatter_add(2, index.expand(n, channels, -1), go * weight * inside)
        for k in range(samples.dims):
            others = math.prod(t if h else 1 - t for j, (t, h) in enumerate(zip(fractions, high)) if j != k)
            along[k] = along[k] + (values * go).sum(1, keepdim=True) * (others if high[k] else -others)
    slopes = samples.slopes
    grad_grid = torch.stack([a.reshape(s.shape) * s for a, s in zip(along, slopes)], dim=-1)
    return (grad_input.reshape(input.shape) if output_mask[0] else None), grad_grid

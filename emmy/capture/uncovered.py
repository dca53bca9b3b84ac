"""ATen ops torch has no decomposition for, spelled in ops emmy lowers.

Each is checked against torch's own kernel in the tests (tests/test_ops.py, test_backward_ops.py,
test_dense_linalg.py, test_special_functions.py).
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


def embedding_renorm(weight, indices, max_norm: float, norm_type: float):
    """The functional form of nn.Embedding's max_norm (torch.export writes the new table back as a
    parameter update): each row `indices` names whose norm is above max_norm is scaled by
    max_norm / (norm + 1e-7), as torch's kernel does: the norm in the table's type, the scale worked
    out in double and rounded to that type; the other rows are kept."""
    named = torch.zeros(weight.shape[0], dtype=torch.bool, device=weight.device)
    named = named.index_put((indices.reshape(-1),), torch.ones((), dtype=torch.bool, device=weight.device))
    norms = torch.linalg.vector_norm(weight, norm_type, dim=1)
    wide = norms.to(torch.float64)
    # number / tensor would be a reciprocal times the number, an ulp off the kernel's division
    scale = (torch.full_like(wide, max_norm) / (wide + 1e-7)).to(weight.dtype)  # as its Scalar, cast to the type
    scaled = weight * scale[:, None]
    return torch.where((named & (norms > max_norm))[:, None], scaled, weight)


# matrix_exp: a Taylor polynomial of the matrix scaled to 1-norm at most 1, squared back up
TAYLOR_DEGREE = {torch.float32: 12, torch.float64: 18}  # truncation 1/13! ~ 2e-10, 1/19! ~ 8e-18
MAX_SQUARINGS = 32  # 1-norms up to 2^32; the squarings a matrix does not need are skipped by a select


def matrix_exp(a):
    """torch.linalg.matrix_exp by scaling and squaring: s = ceil(log2(|A|_1)) halvings (none for a
    norm at most 1) bring A to norm <= 1, where a Taylor polynomial (Horner's form) is accurate to the
    type; the result is squared s times. s differs per matrix of a batch and is known only at run
    time, so MAX_SQUARINGS squarings are written and each keeps the product only where it is due.
    torch picks among Taylor-based polynomials of degree 1 to 18 by the norm instead; both are
    accurate to about the type's precision times the squarings' growth."""
    if a.dtype not in TAYLOR_DEGREE:
        return NotImplemented  # complex and half types: torch's kernel
    order = a.shape[-1]
    norm = a.abs().sum(-2).amax(-1)  # the 1-norm of each matrix
    squarings = torch.clamp(torch.ceil(torch.log2(norm)), min=0, max=MAX_SQUARINGS)
    scaled = a / torch.pow(2.0, squarings).to(a.dtype)[..., None, None]
    eye = torch.eye(order, dtype=a.dtype, device=a.device)
    result = eye
    for k in range(TAYLOR_DEGREE[a.dtype], 0, -1):
        result = eye + (scaled @ result) / k
    for step in range(MAX_SQUARINGS):
        result = torch.where((squarings > step)[..., None, None], result @ result, result)
    return result


def householder_product(a, tau):
    """torch.linalg.householder_product: the first n columns of H_1 ... H_k, H_i = I - tau_i v_i v_i^T
    with v_i = (0, ..., 0, 1, a[i+1:, i]), applied to the identity's columns from the last
    reflector to the first (LAPACK's orgqr order): k rank-one updates."""
    if a.is_complex():
        return NotImplemented  # emmy computes complex values as pairs; the conjugates are not written here
    rows, columns = a.shape[-2:]
    position = torch.arange(rows, device=a.device)
    q = torch.eye(rows, columns, dtype=a.dtype, device=a.device).expand(*a.shape[:-2], rows, columns)
    for i in reversed(range(tau.shape[-1])):
        v = torch.where(position > i, a[..., :, i], (position == i).to(a.dtype))
        projected = (v.unsqueeze(-2) @ q) * tau[..., i, None, None]  # tau_i v^T Q, one row
        q = q - v.unsqueeze(-1) * projected
    return q


def fractional_max_pool(x, kernel_size, output_size, random_samples):
    """fractional_max_pool2d/3d with its samples given: along each pooled axis (its sample as torch's
    kernels read them: in 2-D samples[..., 0] is the width's, in 3-D the time's) window i starts
    at int((i + u) a) - int(u a), a = (input - kernel) / (output - 1), the last at input - kernel,
    computed in the input's type as the kernel does; each output is its window's maximum and the flat
    position of it (the first maximum, or the last NaN: the kernel takes a value above the best so far
    or any NaN)."""
    axes = len(kernel_size)
    spatial = x.shape[-axes:]
    lead = x.shape[:-axes]
    samples = random_samples.to(x.dtype)
    if x.dim() == axes + 1:  # unbatched: samples are (1, C, axes)
        samples = samples[0]
    starts = []
    for axis in range(axes):  # axis 0 the first spatial one
        size, kernel, out = spatial[axis], kernel_size[axis], output_size[axis]
        u = samples[..., (1 - axis) if axes == 2 else axis, None]
        if out > 1:
            alpha = torch.full((), (size - kernel) / (out - 1), dtype=x.dtype, device=x.device)
            i = torch.arange(out - 1, device=x.device).to(x.dtype)
            inner = ((i + u) * alpha).to(torch.int64) - (u * alpha).to(torch.int64)
            starts.append(torch.cat([inner, torch.full_like(inner[..., :1], size - kernel)], -1))
        else:
            starts.append(torch.full((*u.shape[:-1], out), size - kernel, dtype=torch.int64, device=x.device))
    flat = torch.zeros((), dtype=torch.int64, device=x.device)
    stride = 1
    for axis in reversed(range(axes)):  # the flat position of each window element, axes broadcast apart
        offsets = torch.arange(kernel_size[axis], device=x.device)
        along = starts[axis][..., :, None] + offsets  # (..., out, kernel)
        shape = [1] * (2 * axes)
        shape[axis], shape[axes + axis] = output_size[axis], kernel_size[axis]
        flat = flat + (along * stride).reshape(*along.shape[:-2], *shape)
        stride *= spatial[axis]
    positions = flat.reshape(*flat.shape[:flat.dim() - 2 * axes], *output_size, -1)
    positions = positions.expand(*lead, *output_size, positions.shape[-1])
    values = torch.gather(x.reshape(*lead, -1), -1, positions.reshape(*lead, -1)).reshape(positions.shape)
    nan = values.isnan()
    last_nan = positions.shape[-1] - 1 - nan.flip(-1).to(torch.int8).argmax(-1)
    chosen = torch.where(nan.any(-1), last_nan, values.argmax(-1))
    index = torch.gather(positions, -1, chosen[..., None])
    return torch.gather(values, -1, chosen[..., None])[..., 0], index[..., 0]


MODE_MAX_LENGTH = 4096  # torch.mode compares every pair of a row's elements: rows up to this long


def mode(x, dim: int = -1, keepdim: bool = False):
    """torch.mode: the most frequent value of each row (the smallest among equally frequent ones;
    -0 equals 0) and the last position holding it, counted by comparing every pair of a row's
    elements. torch's CPU kernel sorts the row unstably and with NaN unordered, so its position among
    equal values is the last only for rows up to 16 long (insertion sort), and a row with a NaN has
    no defined answer; here each NaN counts once and a NaN is the mode only of a row of NaNs."""
    if x.dim() == 0:
        return x.clone(), torch.zeros((), dtype=torch.int64, device=x.device)
    if x.shape[dim] > MODE_MAX_LENGTH or x.dtype == torch.bool or x.is_complex():
        return NotImplemented
    rows = x.movedim(dim, -1)
    length = rows.shape[-1]
    nan = rows.isnan()
    counts = (rows[..., :, None] == rows[..., None, :]).sum(-1) + nan.to(torch.int64)
    candidate = counts == counts.amax(-1, keepdim=True)
    largest = float("inf") if rows.is_floating_point() else torch.iinfo(rows.dtype).max
    numbers = candidate & ~nan
    smallest = torch.where(numbers, rows, torch.full_like(rows, largest)).amin(-1, keepdim=True)
    only_nan = numbers.sum(-1, keepdim=True) == 0  # every most frequent value a NaN: the last NaN
    holds = torch.where(only_nan, candidate & nan, rows == smallest)
    positions = torch.arange(length, device=x.device).expand(rows.shape)
    index = torch.where(holds, positions, torch.full_like(positions, -1)).amax(-1, keepdim=True)
    values = rows.gather(-1, index)
    if not keepdim:
        return values.squeeze(-1), index.squeeze(-1)
    return values.movedim(-1, dim), index.movedim(-1, dim)


def nonzero_static(x, *, size: int, fill_value: int = -1):
    """torch.nonzero_static: the coordinates of the first `size` nonzero elements in row-major order,
    as torch.nonzero gives them, and rows past their count filled with fill_value, so the shape is
    fixed. The j-th nonzero (from 0) is the first position where the running count of nonzeros
    reaches j + 1: a search in the count, which never decreases."""
    int64 = dict(dtype=torch.int64, device=x.device)
    if x.dim() == 0 or x.numel() == 0:
        return torch.full((size, x.dim()), fill_value, **int64)
    nonzero = (x != 0).reshape(-1).to(torch.int64)
    slots = torch.arange(1, size + 1, **int64)
    position = torch.searchsorted(torch.cumsum(nonzero, 0), slots)
    coordinates = []
    for extent in reversed(x.shape):
        coordinates.append(position % extent)
        position = torch.div(position, extent, rounding_mode="floor")
    found = torch.stack(coordinates[::-1], dim=1)
    return torch.where((slots <= nonzero.sum())[:, None], found, torch.full_like(found, fill_value))


def repeat_counts(repeats, output_size=None):
    """aten.repeat_interleave.Tensor given its output_size (what Tensor.repeat_interleave(repeats,
    output_size=n) calls before it gathers): position j holds the i whose run of repeats[i] copies
    covers j, the number of runs that end at or before j (a search in the running total, which never
    decreases; runs of no copies are passed over). Where the repeats do not add up to output_size
    (torch raises) every position holds len(repeats), past the last run: the gather that follows
    reports it as an index out of range rather than give rows that are not there. Without output_size
    the size is the values' sum: NotImplemented leaves the op to be refused as sized by values."""
    if output_size is None or repeats.shape[0] == 0:
        return NotImplemented
    ends = torch.cumsum(repeats, 0)
    slots = torch.arange(output_size, dtype=ends.dtype, device=repeats.device)
    runs = torch.searchsorted(ends, slots, right=True, out_int32=repeats.dtype == torch.int32)
    return torch.where(ends[-1] == output_size, runs, torch.full_like(runs, repeats.shape[0]))


def uncovered_decompositions() -> dict:
    """ATen op -> emmy's decomposition, for the ops torch's tables leave out."""
    from emmy.capture.grid_sampling import grid_sampler
    from emmy.capture.polynomials import polynomial_decompositions

    return {aten.embedding_renorm.default: embedding_renorm, aten.grid_sampler_3d.default: grid_sampler,
            aten.linalg_matrix_exp.default: matrix_exp, aten.linalg_householder_product.default: householder_product,
            aten.fractional_max_pool2d.default: fractional_max_pool,
            aten.fractional_max_pool3d.default: fractional_max_pool,
            aten.mode.default: mode, aten.nonzero_static.default: nonzero_static,
            aten.repeat_interleave.Tensor: repeat_counts,
            **polynomial_decompositions()}

"""Backward ops of a training graph spelled out in ops emmy lowers, as gathers rather than scatters.

torch keeps these whole (convolution_backward, avg_pool2d_backward, the attention backward) or
decomposes them into scatter_add over indices (max_pool2d_with_indices_backward), which emmy can
only write as a dense match of every position against every write. Here each input position
gathers what reaches it instead: the taps of the windows that cover it, through `col2im` (F.fold,
which emmy sums per pixel), and weight gradients are contractions with `im2col` (F.unfold).

A function returns NotImplemented where its form is not covered (a transposed or 3-D convolution,
3-D pooling); torch then keeps the op and it runs eagerly.
"""

from __future__ import annotations

import math

import torch

aten = torch.ops.aten


def flash_attention_backward(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *,
                             attn_mask=None, scale=None):
    """(grad_query, grad_key, grad_value) of `_scaled_dot_product_flash_attention_for_cpu`, from its
    saved output and log-sum-exp: P = exp(S - lse), dV = P^T dO, dS = P * (dO V^T - rowsum(dO * O)),
    dQ = dS K * scale, dK = dS^T Q * scale (query heads share a key head in groups)."""
    if dropout_p:
        return NotImplemented  # its random mask is torch's
    acc = torch.float64 if query.dtype == torch.float64 else torch.float32
    q, k, v, g, o = (t.to(acc) for t in (query, key, value, grad_out, out))
    n, heads = q.shape[:2]
    key_heads, keys = k.shape[1], k.shape[2]
    group = heads // key_heads
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = masked_scores(q, k, attn_mask, is_causal, scale)
    probs = torch.exp(scores - logsumexp.to(acc).unsqueeze(-1))
    grad_v = torch.matmul(probs.transpose(-2, -1), g)
    grad_scores = probs * (torch.matmul(g, v.transpose(-2, -1)) - (g * o).sum(dim=-1, keepdim=True)) * scale
    grad_q = torch.matmul(grad_scores, k)
    grad_k = torch.matmul(grad_scores.transpose(-2, -1), q)
    if group > 1:
        grad_k = grad_k.view(n, key_heads, group, keys, -1).sum(dim=2)
        grad_v = grad_v.view(n, key_heads, group, keys, -1).sum(dim=2)
    return grad_q.to(query.dtype), grad_k.to(key.dtype), grad_v.to(value.dtype)


def masked_scores(q, k, attn_mask, is_causal: bool, scale):
    """q k^T * scale [.., L, S] in q's dtype, -inf where a causal (top-left) or bool mask hides a
    key, a float mask added."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if is_causal:
        visible = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~visible, float("-inf"))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool \
            else scores + attn_mask.to(scores.dtype)
    return scores


def convolution_backward(grad_out, x, weight, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask):
    """(grad_input, grad_weight, grad_bias) of a 1-D or 2-D convolution: the weight's gradient is
    the output gradient contracted with the input's windows (im2col), the input's is the weight
    contracted with the output gradient, its taps summed back onto the pixels (col2im). A 3-D one:
    emmy.capture.backward_ops._volume_convolution_backward."""
    if x.dim() == 5:
        return _volume_convolution_backward(grad_out, x, weight, stride, padding, dilation, transposed,
                                            output_padding, groups, output_mask)
    if x.dim() not in (3, 4):
        return NotImplemented
    one_d = x.dim() == 3
    if one_d:  # a 1-D convolution is a 2-D one over rows of height 1
        x, weight, grad_out = x.unsqueeze(2), weight.unsqueeze(2), grad_out.unsqueeze(2)
        stride, padding, dilation = (1, *stride), (0, *padding), (1, *dilation)
    if transposed:
        grads = _transposed_convolution_backward(grad_out, x, weight, stride, padding, dilation, groups, output_mask)
        return tuple(t.squeeze(2) if one_d and t is not None and i < 2 else t for i, t in enumerate(grads))
    n, channels_in, height, width = x.shape
    channels_out, per_group, kh, kw = weight.shape
    taps = per_group * kh * kw
    positions = grad_out.shape[2] * grad_out.shape[3]
    g = grad_out.reshape(n, groups, channels_out // groups, positions)
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        w = weight.reshape(groups, channels_out // groups, taps)
        columns = torch.einsum("gok,ngol->ngkl", w, g).reshape(n, groups * taps, positions)
        grad_input = aten.col2im(columns, [height, width], [kh, kw], list(dilation), list(padding), list(stride))
        grad_input = grad_input.squeeze(2) if one_d else grad_input
    if output_mask[1]:
        windows = aten.im2col(x, [kh, kw], list(dilation), list(padding), list(stride))
        windows = windows.reshape(n, groups, taps, positions)
        grad_weight = torch.einsum("ngol,ngkl->gok", g, windows).reshape(weight.shape)
        grad_weight = grad_weight.squeeze(2) if one_d else grad_weight
    if output_mask[2]:
        grad_bias = grad_out.sum(dim=[0, 2, 3])
    return grad_input, grad_weight, grad_bias


def _windows(t, kernel, stride, padding, dilation):
    """t [n, c, *spatial] read as its convolution windows [n, c, *positions, *kernel] (zero
    padding, strides and dilation as a convolution's): unfold along each spatial axis."""
    spatial = t.dim() - 2
    pads = [p for a in reversed(range(spatial)) for p in (padding[a], padding[a])]
    t = torch.nn.functional.pad(t, pads)
    for a in range(spatial):
        t = t.unfold(2 + a, dilation[a] * (kernel[a] - 1) + 1, stride[a])
        if dilation[a] > 1:
            t = t[..., ::dilation[a]]
    return t


def _volume_convolution_backward(grad_out, x, weight, stride, padding, dilation, transposed, output_padding,
                                 groups, output_mask):
    """(grad_input, grad_weight, grad_bias) of a 3-D convolution, plain or transposed. The input's
    gradient is the convolution running the other way by the same weight (a transposed one for a
    plain convolution, its output padding the rows the forward's last stride left unread); the
    weight's, the plain convolution's input (or the transposed one's output gradient) read as
    windows, contracted with the other operand over the batch and the positions."""
    n, spatial = x.shape[0], x.shape[2:]
    kernel = weight.shape[2:]
    grad_input = grad_weight = grad_bias = None
    if output_mask[0] and transposed:
        grad_input = torch.nn.functional.conv3d(grad_out, weight, None, stride, padding, dilation, groups)
        grad_input = grad_input[:, :, :spatial[0], :spatial[1], :spatial[2]]
    elif output_mask[0]:
        unread = [size - ((out - 1) * s - 2 * p + d * (k - 1) + 1) for size, out, s, p, d, k in
                  zip(spatial, grad_out.shape[2:], stride, padding, dilation, kernel)]
        grad_input = torch.nn.functional.conv_transpose3d(grad_out, weight, None, stride, padding, unread, groups,
                                                          dilation)
    if output_mask[1]:
        taps = math.prod(kernel)
        if transposed:  # weight [C_in, C_out/g, *k]: x's pixels against the output gradient's windows
            windows = _windows(grad_out, kernel, stride, padding, dilation)
            windows = windows[:, :, :spatial[0], :spatial[1], :spatial[2]]
            pixels = x.reshape(n, groups, x.shape[1] // groups, -1)
            windows = windows.reshape(n, groups, weight.shape[1], -1, taps)
            grad_weight = torch.einsum("ngil,ngolk->giok", pixels, windows)
        else:  # weight [C_out, C_in/g, *k]: the output gradient against x's windows
            windows = _windows(x, kernel, stride, padding, dilation).reshape(n, groups, weight.shape[1], -1, taps)
            grads = grad_out.reshape(n, groups, grad_out.shape[1] // groups, -1)
            grad_weight = torch.einsum("ngol,ngilk->goik", grads, windows)
        grad_weight = grad_weight.reshape(weight.shape)
    if output_mask[2]:
        grad_bias = grad_out.sum(dim=[0, 2, 3, 4])
    return grad_input, grad_weight, grad_bias


def _transposed_convolution_backward(grad_out, x, weight, stride, padding, dilation, groups, output_mask):
    """(grad_input, grad_weight, grad_bias) of a 2-D transposed convolution (weight [C_in, C_out/g,
    kh, kw]). Its input's gradient is the plain convolution of the output gradient by the same
    weight and stride; its weight's, the input contracted with the output gradient's windows
    (im2col), one window per input pixel. Where output_padding is as large as the stride (a
    dilation allows it) its extra rows make windows past the last pixel: they are dropped."""
    n, channels_in, height, width = x.shape
    _, per_group_out, kh, kw = weight.shape
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        grad_input = torch.nn.functional.conv2d(grad_out, weight, None, stride, padding, dilation, groups)
        grad_input = grad_input[:, :, :height, :width]
    if output_mask[1]:
        windows = aten.im2col(grad_out, [kh, kw], list(dilation), list(padding), list(stride))
        across = [(size + 2 * p - d * (k - 1) - 1) // s + 1 for size, p, d, k, s in
                  zip(grad_out.shape[2:], padding, dilation, (kh, kw), stride)]
        windows = windows.reshape(n, groups * per_group_out * kh * kw, *across)[:, :, :height, :width]
        windows = windows.reshape(n, groups, per_group_out * kh * kw, height * width)
        pixels = x.reshape(n, groups, channels_in // groups, height * width)
        grad_weight = torch.einsum("ngil,ngkl->gik", pixels, windows).reshape(weight.shape)
    if output_mask[2]:
        grad_bias = grad_out.sum(dim=[0, 2, 3])
    return grad_input, grad_weight, grad_bias


def _fold_extent(pooled: int, kernel: int, stride: int, dilation: int) -> int:
    """The extent `pooled` windows tile exactly from the padded input's start (what col2im takes,
    with no padding of its own: its symmetric padding would drop a real pixel where the windows
    stop short of the padded end, as k=3, s=2, p=1 on an even input does)."""
    return (pooled - 1) * stride + dilation * (kernel - 1) + 1


def _tap_positions(pooled: int, kernel: int, stride: int, padding: int, dilation: int):
    """[kernel, pooled]: the input position each tap of each window reads along an axis."""
    return (torch.arange(pooled) * stride - padding).unsqueeze(0) + torch.arange(kernel).unsqueeze(1) * dilation


def _folded(taps_values, n, channels, kernel, dilation, padding, stride, size):
    """Per-window tap values [n, c, kh, kw, ho, wo] summed onto the pixels [n, c, h, w]: folded
    over the padded input, then cut to the input (taps in the padding, or past the input's end in
    ceil_mode, carry nothing to keep) and padded where no window reaches its end."""
    (kh, kw), (h, w), (ph, pw) = kernel, size, padding
    eh, ew = (_fold_extent(p, k, s, d) for p, k, s, d in zip(taps_values.shape[-2:], kernel, stride, dilation))
    columns = taps_values.reshape(n, channels * kh * kw, -1)
    pixels = aten.col2im(columns, [eh, ew], [kh, kw], list(dilation), [0, 0], list(stride))
    pixels = pixels[:, :, ph:ph + h, pw:pw + w]
    return torch.nn.functional.pad(pixels, (0, w - pixels.shape[3], 0, h - pixels.shape[2]))


def _as_batched(x, grad_out, *more):
    if x.dim() == 3:
        return True, (x.unsqueeze(0), grad_out.unsqueeze(0), *(t.unsqueeze(0) for t in more))
    return False, (x, grad_out, *more)


def max_pool2d_backward(grad_out, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    """Each window's gradient goes to the tap its forward chose (indices: flat positions in the
    plane), summed where windows overlap."""
    unbatched, (x, grad_out, indices) = _as_batched(x, grad_out, indices)
    kernel, stride, padding, dilation = _pairs(kernel_size, stride or kernel_size, padding, dilation)
    n, channels, h, w = x.shape
    ho, wo = grad_out.shape[2:]
    rows, cols = (_tap_positions(p, k, s, pad, d) for p, k, s, pad, d in zip((ho, wo), kernel, stride, padding, dilation))
    # a tap outside the input may name another pixel's flat position, but what it carries lands
    # outside the input and is cut
    flat = (rows[:, None, :, None] * w + cols[None, :, None, :]).to(x.device)
    chosen = indices.unsqueeze(2).unsqueeze(2) == flat  # [n, c, kh, kw, ho, wo]
    values = torch.where(chosen, grad_out.unsqueeze(2).unsqueeze(2), 0)
    grad = _folded(values, n, channels, kernel, dilation, padding, stride, (h, w))
    return grad.squeeze(0) if unbatched else grad


def avg_pool2d_backward(grad_out, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override=None):
    """Each window's gradient over its divisor, spread on its taps (those in the padding dropped)."""
    unbatched, (x, grad_out) = _as_batched(x, grad_out)
    kernel, stride, padding = _pairs(kernel_size, stride or kernel_size, padding)
    n, channels, h, w = x.shape
    ho, wo = grad_out.shape[2:]
    divisor = _avg_divisor(h, ho, kernel[0], stride[0], padding[0], count_include_pad)[:, None] * \
        _avg_divisor(w, wo, kernel[1], stride[1], padding[1], count_include_pad)[None, :]
    if divisor_override:
        divisor = torch.full_like(divisor, divisor_override)
    share = (grad_out / divisor.to(grad_out.device, grad_out.dtype)).unsqueeze(2).unsqueeze(2)
    values = share.expand(n, channels, kernel[0], kernel[1], ho, wo)
    grad = _folded(values, n, channels, kernel, (1, 1), padding, stride, (h, w))
    return grad.squeeze(0) if unbatched else grad


def _avg_divisor(size: int, pooled: int, kernel: int, stride: int, padding: int, count_include_pad: bool):
    """Per window along one axis, how many of its taps it averages (torch's CPU rule: the window
    clipped to the padded input, or to the input itself without count_include_pad)."""
    start = torch.arange(pooled) * stride - padding
    end = torch.clamp(start + kernel, max=size + padding)
    if count_include_pad:
        return (end - start).to(torch.float64)
    return (torch.clamp(end, max=size) - torch.clamp(start, min=0)).to(torch.float64)


def adaptive_avg_pool2d_backward(grad_out, x):
    """Adaptive average pooling is separable: out = A_h x A_w^T with A's rows averaging torch's
    windows [floor(i*H/Ho), ceil((i+1)*H/Ho)); the gradient is A_h^T g A_w."""
    rows = _adaptive_matrix(x.shape[-2], grad_out.shape[-2]).to(grad_out.device, grad_out.dtype)
    cols = _adaptive_matrix(x.shape[-1], grad_out.shape[-1]).to(grad_out.device, grad_out.dtype)
    return torch.einsum("ih,...ij,jw->...hw", rows, grad_out, cols)


def adaptive_avg_pool3d_backward(grad_out, x):
    """The 3-D form of adaptive_avg_pool2d_backward: A_d^T, A_h^T, A_w^T applied to the gradient."""
    depth, rows, cols = (_adaptive_matrix(x.shape[k], grad_out.shape[k]).to(grad_out.device, grad_out.dtype)
                         for k in (-3, -2, -1))
    return torch.einsum("id,jh,kw,...ijk->...dhw", depth, rows, cols, grad_out)


def avg_pool3d_backward(grad_out, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override=None):
    """Average pooling is separable (a box's tap count, clipped or not, is the product of its axes'
    counts), so its gradient is a matrix per axis applied to the gradient: A[o, i] = 1 / divisor[o]
    where input position i is a tap of window o."""
    kernel, stride, padding = (_triples(v) for v in (kernel_size, stride or kernel_size, padding))
    matrices = []
    for axis in range(3):
        size, pooled = x.shape[axis - 3], grad_out.shape[axis - 3]
        start = torch.arange(pooled).unsqueeze(1) * stride[axis] - padding[axis]
        at = torch.arange(size).unsqueeze(0)
        taps = ((at >= start) & (at < start + kernel[axis])).to(torch.float64)
        divisor = _avg_divisor(size, pooled, kernel[axis], stride[axis], padding[axis], count_include_pad)
        matrices.append((taps if divisor_override else taps / divisor.unsqueeze(1)).to(grad_out.device,
                                                                                    grad_out.dtype))
    grad = torch.einsum("id,jh,kw,...ijk->...dhw", *matrices, grad_out)
    return grad / divisor_override if divisor_override else grad


def _triples(value):
    return tuple(value) * (3 // len(value)) if isinstance(value, (list, tuple)) else (value,) * 3


def adaptive_max_pool2d_backward(grad_out, x, indices):
    """adaptive_max_pool2d's gradient: each output's gradient added at the input position its index
    names (flat over the plane, as torch's indices are). A scatter_add, not a gather: adaptive windows
    differ in size, so no fixed set of taps reaches a pixel."""
    return _added_at_indices(grad_out, x, indices, spatial=2)


def adaptive_max_pool3d_backward(grad_out, x, indices):
    return _added_at_indices(grad_out, x, indices, spatial=3)


def fractional_max_pool2d_backward(grad_out, x, kernel_size, output_size, indices):
    """fractional_max_pool2d's gradient: its windows overlap and differ per plane, so each output's
    gradient is added at the position its index names, as adaptive max pooling's."""
    return _added_at_indices(grad_out, x, indices, spatial=2)


def fractional_max_pool3d_backward(grad_out, x, kernel_size, output_size, indices):
    return _added_at_indices(grad_out, x, indices, spatial=3)


def _added_at_indices(grad_out, x, indices, spatial: int):
    lead = x.shape[:x.dim() - spatial]
    grad = torch.zeros(*lead, math.prod(x.shape[x.dim() - spatial:]), dtype=grad_out.dtype, device=grad_out.device)
    return grad.scatter_add(-1, indices.reshape(*lead, -1), grad_out.reshape(*lead, -1)).reshape(x.shape)


def replication_pad_backward(grad_out, x, padding):
    """replication_pad1d/2d/3d's gradient: per padded axis, the strips padding took from an edge
    summed back onto that edge (padding pairs run from the last axis, as F.pad's)."""
    if any(p < 0 for p in padding):
        return NotImplemented  # a crop: torch's kernel
    grad = grad_out
    for k in range(len(padding) // 2):
        axis, before, after = grad.dim() - 1 - k, padding[2 * k], padding[2 * k + 1]
        size = x.shape[axis]
        core = grad.narrow(axis, before, size)
        edges = []
        if before:
            edges.append((grad.narrow(axis, 0, before).sum(axis, keepdim=True), 0))
        if after:
            edges.append((grad.narrow(axis, before + size, after).sum(axis, keepdim=True), size - 1))
        for strip, at in edges:  # the strip's sum placed at its edge, zeros elsewhere along the axis
            spread = [0, 0] * (grad.dim() - 1 - axis) + [at, size - 1 - at]
            core = core + torch.nn.functional.pad(strip, spread)
        grad = core
    return grad


def pdist_backward(grad, x, p: float, distances):
    """torch.pdist's gradient: the pair gradients placed in a symmetric (N, N) matrix (pair i < j at
    [i, j] and [j, i]) and taken through cdist_backward of x against itself."""
    n = x.shape[0]
    rows, cols = torch.triu_indices(n, n, 1)
    pairs = torch.zeros(n, n, dtype=grad.dtype, device=grad.device).index_put((rows, cols), grad)
    full = torch.zeros(n, n, dtype=distances.dtype, device=distances.device).index_put((rows, cols), distances)
    return cdist_backward(pairs + pairs.t(), x, x, p, full + full.t())


def _adaptive_matrix(size: int, pooled: int):
    i = torch.arange(pooled).unsqueeze(1)
    at = torch.arange(size).unsqueeze(0)
    start, end = (i * size) // pooled, ((i + 1) * size + pooled - 1) // pooled
    return ((at >= start) & (at < end)).to(torch.float64) / (end - start)


def _pairs(*values):
    return [tuple(v) * (2 // len(v)) if isinstance(v, (list, tuple)) else (v, v) for v in values]


def cdist_backward(grad, x1, x2, p: float, distances):
    """x1's gradient of torch.cdist(x1, x2, p) (x2's is this with the two swapped): over every
    x2 row j, grad[i, j] times the derivative of the p-norm of x1[i] - x2[j], as torch defines it
    (0 where the distance is 0; for p = inf only the coordinates at the maximum)."""
    diff = x1.unsqueeze(-2) - x2.unsqueeze(-3)  # [..., P, R, M]
    g = grad.unsqueeze(-1)
    dist = distances.unsqueeze(-1)
    if p == 0:
        return torch.zeros_like(x1)
    if p == 1:
        each = diff.sign()
    elif p == math.inf:
        each = diff.sign() * (diff.abs() == dist)
    elif p == 2:
        each = torch.where(dist == 0, 0.0, diff / dist)
    else:
        each = torch.where(dist == 0, 0.0, diff * diff.abs().pow(p - 2) / dist.pow(p - 1))
        if p < 2:  # |diff|^(p-2) is infinite at diff = 0, where the derivative is 0
            each = torch.where(diff == 0, 0.0, each)
    return (g * each).sum(-2)


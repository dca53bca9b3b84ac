"""emmy's spellings of the backward ops a training graph holds (emmy.capture.backward_ops), each
checked in eager torch against torch's own op over the forms real models use, and the training
table (emmy.capture.training) checked to hold them and no decomposition that changes what an op's
backward reads."""

import math

import pytest
import torch
import torch.nn.functional as F

from emmy.capture import backward_ops, grid_sampling
from emmy.capture.training import training_decomposition_table

aten = torch.ops.aten


@pytest.mark.parametrize("shape, weight, stride, padding, dilation, groups", [
    ((2, 4, 9, 9), (6, 4, 3, 3), [1, 1], [1, 1], [1, 1], 1),
    ((2, 4, 11, 10), (6, 4, 3, 2), [2, 3], [1, 0], [1, 1], 1),  # strides that skip pixels
    ((1, 6, 9, 9), (6, 2, 3, 3), [1, 1], [2, 2], [2, 2], 3),  # grouped and dilated
    ((2, 4, 7, 7), (4, 1, 3, 3), [2, 2], [1, 1], [1, 1], 4),  # depthwise
    ((2, 3, 8, 8), (5, 3, 1, 1), [1, 1], [0, 0], [1, 1], 1),  # pointwise
    ((2, 4, 13), (5, 4, 3), [2], [1], [1], 1),  # 1-D
    ((2, 4, 13), (4, 2, 5), [1], [4], [2], 2),  # 1-D, grouped and dilated
], ids=["plain", "strided", "grouped_dilated", "depthwise", "pointwise", "conv1d", "conv1d_grouped"])
def test_convolution_backward_matches_torch(shape, weight, stride, padding, dilation, groups):
    torch.manual_seed(0)
    x, w = torch.randn(shape, dtype=torch.float64), torch.randn(weight, dtype=torch.float64)
    out = aten.convolution(x, w, None, stride, padding, dilation, False, [0] * len(stride), groups)
    grad = torch.randn_like(out)
    args = (grad, x, w, [weight[0]], stride, padding, dilation, False, [0] * len(stride), groups)
    want = aten.convolution_backward(*args, [True, True, True])
    got = backward_ops.convolution_backward(*args, [True, True, True])
    for g, t in zip(got, want):
        torch.testing.assert_close(g, t)
    only_weight = backward_ops.convolution_backward(*args, [False, True, False])
    assert only_weight[0] is None and only_weight[2] is None


@pytest.mark.parametrize("spatial, transposed", [(3, False), (3, True), (2, True)],
                         ids=["conv3d", "conv_transpose3d", "conv_transpose2d"])
def test_convolution_backward_matches_torch_over_drawn_geometries(spatial, transposed):
    """Kernels, strides, dilations, paddings, output paddings, groups and sizes drawn at random
    (legal for torch) for the forms the named cases above do not sweep."""
    rng = torch.Generator().manual_seed(3)

    def draw(lo, hi, count=None):
        values = [int(torch.randint(lo, hi + 1, (), generator=rng)) for _ in range(count or 1)]
        return values if count else values[0]

    checked = 0
    while checked < 40:
        groups = draw(1, 2)
        kernel, stride, dilation = draw(1, 3, spatial), draw(1, 3, spatial), draw(1, 2, spatial)
        padding = [draw(0, dilation[a] * (kernel[a] - 1) if transposed else kernel[a] // 2) for a in range(spatial)]
        output_padding = [draw(0, max(stride[a], dilation[a]) - 1) if transposed else 0 for a in range(spatial)]
        x = torch.randn(2, 2 * groups, *draw(1, 5, spatial), dtype=torch.float64, generator=rng)
        w = torch.randn(2 * groups if transposed else draw(1, 2) * groups, draw(1, 3) if transposed else 2, *kernel,
                        dtype=torch.float64, generator=rng)
        try:
            out = aten.convolution(x, w, None, stride, padding, dilation, transposed, output_padding, groups)
        except RuntimeError:
            continue  # an output of no positions, or a kernel wider than the padded input
        checked += 1
        args = (torch.randn_like(out), x, w, [out.shape[1]], stride, padding, dilation, transposed, output_padding,
                groups, [True, True, True])
        for got, want in zip(backward_ops.convolution_backward(*args), aten.convolution_backward(*args)):
            torch.testing.assert_close(got, want)


def _transposed_backward_matches_torch(x, w, stride, padding, output_padding, dilation, groups):
    out = aten.convolution(x, w, None, stride, padding, dilation, True, output_padding, groups)
    grad = torch.randn_like(out)
    args = (grad, x, w, [w.shape[1] * groups], stride, padding, dilation, True, output_padding, groups)
    for got, want in zip(backward_ops.convolution_backward(*args, [True, True, True]),
                         aten.convolution_backward(*args, [True, True, True])):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("shape, weight, stride, padding, output_padding, dilation, groups", [
    ((2, 4, 5, 5), (4, 3, 4, 4), [2, 2], [1, 1], [0, 0], [1, 1], 1),  # a DCGAN / U-Net upsampling
    ((2, 4, 5, 6), (4, 3, 3, 3), [2, 2], [1, 1], [1, 1], [1, 1], 1),  # output_padding
    ((1, 6, 4, 4), (6, 2, 3, 2), [3, 1], [2, 0], [1, 0], [2, 1], 3),  # grouped, dilated, uneven
    ((2, 3, 4, 4), (3, 2, 3, 3), [1, 1], [1, 1], [1, 1], [2, 2], 1),  # output_padding = stride (dilation)
    ((2, 4, 9), (4, 5, 4), [2], [1], [1], [1], 1),  # 1-D
], ids=["upsample", "output_padding", "grouped_dilated", "padding_past_windows", "conv1d"])
def test_transposed_convolution_backward_matches_torch(shape, weight, stride, padding, output_padding, dilation,
                                                       groups):
    torch.manual_seed(0)
    x, w = torch.randn(shape, dtype=torch.float64), torch.randn(weight, dtype=torch.float64)
    _transposed_backward_matches_torch(x, w, stride, padding, output_padding, dilation, groups)


@pytest.mark.parametrize("shape, kernel, stride, padding, dilation, ceil_mode", [
    ((2, 3, 8, 8), 2, 2, 0, 1, False),
    ((2, 3, 11, 11), 3, 2, 1, 1, False),  # windows overlap
    ((2, 3, 16, 16), 3, 2, 1, 1, False),  # ResNet's stem: on an even input the windows stop short of the padding
    ((2, 3, 10, 9), (3, 2), (2, 1), (1, 0), (1, 2), True),  # ceil_mode: a last window past the input
    ((3, 7, 7), 2, 2, 0, 1, True),  # unbatched
    ((1, 2, 5, 5), 2, 2, 0, 1, False),  # the last row and column in no window
], ids=["plain", "overlapping", "resnet_stem", "ceil_dilated", "unbatched", "uncovered"])
def test_max_pool_backward_matches_torch(shape, kernel, stride, padding, dilation, ceil_mode):
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=torch.float64)
    out, indices = aten.max_pool2d_with_indices(x, kernel, stride, padding, dilation, ceil_mode)
    grad = torch.randn_like(out)
    pairs = [list(v) if isinstance(v, tuple) else [v, v] for v in (kernel, stride, padding, dilation)]
    want = aten.max_pool2d_with_indices_backward(grad, x, *pairs, ceil_mode, indices)
    got = backward_ops.max_pool2d_backward(grad, x, *pairs, ceil_mode, indices)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("shape, kernel, stride, padding, ceil_mode, count_include_pad, divisor", [
    ((2, 3, 8, 8), [2, 2], [2, 2], [0, 0], False, True, None),
    ((2, 3, 9, 10), [3, 3], [2, 2], [1, 1], True, False, None),
    ((2, 3, 8, 12), [3, 3], [2, 2], [1, 1], False, True, None),  # windows stop short of the padding
    ((2, 3, 9, 10), [3, 2], [2, 1], [1, 1], True, True, None),
    ((3, 7, 7), [3, 3], [], [1, 1], False, True, 4),  # unbatched, stride defaults to the kernel, divisor_override
], ids=["plain", "ceil_excluding_pad", "short_of_padding", "ceil_including_pad", "unbatched_divisor"])
def test_avg_pool_backward_matches_torch(shape, kernel, stride, padding, ceil_mode, count_include_pad, divisor):
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=torch.float64)
    out = aten.avg_pool2d(x, kernel, stride, padding, ceil_mode, count_include_pad, divisor)
    grad = torch.randn_like(out)
    want = aten.avg_pool2d_backward(grad, x, kernel, stride, padding, ceil_mode, count_include_pad, divisor)
    got = backward_ops.avg_pool2d_backward(grad, x, kernel, stride, padding, ceil_mode, count_include_pad, divisor)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("shape, pooled", [((2, 3, 7, 7), (1, 1)), ((2, 3, 10, 7), (3, 4)), ((3, 5, 9), (5, 2))])
def test_adaptive_avg_pool_backward_matches_torch(shape, pooled):
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=torch.float64)
    grad = torch.randn_like(F.adaptive_avg_pool2d(x, pooled))
    torch.testing.assert_close(backward_ops.adaptive_avg_pool2d_backward(grad, x),
                               aten._adaptive_avg_pool2d_backward(grad, x))


@pytest.mark.parametrize("heads, key_heads, causal, mask, scale", [
    (4, 4, True, None, None),
    (4, 2, False, "float", 0.3),  # grouped heads, an additive mask with a row that sees no key
    (2, 2, False, None, None),
], ids=["causal", "grouped_masked", "plain"])
def test_attention_backward_matches_torch(heads, key_heads, causal, mask, scale):
    torch.manual_seed(0)
    q = torch.randn(2, heads, 5, 8)
    k, v = torch.randn(2, key_heads, 6, 8), torch.randn(2, key_heads, 6, 8)
    attn_mask = None
    if mask:
        seen = torch.rand(5, 6) > 0.4
        seen[2] = False
        attn_mask = torch.zeros(5, 6).masked_fill(~seen, float("-inf"))
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=attn_mask, scale=scale)
    grad = torch.randn_like(out)
    args = (grad, q, k, v, out, lse, 0.0, causal)
    want = aten._scaled_dot_product_flash_attention_for_cpu_backward(*args, attn_mask=attn_mask, scale=scale)
    got = backward_ops.flash_attention_backward(*args, attn_mask=attn_mask, scale=scale)
    for g, t in zip(got, want):
        torch.testing.assert_close(g, t, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, float("inf")])
@pytest.mark.parametrize("shapes", [((4, 3), (5, 3)), ((2, 4, 3), (2, 6, 3))], ids=["rows", "batched"])
def test_cdist_backward_matches_torch(p, shapes):
    torch.manual_seed(0)
    x1, x2 = (torch.randn(shape, dtype=torch.float64) for shape in shapes)
    x2[..., 0, :] = x1[..., 0, :]  # a distance of 0
    x2[..., 1, 0] = x1[..., 1, 0]  # a coordinate difference of 0 (|d|^(p-2) infinite for p < 2)
    distances = torch.cdist(x1, x2, p)
    grad = torch.randn_like(distances)
    torch.testing.assert_close(backward_ops.cdist_backward(grad, x1, x2, p, distances),
                               aten._cdist_backward(grad, x1, x2, p, distances))


@pytest.mark.parametrize("mode", [0, 1], ids=["linear", "nearest"])
@pytest.mark.parametrize("padding", [0, 1, 2], ids=["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("spatial", [(5, 6), (4, 5, 3)], ids=["2d", "3d"])
def test_grid_sampler_forward_and_backward_match_torch(mode, padding, align_corners, spatial):
    torch.manual_seed(0)
    x = torch.randn(2, 3, *spatial, dtype=torch.float64)
    samples = (4, 7) if len(spatial) == 2 else (3, 2, 4)
    grid = torch.rand(2, *samples, len(spatial), dtype=torch.float64) * 3.4 - 1.7  # past the input: padding
    grad = torch.randn(2, 3, *samples, dtype=torch.float64)
    forward = aten.grid_sampler_2d if len(spatial) == 2 else aten.grid_sampler_3d
    backward = aten.grid_sampler_2d_backward if len(spatial) == 2 else aten.grid_sampler_3d_backward
    torch.testing.assert_close(grid_sampling.grid_sampler(x, grid, mode, padding, align_corners),
                               forward(x, grid, mode, padding, align_corners))
    want = backward(grad, x, grid, mode, padding, align_corners, [True, True])
    got = grid_sampling.grid_sampler_backward(grad, x, grid, mode, padding, align_corners, [True, True])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    for spelled in (grid_sampling.grid_sampler(x, grid, 2, padding, align_corners),
                    grid_sampling.grid_sampler_backward(grad, x, grid, 2, padding, align_corners, [True, True])):
        assert spelled is NotImplemented  # bicubic stays torch's


def test_the_training_table_holds_the_backward_ops_and_not_torchs_attention_decomposition():
    """torch's decomposition of the CPU attention op returns the attention weights where the op
    returns the log-sum-exp its backward reads: a training graph built with it gets wrong q/k/v
    gradients, so neither table may hold it."""
    from emmy.capture.exporting import decomposition_table

    table = training_decomposition_table()
    assert aten._scaled_dot_product_flash_attention_for_cpu.default not in table
    assert aten._scaled_dot_product_flash_attention_for_cpu.default not in decomposition_table()
    for op, spelled in [(aten.convolution_backward, backward_ops.convolution_backward),
                        (aten.max_pool2d_with_indices_backward, backward_ops.max_pool2d_backward),
                        (aten.avg_pool2d_backward, backward_ops.avg_pool2d_backward),
                        (aten._adaptive_avg_pool2d_backward, backward_ops.adaptive_avg_pool2d_backward),
                        (aten._scaled_dot_product_flash_attention_for_cpu_backward,
                         backward_ops.flash_attention_backward),
                        (aten._cdist_backward, backward_ops.cdist_backward),
                        (aten._pdist_backward, backward_ops.pdist_backward),
                        (aten.avg_pool3d_backward, backward_ops.avg_pool3d_backward),
                        (aten._adaptive_avg_pool3d_backward, backward_ops.adaptive_avg_pool3d_backward),
                        (aten.adaptive_max_pool2d_backward, backward_ops.adaptive_max_pool2d_backward),
                        (aten.adaptive_max_pool3d_backward, backward_ops.adaptive_max_pool3d_backward),
                        (aten.fractional_max_pool2d_backward, backward_ops.fractional_max_pool2d_backward),
                        (aten.fractional_max_pool3d_backward, backward_ops.fractional_max_pool3d_backward),
                        (aten.replication_pad2d_backward, backward_ops.replication_pad_backward),
                        (aten.grid_sampler_2d_backward, grid_sampling.grid_sampler_backward),
                        (aten.grid_sampler_3d_backward, grid_sampling.grid_sampler_backward)]:
        assert table[op.default] is spelled
    assert aten._native_batch_norm_legit_functional.default in table


def test_pooling_and_convolution_backward_match_torch_over_drawn_geometries():
    """Sizes, kernels, strides, paddings, dilations and ceil_mode drawn at random (legal for
    torch): every geometry agrees with torch's op, not just the ones named above."""
    rng = torch.Generator().manual_seed(7)

    def draw(lo, hi):
        return int(torch.randint(lo, hi + 1, (), generator=rng))

    checked = 0
    while checked < 150:
        h, w = draw(3, 13), draw(3, 13)
        kernel, stride, dilation = [draw(1, 4), draw(1, 4)], [draw(1, 3), draw(1, 3)], [draw(1, 2), draw(1, 2)]
        padding = [draw(0, kernel[0] // 2), draw(0, kernel[1] // 2)]
        ceil_mode = bool(draw(0, 1))
        x = torch.randn(2, 3, h, w, dtype=torch.float64, generator=rng)
        try:
            out, indices = aten.max_pool2d_with_indices(x, kernel, stride, padding, dilation, ceil_mode)
            averaged = aten.avg_pool2d(x, kernel, stride, padding, ceil_mode, bool(checked % 2), None)
            convolved = aten.convolution(x, torch.randn(4, 3, *kernel, dtype=torch.float64, generator=rng), None,
                                         stride, padding, dilation, False, [0, 0], 1)
        except RuntimeError:
            continue  # a geometry torch refuses (an output of no positions, padding past half the kernel)
        checked += 1
        grad = torch.randn_like(out)
        torch.testing.assert_close(
            backward_ops.max_pool2d_backward(grad, x, kernel, stride, padding, dilation, ceil_mode, indices),
            aten.max_pool2d_with_indices_backward(grad, x, kernel, stride, padding, dilation, ceil_mode, indices))
        grad = torch.randn_like(averaged)
        args = (grad, x, kernel, stride, padding, ceil_mode, bool(checked % 2), None)
        torch.testing.assert_close(backward_ops.avg_pool2d_backward(*args), aten.avg_pool2d_backward(*args))
        weight = torch.randn(4, 3, *kernel, dtype=torch.float64, generator=rng)
        grad = torch.randn_like(convolved)
        args = (grad, x, weight, [4], stride, padding, dilation, False, [0, 0], 1, [True, True, True])
        for got, want in zip(backward_ops.convolution_backward(*args), aten.convolution_backward(*args)):
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize("kernel,stride,padding,ceil_mode,count_include_pad,divisor",
                         [((2, 2, 3), (2, 1, 2), (1, 0, 1), False, True, None),
                          ((3, 3, 3), (2, 2, 2), (1, 1, 1), True, False, None), ((2, 2, 2), [], 0, True, True, 3)])
def test_average_pooling_in_3d_backward_matches_torch(kernel, stride, padding, ceil_mode, count_include_pad, divisor):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 6, 7, dtype=torch.float64)
    out = F.avg_pool3d(x, kernel, stride or None, padding, ceil_mode, count_include_pad, divisor)
    grad = torch.randn_like(out)
    args = (grad, x, kernel, stride, padding, ceil_mode, count_include_pad, divisor)
    torch.testing.assert_close(backward_ops.avg_pool3d_backward(*args), aten.avg_pool3d_backward(*args))
    adaptive = torch.randn_like(F.adaptive_avg_pool3d(x, (2, 4, 3)))
    torch.testing.assert_close(backward_ops.adaptive_avg_pool3d_backward(adaptive, x),
                               aten._adaptive_avg_pool3d_backward(adaptive, x))


@pytest.mark.parametrize("shape,size", [((3, 5, 7), (3, 4)), ((2, 3, 5, 7), (3, 4)), ((2, 3, 5, 6, 7), (2, 3, 4)),
                                        ((3, 5, 6, 7), (2, 3, 4))], ids=["2d_unbatched", "2d", "3d", "3d_unbatched"])
def test_adaptive_max_pooling_backward_matches_torch(shape, size):
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=torch.float64)
    pool, ours, theirs = ((F.adaptive_max_pool2d, backward_ops.adaptive_max_pool2d_backward,
                           aten.adaptive_max_pool2d_backward) if len(size) == 2 else
                          (F.adaptive_max_pool3d, backward_ops.adaptive_max_pool3d_backward,
                           aten.adaptive_max_pool3d_backward))
    out, indices = pool(x, size, return_indices=True)
    grad = torch.randn_like(out)
    torch.testing.assert_close(ours(grad, x, indices), theirs(grad, x, indices))


@pytest.mark.parametrize("shape,kernel,size", [((2, 3, 9, 8), (2, 3), (4, 5)), ((3, 7, 9), (3, 3), (5, 4)),
                                              ((2, 2, 6, 7, 8), (2, 3, 2), (3, 4, 5))],
                         ids=["2d", "2d_unbatched", "3d"])
def test_fractional_max_pooling_backward_matches_torch(shape, kernel, size):
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=torch.float64)
    samples = torch.rand(shape[0] if len(shape) == len(kernel) + 2 else 1, shape[-len(kernel) - 1], len(kernel),
                         dtype=torch.float64)
    spatial = len(kernel)
    forward = aten.fractional_max_pool2d if spatial == 2 else aten.fractional_max_pool3d
    out, indices = forward(x, list(kernel), list(size), samples)
    grad = torch.randn_like(out)
    ours = getattr(backward_ops, f"fractional_max_pool{spatial}d_backward")
    theirs = getattr(aten, f"fractional_max_pool{spatial}d_backward")
    torch.testing.assert_close(ours(grad, x, list(kernel), list(size), indices),
                               theirs(grad, x, list(kernel), list(size), indices))


@pytest.mark.parametrize("padding,shape", [((2, 1), (3, 7)), ((2, 1, 0, 3), (3, 6, 7)),
                                           ((1, 2, 3, 0, 1, 1), (2, 3, 5, 6, 7)), ((1, 1, 1, 1), (2, 1, 7))])
def test_replication_padding_backward_matches_torch(padding, shape):
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=torch.float64)
    grad = torch.randn_like(F.pad(x, padding, mode="replicate"))
    theirs = getattr(aten, f"replication_pad{len(padding) // 2}d_backward")
    torch.testing.assert_close(backward_ops.replication_pad_backward(grad, x, list(padding)),
                               theirs(grad, x, list(padding)))


@pytest.mark.parametrize("p", [1.0, 1.5, 2.0, 3.0, math.inf])
def test_pdist_backward_matches_torch(p):
    torch.manual_seed(0)
    x = torch.randn(6, 4, dtype=torch.float64)
    distances = F.pdist(x, p)
    grad = torch.randn_like(distances)
    torch.testing.assert_close(backward_ops.pdist_backward(grad, x, p, distances),
                               aten._pdist_backward(grad, x, p, distances))

"""The decompositions of a training graph: what torch.compile's AOTAutograd hands emmy's backend
(emmy.dynamo), a forward that keeps what its backward reads and the backward itself.

torch.export's table is made for inference. The attention op a CPU training graph holds,
`_scaled_dot_product_flash_attention_for_cpu`, emmy lowers itself (its output and the log-sum-exp
its backward reads: torch's decomposition gives the attention weights there, and a causal attention
block's q/k/v gradients came out 0.8-4x off, torch 2.13). The backward ops torch keeps whole, or
spells as scatters, are emmy's own (emmy.capture.backward_ops); batch norm in training mode (batch
statistics, running statistics updated) and dropout take torch's decompositions, which export's
table leaves out.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


def dropout(x, p: float, train: bool | None):
    """native_dropout as a uniform draw > p: the draw runs eagerly (torch's generator, so
    torch.manual_seed repeats it; not eager dropout's stream), the mask and the scaling compile
    with the ops around them. The draw reads only x's shape, so it cuts no part in two."""
    if not train or p == 0 or p == 1 or not x.dtype.is_floating_point:
        from torch._decomp import decomposition_table

        return decomposition_table[aten.native_dropout.default](x, p, train)
    kept = torch.rand(x.shape, dtype=x.dtype, device=x.device) > p
    return kept * x * (1.0 / (1.0 - p)), kept


# emmy writes x[ids] += v as a match of every row against every id (emmy.decompose.scatter): work
# rows x ids x width where the sum needs ids x width. Past this many rows the match is over a
# thousand times the sum's work, and torch's own kernel does better.
DENSE_MATCH_ROWS = 1024


def embedding_backward(grad, ids, num_weights: int, padding_idx: int, scale_grad_by_freq: bool):
    """An embedding table's gradient: torch's decomposition (an index_put that adds up) for a small
    table, a position or token-type embedding; a vocabulary's stays torch's kernel (eager)."""
    if num_weights > DENSE_MATCH_ROWS:
        return NotImplemented
    from torch._decomp import decomposition_table

    return decomposition_table[aten.embedding_dense_backward.default](grad, ids, num_weights, padding_idx,
                                                                      scale_grad_by_freq)


def training_decomposition_table() -> dict:
    """emmy's decomposition table (emmy.capture.exporting) made right for a training graph."""
    from torch._decomp import get_decompositions

    from emmy.capture import backward_ops, grid_sampling
    from emmy.capture.exporting import decomposition_table

    table = decomposition_table()
    table.update(get_decompositions([aten._native_batch_norm_legit_functional.default]))
    table[aten.native_dropout.default] = dropout
    table[aten.embedding_dense_backward.default] = embedding_backward
    table.update({
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default: backward_ops.flash_attention_backward,
        aten.convolution_backward.default: backward_ops.convolution_backward,
        aten.max_pool2d_with_indices_backward.default: backward_ops.max_pool2d_backward,
        aten.avg_pool2d_backward.default: backward_ops.avg_pool2d_backward,
        aten._adaptive_avg_pool2d_backward.default: backward_ops.adaptive_avg_pool2d_backward,
        aten._cdist_backward.default: backward_ops.cdist_backward,
        aten._pdist_backward.default: backward_ops.pdist_backward,
        aten._adaptive_avg_pool3d_backward.default: backward_ops.adaptive_avg_pool3d_backward,
        aten.avg_pool3d_backward.default: backward_ops.avg_pool3d_backward,
        aten.adaptive_max_pool2d_backward.default: backward_ops.adaptive_max_pool2d_backward,
        aten.adaptive_max_pool3d_backward.default: backward_ops.adaptive_max_pool3d_backward,
        aten.fractional_max_pool2d_backward.default: backward_ops.fractional_max_pool2d_backward,
        aten.fractional_max_pool3d_backward.default: backward_ops.fractional_max_pool3d_backward,
        aten.replication_pad1d_backward.default: backward_ops.replication_pad_backward,
        aten.replication_pad2d_backward.default: backward_ops.replication_pad_backward,
        aten.replication_pad3d_backward.default: backward_ops.replication_pad_backward,
        aten.grid_sampler_2d_backward.default: grid_sampling.grid_sampler_backward,
        aten.grid_sampler_3d_backward.default: grid_sampling.grid_sampler_backward,
    })
    return table

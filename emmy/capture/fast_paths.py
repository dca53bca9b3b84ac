"""PyTorch's fused inference fast paths, spelled in the ops they fuse.

An `nn.TransformerEncoderLayer` (and so `nn.TransformerEncoder`) in eval mode under `no_grad` or
`inference_mode` calls one op, `aten._transformer_encoder_layer_fwd`, and an
`nn.MultiheadAttention` self-attention `aten._native_multi_head_attention`; torch.compile's graphs
hold them whole (torch.export's tracing does not take the fast path). They are decomposed here into
the layer norms, projections, attention and feed-forward block they compute, so emmy compiles the
layer instead of leaving it to eager.

The masks are those `MultiheadAttention.merge_masks` hands over: `mask_type` 0 an (L, L) attention
mask, 1 a (B, L) key padding mask, 2 a mask already expanded to (B, H, L, L). A mask is True, or
for a float mask nonzero, where a key is masked out: the fused kernels read a float mask as bool,
not as added to the scores (the Python layer hands over -inf where a key is masked and 0
elsewhere).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _broadcast_mask(mask: torch.Tensor, mask_type: int | None, batch: int, queries: int, keys: int) -> torch.Tensor:
    """The mask as (B, H, L, S) or something that broadcasts to it."""
    if mask_type == 1:
        return mask.view(batch, 1, 1, keys)
    if mask.dim() == 3:
        return mask.view(batch, -1, queries, keys)
    return mask


def _attention(query, key, value, embed_dim: int, heads: int, qkv_weight, qkv_bias, proj_weight, proj_bias,
               mask, mask_type):
    """(output, per-head weights) of a multi-head attention with packed q, k, v projections."""
    batch, queries, _ = query.shape
    keys = key.shape[1]
    head_dim = embed_dim // heads
    w_q, w_k, w_v = qkv_weight.split(embed_dim)
    b_q, b_k, b_v = qkv_bias.split(embed_dim)

    def heads_of(x, w, b, length):
        return F.linear(x, w, b).view(batch, length, heads, head_dim).transpose(1, 2)

    q = heads_of(query, w_q, b_q, queries)
    k = heads_of(key, w_k, b_k, keys)
    v = heads_of(value, w_v, b_v, keys)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(head_dim)
    if mask is not None:
        mask = _broadcast_mask(mask, mask_type, batch, queries, keys)
        # torch's fused kernels read a float mask as bool: any nonzero entry masks its key out
        scores = scores.masked_fill(mask if mask.dtype == torch.bool else mask != 0, float("-inf"))
    weights = scores.softmax(-1)
    out = (weights @ v).transpose(1, 2).reshape(batch, queries, embed_dim)
    return F.linear(out, proj_weight, proj_bias), weights


def native_multi_head_attention(query, key, value, embed_dim: int, num_head: int, qkv_weight, qkv_bias,
                                proj_weight, proj_bias, mask=None, need_weights: bool = True,
                                average_attn_weights: bool = True, mask_type: int | None = None):
    out, weights = _attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight,
                              proj_bias, mask, mask_type)
    if not need_weights:
        return out, torch.empty(0, dtype=out.dtype, device=out.device)
    return out, weights.mean(1) if average_attn_weights else weights


def transformer_encoder_layer(src, embed_dim: int, num_heads: int, qkv_weight, qkv_bias, proj_weight, proj_bias,
                              use_gelu: bool, norm_first: bool, eps: float, norm_weight_1, norm_bias_1,
                              norm_weight_2, norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2,
                              mask=None, mask_type: int | None = None):
    """One encoder layer: self-attention and a ReLU or GELU feed-forward block, each with its
    residual, layer norms before them (norm_first) or after."""
    def norm1(x):
        return F.layer_norm(x, (embed_dim,), norm_weight_1, norm_bias_1, eps)

    def norm2(x):
        return F.layer_norm(x, (embed_dim,), norm_weight_2, norm_bias_2, eps)

    def feed_forward(x):
        hidden = F.linear(x, ffn_weight_1, ffn_bias_1)
        hidden = F.gelu(hidden) if use_gelu else F.relu(hidden)
        return F.linear(hidden, ffn_weight_2, ffn_bias_2)

    def self_attention(x):
        return _attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                          mask, mask_type)[0]

    if norm_first:
        x = src + self_attention(norm1(src))
        return x + feed_forward(norm2(x))
    x = norm1(src + self_attention(src))
    return norm2(x + feed_forward(x))


def fast_path_decompositions() -> dict:
    aten = torch.ops.aten
    return {aten._transformer_encoder_layer_fwd.default: transformer_encoder_layer,
            aten._native_multi_head_attention.default: native_multi_head_attention}

"""Attention with a mask or bias read per query and key (a sparse pattern, a padding mask, a
relative-position bias): the tensor cores still take q, k and v, the score statements load the
mask per score element and never outside its buffer (keys past the end read the last key's), and
the cost model counts the mask's bytes."""

import math
from math import prod

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import emmy
from emmy.schedule.knobs import parse_pins
from emmy.schedule.shape import kernel_shape


class PatternBuffer(nn.Module):
    """minGPT's attention with a sparse pattern in its buffer of ones and zeros (each query sees
    itself and a random half of the keys): a mask no index guard describes, read per score (a
    causal triangle becomes guards instead: tests/test_index_values.py)."""

    def __init__(self, tokens: int):
        super().__init__()
        pattern = (torch.rand(tokens, tokens, generator=torch.Generator().manual_seed(3)) < 0.5).float()
        self.register_buffer("bias", torch.maximum(pattern, torch.eye(tokens)).view(1, 1, tokens, tokens))

    def forward(self, q, k, v):
        tokens = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :tokens, :tokens] == 0, float("-inf"))
        return F.softmax(att, dim=-1) @ v


class HeadBias(nn.Module):
    """An additive bias per head, query and key (T5's relative positions, ALiBi), in f32."""

    def __init__(self, heads: int, tokens: int):
        super().__init__()
        self.register_buffer("bias", torch.randn(heads, tokens, tokens))

    def forward(self, q, k, v):
        att = (q @ k.transpose(-2, -1)).float() + self.bias
        return (F.softmax(att, dim=-1).to(q.dtype)) @ v


def _inputs(tokens: int, seed: int = 0):
    torch.manual_seed(seed)
    return [torch.randn(1, 2, tokens, 16, dtype=torch.float16) for _ in range(3)]


class AdditiveMask(nn.Module):
    """sdpa with an f16 additive mask, as Hugging Face models pass one: causal and left padding,
    hidden keys at the type's least value (not -inf)."""

    def __init__(self, tokens: int):
        super().__init__()
        allowed = torch.ones(tokens, tokens, dtype=torch.bool).tril()
        allowed[:, :5] = False  # five padded keys
        allowed[:5, :5] = True
        hidden = torch.zeros(tokens, tokens, dtype=torch.float16).masked_fill(~allowed, torch.finfo(torch.float16).min)
        self.register_buffer("mask", hidden)

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask.to(q.dtype))


MODELS = {"pattern_buffer": PatternBuffer, "head_bias": lambda tokens: HeadBias(2, tokens)}
ROWS = {  # tensor cores: fragments from global memory, plain- and cp.async-staged K and V tiles
    "mma": "WORK=w1x1,TILE=mma_m16n8k16_f16_f32/f1x2/k1,REDUCE=,STAGE=,RASTER=",
    "mma_smem": "WORK=w1x1,TILE=mma_m16n8k16_f16_f32/f2x4/k1,REDUCE=,STAGE=d1/smem,RASTER=",
    "mma_async": "WORK=w2x1,TILE=mma_m16n8k16_f16_f32/f1x2/k1,REDUCE=,STAGE=d2/smem-async,RASTER=",
}


@pytest.fixture(scope="module", params=list(MODELS))
def masked(request):
    tokens = 70  # not a multiple of a key step: the last step's keys past 70 read nothing
    model = MODELS[request.param](tokens).eval()
    inputs = _inputs(tokens)
    program = emmy.optimize(model, *inputs)
    (kernel,) = [k for k in program.loop_ir.kernels if kernel_shape(k).kind == "attention"]
    return model, inputs, program, kernel


def test_a_masked_attention_is_a_tensor_core_kernel_that_counts_its_mask(masked):
    _, _, program, kernel = masked
    shape = kernel_shape(kernel)
    assert shape.mma == "f16" and shape.itemsize == 2  # q, k and v; the mask's type does not matter
    assert shape.score_bytes in (1, 4)  # the mask's element (bool) or the bias's (f32), per score


@pytest.mark.parametrize("row", list(ROWS))
def test_masked_attention_on_tensor_cores_reads_the_mask_inside_its_buffer_and_matches_torch(masked, row):
    model, inputs, program, kernel = masked
    variant = program.with_rows({kernel.name: parse_pins(ROWS[row])})
    assert "mma_m16n8k16" in variant.kernel_ir[0].knobs
    out = variant(*inputs, sim_mode="asan")
    with torch.no_grad():
        expected = model(*(t.float() for t in inputs))
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)


def _sdpa_with_mask(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _padding_mask(queries: int, keys: int, blind: int) -> torch.Tensor:
    """Keys past 3/4 hidden from every query, and query `blind` sees no key at all."""
    mask = torch.ones(queries, keys, dtype=torch.bool)
    mask[:, keys * 3 // 4:] = False
    mask[blind] = False
    return mask


def test_sdpa_with_a_mask_is_a_flash_kernel_that_reads_its_row_test():
    """The mask's row test (a query that sees no key gives 0) is a reduction of its own: fusing the
    scores into the flash kernel pays only with that test cut out of it, a move of two cuts at once
    (emmy.egraph.search); each alone costs more, so the scores used to be materialized. The test's
    kernel runs first and the flash kernel's epilogue reads it (its row values are computed after
    the fold: tile_ir.build), so the attention's output makes no second trip through memory."""
    inputs = [torch.randn(1, 8, 512, 64, dtype=torch.float16) for _ in range(3)]
    mask = _padding_mask(512, 512, blind=5)
    program = emmy.optimize(_sdpa_with_mask, *inputs, mask, stop_after="tile")
    kinds = [kernel_shape(k).kind for k in program.loop_ir.kernels]
    assert kinds == ["row", "attention"], kinds
    test, flash = program.loop_ir.kernels
    assert flash.output == program.loop_ir.outputs[0]  # the where of the row test is its epilogue
    assert prod(test.type.shape) * 64 == prod(flash.type.shape)  # a value per query and head


def test_an_additive_f16_mask_keeps_tensor_cores_at_a_model_s_size():
    inputs = [torch.randn(1, 8, 512, 64, dtype=torch.float16) for _ in range(3)]
    program = emmy.optimize(AdditiveMask(512).eval(), *inputs, stop_after="tile")
    (tile,) = [t for t in program.tile_ir.kernels if t.shape.kind == "attention"]
    assert tile.shape.mma == "f16" and tile.shape.score_bytes == 2
    assert any(b.row.tile.mma for b in program.ranked_rows(tile.kernel))  # tensor-core rows offered


def test_sdpa_with_a_mask_runs_right_with_a_query_that_sees_no_key():
    inputs = _inputs(40)
    mask = _padding_mask(40, 40, blind=3)
    program = emmy.optimize(_sdpa_with_mask, *inputs, mask)
    out = program(*inputs, mask, sim_mode="asan")
    expected = _sdpa_with_mask(*(t.float() for t in inputs), mask)
    assert torch.all(out[:, :, 3] == 0)
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)


class Alibi(nn.Module):
    """ALiBi (BLOOM, MPT): a bias per head of slope times the key's distance from the query, with a
    causal mask. The slope is a row value of the head; the flash kernel's fold reads it (computed
    in the walk over the keys: tile_ir.build), so the scores are never materialized."""

    def forward(self, q, k, v):
        heads, tokens = q.shape[1], q.shape[2]
        slopes = torch.tensor([2 ** (-8 * (h + 1) / heads) for h in range(heads)])
        pos = torch.arange(tokens)
        bias = (pos[None, :] - pos[:, None]).float()[None] * slopes[:, None, None]
        att = (q @ k.transpose(-1, -2)).float() / math.sqrt(q.size(-1)) + bias
        att = att.masked_fill(pos[None, :] > pos[:, None], float("-inf"))
        return F.softmax(att, dim=-1).to(q.dtype) @ v


SIMT_ROWS = {"simt": "WORK=t64,TILE=f2,REDUCE=,STAGE=,RASTER=",
             "simt_async": "WORK=t64,TILE=f2,REDUCE=,STAGE=d2/smem-async,RASTER="}


@pytest.mark.parametrize("row", list(ROWS) + list(SIMT_ROWS))
def test_alibi_is_one_flash_kernel_that_matches_torch(row):
    inputs = _inputs(70)
    model = Alibi()
    program = emmy.optimize(model, *inputs)
    (kernel,) = program.loop_ir.kernels
    assert kernel_shape(kernel).kind == "attention" and kernel_shape(kernel).key_bound is not None
    variant = program.with_rows({kernel.name: parse_pins({**ROWS, **SIMT_ROWS}[row])})
    out = variant(*inputs, sim_mode="asan")
    expected = model(*(t.float() for t in inputs))
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)


def test_a_padding_mask_is_read_per_key_not_per_score():
    """A mask every query reads alike (batch and key only) is staged traffic like K's, counted once a
    block of queries; one per query and key is counted per score."""
    q, k, v = (torch.randn(2, 4, 256, 32, dtype=torch.float16) for _ in range(3))
    per_key = torch.ones(2, 1, 1, 256, dtype=torch.bool)
    per_score = torch.ones(2, 1, 256, 256, dtype=torch.bool)
    shapes = {}
    for name, mask in (("key", per_key), ("score", per_score)):
        program = emmy.optimize(_sdpa_with_mask, q, k, v, mask, stop_after="loop")
        (shapes[name],) = [kernel_shape(k) for k in program.loop_ir.kernels if kernel_shape(k).kind == "attention"]
    assert (shapes["key"].key_bytes, shapes["key"].score_bytes) == (1, 0)
    assert (shapes["score"].key_bytes, shapes["score"].score_bytes) == (0, 1)


class PartialRotary(nn.Module):
    """GPT-NeoX's attention: rotary embeddings on the first quarter of each head's dimensions, the
    angles computed in forward from the positions, then causal sdpa. Fused into the scores, the
    query's rotation reads row values (its position's angles) inside the q.k dot, which the flash
    templates hold before they walk the keys: such a kernel must keep a form that builds."""

    def __init__(self, head: int = 8, rotary: int = 2):
        super().__init__()
        self.rotary = rotary
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, rotary, 2).float() / rotary)))

    def _rotate(self, x, cos, sin):
        r, rest = x[..., :self.rotary], x[..., self.rotary:]
        half = self.rotary // 2
        turned = torch.cat((-r[..., half:], r[..., :half]), dim=-1)
        return torch.cat((r * cos + turned * sin, rest), dim=-1)

    def forward(self, qkv):
        q, k, v = qkv.unbind(2)  # [B, H, 3, T, D]
        angles = torch.arange(q.size(-2)).float()[:, None] * self.inv_freq[None]
        emb = torch.cat((angles, angles), dim=-1)
        q, k = self._rotate(q, emb.cos(), emb.sin()), self._rotate(k, emb.cos(), emb.sin())
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_a_query_rotation_read_inside_the_dot_builds_and_matches_torch():
    torch.manual_seed(0)
    qkv = torch.randn(2, 4, 3, 12, 8)
    model = PartialRotary().eval()
    program = emmy.optimize(model, qkv)
    out = program(qkv, sim_mode="asan")
    torch.testing.assert_close(out, model(qkv), rtol=1e-4, atol=1e-4)

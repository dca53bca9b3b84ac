"""Training through torch.compile(backend="emmy"): the forward and the backward graph compile, run in
the simulator (ASan on), and a step's loss, gradients and running statistics equal eager torch's;
optimizer steps compile whole."""

import copy
import logging
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import emmy.dynamo

SIMULATE = {"simulate": True, "sim_mode": "asan"}


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden, self.norm, self.out = nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 8)

    def forward(self, x, labels):
        return F.cross_entropy(self.out(F.gelu(self.norm(self.hidden(x)))), labels)


class ConvNet(nn.Module):
    """Batch norm on batch statistics, strided / grouped / dilated / 1-D convolutions, overlapping
    and ceil-mode pooling, adaptive pooling: each one's backward compiled."""

    def __init__(self):
        super().__init__()
        self.stem, self.norm = nn.Conv2d(3, 6, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(6)
        self.depthwise = nn.Conv2d(6, 6, 3, padding=2, dilation=2, groups=3)
        self.line = nn.Conv1d(6, 5, 3, padding=1)
        self.head = nn.Linear(5 * 9, 4)

    def forward(self, x, labels):
        h = F.relu(self.norm(self.stem(F.max_pool2d(x, 3, 2, 1))))
        h = self.depthwise(h)
        h = F.avg_pool2d(h, 3, 2, 1, ceil_mode=True, count_include_pad=False) + F.adaptive_avg_pool2d(h, (2, 2))
        h = F.gelu(self.line(F.max_pool2d(h, 2, 1, ceil_mode=True).flatten(2)))
        return F.cross_entropy(self.head(F.adaptive_avg_pool1d(h, 9).flatten(1)), labels)


class TinyLM(nn.Module):
    """Embedding, causal attention with grouped key/value heads, RMSNorm, SiLU MLP, a vocabulary head."""

    def __init__(self, vocab=40, dim=32, heads=4, key_heads=2):
        super().__init__()
        self.heads, self.key_heads = heads, key_heads
        self.embed, self.norm = nn.Embedding(vocab, dim), nn.RMSNorm(dim)
        self.q, self.kv = nn.Linear(dim, dim), nn.Linear(dim, 2 * dim * key_heads // heads)
        self.o, self.up, self.down = nn.Linear(dim, dim), nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)
        self.lm_head = nn.Linear(dim, vocab)

    def forward(self, ids, targets):
        x = self.embed(ids)
        b, t, d = x.shape
        h = self.norm(x)
        q = self.q(h).view(b, t, self.heads, -1).transpose(1, 2)
        k, v = self.kv(h).view(b, t, self.key_heads, -1).transpose(1, 2).chunk(2, dim=-1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        x = x + self.down(F.silu(self.up(x)))
        return F.cross_entropy(self.lm_head(x).flatten(0, 1), targets.flatten())


class Upsampler(nn.Module):
    """A decoder's transposed convolutions (output padding, groups, 1-D) under a reconstruction loss."""

    def __init__(self):
        super().__init__()
        self.down = nn.Conv2d(2, 4, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(4, 4, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.norm = nn.BatchNorm2d(4)
        self.line = nn.ConvTranspose1d(4, 2, 4, stride=2, padding=1)

    def forward(self, x, target):
        h = F.relu(self.norm(self.up(F.relu(self.down(x)))))
        return F.mse_loss(self.line(h.mean(2)), target)


class Volume(nn.Module):
    """3-D convolutions, grouped and transposed (a video or medical-imaging encoder and decoder)."""

    def __init__(self):
        super().__init__()
        self.down = nn.Conv3d(2, 4, 3, stride=2, padding=1, groups=2)
        self.up = nn.ConvTranspose3d(4, 2, 2, stride=2)

    def forward(self, x, target):
        return F.mse_loss(self.up(F.relu(self.down(x))), target)


class Prototypes(nn.Module):
    """Metric learning: classes scored by the distance to learned prototypes (torch.cdist)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(6, 4)
        self.prototypes = nn.Parameter(torch.randn(5, 4))

    def forward(self, x, labels):
        return F.cross_entropy(-torch.cdist(self.embed(x), self.prototypes), labels)


class SpatialTransformer(nn.Module):
    """A spatial transformer: a predicted affine grid resamples the image (F.grid_sample)."""

    def __init__(self):
        super().__init__()
        self.locate = nn.Linear(2 * 5 * 5, 6)
        self.head = nn.Linear(2 * 4 * 4, 3)

    def forward(self, x, labels):
        theta = self.locate(x.flatten(1)).view(-1, 2, 3)
        warped = F.grid_sample(x, F.affine_grid(theta, [x.shape[0], 2, 4, 4], align_corners=False),
                               padding_mode="border", align_corners=False)
        return F.cross_entropy(self.head(warped.flatten(1)), labels)


class VolumeWarp(nn.Module):
    """3-D registration (VoxelMorph's spatial transformer): a predicted displacement field warps the
    moving volume onto the fixed one (trilinear grid_sample in 3-D, reflection padding)."""

    def __init__(self):
        super().__init__()
        self.flow = nn.Conv3d(2, 3, 3, padding=1)

    def forward(self, moving, fixed):
        displacement = self.flow(torch.cat([moving, fixed], 1)).permute(0, 2, 3, 4, 1) * 0.3
        identity = torch.eye(3, 4).expand(moving.shape[0], 3, 4)
        grid = F.affine_grid(identity, list(moving.shape), align_corners=False) + displacement
        warped = F.grid_sample(moving, grid, padding_mode="reflection", align_corners=False)
        return F.mse_loss(warped, fixed)


class RecurrentTagger(nn.Module):
    """A GRU encoder with attention pooling and a classifier: Dynamo skips such a frame whole unless
    its allow_rnn is on, which looking up emmy's backend turns on (emmy.dynamo)."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.GRU(6, 8, batch_first=True)
        self.score = nn.Linear(8, 1)
        self.head = nn.Linear(8, 3)

    def forward(self, x, labels):
        states, _ = self.encoder(x)
        weights = torch.softmax(self.score(states).squeeze(-1), dim=1)
        return F.cross_entropy(self.head((weights.unsqueeze(-1) * states).sum(1)), labels)


class SpectralRotary(nn.Module):
    """Meta's Llama rotary embedding (queries as complex numbers times a complex buffer) and FNet's
    token mixing (the real part of a 2-D FFT): complex tensors in the forward and backward graphs."""

    def __init__(self):
        super().__init__()
        self.q = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)
        angles = torch.outer(torch.arange(4.0), 1.0 / 10000 ** (torch.arange(0, 8, 2) / 8))
        self.register_buffer("freqs", torch.polar(torch.ones_like(angles), angles))

    def forward(self, x, labels):
        q = self.q(x)
        rotated = torch.view_as_real(torch.view_as_complex(q.reshape(*q.shape[:-1], -1, 2)) * self.freqs)
        mixed = torch.fft.fft2(rotated.flatten(-2)).real
        return F.cross_entropy(self.head(mixed.mean(1)), labels)


class PooledFeatures(nn.Module):
    """Replicate and circular padding, 3-D average pooling (ceil mode), adaptive 3-D average and 2-D
    max pooling, and torch.pdist between the samples' features: backward ops torch keeps whole."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(2, 4, 3)
        self.head = nn.Linear(4 * 4 + 4 * 4, 3)

    def forward(self, x, labels):
        h = self.conv(F.pad(x, (1, 1, 1, 1, 1, 1), mode="replicate"))
        h = F.avg_pool3d(h, 2, ceil_mode=True)
        averaged = F.adaptive_avg_pool3d(h, (1, 2, 2)).flatten(1)
        peaks = F.adaptive_max_pool2d(F.pad(h.mean(2), (1, 1, 1, 1), mode="circular"), (2, 2)).flatten(1)
        features = torch.cat([averaged, peaks], 1)
        return F.cross_entropy(self.head(features), labels) + 0.1 * F.pdist(features).mean()


MODELS = {
    "classifier": (Classifier, lambda: (torch.randn(4, 16), torch.randint(0, 8, (4,)))),
    "convnet": (ConvNet, lambda: (torch.randn(2, 3, 12, 12), torch.randint(0, 4, (2,)))),
    "tiny_lm": (TinyLM, lambda: (torch.randint(0, 40, (2, 6)), torch.randint(0, 40, (2, 6)))),
    "upsampler": (Upsampler, lambda: (torch.randn(2, 2, 6, 6), torch.randn(2, 2, 12))),
    "volume": (Volume, lambda: (torch.randn(1, 2, 4, 6, 4), torch.randn(1, 2, 4, 6, 4))),
    "prototypes": (Prototypes, lambda: (torch.randn(6, 6), torch.randint(0, 5, (6,)))),
    "spatial_transformer": (SpatialTransformer, lambda: (torch.randn(2, 2, 5, 5), torch.randint(0, 3, (2,)))),
    "pooled_features": (PooledFeatures, lambda: (torch.randn(3, 2, 5, 5, 5), torch.randint(0, 3, (3,)))),
    "spectral_rotary": (SpectralRotary, lambda: (torch.randn(2, 4, 8), torch.randint(0, 3, (2,)))),
    "recurrent_tagger": (RecurrentTagger, lambda: (torch.randn(2, 4, 6), torch.randint(0, 3, (2,)))),
    "volume_warp": (VolumeWarp, lambda: (torch.randn(2, 1, 4, 5, 3), torch.randn(2, 1, 4, 5, 3))),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_a_training_step_compiles_forward_and_backward_and_matches_eager(name, caplog):
    model_class, make_inputs = MODELS[name]
    torch.manual_seed(0)
    model = model_class()
    reference = copy.deepcopy(model)
    inputs = make_inputs()
    compiled = torch.compile(model, backend="emmy", dynamic=False, options=SIMULATE)
    with caplog.at_level(logging.INFO, logger="emmy"), warnings.catch_warnings():
        warnings.simplefilter("error")  # a part falling back to eager warns
        loss = compiled(*inputs)
        loss.backward()
    want = reference(*inputs)
    want.backward()
    torch.testing.assert_close(loss, want)
    scale = max(p.grad.abs().max() for p in reference.parameters())
    for (label, got), ref in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(got.grad, ref.grad, atol=1e-6 * scale, rtol=1e-4, msg=label)
    for got, ref in zip(model.buffers(), reference.buffers()):  # running statistics, updated
        torch.testing.assert_close(got, ref)
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "not supported" in m]
    compiled_parts = [m for m in messages if m.startswith("emmy: compiled fused_")]
    assert len(compiled_parts) == 2, compiled_parts  # the forward graph and the backward graph


@pytest.mark.parametrize("make_optimizer", [
    lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-2),
    lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1),
    # the multi-tensor steps optimizers take by default on CUDA tensors (_foreach_* ops)
    lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True, foreach=True),
    lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, amsgrad=True, foreach=True),
], ids=["sgd_momentum", "adamw", "sgd_nesterov_foreach", "adamw_amsgrad_foreach"])
def test_an_optimizer_step_compiles_whole(make_optimizer, caplog):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    reference = copy.deepcopy(model)
    optimizer, reference_optimizer = make_optimizer(model.parameters()), make_optimizer(reference.parameters())

    @torch.compile(backend="emmy", options=SIMULATE)
    def step():
        optimizer.step()

    x = torch.randn(5, 8)
    with caplog.at_level(logging.INFO, logger="emmy"):
        for _ in range(2):
            for net, opt, update in ((model, optimizer, step), (reference, reference_optimizer, reference_optimizer.step)):
                opt.zero_grad()
                net(x).square().mean().backward()
                update()
    for got, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got, want)
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "not supported" in m]  # Adam's lerp is an FMA: lowered
    assert any(m.startswith("emmy: compiled fused_") for m in messages)


def test_outputs_keep_the_strides_eager_gives():
    """emmy writes outputs contiguous; the code AOTAutograd wraps around a part, and the caller,
    see the layout torch traced (a transposed result stays transposed)."""
    def transposed(x):
        return (x * 2 + 1).t()

    x = torch.randn(5, 3)
    with torch.no_grad():
        got = torch.compile(transposed, backend="emmy", dynamic=False, options=SIMULATE)(x)
    want = transposed(x)
    torch.testing.assert_close(got, want)
    assert got.stride() == want.stride() == (1, 3)


def test_an_output_traced_as_a_broadcast_comes_back_with_its_values():
    """A result torch traced as an expand (stride 0) is not copied into that layout (the copy would
    write one place many times: BERT's training graph returned one)."""
    def spread(x):
        return (x.sum(0) * 2).expand(4, -1)

    x = torch.randn(3, 5)
    with torch.no_grad():
        got = torch.compile(spread, backend="emmy", dynamic=False, options=SIMULATE)(x)
    torch.testing.assert_close(got, spread(x))


def test_dropout_draws_eagerly_and_its_mask_and_gradient_compile(caplog, monkeypatch):
    """Training-mode dropout: the uniform draw runs eagerly from torch's generator (a seed repeats
    it), the mask, the 1/(1-p) scaling and the backward through the kept elements compile in the
    same parts as the ops around them."""
    monkeypatch.setattr(emmy.dynamo, "_REPORTED", set())  # unsupported ops are logged once a process
    torch.manual_seed(0)
    weight = nn.Parameter(torch.randn(6))
    drop = nn.Dropout(0.25).train()

    def layer(x):
        return drop(torch.tanh(x * weight))

    x = torch.randn(50, 6)
    compiled = torch.compile(layer, backend="emmy", dynamic=False, options=SIMULATE)
    with caplog.at_level(logging.INFO, logger="emmy"):
        y = compiled(x)
        y.sum().backward()
    kept = y != 0
    assert 0.6 < kept.float().mean() < 0.9
    activation = torch.tanh(x * weight.detach())
    torch.testing.assert_close(y[kept], activation[kept] / 0.75)
    torch.testing.assert_close(weight.grad, ((1 - activation**2) * x * kept / 0.75).sum(0))
    messages = [r.getMessage() for r in caplog.records]
    assert [m for m in messages if "not supported" in m] == ["emmy: aten.rand.default is not supported; it runs eagerly"]
    assert len([m for m in messages if m.startswith("emmy: compiled fused_")]) == 2  # one forward part, one backward
    with torch.no_grad():
        torch.manual_seed(3)
        first = compiled(x)
        torch.manual_seed(3)
        again, next_draw = compiled(x), compiled(x)
    assert torch.equal(first, again) and not torch.equal(again, next_draw)


@pytest.mark.parametrize("rows", [50, 5000], ids=["positions", "vocabulary"])
def test_an_embeddings_gradient_compiles_for_a_small_table_and_stays_torchs_for_a_vocabulary(rows, caplog, monkeypatch):
    """emmy adds up x[ids] += v as a match of every row against every id: a position table's
    gradient compiles, a vocabulary's (over 1024 rows: the match is 1000x the sum's work) stays
    torch's kernel; both are right."""
    monkeypatch.setattr(emmy.dynamo, "_REPORTED", set())
    torch.manual_seed(0)
    table = nn.Embedding(rows, 8)
    ids = torch.randint(0, rows, (2, 5))
    ids[1, 3] = ids[0, 0]  # a repeated id: its gradients add up
    compiled = torch.compile(lambda i: (table(i) * 2).tanh().sum(), backend="emmy", dynamic=False, options=SIMULATE)
    with caplog.at_level(logging.INFO, logger="emmy"):
        compiled(ids).backward()
    want = torch.zeros_like(table.weight).index_put_((ids,), (1 - (table.weight.detach()[ids] * 2).tanh() ** 2) * 2,
                                                     accumulate=True)
    torch.testing.assert_close(table.weight.grad, want)
    eager = [r.getMessage() for r in caplog.records if "not supported" in r.getMessage()]
    assert eager == ([] if rows <= 1024 else ["emmy: aten.embedding_dense_backward.default is not supported; it runs eagerly"])


def test_the_cpu_attention_op_gives_torchs_output_and_log_sum_exp():
    """The op a CPU training graph's attention is: its second output is each query's log-sum-exp
    (0 where the mask lets a query see no key), which its backward reads."""
    import emmy

    def attention(q, k, v, mask):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=mask,
                                                                          scale=0.4)

    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    seen = torch.rand(5, 6) > 0.4
    seen[3] = False
    mask = torch.zeros(5, 6).masked_fill(~seen, float("-inf"))
    program = emmy.optimize(attention, q, k, v, mask)
    for got, want in zip(program(q, k, v, mask, sim_mode="asan"), attention(q, k, v, mask)):
        torch.testing.assert_close(got, want)

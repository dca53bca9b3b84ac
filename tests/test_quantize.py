"""Fake quantization (emmy.decompose.quantize) bit for bit against torch's CPU kernels: the per-tensor,
per-channel, tensor-parameter and learnable forms, and quantization-aware training's fused
moving-average observer, whose running ranges, scales and zero points a call updates as eager does."""

import copy

import numpy as np

import pytest
import torch
import torch.ao.quantization as tq
import torch.nn as nn

import emmy


class FakeQuantForms(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.register_buffer("channel_scale", torch.rand(4) * 0.1 + 0.01)
        self.register_buffer("channel_zero", torch.randint(-5, 5, (4,), dtype=torch.int32))
        self.register_buffer("last_scale", torch.rand(5) * 0.1 + 0.01)
        self.register_buffer("learned_zero", torch.tensor([1.4, 2.5, 300.0, -3.0]))
        self.register_buffer("float_zero", torch.tensor([0.3, 1.5, -2.7, 2.5]))

    def forward(self, x, enabled):
        by_tensors = torch.ops.aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams
        return (*torch.ops.aten.fake_quantize_per_tensor_affine_cachemask(x, 0.037, 120, 0, 255),
                *by_tensors(x, torch.tensor([0.05]), torch.tensor([3], dtype=torch.int32), enabled, -128, 127),
                *torch.ops.aten.fake_quantize_per_channel_affine_cachemask(x, self.channel_scale, self.channel_zero, 1,
                                                                           -128, 127),
                torch.fake_quantize_per_channel_affine(x, self.last_scale, torch.zeros(5, dtype=torch.int32), 2, -8, 7),
                torch._fake_quantize_learnable_per_tensor_affine(x, torch.tensor([0.05]), torch.tensor([2.6]), 0, 255),
                torch._fake_quantize_learnable_per_channel_affine(x, self.channel_scale, self.learned_zero, 1, 0, 255),
                torch.fake_quantize_per_tensor_affine(x.half(), 0.05, 3, -128, 127),
                # float zero points: per channel rounded with x / scale, per tensor truncated to an integer
                *torch.ops.aten.fake_quantize_per_channel_affine_cachemask(x, self.channel_scale, self.float_zero, 1,
                                                                           -128, 127),
                *by_tensors(x, torch.tensor([0.05]), torch.tensor([2.7]), enabled, -128, 127))


def _equal(got, want):
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, (k, g.dtype, w.dtype)
        assert torch.equal(g, w), f"output {k}: {(g != w).sum().item()} elements differ"


@pytest.mark.parametrize("enabled", [1, 0])
def test_every_fake_quantization_form_matches_torch_bit_for_bit(enabled):
    torch.manual_seed(1)
    x, on = torch.randn(3, 4, 5) * 3, torch.tensor([enabled])
    program = emmy.optimize(FakeQuantForms(), x, on)
    _equal(program(x, on, device="interpret"), FakeQuantForms()(x, on))


def _prepared(backend: str):
    """A convolution and a linear layer prepared for QAT (weights per channel and symmetric under
    x86, per tensor under qnnpack; activations per tensor), observed once in training."""
    torch.manual_seed(2)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 5))
    model.train()
    model.qconfig = tq.get_default_qat_qconfig(backend)
    prepared = tq.prepare_qat(model)
    prepared(torch.randn(2, 3, 6, 6))
    return prepared.eval()  # observers stay on: each call moves the ranges


def _weight(program, key: str):
    """The program's copy of the buffer at `key` (named by its path, prefixed where it starts with a digit)."""
    name = key.replace(".", "_")
    return program.weights[name if name in program.weights else "w_" + name]


def _observed(program, model):
    """(emmy's buffer, eager's buffer) for each range, scale and zero point the observers keep."""
    state = model.state_dict()
    return [(_weight(program, key), state[key].numpy()) for key in state
            if key.endswith(("min_val", "max_val", "scale", "zero_point"))]


@pytest.mark.parametrize("backend", ["x86", "qnnpack"])
def test_a_qat_model_and_its_observers_follow_eager_call_after_call(backend):
    model = _prepared(backend)
    eager = copy.deepcopy(model)
    x = torch.randn(2, 3, 6, 6)
    program = emmy.optimize(model, x)
    for scale in (2.0, 0.5):  # the second call reads the ranges the first one moved
        x = torch.randn(2, 3, 6, 6) * scale
        assert torch.equal(program(x, device="interpret"), eager(x))
        observed = _observed(program, eager)
        assert len(observed) == 16
        for mine, theirs in observed:
            # a range is the min or max of an f32 convolution, which the interpreter sums in f64 and
            # rounds once, while eager's oneDNN sums in an order of its own (which depends on the
            # CPU): they may differ by an ulp, far less than a range moves between calls
            np.testing.assert_allclose(mine, theirs, rtol=1e-6, atol=0)


def test_a_qat_models_cuda_matches_eager_asan_clean():
    model = _prepared("x86")
    x = torch.randn(2, 3, 6, 6)
    program = emmy.optimize(copy.deepcopy(model), x)
    assert torch.equal(program(x, sim_mode="asan"), model(x))


def test_the_observer_chooses_torchs_parameters_for_edge_ranges():
    """Ranges that do not straddle 0, and one so narrow that its scale is raised to the small-scale
    cut (quant_utils' 6.1e-5): the scales and zero points are torch's."""
    torch.manual_seed(3)
    inputs = [torch.rand(6) + 1.0, -torch.rand(6) - 0.5, torch.full((6,), 1e-6) + torch.rand(6) * 1e-7,
              torch.randn(6) * 1e-6]
    for x in inputs:
        for symmetric in (False, True):
            observer = tq.FusedMovingAvgObsFakeQuantize(
                observer=tq.MovingAverageMinMaxObserver, quant_min=0 if not symmetric else -128,
                quant_max=255 if not symmetric else 127,
                dtype=torch.qint8 if symmetric else torch.quint8,
                qscheme=torch.per_tensor_symmetric if symmetric else torch.per_tensor_affine)
            eager = copy.deepcopy(observer)
            program = emmy.optimize(observer, x)
            assert torch.equal(program(x, device="interpret"), eager(x))
            for mine, theirs in _observed(program, eager):
                assert (mine == theirs).all(), (x, symmetric)


class LearnedStepLinear(nn.Module):
    """LSQ: a linear layer whose input scale and zero point, and its weight's per-channel ones, are
    parameters trained with it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(4)
        self.linear = nn.Linear(8, 6)
        self.scale, self.zero = nn.Parameter(torch.tensor([0.05])), nn.Parameter(torch.tensor([2.6]))
        self.channel_scale = nn.Parameter(torch.rand(6) * 0.02 + 0.005)
        self.channel_zero = nn.Parameter(torch.tensor([0.2, 1.6, -3.0, 2.5, 0.0, 4.4]))

    def forward(self, x):
        xq = torch._fake_quantize_learnable_per_tensor_affine(x, self.scale, self.zero, -128, 127, 0.5)
        wq = torch._fake_quantize_learnable_per_channel_affine(self.linear.weight, self.channel_scale,
                                                               self.channel_zero, 0, -8, 7, 1.0)
        return torch.nn.functional.linear(xq, wq, self.linear.bias)


def test_lsq_training_compiles_its_backward_and_gives_eagers_gradients(fresh_dynamo, caplog):
    import logging

    model = LearnedStepLinear()
    eager = copy.deepcopy(model)
    x = torch.randn(5, 8) * 4
    compiled = torch.compile(model, backend="emmy", dynamic=False, options={"simulate": True})
    with caplog.at_level(logging.INFO, logger="emmy"):
        compiled(x).square().mean().backward()
    assert not [r for r in caplog.records if "not supported" in r.getMessage()]
    eager(x).square().mean().backward()
    for (name, mine), (_, theirs) in zip(model.named_parameters(), eager.named_parameters()):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")


class Int8Linear(nn.Module):
    """The two int8 linear layers of quantized inference: dynamic activation quantization per row with
    an int8 x int8 -> int32 product (torch._int_mm, torchao's route) dequantized by row and column
    scales, and a weight-only int8 layer (aten._weight_int8pack_mm, gpt-fast's route on CPU)."""

    def __init__(self):
        super().__init__()
        weight = torch.randn(24, 64)
        self.register_buffer("weight_scale", weight.abs().amax(1) / 127)
        self.register_buffer("weight_q", (weight / self.weight_scale[:, None]).round().to(torch.int8))

    def forward(self, x):
        x_scale = x.abs().amax(1, keepdim=True) / 127
        x_q = (x / x_scale).round().clamp(-128, 127).to(torch.int8)
        dynamic = torch._int_mm(x_q, self.weight_q.t().contiguous()) * x_scale * self.weight_scale
        half = x.to(torch.bfloat16)
        weight_only = torch.ops.aten._weight_int8pack_mm(half, self.weight_q, self.weight_scale.to(torch.bfloat16))
        return dynamic, weight_only, torch._int_mm(x_q, x_q.t().contiguous())


def test_int8_products_of_quantized_inference_match_torch():
    torch.manual_seed(2)
    model, x = Int8Linear(), torch.randn(32, 64)
    program = emmy.optimize(model, x)
    dynamic, weight_only, gram = program(x, sim_mode="asan")
    want_dynamic, want_weight_only, want_gram = model(x)
    assert gram.dtype == torch.int32 and torch.equal(gram, want_gram)  # exact: integer sums
    torch.testing.assert_close(dynamic, want_dynamic)
    assert weight_only.dtype == torch.bfloat16
    torch.testing.assert_close(weight_only, want_weight_only, atol=0, rtol=2 ** -7)  # one bf16 rounding

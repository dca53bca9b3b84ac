"""torch.compile(model, backend="emmy"): supported parts compiled (run in the simulator when asked,
on CPU tensors), unsupported ops eager with one log line each, emmy failures eager with one warning."""

import logging
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import emmy.dynamo


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


class LlamaMLP(nn.Module):
    def __init__(self, dim=32, hidden=64):
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class AttentionBlock(nn.Module):
    def __init__(self, dim=32, heads=2):
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.out(y.transpose(1, 2).reshape(b, s, d))


class SpectralCNN(nn.Module):
    """A convolution emmy compiles, singular values it does not (an iterative SVD), then a classifier
    head it does."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4 * 8, 10)

    def forward(self, x):
        h = torch.relu(self.conv(x))
        h = torch.linalg.svdvals(h)
        return F.softmax(self.head(h.flatten(1)), dim=-1)


def _compiled_run(model, *inputs, **options):
    model = model.eval()
    with torch.no_grad():
        want = model(*inputs)
        got = torch.compile(model, backend="emmy", dynamic=False, options=options)(*inputs)
    return got, want


def test_emmy_is_a_registered_dynamo_backend():
    assert "emmy" in torch._dynamo.list_backends()


@pytest.mark.parametrize("model, shape", [(LlamaMLP, (2, 8, 32)), (AttentionBlock, (2, 8, 32))],
                         ids=["llama_mlp", "attention_block"])
def test_models_run_in_the_simulator_equal_to_eager(model, shape, caplog):
    torch.manual_seed(0)
    with caplog.at_level(logging.INFO, logger="emmy"):
        got, want = _compiled_run(model(), torch.randn(shape), simulate=True, sim_mode="asan")
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    assert any("emmy: compiled fused_" in r.getMessage() for r in caplog.records)


def test_unsupported_ops_run_eagerly_logged_once_and_the_rest_is_compiled(caplog, monkeypatch):
    monkeypatch.setattr(emmy.dynamo, "_REPORTED", set())
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    with caplog.at_level(logging.INFO, logger="emmy"):
        got, want = _compiled_run(SpectralCNN(), x, simulate=True)
        torch._dynamo.reset()
        again, _ = _compiled_run(SpectralCNN(), x, simulate=True)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    messages = [r.getMessage() for r in caplog.records]
    assert [m for m in messages if "not supported" in m] == [
        "emmy: aten._linalg_svd.default is not supported; it runs eagerly"]
    assert sum("emmy: compiled fused_" in m for m in messages) == 4  # conv part and head part, twice


def test_cpu_tensors_run_eagerly_unless_simulation_is_asked_for(caplog):
    torch.manual_seed(0)
    with caplog.at_level(logging.INFO, logger="emmy"):
        got, want = _compiled_run(LlamaMLP(), torch.randn(4, 32))
    torch.testing.assert_close(got, want)
    assert not any("compiled" in r.getMessage() for r in caplog.records)


def test_an_emmy_failure_falls_back_to_eager_with_one_warning(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("planted failure")

    monkeypatch.setattr("emmy.calling.call", broken)
    torch.manual_seed(0)
    model = LlamaMLP().eval()
    x = torch.randn(4, 32)
    compiled = torch.compile(model, backend="emmy", dynamic=False, options={"simulate": True})
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        first, second = compiled(x), compiled(x)
    ours = [w for w in caught if "emmy could not run" in str(w.message)]
    assert len(ours) == 1 and "planted failure" in str(ours[0].message)
    with torch.no_grad():
        torch.testing.assert_close(first, model(x))
        torch.testing.assert_close(second, model(x))


def test_a_compile_failure_falls_back_too(monkeypatch):
    def refuse(*args, **kwargs):
        raise emmy.errors.UnsupportedOpError("planted: no decomposition")

    monkeypatch.setattr("emmy.optimize", refuse)
    with pytest.warns(RuntimeWarning, match="emmy could not run fused_.*planted: no decomposition"):
        got, want = _compiled_run(LlamaMLP(), torch.randn(4, 32), simulate=True)
    torch.testing.assert_close(got, want)


def test_new_shapes_compile_again_and_options_are_checked():
    torch.manual_seed(0)
    model = LlamaMLP().eval()
    compiled = torch.compile(model, backend="emmy", dynamic=False, options={"simulate": True})
    with torch.no_grad():
        for rows in (4, 6):
            x = torch.randn(rows, 32)
            torch.testing.assert_close(compiled(x), model(x), atol=2e-5, rtol=1e-4)
    with pytest.raises(emmy.errors.EmmyError, match="unknown emmy backend option 'simulated'"):
        emmy.dynamo._Options.of({"simulated": True})


def test_a_graph_dynamo_makes_dynamic_compiles_each_new_shape_with_emmy(caplog):
    # torch.compile's default: the second shape makes Dynamo trace a dynamic graph; emmy, which
    # compiles static shapes, specializes it per call signature instead of running it eagerly
    torch.manual_seed(0)
    model = LlamaMLP().eval()
    compiled = torch.compile(model, backend="emmy", options={"simulate": True})
    with caplog.at_level(logging.INFO, logger="emmy"), torch.no_grad():
        for rows in (4, 6, 9, 6):
            x = torch.randn(rows, 32)
            torch.testing.assert_close(compiled(x), model(x), atol=2e-5, rtol=1e-4)
    specialized = [r.getMessage() for r in caplog.records if "a dynamic graph compiled for" in r.getMessage()]
    assert len(specialized) == 2 and "6x32 float32" in specialized[0] and "9x32 float32" in specialized[1]
    assert "64x32" not in specialized[0]  # the call's sizes and input, not every weight's shape
    parts = [r.getMessage() for r in caplog.records if r.getMessage().startswith("emmy: compiled")]
    assert len(parts) == 3  # one program per shape; the repeated 6 rows ran the cached one


def test_a_dynamic_graph_trains_with_emmy_s_kernels_at_each_shape(caplog):
    torch.manual_seed(0)
    model = LlamaMLP()
    compiled = torch.compile(model, backend="emmy", dynamic=True, options={"simulate": True})
    caplog.set_level(logging.INFO, logger="emmy")
    for rows in (3, 5):
        x = torch.randn(rows, 32)
        model.zero_grad()
        compiled(x).square().mean().backward()
        got = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        model(x).square().mean().backward()
        for g, want in zip(got, (p.grad for p in model.parameters())):
            torch.testing.assert_close(g, want, atol=2e-5, rtol=1e-4)
    # each shape: the forward's and the backward's parts compiled by emmy
    compiled_parts = [r.getMessage() for r in caplog.records if r.getMessage().startswith("emmy: compiled")]
    assert len(compiled_parts) >= 4, compiled_parts

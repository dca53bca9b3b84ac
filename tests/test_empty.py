"""Tensors with no elements (emmy.decompose.empty): an empty key/value cache, a batch of 0, a slice
past the end. Nothing about them is computed; the rest of the program runs as before, in the
simulator under ASan, and what is returned has eager PyTorch's shapes, dtypes and values."""

import pytest
import torch
import torch.nn.functional as F

import emmy
from emmy.errors import UnsupportedOpError

from tests.conftest import Calls, run_emmy


class CachedAttention(torch.nn.Module):
    """One attention step over a key/value cache, as Hugging Face's decoders write it: the cache is
    concatenated with the new keys and values, and is empty (`torch.tensor([])`) at the first step."""

    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(16, 16)
        self.k = torch.nn.Linear(16, 16)
        self.v = torch.nn.Linear(16, 16)
        self.register_buffer("empty_cache", torch.tensor([]), persistent=False)

    def forward(self, x, past_k, past_v):
        b, s, _ = x.shape
        heads = lambda t: t.view(b, s, 2, 8).transpose(1, 2)  # noqa: E731
        k = torch.cat([past_k, heads(self.k(x))], dim=2)
        v = torch.cat([self.empty_cache, torch.cat([past_v, heads(self.v(x))], dim=2).flatten()])
        v = v.view(k.shape)
        out = torch.nn.functional.scaled_dot_product_attention(heads(self.q(x)), k, v)
        return out.transpose(1, 2).reshape(b, s, 16), k, v


def _flat(value):
    if isinstance(value, dict):
        return [t for v in value.values() for t in _flat(v)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flat(v)]
    return [value]


def _runs_like_eager(module, *inputs, device="sim"):
    torch.manual_seed(0)
    program = emmy.optimize(module, *inputs)
    expected = module(*[x.clone() for x in inputs])
    got = program(*inputs, device=device, sim_mode="asan") if device == "sim" else program(*inputs, device=device)
    assert type(got) is type(expected)
    for want, have in zip(_flat(expected), _flat(got), strict=True):
        assert have.shape == want.shape and have.dtype == want.dtype
        torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-5, equal_nan=True)
    return program


X = torch.randn(3, 5)

CASES = [
    ("an empty output beside a computed one", lambda x: (x * 2, x[:0] + 1), (X,)),
    ("only empty outputs", lambda x: x[:, :0] * 2, (X,)),
    ("a sum over a length-0 dim", lambda x, e: x + e.sum(1, keepdim=True), (X, torch.randn(3, 0))),
    ("a mean over a length-0 dim (NaN)", lambda x, e: x + e.mean(1, keepdim=True), (X, torch.randn(3, 0))),
    ("both results of an empty var_mean", lambda x, e: x * torch.var_mean(e, 1, keepdim=True)[1] + torch.var_mean(e, 1, keepdim=True)[0],
     (X, torch.randn(3, 0))),
    ("a matmul with inner size 0", lambda a, b, c: torch.mm(a, b) + c, (torch.randn(3, 0), torch.randn(0, 5), X)),
    ("a dict with an empty entry", lambda x: {"a": x[2:2], "b": x.relu(), "c": x.sum()}, (X,)),
    ("an empty 1-d piece of a cat", lambda e, x: torch.cat([e, x.flatten()]) * 2, (torch.randn(0), X)),
    ("an empty input read by nothing", lambda e, x: x.exp(), (torch.randn(0), X)),
    ("a batch of 0 through a layer", lambda x, w: (torch.relu(x @ w), w.sum()), (torch.randn(0, 5), torch.randn(5, 4))),
    ("a layer with no input features", lambda x, w, b: F.linear(x, w, b) * 2, (torch.randn(3, 0), torch.randn(4, 0), torch.randn(4))),
    ("addmm of empty factors, scaled", lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2), (X, torch.randn(3, 0), torch.randn(0, 5))),
    ("baddbmm of empty factors, beta 0", lambda c, a, b: torch.baddbmm(c, a, b, beta=0) + 1, (torch.randn(2, 3, 5), torch.randn(2, 3, 0), torch.randn(2, 0, 5))),
    # an op of empties whose results are part empty, part full: the empty part stays a marker
    ("a factorisation of a 0x0 matrix", lambda e: tuple(torch.linalg.cholesky_ex(e)), (torch.randn(0, 0),)),
    ("a checked inverse of a 0x0 matrix", lambda e: torch.linalg.inv(e), (torch.randn(0, 0),)),
    # writes of nothing into a full tensor leave it as it was (a shifted window's mask by empty slices)
    ("an empty slice assigned", lambda x: _assigned(x, slice(5, None), 7.0) + 1, (X,)),
    ("an empty piece written", lambda x, e: torch.slice_scatter(x, e, 1, 2, 2) * 2, (X, torch.randn(3, 0))),
    ("an index_add of no rows", lambda x, e: x.index_add(0, torch.zeros(0, dtype=torch.long), e), (X, torch.randn(0, 5))),
    ("a split's piece of size 0 returned", lambda x: torch.split(x, [2, 0, 3], dim=1), (X,)),
    ("a scatter of no columns", lambda x: x.scatter(1, torch.zeros(3, 0, dtype=torch.long), 1.0) - x, (X,)),
]


def _assigned(x, where, value):
    y = x.clone()
    y[:, where] = value
    return y


@pytest.mark.filterwarnings("ignore:var_mean\\(\\). degrees of freedom")  # eager's own, over nothing
@pytest.mark.parametrize("fn,inputs", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_programs_with_empty_tensors_run_like_eager(fn, inputs):
    _runs_like_eager(Calls(fn), *inputs)


def test_an_empty_kv_cache_at_the_first_step_and_a_full_one_after():
    module = CachedAttention().eval()
    x = torch.randn(1, 3, 16)
    with torch.no_grad():
        first = _runs_like_eager(module, x, torch.randn(1, 2, 0, 8), torch.randn(1, 2, 0, 8))
        _runs_like_eager(module, x, torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8))
    read = {name for name, _ in first.loop_ir.inputs} | {name for name, _ in first.loop_ir.weights}
    assert "x" in read and not read & {"past_k", "past_v", "empty_cache"}  # nothing of them to upload


def test_the_interpreter_and_a_saved_program_return_the_empty_outputs(tmp_path):
    module = Calls(lambda x, e: (x[:, 5:], torch.cat([e, x], 0) * 3, e.sum(0)))
    inputs = (X, torch.randn(0, 5))
    program = _runs_like_eager(module, *inputs, device="interpret")
    program.save(tmp_path / "empty.emmy")
    loaded = emmy.load(tmp_path / "empty.emmy")
    for want, have in zip(module(*inputs), loaded(*inputs), strict=True):
        assert have.shape == want.shape
        torch.testing.assert_close(have, want)
    assert program.signature.output_names == ("out1", "out2")  # out0 has no elements: never computed


def test_an_empty_tensor_changed_in_place_stays_as_it_was():
    class Updates(torch.nn.Module):
        def forward(self, x, e):
            e.add_(1)
            return x * 2

    program = _runs_like_eager(Updates(), X, torch.randn(0, 5))
    assert program.signature.mutations == ()


def test_an_op_reading_an_empty_and_a_full_tensor_is_refused_by_name():
    with pytest.raises(UnsupportedOpError, match="aten.histogram.bins_tensor .*reads a tensor with no elements beside one"):
        emmy.optimize(Calls(lambda e, b: torch.histogram(e, b)[0]), torch.randn(0), torch.linspace(0, 1, 5)).tensor_ir


def test_the_cli_says_an_empty_output_has_nothing_to_compute():
    result = run_emmy("run", "--check", "-c", "x=torch.randn(3,5); x[:, :0] * 2, x * 2")
    assert result.returncode == 0, result.stderr
    assert "out1" in result.stdout and " ok" in result.stdout
    result = run_emmy("run", "-c", "x=torch.randn(3,5); x[:, :0] * 2")
    assert result.returncode == 0, result.stderr
    assert "an output of float32[3, 0]: no elements, nothing to compute" in result.stdout


def test_a_program_with_an_effect_token_prints_its_captured_graph():
    """linalg's error check reaches the captured graph as with_effects(token, op, ...): the op is
    printed by its name (the printer took an OpOverload for a graph node and failed)."""
    program = emmy.optimize(Calls(lambda e: torch.linalg.cholesky(e)), torch.randn(0, 0))
    assert "with_effects(token, aten._linalg_check_errors.default, getitem_1" in program.ir("torch")

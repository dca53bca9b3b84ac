"""torch.cond: both branches computed, each output taken by the predicate at run time; the same
compiled program follows whichever branch its inputs choose."""

import logging

import pytest
import torch
import torch.nn as nn

import emmy


class Gated(nn.Module):
    """A branch with weights, one with two outputs of different types, a cond nested in a branch."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 6)

    def forward(self, x, scale):
        def inner_true(x):
            return x.exp(),

        def inner_false(x):
            return -x,

        def true_fn(x, scale):
            y = self.proj(x).tanh() * scale
            return y, (y > 0).sum(-1)

        def false_fn(x, scale):
            (z,) = torch.cond(x.mean() > -0.5, inner_true, inner_false, (x,))
            return z - scale, (x < 0).sum(-1)

        y, count = torch.cond(x.sum() > 0, true_fn, false_fn, (x, scale))
        return y + 1, count * 2


def _inputs(sign: float, shift: float = 0.0):
    torch.manual_seed(0)
    x = torch.randn(4, 6).abs() * sign + shift
    return x, torch.tensor(0.5)


@pytest.mark.parametrize("case", ["true", "false_then_inner_true", "false_then_inner_false"])
def test_a_cond_program_follows_the_branch_its_inputs_choose(case):
    model = Gated().eval()
    program = emmy.optimize(model, *_inputs(1.0))  # compiled once, on inputs that take the true branch
    inputs = {"true": _inputs(1.0), "false_then_inner_true": _inputs(-0.1),
              "false_then_inner_false": _inputs(-1.0, -0.5)}[case]
    with torch.no_grad():
        expected = model(*inputs)
    for device in ("sim", "interpret"):
        got = program(*inputs, sim_mode="asan") if device == "sim" else program(*inputs, device="interpret")
        torch.testing.assert_close(got, expected)


def test_a_cond_under_torch_compile_is_compiled_and_runs_in_the_simulator(caplog):
    model = Gated().eval()
    compiled = torch.compile(model, backend="emmy", options={"simulate": True, "sim_mode": "asan"})
    with caplog.at_level(logging.INFO, logger="emmy"):
        for inputs in (_inputs(1.0), _inputs(-1.0, -0.5)):
            with torch.no_grad():
                torch.testing.assert_close(compiled(*inputs), model(*inputs))
    messages = [r.getMessage() for r in caplog.records]
    assert any("emmy: compiled fused_" in m for m in messages)
    assert not any("not supported" in m or "runs eagerly" in m for m in messages), messages

"""Programs that take gradients inside themselves, which torch.export refuses: captured by make_fx
(emmy.capture.gradients), compiled, and run right in the simulator (ASan on) and the interpreter."""

import pytest
import torch
import torch.nn as nn

import emmy
from emmy.errors import EmmyError


def _loss(w, x):
    return (x @ w).tanh().sum()


def func_grad(x, w):  # torch.func: export's decompositions fail on it
    return torch.func.grad(_loss)(w, x)


def autograd_grad(x, w):  # torch.autograd.grad: export fails on it
    w = w.detach().requires_grad_()
    with torch.enable_grad():
        (grad,) = torch.autograd.grad(_loss(w, x), w)
    return grad


class Saliency(nn.Module):
    """|d top logit / d input| through Tensor.backward and .grad, the module's weights as weights."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 3))

    def forward(self, x):
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            self.net(x).max(-1).values.sum().backward()
        return x.grad.abs()


class HeatResidual(nn.Module):
    """A physics-informed network's residual u_t - 0.1 u_xx: a second derivative (create_graph)."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, xt):
        with torch.enable_grad():
            xt = xt.detach().requires_grad_()
            (du,) = torch.autograd.grad(self.net(xt).sum(), xt, create_graph=True)
            (second,) = torch.autograd.grad(du[:, 0].sum(), xt, create_graph=True)
        return du[:, 1:] - 0.1 * second[:, :1]


PROGRAMS = {
    "func_grad": (lambda: func_grad, lambda: (torch.randn(4, 8), torch.randn(8, 3))),
    "autograd_grad": (lambda: autograd_grad, lambda: (torch.randn(4, 8), torch.randn(8, 3))),
    "saliency": (Saliency, lambda: (torch.randn(4, 8),)),
    "heat_residual": (HeatResidual, lambda: (torch.randn(5, 2),)),
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_a_program_that_takes_gradients_compiles_and_runs_right(name):
    make, inputs = PROGRAMS[name]
    torch.manual_seed(0)
    program_fn, args = make(), inputs()
    program = emmy.optimize(program_fn, *args)
    want = program_fn(*args)
    torch.testing.assert_close(program(*args, sim_mode="asan"), want, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(program(*args, device="interpret"), want, atol=1e-5, rtol=1e-4)
    other = tuple(torch.randn_like(a) for a in args)  # compiled for the shapes, not the values
    torch.testing.assert_close(program(*other), program_fn(*other), atol=1e-5, rtol=1e-4)


def test_a_gradient_programs_weights_are_weights_and_it_saves(tmp_path):
    torch.manual_seed(0)
    model, x = Saliency(), torch.randn(4, 8)
    program = emmy.optimize(model, x)
    assert program.signature.describe().startswith("(x: f32[4, 8]) ->")  # the caller passes x alone
    program.save(tmp_path / "saliency.emmy")
    torch.testing.assert_close(emmy.load(tmp_path / "saliency.emmy")(x), model(x), atol=1e-5, rtol=1e-4)


def test_a_program_export_refuses_that_takes_no_gradients_keeps_exports_error():
    class Branching(nn.Module):
        def forward(self, x):
            return x if x.sum() > 0 else -x  # control flow on values: refused

    with pytest.raises(EmmyError, match="data-dependent|depends on the values"):
        emmy.optimize(Branching(), torch.randn(3))

"""nn.LSTMCell's fused CUDA kernel as graphs of CUDA tensors hold it (emmy.capture.cuda_cells):
the decomposition computes torch's cell (checked against the CPU's lstm_cell), its backward the
gradients autograd gives, and a model calling the kernel trains with emmy (its fake-tensor shapes
work on the CPU, so Dynamo and AOTAutograd trace it here as on a GPU)."""

import logging

import pytest
import torch
import torch.nn as nn

from emmy.capture import cuda_cells

aten = torch.ops.aten


def _cell_inputs(bias: bool):
    torch.manual_seed(0)
    return (torch.randn(3, 16, dtype=torch.float64), torch.randn(3, 16, dtype=torch.float64),
            torch.randn(3, 4, dtype=torch.float64),
            *(torch.randn(16, dtype=torch.float64) if bias else None for _ in range(2)))


@pytest.mark.parametrize("bias", [True, False])
def test_the_fused_cell_computes_torch_s_lstm_cell(bias):
    input_gates, hidden_gates, cx, input_bias, hidden_bias = _cell_inputs(bias)
    hy, cy, _ = cuda_cells.lstm_cell(input_gates, hidden_gates, cx, input_bias, hidden_bias)
    # lstm_cell(x, (h, c), w_ih, w_hh, b_ih, b_hh) reading both gates as given: x holds them side by
    # side, w_ih = [I I] sums them, h is unused (w_hh = 0)
    eye = torch.eye(16, dtype=torch.float64)
    want_h, want_c = torch.lstm_cell(torch.cat([input_gates, hidden_gates], 1), (torch.zeros_like(cx), cx),
                                     torch.cat([eye, eye], 1), torch.zeros(16, 4, dtype=torch.float64),
                                     input_bias, hidden_bias)
    torch.testing.assert_close(hy, want_h)
    torch.testing.assert_close(cy, want_c)


@pytest.mark.parametrize("grads", ["both", "hidden_only", "cell_only"])
def test_the_fused_cell_backward_gives_autograd_s_gradients(grads):
    input_gates, hidden_gates, cx, input_bias, _ = _cell_inputs(True)
    input_gates.requires_grad_(), cx.requires_grad_(), input_bias.requires_grad_()
    hy, cy, workspace = cuda_cells.lstm_cell(input_gates, hidden_gates, cx, input_bias, None)
    grad_hy = torch.randn_like(hy) if grads != "cell_only" else None
    grad_cy = torch.randn_like(cy) if grads != "hidden_only" else None
    outputs = [t for t, g in ((hy, grad_hy), (cy, grad_cy)) if g is not None]
    wanted = torch.autograd.grad(outputs, [input_gates, cx, input_bias],
                                 [g for g in (grad_hy, grad_cy) if g is not None])
    got = cuda_cells.lstm_cell_backward(grad_hy, grad_cy, cx.detach(), cy.detach(), workspace.detach(), True)
    for g, w in zip(got, wanted):
        torch.testing.assert_close(g, w)


class FusedCell(nn.Module):
    """An LSTM cell as CUDA tensors compute it: the fused kernel fed by the two projections."""

    def __init__(self):
        super().__init__()
        self.ih, self.hh = nn.Linear(6, 16, bias=False), nn.Linear(4, 16, bias=False)
        self.b_ih, self.b_hh = nn.Parameter(torch.randn(16)), nn.Parameter(torch.randn(16))

    def forward(self, x, h, c):
        hy, cy, _ = aten._thnn_fused_lstm_cell(self.ih(x), self.hh(h), c, self.b_ih, self.b_hh)
        return hy + cy


@pytest.mark.usefixtures("fresh_dynamo")
def test_a_model_whose_graph_holds_the_fused_cell_trains_with_emmy(caplog):
    torch.manual_seed(0)
    model = FusedCell()
    x, h, c = torch.randn(3, 6), torch.randn(3, 4), torch.randn(3, 4)
    with caplog.at_level(logging.INFO, logger="emmy"):
        compiled = torch.compile(model, backend="emmy", dynamic=False, options={"simulate": True, "sim_mode": "asan"})
        out = compiled(x, h, c)
        out.square().sum().backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    want_h, want_c = torch.lstm_cell(x, (h, c), model.ih.weight, model.hh.weight, model.b_ih, model.b_hh)
    (want_h + want_c).square().sum().backward()
    torch.testing.assert_close(out, want_h + want_c, atol=2e-5, rtol=1e-4)
    for g, p in zip(got, model.parameters()):
        torch.testing.assert_close(g, p.grad, atol=2e-5, rtol=1e-4)
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "not supported" in m]
    assert sum(m.startswith("emmy: compiled fused_") for m in messages) == 2

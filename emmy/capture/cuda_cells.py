"""nn.LSTMCell as a graph of CUDA tensors holds it.

On CUDA tensors `lstm_cell` computes its gates with one fused kernel, `_thnn_fused_lstm_cell`
(input and hidden gates, their biases, the old cell state -> new hidden and cell states and a
workspace of the activated gates the backward reads), whose backward is
`_thnn_fused_lstm_cell_backward_impl`. torch.compile's CUDA graphs hold those; emmy has no lowering
of them, so both are spelled here in the elementwise ops they compute. The workspace holds the four
activated gates (input, forget, cell, output), as torch's kernel keeps them, and only this
backward reads it.
"""

from __future__ import annotations

import torch


def lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias
    if hidden_bias is not None:
        gates = gates + hidden_bias
    i, f, g, o = gates.chunk(4, dim=1)
    i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
    cy = f * cx + i * g
    hy = o * torch.tanh(cy)
    return hy, cy, torch.cat([i, f, g, o], dim=1)


def lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias: bool):
    """(gradient of the gates' pre-activation sum, of the old cell state, of a bias)."""
    i, f, g, o = workspace.chunk(4, dim=1)
    tanh_cy = torch.tanh(cy)
    grad_hy = torch.zeros_like(cy) if grad_hy is None else grad_hy
    grad_c = grad_hy * o * (1 - tanh_cy * tanh_cy)
    if grad_cy is not None:
        grad_c = grad_c + grad_cy
    grad_gates = torch.cat([grad_c * g * i * (1 - i), grad_c * cx * f * (1 - f), grad_c * i * (1 - g * g),
                            grad_hy * tanh_cy * o * (1 - o)], dim=1)
    return grad_gates, grad_c * f, grad_gates.sum(0) if has_bias else None


def cuda_cell_decompositions() -> dict:
    aten = torch.ops.aten
    return {aten._thnn_fused_lstm_cell.default: lstm_cell,
            aten._thnn_fused_lstm_cell_backward_impl.default: lstm_cell_backward}

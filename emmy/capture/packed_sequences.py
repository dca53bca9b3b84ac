"""Packed sequences captured as padded ones with a mask.

`pack_padded_sequence` -> nn.LSTM/GRU/RNN -> `pad_packed_sequence` is how much sequence code runs
batches of different lengths. A PackedSequence's batch sizes are counts of the lengths' values,
which torch.export cannot trace (the RNN's kernel takes them as a size). While emmy captures a
program, packing keeps the padded tensor and its lengths instead (`MaskedSequence`); an RNN given
one runs its recurrence step by step over every padded position, each step kept only where the
step is inside that sequence (`t < length`), so every sequence's states stop at its own end (and a
reversed direction starts there); unpacking writes the padding value past each end. The values are
eager torch's; without `total_length` (or lengths given as a Python list) the unpacked length is
the longest one, read from the lengths tensor, which emmy compiles in with a guard
(emmy.capture.guarded_reads).
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn.utils import rnn as rnn_utils

# torch's functions are entered through their code, swapped while a program is captured, so that
# names a program imported (`from torch.nn.utils.rnn import pack_padded_sequence`) reach the
# stand-ins too; _TORCH_PAD is torch's own, to unpack a real PackedSequence
_PACK, _PAD = rnn_utils.pack_padded_sequence, rnn_utils.pad_packed_sequence
_PACK_CODE, _PAD_CODE = _PACK.__code__, _PAD.__code__
_TORCH_PAD = types.FunctionType(_PAD_CODE, _PAD.__globals__, _PAD.__name__, _PAD.__defaults__, _PAD.__closure__)
_FORWARDS = {kind: kind.forward for kind in (nn.LSTM, nn.GRU, nn.RNN)}


@dataclass(frozen=True)
class MaskedSequence:
    """A packed batch kept padded: `data` (time, batch, ...) and each sequence's length."""

    data: torch.Tensor
    lengths: torch.Tensor  # int64, one per sequence
    known_lengths: tuple[int, ...] | None  # the lengths as numbers, where the program was given a list

    def steps_inside(self) -> torch.Tensor:
        """(time, batch) bool: whether step t is inside sequence b."""
        steps = torch.arange(self.data.shape[0], device=self.data.device)
        return steps[:, None] < self.lengths.to(self.data.device)[None, :]


def pack_padded_sequence(input, lengths, batch_first=False, enforce_sorted=True):
    data = input.transpose(0, 1) if batch_first else input
    known = tuple(int(n) for n in lengths) if isinstance(lengths, (list, tuple)) else None
    lengths = torch.as_tensor(lengths, dtype=torch.int64) if known is not None else lengths.to(torch.int64)
    return MaskedSequence(data, lengths, known)


def pad_packed_sequence(sequence, batch_first=False, padding_value=0.0, total_length=None):
    if not isinstance(sequence, MaskedSequence):
        return _TORCH_PAD(sequence, batch_first=batch_first, padding_value=padding_value, total_length=total_length)
    if total_length is not None:
        length = total_length
    elif sequence.known_lengths is not None:
        length = max(sequence.known_lengths)
    else:  # the longest length, read from the lengths: compiled in with a guard (emmy.capture.guarded_reads)
        length = int(sequence.lengths.max())
    inside = sequence.steps_inside()[:length]
    inside = inside.reshape(*inside.shape, *[1] * (sequence.data.dim() - 2))
    padded = torch.where(inside, sequence.data[:length], torch.full_like(sequence.data[:length], padding_value))
    if length > padded.shape[0]:  # torch pads up to total_length
        extra = torch.full((length - padded.shape[0], *padded.shape[1:]), padding_value, dtype=padded.dtype,
                           device=padded.device)
        padded = torch.cat([padded, extra])
    return (padded.transpose(0, 1) if batch_first else padded), sequence.lengths


def _recurrent_forward(kind):
    original = _FORWARDS[kind]

    def forward(self, input, hx=None):
        if not isinstance(input, MaskedSequence):
            return original(self, input, hx)
        return _masked_recurrence(self, input, hx)

    return forward


def _masked_recurrence(module, sequence: MaskedSequence, hx):
    """The module's layers and directions run one step at a time over the padded steps, each step's
    new state kept only inside each sequence (eval mode: no dropout between layers)."""
    data, inside = sequence.data, sequence.steps_inside()
    steps, batch = data.shape[0], data.shape[1]
    directions = 2 if module.bidirectional else 1
    lstm = isinstance(module, nn.LSTM)
    out_size = module.proj_size if getattr(module, "proj_size", 0) else module.hidden_size
    if hx is None:
        h0 = data.new_zeros(module.num_layers * directions, batch, out_size)
        c0 = data.new_zeros(module.num_layers * directions, batch, module.hidden_size)
    else:
        h0, c0 = hx if lstm else (hx, None)
    layer_input, finals_h, finals_c = data, [], []
    for layer in range(module.num_layers):
        outputs = []
        for direction in range(directions):
            suffix = f"_l{layer}" + ("_reverse" if direction else "")
            weights = {name: getattr(module, name + suffix, None) for name in
                       ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr")}
            k = layer * directions + direction
            h, c = h0[k], (c0[k] if lstm else None)
            written = [None] * steps
            for t in (reversed(range(steps)) if direction else range(steps)):
                h_new, c_new = _cell(module, weights, layer_input[t], h, c)
                keep = inside[t][:, None]
                h = torch.where(keep, h_new, h)
                c = torch.where(keep, c_new, c) if lstm else None
                written[t] = torch.where(keep, h_new, torch.zeros_like(h_new))
            outputs.append(torch.stack(written))
            finals_h.append(h)
            finals_c.append(c)
        layer_input = torch.cat(outputs, -1) if directions == 2 else outputs[0]
    h_n = torch.stack(finals_h)
    state = (h_n, torch.stack(finals_c)) if lstm else h_n
    return MaskedSequence(layer_input, sequence.lengths, sequence.known_lengths), state


def _cell(module, w, x, h, c):
    """One step of an LSTM, GRU or Elman cell, as torch's gates order them."""
    def linear(value, weight, bias):
        return value @ weight.t() + (bias if bias is not None else 0)

    gates_x, gates_h = linear(x, w["weight_ih"], w["bias_ih"]), linear(h, w["weight_hh"], w["bias_hh"])
    if isinstance(module, nn.LSTM):
        i, f, g, o = (gates_x + gates_h).chunk(4, -1)
        c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h_new = torch.sigmoid(o) * torch.tanh(c_new)
        if w["weight_hr"] is not None:
            h_new = h_new @ w["weight_hr"].t()
        return h_new, c_new
    if isinstance(module, nn.GRU):
        xr, xz, xn = gates_x.chunk(3, -1)
        hr, hz, hn = gates_h.chunk(3, -1)
        r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
        n = torch.tanh(xn + r * hn)
        return (1 - z) * n + z * h, None
    act = torch.tanh if module.nonlinearity == "tanh" else torch.relu
    return act(gates_x + gates_h), None


def _pack_entry(input, lengths, batch_first=False, enforce_sorted=True):
    from emmy.capture.packed_sequences import pack_padded_sequence  # run with torch's module globals

    return pack_padded_sequence(input, lengths, batch_first, enforce_sorted)


def _pad_entry(sequence, batch_first=False, padding_value=0.0, total_length=None):
    from emmy.capture.packed_sequences import pad_packed_sequence

    return pad_packed_sequence(sequence, batch_first, padding_value, total_length)


def install() -> None:
    _PACK.__code__, _PAD.__code__ = _pack_entry.__code__, _pad_entry.__code__
    for kind in _FORWARDS:
        kind.forward = _recurrent_forward(kind)


def uninstall() -> None:
    _PACK.__code__, _PAD.__code__ = _PACK_CODE, _PAD_CODE
    for kind, forward in _FORWARDS.items():
        kind.forward = forward

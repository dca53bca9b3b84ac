"""Packed sequences captured padded with a mask (emmy.capture.packed_sequences): pack_padded_sequence,
an LSTM/GRU/RNN over it and pad_packed_sequence compile and give eager torch's outputs and final
states (each sequence's own end), checked in the simulator under ASan."""

import pytest
import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from torch.utils._pytree import tree_leaves

import emmy
from emmy.capture import packed_sequences


class PackedEncoder(nn.Module):
    def __init__(self, recurrent: nn.Module, batch_first: bool = True):
        super().__init__()
        self.recurrent, self.batch_first = recurrent, batch_first

    def forward(self, x, lengths):
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=self.batch_first, enforce_sorted=False)
        out, state = self.recurrent(packed)
        padded, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=self.batch_first,
                                                     total_length=x.shape[1 if self.batch_first else 0])
        return padded, state


class ImportedNames(nn.Module):
    """The functions imported by name before the capture, as most sequence code does."""

    def __init__(self):
        super().__init__()
        self.recurrent = nn.LSTM(4, 5, batch_first=True)

    def forward(self, x, lengths):
        out, (h, c) = self.recurrent(pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
        return pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])[0], h, c


class ListedLengths(nn.Module):
    """Lengths as a Python list: the unpacked length is known, so total_length may be left out."""

    def __init__(self):
        super().__init__()
        self.recurrent = nn.GRU(4, 5, batch_first=True, bidirectional=True)

    def forward(self, x):
        packed = nn.utils.rnn.pack_padded_sequence(x, [3, 2, 3], batch_first=True, enforce_sorted=False)
        out, h = self.recurrent(packed)
        return nn.utils.rnn.pad_packed_sequence(out, batch_first=True, padding_value=-1.0)[0], h


LENGTHS = torch.tensor([5, 2, 4])
CASES = {
    "lstm_bidirectional_two_layers": (lambda: PackedEncoder(nn.LSTM(4, 6, num_layers=2, batch_first=True,
                                                                    bidirectional=True)),
                                      (torch.randn(3, 5, 4), LENGTHS)),
    "lstm_projected": (lambda: PackedEncoder(nn.LSTM(4, 6, proj_size=3, batch_first=True)),
                       (torch.randn(3, 5, 4), LENGTHS)),
    "gru_time_major": (lambda: PackedEncoder(nn.GRU(4, 6, bidirectional=True), batch_first=False),
                       (torch.randn(5, 3, 4), LENGTHS)),
    "rnn_relu": (lambda: PackedEncoder(nn.RNN(4, 6, nonlinearity="relu", num_layers=2, batch_first=True)),
                 (torch.randn(3, 5, 4), LENGTHS)),
    "listed_lengths": (ListedLengths, (torch.randn(3, 4, 4),)),
    "imported_names": (ImportedNames, (torch.randn(3, 5, 4), LENGTHS)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_packed_recurrence_runs_like_eager(name):
    make, inputs = CASES[name]
    torch.manual_seed(0)
    model = make().eval()
    program = emmy.optimize(model, *inputs)
    with torch.no_grad():
        want = tree_leaves(model(*inputs))
    got = tree_leaves(program(*inputs, sim_mode="asan"))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_packing_is_torch_s_own_outside_a_capture():
    emmy.optimize(PackedEncoder(nn.GRU(4, 3, batch_first=True)).eval(), torch.randn(3, 5, 4), LENGTHS,
                  stop_after="tensor")
    assert pack_padded_sequence.__code__ is packed_sequences._PACK_CODE
    assert pad_packed_sequence.__code__ is packed_sequences._PAD_CODE
    assert nn.LSTM.forward is packed_sequences._FORWARDS[nn.LSTM]
    x = torch.randn(3, 5, 4)  # torch's packing again: a PackedSequence of the lengths' batch sizes
    assert pack_padded_sequence(x, LENGTHS, batch_first=True, enforce_sorted=False).batch_sizes.tolist() == \
        [3, 3, 2, 2, 1]


def test_unpacking_to_the_longest_length_is_compiled_for_it_with_a_guard():
    """Without total_length, pad_packed_sequence pads to the longest length, read from the lengths
    tensor: compiled in as the example's (emmy.capture.guarded_reads), a call whose longest length
    differs (another output shape in eager torch) refused."""

    class Unbounded(nn.Module):
        def __init__(self):
            super().__init__()
            self.recurrent = nn.LSTM(4, 3, batch_first=True)

        def forward(self, x, lengths):
            out, _ = self.recurrent(nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True,
                                                                      enforce_sorted=False))
            return nn.utils.rnn.pad_packed_sequence(out, batch_first=True)[0]

    torch.manual_seed(0)
    module, x = Unbounded().eval(), torch.randn(3, 6, 4)
    program = emmy.optimize(module, x, LENGTHS)
    with torch.no_grad():
        want = module(x, LENGTHS)
    assert want.shape[1] == int(LENGTHS.max()) < x.shape[1]  # shorter than the input: the read decides it
    torch.testing.assert_close(program(x, LENGTHS, sim_mode="asan"), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(emmy.EmmyError, match=rf"compiled in as the example inputs' value, {int(LENGTHS.max())}; "
                                             r"these inputs give 3"):
        program(x, torch.tensor([3, 2, 3]))

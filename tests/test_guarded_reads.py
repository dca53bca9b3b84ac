"""Integers read from the inputs into Python (emmy.capture.guarded_reads): compiled in as the example
inputs' values, each checked on every call (emmy.tensor_ir.guards) — the program runs right wherever
the values hold, on every path (simulator under ASan, interpreter, a saved program), and a call
where one differs is refused with the line that read it and both values."""

import pytest
import torch
import torch.nn as nn

import emmy
from emmy.errors import InputMismatchError


class PaddedToLongest(nn.Module):
    """torchaudio's Conformer and Emformer: a padding mask as long as the longest length."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 6)

    def forward(self, x, lengths):
        longest = int(torch.max(lengths).item())
        padding = torch.arange(longest).expand(lengths.shape[0], longest) >= lengths.unsqueeze(1)
        scores = self.proj(x) @ x.transpose(1, 2)
        scores = scores.masked_fill(padding.unsqueeze(1), float("-inf"))
        return scores.softmax(-1) @ x


def _eager(module, *inputs):
    with torch.no_grad():
        return module(*inputs)


def test_a_padding_mask_as_long_as_the_longest_length_runs_right_wherever_its_guard_holds():
    torch.manual_seed(0)
    module, x = PaddedToLongest().eval(), torch.randn(3, 5, 6)
    lengths = torch.tensor([5, 2, 4])
    program = emmy.optimize(module, x, lengths)
    assert [r.expected for r in program.signature.guards.reads] == [5]
    torch.testing.assert_close(program(x, lengths, sim_mode="asan"), _eager(module, x, lengths), rtol=1e-5, atol=1e-5)
    other = torch.tensor([3, 5, 1])  # other lengths, the same longest: the guard holds
    torch.testing.assert_close(program(x, other, sim_mode="asan"), _eager(module, x, other), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(program(x, other, device="interpret"), _eager(module, x, other), rtol=1e-5, atol=1e-5)
    for device in ("sim", "interpret"):
        with pytest.raises(InputMismatchError, match=r"test_guarded_reads.py:\d+: `longest = int\(torch.max\(lengths\)"
                                                     r"\.item\(\)\)` is compiled in as the example inputs' value, 5; "
                                                     r"these inputs give 4"):
            program(x, torch.tensor([4, 2, 4]), device=device)


class PaddedToInput(PaddedToLongest):
    """The same program with the mask as long as the input: nothing read from a value."""

    def forward(self, x, lengths):
        padding = torch.arange(x.shape[1]).expand(lengths.shape[0], x.shape[1]) >= lengths.unsqueeze(1)
        scores = self.proj(x) @ x.transpose(1, 2)
        scores = scores.masked_fill(padding.unsqueeze(1), float("-inf"))
        return scores.softmax(-1) @ x


def test_the_guard_is_computed_on_the_host_and_costs_no_kernel():
    """The guard's value (the longest length) is computed from the inputs before the kernels run, so
    the program launches the same kernels as one that reads no value."""
    torch.manual_seed(0)
    x, lengths = torch.randn(3, 5, 6), torch.tensor([5, 2, 4])
    guarded = emmy.optimize(PaddedToLongest().eval(), x, lengths)
    plain = emmy.optimize(PaddedToInput().eval(), x, lengths)
    assert plain.signature.guards is None
    assert len(guarded.kernel_ir) == len(plain.kernel_ir)
    from emmy.tensor_ir.nodes import Input, Reduce

    nodes = guarded.signature.guards.graph.nodes
    assert [n.name for n in nodes if isinstance(n, Input)] == ["lengths"] and any(isinstance(n, Reduce) for n in nodes)


def test_a_saved_program_keeps_its_guards(tmp_path):
    torch.manual_seed(0)
    module, x, lengths = PaddedToLongest().eval(), torch.randn(3, 5, 6), torch.tensor([5, 2, 4])
    emmy.optimize(module, x, lengths).save(tmp_path / "padded.emmy")
    loaded = emmy.load(tmp_path / "padded.emmy")
    torch.testing.assert_close(loaded(x, lengths), _eager(module, x, lengths), rtol=1e-5, atol=1e-5)
    with pytest.raises(InputMismatchError, match="example inputs' value, 5; these inputs give 3"):
        loaded(x, torch.tensor([3, 2, 1]))


def test_two_reads_on_one_line_are_each_told_their_own_value():
    """torch.export refuses the slice (its bounds are values): the module runs once eagerly, and the
    reads are matched to the trace's by their line and order there."""

    def window(x, bounds):
        return x[:, int(bounds[0]):int(bounds[1])] * 2

    x, bounds = torch.randn(3, 8), torch.tensor([2, 7])
    program = emmy.optimize(window, x, bounds)
    assert [r.expected for r in program.signature.guards.reads] == [2, 7]
    torch.testing.assert_close(program(x, bounds, sim_mode="asan"), window(x, bounds))
    with pytest.raises(InputMismatchError, match="value, 7; these inputs give 6"):
        program(x, torch.tensor([2, 6]))


def test_a_read_export_takes_as_a_symbol_is_guarded_too():
    """A count read and used as a number: torch.export keeps it as a symbol (no branch on it), and
    emmy writes the example's value in."""

    def scaled(x, count):
        return x * count.sum().item() + 1

    x, count = torch.randn(4), torch.tensor([1, 2, 3])
    program = emmy.optimize(scaled, x, count)
    torch.testing.assert_close(program(x, count, sim_mode="asan"), scaled(x, count))
    torch.testing.assert_close(program(x, torch.tensor([3, 2, 1]), sim_mode="asan"), scaled(x, count))
    with pytest.raises(InputMismatchError, match="value, 6; these inputs give 7"):
        program(x, torch.tensor([1, 2, 4]))


def test_an_int_argument_read_as_a_number_is_still_a_constant_of_the_program():
    """A Python int read as a size makes the fixed-ints capture (the call must pass the same int),
    not a guard on a rank-0 tensor."""

    def last(x, n: int):
        return x[:, -n:] + 1

    program = emmy.optimize(last, torch.randn(2, 6), 4)
    assert program.signature.fixed_ints and program.signature.guards is None


def test_a_bool_branch_on_values_is_still_refused():
    with pytest.raises(emmy.EmmyError, match="data-dependent control flow"):
        emmy.optimize(lambda x: x if x.sum() > 0 else -x, torch.randn(4))


def test_a_module_whose_input_is_named_input_keeps_its_signature():
    """fx renames a copied node that shadows a builtin (`input` became input_1), which the export
    signature then did not name: every pass that rewrites a copy of the graph failed on nn.Module's
    own argument name."""

    class Named(nn.Module):
        def forward(self, input, lengths):
            return input[:, :int(lengths.max())] * 2

    x, lengths = torch.randn(2, 6), torch.tensor([3, 4])
    program = emmy.optimize(Named(), x, lengths)
    torch.testing.assert_close(program(x, lengths, sim_mode="asan"), x[:, :4] * 2)


def test_an_exported_program_with_a_read_is_guarded_on_its_example_inputs():
    """torch.export keeps a read used as a number as a symbol; the ExportedProgram given to optimize
    is guarded on the inputs given with it, and described so."""

    def scaled(x, count):
        return x * count.sum().item() + 1

    x, count = torch.randn(4), torch.tensor([1, 2, 3])
    program = emmy.optimize(torch.export.export(_AsModule(scaled), (x, count), strict=False), x, count)
    assert program.signature.describe().endswith("; compiled for 6 read from the inputs")
    torch.testing.assert_close(program(x, count, sim_mode="asan"), scaled(x, count))
    with pytest.raises(InputMismatchError, match="value, 6; these inputs give 0"):
        program(x, torch.zeros(3, dtype=torch.int64))


class _AsModule(nn.Module):
    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, *args):
        return self.function(*args)


def test_a_branch_on_a_table_the_code_builds_is_taken_as_eager_takes_it():
    """e3nn's so3_generators asserts on a product of constant matrices (`assert torch.all(...)`), a
    bool no input reaches: told its value while exporting, then folded; no guard is needed."""

    def rotated(x):
        basis = torch.tensor([[0.6, -0.8], [0.8, 0.6]]) * torch.ones(2, 1)
        assert torch.all((basis @ basis.T - torch.eye(2)).abs() < 1e-5)
        return x @ basis

    x = torch.randn(3, 2)
    program = emmy.optimize(rotated, x)
    assert program.signature.guards is None
    torch.testing.assert_close(program(x, sim_mode="asan"), rotated(x))


def test_a_branch_an_input_decides_is_refused_even_after_the_eager_run():
    """The retry tells every bool read its example value; one an input reaches would make the program
    that branch's alone, so the capture is refused with export's own message."""

    def checked(x, lengths):
        n = int(lengths.max())  # an integer read: the retry runs
        if (x[:, :n] > 0).all():
            return x * 2
        return x[:, :n].sum()

    with pytest.raises(emmy.EmmyError, match=r"data-dependent control flow at .*test_guarded_reads.py"):
        emmy.optimize(checked, torch.randn(2, 5), torch.tensor([3, 5]))


def test_the_eager_run_leaves_the_inputs_and_the_buffers_as_they_were():
    """The run that learns the values works on copies of the inputs and puts the module's buffers
    back: what a forward writes in place is neither the caller's loss nor captured."""

    class Counting(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

        def forward(self, x, lengths):
            self.calls += 1
            x.mul_(2)
            return x[:, :int(lengths.max())] + self.calls

    module, x, lengths = Counting(), torch.ones(2, 5), torch.tensor([3, 4])
    program = emmy.optimize(module, x, lengths)
    assert module.calls.item() == 0 and torch.equal(x, torch.ones(2, 5))
    assert torch.equal(program(x.clone(), lengths, sim_mode="asan"), torch.full((2, 4), 3.0))


def test_an_axis_order_read_with_tolist_is_pinned_from_constants_and_guarded_from_inputs():
    """kornia's zca_whiten reads an axis order with .tolist() from a cat of aranges: eager torch reads
    a list without an op, the trace one element at a time; both are matched by line and order."""

    def constant_order(x):
        order = torch.cat([torch.tensor([2]), torch.arange(0, 2)]).tolist()
        return x.permute(order) * 2

    def given_order(x, order):
        return x.permute(order.tolist()) + 1

    x = torch.randn(2, 3, 4)
    program = emmy.optimize(constant_order, x)
    assert program.signature.guards is None
    torch.testing.assert_close(program(x, sim_mode="asan"), constant_order(x))
    order = torch.tensor([1, 2, 0])
    program = emmy.optimize(given_order, x, order)
    assert [r.expected for r in program.signature.guards.reads] == [1, 2, 0]
    torch.testing.assert_close(program(x, order, sim_mode="asan"), given_order(x, order))
    with pytest.raises(InputMismatchError, match="value, 1; these inputs give 2"):
        program(x, torch.tensor([2, 1, 0]))


def test_c_code_reading_a_length_from_an_input_compiles_with_a_guard():
    """-c code first runs on fake tensors to make its inputs; a value read into Python has none
    there, so that run is made again for real."""
    program = emmy.optimize("x = torch.randn(3, 6)\nn = torch.tensor([2, 4])\nx[:, :int(n.max())] * 2")
    x, n = program.example_inputs
    assert torch.equal(program(x, n, sim_mode="asan"), x[:, :4] * 2)
    with pytest.raises(InputMismatchError, match=r"line 3: `x\[:, :int\(n.max\(\)\)\] \* 2` is compiled in as the "
                                                 r"example inputs' value, 4; these inputs give 5"):
        program(x, torch.tensor([5, 1]))

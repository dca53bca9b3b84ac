"""A tensor's value read into Python (.item(), int(t)) that no input reaches is a constant of the program."""

import pytest
import torch

import emmy


class PositionsBySize(torch.nn.Module):
    """Reformer's form: the count of positions is read back from an arange (`positions.max().item()`)
    and slices a table; Funnel's: relative positions are an arange bounded by differences of
    another (0-d tensors read as numbers). A learned temperature is read as a float."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(16, 8))
        self.temperature = torch.nn.Parameter(torch.tensor(0.75))

    def forward(self, x):
        positions = torch.arange(x.shape[1])
        count = positions.max().item() + 1
        relative = torch.arange(positions[0] - positions[-1], positions[-1] + 1)  # -(n - 1) ... n - 1
        scaled = (x + self.table[:count]) * self.temperature.item()
        return scaled + relative[:count, None] * relative[-count:, None]


def test_reads_no_input_reaches_are_folded_and_the_program_equals_eager():
    module, x = PositionsBySize(), torch.randn(2, 5, 8)
    program = emmy.optimize(module, x)
    got = program(x, sim_mode="asan")
    torch.testing.assert_close(got, module(x).detach(), rtol=1e-5, atol=1e-5)
    graph = program.captured.exported.graph
    assert not [n for n in graph.nodes if n.target is torch.ops.aten._local_scalar_dense.default]


def test_a_float_read_an_input_reaches_is_still_refused_with_its_line():
    """A float varies from call to call, so no guard holds it (integers are compiled in with one:
    tests/test_guarded_reads.py)."""

    def scaled(x):
        return x * x.abs().max().item()

    with pytest.raises(emmy.EmmyError, match=r"_local_scalar_dense.*x\.abs\(\)\.max\(\)\.item\(\).*read into Python"):
        emmy.optimize(scaled, torch.randn(4))


def test_an_exported_program_given_to_optimize_is_left_as_it_was():
    module, x = PositionsBySize(), torch.randn(2, 5, 8)
    exported = torch.export.export(module, (x,), strict=False).run_decompositions()
    reads_before = [n.name for n in exported.graph.nodes if n.target is torch.ops.aten._local_scalar_dense.default]
    program = emmy.optimize(exported, x)
    torch.testing.assert_close(program(x, device="interpret"), module(x).detach(), rtol=1e-5, atol=1e-5)
    assert reads_before and reads_before == [
        n.name for n in exported.graph.nodes if n.target is torch.ops.aten._local_scalar_dense.default]


def test_a_read_of_a_random_draw_is_no_constant():
    """torch.rand(1).item() reaches no input, but eager torch draws another number on each call:
    folding it in would fix one draw for ever. The read stays (and emmy refuses the draw)."""
    from emmy.capture.constant_reads import fold_constant_reads

    class Jitter(torch.nn.Module):
        def forward(self, x):
            return x * torch.rand(1).item()

    exported = torch.export.export(Jitter(), (torch.randn(4),), strict=False).run_decompositions()
    folded = fold_constant_reads(exported)
    assert [n for n in folded.graph.nodes if n.target is torch.ops.aten._local_scalar_dense.default]
    with pytest.raises(emmy.EmmyError, match=r"aten\.rand\.default .*torch\.rand\(1\)\.item\(\).*draws random"):
        emmy.optimize(Jitter(), torch.randn(4))


def _branch_on_positions(x):
    positions = torch.arange(3, 3 + x.shape[1])  # a cache's positions after 3 earlier tokens
    if positions[0] > 0:  # decoding after a prefix
        return x + positions[:, None]
    return x * 2


def _width_from_aranges(x):
    widths = torch.arange(1, 4)  # per-head widths, written as a table
    return x.reshape(x.shape[0], -1, int(widths[-1]))  # a view sized by a table's entry


@pytest.mark.parametrize("program", [_branch_on_positions, _width_from_aranges])
def test_a_branch_or_a_size_read_from_factory_values_is_taken_as_eager_takes_it(program):
    """torch.export's fake tensors have no values, so branching on an arange's entry or sizing a view
    by one was refused as data-dependent; the values are fixed by the code, and carried while emmy
    exports."""
    x = torch.randn(2, 5, 3)
    compiled = emmy.optimize(program, x)
    torch.testing.assert_close(compiled(x, sim_mode="asan"), program(x))


def test_a_factory_written_in_place_from_an_input_has_no_known_value():
    """torch forgets a value when the tensor is written by an op without one: the branch stays
    data-dependent, and refused."""

    def shifted(x):
        positions = torch.arange(x.shape[1])
        positions.add_(x[0].long())
        if positions[0] > 0:
            return x + 1
        return x * 2

    with pytest.raises(emmy.EmmyError, match=r"data-dependent control flow .*`if positions\[0\] > 0:"):
        emmy.optimize(shifted, torch.randn(3, 4))


_UNIT_TEMPERATURE = torch.tensor(1.0)


def _soft_argmax(x, temperature=_UNIT_TEMPERATURE):
    if temperature <= 0:  # kornia validates a default tensor argument so
        raise ValueError("temperature must be positive")
    return torch.softmax(x / temperature, dim=-1)


class ScaledUnlessUnit(torch.nn.Module):
    """A plain tensor attribute (no buffer), branched on."""

    def __init__(self):
        super().__init__()
        self.scale = torch.tensor([2.0, 3.0, 0.5, 1.0])

    def forward(self, x):
        return x * self.scale if self.scale[-1] != 1.0 else x + self.scale


@pytest.mark.parametrize("program", [_soft_argmax, ScaledUnlessUnit()])
def test_a_branch_on_a_tensor_the_code_holds_is_taken_as_eager_takes_it(program):
    x = torch.randn(3, 4)
    compiled = emmy.optimize(program, x)
    torch.testing.assert_close(compiled(x, sim_mode="asan"), program(x))


def test_a_factory_sized_by_a_value_read_in_the_trace_is_made_as_before():
    """A factory whose size is a tensor's value (`torch.full((n, positions[-1] + 1))` over positions the
    inputs reach) has a symbolic size: asking it for its element count made export guard on the
    symbol (Jamba's causal mask, refused as data-dependent where it had captured before). The size
    read from the input is compiled in with a guard (emmy.capture.guarded_reads)."""

    def causal(x, positions):
        mask = torch.full((x.shape[1], positions[-1] + 1), fill_value=-1.0)
        return mask.sum()

    x = torch.randn(2, 7)
    program = emmy.optimize(causal, x, torch.arange(7))
    assert program(x, torch.arange(7), sim_mode="asan").item() == causal(x, torch.arange(7)).item() == -49
    with pytest.raises(emmy.EmmyError, match=r"positions\[-1\].*compiled in as the example inputs' value, 7; "
                                             r"these inputs give 10"):
        program(x, torch.arange(3, 10))


def test_a_view_the_module_cached_on_an_earlier_call_is_captured():
    """neuralop's grid embedding keeps the grid it made (unsqueezed: a view) for later calls; met in
    the trace, a view cannot carry its value (torch makes its fake tensor from the base's and then
    refused it as a constant), so it is taken as a plain constant."""

    class CachedGrid(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.grid = None

        def forward(self, x):
            if self.grid is None:
                self.grid = torch.linspace(0, 1, x.shape[-1]).unsqueeze(0).unsqueeze(0)
            return torch.cat([x, self.grid.repeat(x.shape[0], 1, 1)], dim=1) * 2

    module, x = CachedGrid(), torch.randn(2, 3, 8)
    want = module(x)  # the eager call caches the grid
    program = emmy.optimize(module, x)
    torch.testing.assert_close(program(x, sim_mode="asan"), want)

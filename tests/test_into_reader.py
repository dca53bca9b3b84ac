"""A kernel computed inside its first reader (emmy.loop_ir.into_reader), and the nesting bound on
recomputed shared values (emmy.egraph.kernels.MAX_SHARED_CHAIN) that keeps an unrolled
recurrence's kernels the size of one step."""

import pytest
import torch

import emmy
from emmy.affine import Affine
from emmy.dtypes import DType
from emmy.loop_ir.into_reader import merge_into_readers
from emmy.loop_ir.nodes import Assign, Kernel, Load, Loop, LoopProgram, Op, Store, statements
from emmy.runtime import check_program
from emmy.tensor_ir.nodes import TensorType

F32 = DType.F32
ROW = TensorType((4, 8), F32)


def _pointwise(name: str, out: str, reads: list[tuple[str, tuple]], op: str = "add") -> Kernel:
    """out[a0, a1] = op of the loads `reads` (buffer, index), in one nest of two free loops."""
    loads = tuple(Assign(f"in{k}", F32, Load(buffer, index)) for k, (buffer, index) in enumerate(reads))
    value = Assign("v0", F32, Op(op, tuple(s.name for s in loads)))
    store = Store(out, (Affine.dim(0), Affine.dim(1)), "v0")
    return Kernel(name, out, ROW, (Loop(0, 4, (Loop(1, 8, (*loads, value, store)),)),))


HERE = (Affine.dim(0), Affine.dim(1))
TURNED = (Affine.dim(0), Affine.constant(7) - Affine.dim(1))


def _program(*kernels) -> LoopProgram:
    return LoopProgram(tuple(kernels), (("x", ROW), ("y", ROW)), (), tuple(k.output for k in kernels))


def test_a_value_read_where_it_was_written_is_computed_in_its_reader():
    first = _pointwise("k_c", "c", [("x", HERE), ("y", HERE)])
    second = _pointwise("k_h", "h", [("c", HERE), ("x", HERE)], "multiply")
    merged = merge_into_readers(_program(first, second), lambda *_: True)
    (kernel,) = merged.kernels
    assert [name for name, _ in kernel.outputs] == ["h", "c"]
    assert not any(isinstance(s, Assign) and isinstance(s.expr, Load) and s.expr.buffer == "c"
                   for s in statements(kernel.body))
    stores = [s for s in statements(kernel.body) if isinstance(s, Store)]
    assert [s.buffer for s in stores] == ["c", "h"]


@pytest.mark.parametrize("case", ["another position", "refused by the price"])
def test_a_value_stays_in_its_own_kernel_where_its_reader_cannot_or_should_not_compute_it(case):
    first = _pointwise("k_c", "c", [("x", HERE), ("y", HERE)])
    if case == "another position":  # the reader reads c at a column its own element does not compute
        program, accept = _program(first, _pointwise("k_h", "h", [("c", TURNED), ("x", HERE)])), (lambda *_: True)
    else:
        program, accept = _program(first, _pointwise("k_h", "h", [("c", HERE), ("x", HERE)])), (lambda *_: False)
    assert merge_into_readers(program, accept) == program


def _statements_per_kernel(program) -> list[int]:
    return [sum(1 for _ in statements(k.body)) for k in program.loop_ir.kernels]


def test_an_unrolled_lstm_keeps_kernels_the_size_of_a_step_and_runs_right():
    """Each step's kernel recomputed every earlier step's cell state (it grew by a step's work per
    step, and 32 steps took 90 s to extract); now a step's kernel is the same size at step 3 and
    step 12, each computes its cell state and stores it beside its output, and the program runs
    right in the simulator (ASan on)."""
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(64, 64, batch_first=True).eval()
    short = emmy.optimize(lstm, torch.randn(2, 3, 64), stop_after="loop")
    x = torch.randn(2, 12, 64)
    long = emmy.optimize(lstm, x)
    assert max(_statements_per_kernel(long)) <= max(_statements_per_kernel(short)) + 8
    assert sum(1 for k in long.loop_ir.kernels if k.more_outputs) >= 5  # cell states, stored by their readers
    assert all(c.ok for c in check_program(long, [x], mode="asan"))
    # the merged kernels are priced again: the extraction's prediction is the program's, kernel by kernel
    prices, tiles = long.loop_result.kernel_prices, long.tile_ir.kernels
    assert [p.signature for p in prices] == [t.signature for t in tiles]
    assert long.loop_result.predicted_seconds == pytest.approx(sum(t.seconds for t in tiles))

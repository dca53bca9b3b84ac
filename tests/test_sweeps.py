"""A row's sweep runs over the row as one axis: norms over several axes (LayerNorm over (C, H, W),
GroupNorm, a sum over two axes broadcast back) fold and sweep rows of their full length, and
GroupNorm folds once per group, not once per channel."""

import math

import numpy as np
import pytest

import emmy
from emmy.affine import Affine
from emmy.loop_ir.nodes import Loop

CASES = {
    "layer norm (C,H,W)": ("x=torch.randn(2,4,16,16); w=torch.randn(4,16,16); b=torch.randn(4,16,16); "
                           "torch.nn.functional.layer_norm(x, (4,16,16), w, b)", 2, 1024),
    "group norm, affine": ("m=torch.nn.GroupNorm(4, 16); x=torch.randn(2,16,8,8); m(x)", 8, 256),
    "group norm": ("x=torch.randn(3,16,4,4); torch.nn.functional.group_norm(x, 2)", 6, 128),
    "rms norm (H,W)": ("x=torch.randn(4,8,16); w=torch.randn(8,16); torch.nn.functional.rms_norm(x, (8,16), w)",
                       4, 128),
    "sum over two axes, transposed out": ("x=torch.randn(4,8,16); (x - x.mean(dim=(1,2), keepdim=True)).transpose(1,2)",
                                          4, 128),
    "per-channel factor in the sweep": ("x=torch.randn(4,8,16); y=torch.randn(4,8,1); "
                                        "x / x.sum(dim=(1,2), keepdim=True) * y", 4, 128),
}


def _row_kernel(program):
    """The one kernel, and the loops of one row: (row loop extents, loops in the row's body)."""
    (kernel,) = program.loop_ir.kernels
    rows, level = [], kernel.body
    while len(level) == 1 and isinstance(level[0], Loop) and not level[0].reduction:
        rows.append(level[0].extent)
        level = level[0].body
    return rows, [s for s in level if isinstance(s, Loop)]


@pytest.mark.parametrize("name", CASES)
def test_a_rows_fold_and_sweep_each_run_once_over_the_whole_row(name):
    code, rows, length = CASES[name]
    program = emmy.optimize(code, target="sm_90", knobs="REDUCE=coop")
    row_loops, body_loops = _row_kernel(program)
    assert math.prod(row_loops) == rows  # GroupNorm: a row per (sample, group), not per channel
    assert body_loops and all(loop.extent == length for loop in body_loops)
    assert any(loop.reduction for loop in body_loops) and any(not loop.reduction for loop in body_loops)


@pytest.mark.parametrize("name", CASES)
def test_the_coalesced_sweeps_run_right_in_the_simulator(name):
    from emmy.runtime import check_program

    code, _, _ = CASES[name]
    program = emmy.optimize(code, target="sm_90", knobs="REDUCE=coop,TILE=f4/v4")  # vectors where contiguous
    assert all(c.ok for c in check_program(program, mode="asan")), name


def test_a_contiguous_sweep_loads_and_stores_vectors_with_plain_offsets():
    """The merged sweep's reads and writes are contiguous: the CUDA indexes them by the row's
    element, without the division and remainder the coordinates were recovered by."""
    code, _, _ = CASES["group norm, affine"]
    program = emmy.optimize(code, target="sm_90", knobs="REDUCE=coop,TILE=f4/v4")
    cuda = program.cuda_source
    assert "emmy::store_vec<4>(&g_group_norm_shifted[" in cuda
    assert "emmy::load_vec<4>(&g_x[" in cuda


def test_kernel_ir_lists_a_serial_loop_inside_an_element_loop():
    """A sweep element that folds its own short axis (z.sum(-1) per element) keeps that loop; the
    Kernel IR listing shows it nested under the element loop."""
    code = "x=torch.randn(4,8,16); z=torch.randn(4,8,16,5); x / x.sum(dim=(1,2), keepdim=True) + z.sum(-1)"
    program = emmy.optimize(code, target="sm_90", knobs="REDUCE=coop,STAGE=")  # not held: plain loads
    listing = program.ir("kernel").splitlines()
    (element,) = [i for i, line in enumerate(listing) if line.startswith("for a2 in tid*1..128")]
    assert listing[element + 2].startswith("  for a3 in 0..5")
    assert listing[element + 3].startswith("    in1 = load z[a0, a2 // 16, a2 % 16, a3]")


@pytest.mark.parametrize("extents,strides", [((8, 8192), (8192, 1)), ((3, 5, 7), (35, 7, 1)), ((6, 10), (10, 1))])
def test_digit_recovers_each_coordinate_of_a_row_major_offset(extents, strides):
    """Affine.digit is exact: the coordinates of a row-major shape from the linear offset of
    another loop nest over the same elements, checked at every point."""
    total = math.prod(extents)
    offset = sum((Affine.dim(k) * s for k, s in enumerate(strides)), Affine.constant(0))
    coords = np.meshgrid(*(np.arange(n) for n in extents), indexing="ij")
    linear = sum(c * s for c, s in zip(coords, strides))
    for shape in ((total,), (2, total // 2), (total // 4, 2, 2)) if total % 4 == 0 else ((total,),):
        step = 1
        for n in reversed(shape):
            got = offset.digit(step, n, list(extents)).evaluate(coords)
            assert np.array_equal(got, linear // step % n), (shape, step, n)
            step *= n

"""The kernel the cost model prices is the kernel the lowering emits.

For every offered row of every kernel of the reference workloads and of held-out programs
(LayerNorm over three trailing dims, GroupNorm, a middle-axis sum, a spatial mean), the launch
the model prices (emmy.schedule.geometry: threads a block, blocks, vector width) is the launch
the Kernel IR makes. For a sample of rows of every map, row and column kernel, the bytes the
model says the kernel's threads request from global memory (schedule.cost_model.requested_bytes)
are the bytes the simulator counts, access by access, when the emitted CUDA runs; for staged
contractions (micro-tiled and strided SIMT rows) the panel bytes the model sends through L2 are
the bytes the kernel requests (cp.async copies counted as they complete).
"""

from __future__ import annotations

import dataclasses
from math import prod

import numpy as np
import pytest

import emmy
from emmy.schedule.cost_model import requested_bytes
from emmy.schedule.loop_cost import kernel_cost
from emmy.extract.targets import get_target
from emmy.kernel_ir import nodes as K
from emmy.kernel_ir.index_faults import INDEX_FAULTS
from emmy.kernel_ir.lower import lower_kernel
from emmy.kernel_ir.lower import lowers_row
from emmy.schedule.pricing import KernelPricer
from emmy.tile_ir.build import tile_kernel
from emmy.schedule.geometry import geometry
from emmy.schedule.shape import kernel_shape
from emmy.workloads import WORKLOADS

from tests.conftest import compiled

HELD_OUT = {
    "layer_norm_chw": "x=torch.randn(4,8,16,16); w=torch.randn(8,16,16); b=torch.randn(8,16,16); "
                      "torch.nn.functional.layer_norm(x,(8,16,16),w,b)",
    "group_norm": "x=torch.randn(2,8,8,8); w=torch.randn(8); b=torch.randn(8); torch.nn.functional.group_norm(x,4,w,b)",
    "sum_middle_axis": "x=torch.randn(3,40,70); x.sum(dim=1)",
    "mean_hw": "x=torch.randn(2,6,9,9); x.mean(dim=(2,3))",
    # few long rows and few columns: split across blocks (a workspace, or atomics)
    "var_few_rows": "x=torch.randn(4,20000); x.var(dim=-1)",
    "scaled_mean_few_rows": "x=torch.randn(3,9000); w=torch.randn(3); x.mean(-1)*w",
    "centered_sq_few_rows": "x=torch.randn(3,9000); m=torch.randn(3,1); ((x-m)**2).sum(-1)",
    "sum_few_columns": "x=torch.randn(3000,40); x.sum(dim=0)",
    # few long rows with a sweep: a grid-synced row offered (its sweep's bytes too)
    "softmax_few_long_rows": "x=torch.randn(3,4096); torch.softmax(x, dim=-1)",
    # chained folds merged in the e-graph: one row read through two composed reshapes, and a column
    "chained_max_rows": "x=torch.randn(3,5,6,40); x.amax(-1).amax(-1).amax(-1)",
    "chained_sum_columns": "x=torch.randn(4,30,20,8); x.sum(1).sum(1)",
    # a padded convolution: its input staged through the padding's guards (SIMT, micro-tile and mma rows)
    "conv_padded_f16": "x=torch.randn(1,32,10,10,dtype=torch.float16); c=nn.Conv2d(32,64,3,padding=1).half(); c(x)",
}
PROGRAMS = {w.name: w.sim_code or w.code for w in WORKLOADS} | HELD_OUT


def _program(name: str):
    return compiled(PROGRAMS[name], "sm_90")


def _vector_widths(node, found: list[int]) -> list[int]:
    """The widths of every vector load, store and staged panel in a Kernel IR node."""
    if isinstance(node, (K.VecLoad, K.VecStore, K.Panel)):
        found.append(node.width)
    for field in dataclasses.fields(node) if dataclasses.is_dataclass(node) else ():
        value = getattr(node, field.name)
        for item in value if isinstance(value, tuple) else (value,):
            if dataclasses.is_dataclass(item) and not isinstance(item, type):
                _vector_widths(item, found)
    return found


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_every_offered_row_launches_the_grid_block_and_vectors_the_model_prices(name):
    program = _program(name)
    types, space = program.buffer_types, program.schedule_space()
    checked = 0
    for kernel in program.loop_ir.kernels:
        shape = kernel_shape(kernel)
        for row in space.rows[kernel.name]:
            tile = tile_kernel(kernel, shape, row)
            (main,) = [k for k in lower_kernel(tile, types) if k.name == kernel.name]
            g = tile.geometry
            assert main.block == (g.threads, 1, 1), (kernel.name, str(row))
            assert prod(main.grid) == g.blocks, (kernel.name, str(row), main.grid)
            # mma fragments, flash tiles and micro-tiles promise no TILE vectors
            if not g.mma and not g.micro_m and shape.kind != "attention":
                assert max(_vector_widths(main, []), default=1) == g.vec, (kernel.name, str(row))
            assert _staged_bytes(main) == g.smem_bytes <= program.target.smem_per_block, (kernel.name, str(row))
            checked += 1
    assert checked == sum(len(rows) for rows in space.rows.values()) > 0


def _staged_bytes(kernel: K.KernelIR) -> int:
    """The shared memory a lowered kernel holds: dynamic (flash tiles, mma panels) and static (SIMT
    and micro-tiled panels, a column block's partial folds), all but a row reduction's warp-tree
    scratch (`*_partials`, one value a warp and accumulator: never what limits occupancy, and left
    out of the geometry)."""
    return kernel.dynamic_smem + sum(s.size * s.dtype.itemsize for s in kernel.shared
                                     if not s.name.endswith("_partials"))


STAGED = sorted(w.name for w in WORKLOADS if w.name in ("matmul_small", "mlp", "matmul_f16", "attention",
                                                        "llama_decoder", "lm_step")) + ["conv_padded_f16"]


@pytest.mark.parametrize("target", ["sm_80", "sm_89", "sm_120"])
def test_the_rules_the_geometry_and_the_lowerings_agree_on_shared_memory(target):
    """One shared-memory formula (schedule.geometry): every row the rules offer on the other targets
    (sm_90 above) fits the target, and the lowered kernel stages exactly what the geometry says,
    for every staged kernel of the workloads with contractions and attention (their sm_90 kernels:
    the space and the lowering are the target's own)."""
    chosen, checked = get_target(target), 0
    for name in STAGED:
        program = _program(name)
        kernels = [k for k in program.loop_ir.kernels if kernel_shape(k).kind in ("contraction", "attention")]
        pricer = KernelPricer(chosen, lowers_row)
        for kernel in kernels:
            shape = kernel_shape(kernel)
            for row in pricer.offered(kernel, program.buffer_types):
                tile = tile_kernel(kernel, shape, row)
                (main,) = [k for k in lower_kernel(tile, program.buffer_types) if k.name == kernel.name]
                assert _staged_bytes(main) == tile.geometry.smem_bytes <= chosen.smem_per_block, \
                    (name, kernel.name, str(row))
                checked += 1
    assert checked > 100


def _sampled_rows(program, kernel, shape) -> list:
    """The cheapest row of each (REDUCE, TILE) pair, cheapest first, three at most; the
    cheapest grid-synced row (REDUCE=g<N>s) where one is offered; and the cheapest row held in
    registers (STAGE=regs) of a cooperating block and of a grid where offered."""
    ranked = program.ranked_rows(kernel)
    picked, seen = [], set()
    for breakdown in ranked:
        if (breakdown.row.REDUCE, breakdown.row.TILE) not in seen:
            seen.add((breakdown.row.REDUCE, breakdown.row.TILE))
            picked.append(breakdown.row)
    grid = [b.row for b in ranked if b.row.reduce.grid]
    chosen = picked[:3] + [r for r in grid[:1] if r not in picked[:3]]
    for grid_synced in (False, True):
        held = [b.row for b in ranked if b.row.stage.held and b.row.reduce.grid == grid_synced]
        chosen += [r for r in held[:1] if r not in chosen]
    return chosen


def _filled_by_the_interpreter(program, buffers: dict) -> None:
    """Each kernel output's values, from the Loop IR interpreter (in kernel storage): what the
    counted rows read, without running the whole program in the instrumented build."""
    from emmy.dtypes import from_device
    from emmy.loop_ir.interpreter import run_kernel
    from emmy.runtime import to_device

    types = program.buffer_types
    values = {name: from_device(b, types[name].dtype) for name, b in buffers.items() if name in types}
    for kernel in program.loop_ir.kernels:
        for name, out in run_kernel(kernel, values).items():
            values[name] = out
            buffers[name][...] = to_device(out, types[name].dtype).reshape(buffers[name].shape)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_the_bytes_the_model_requests_are_the_bytes_the_emitted_kernels_move(name):
    """Counted in the simulator's race-check build, which instruments every load and store. An
    index tensor (embedding ids) may be read less often than the model says, never more: the
    compiler keeps an index value in a register across a loop that does not change it."""
    import emmy.sim as sim
    from emmy.kernel_ir.cuda import program_source
    from emmy.runtime import check_inputs, host_buffers, launch_in_order

    program = _program(name)
    types = program.buffer_types
    sizes = {n: (t.numel, t.dtype.itemsize) for n, t in types.items()}
    variants, kernels = [], {k.name: k for k in program.kernel_ir}
    for kernel in program.loop_ir.kernels:
        shape = kernel_shape(kernel)
        if shape.kind not in ("map", "row", "column"):
            continue
        cost = kernel_cost(kernel, sizes)
        for i, row in enumerate(_sampled_rows(program, kernel, shape)):
            lowered = [dataclasses.replace(k, name=f"{k.name}_row{i}")
                       for k in lower_kernel(tile_kernel(kernel, shape, row), types)]
            kernels |= {k.name: k for k in lowered}
            variants.append((kernel, row, f"{kernel.name}_row{i}", lowered,
                             requested_bytes(shape, row, geometry(shape, row), cost)))
    if not variants:
        pytest.skip("no map, row or column kernels")
    module = sim.load(program_source(list(kernels.values()), types, {}), "counted.cu", mode="racecheck")
    buffers = host_buffers(program, check_inputs(program, program.example_inputs))
    for kernel in kernels.values():  # scratch of the sampled rows (a split's workspace)
        buffers |= {p.name: np.zeros(p.scratch, p.dtype.numpy) for p in kernel.params if p.name not in buffers}
    _filled_by_the_interpreter(program, buffers)  # every buffer a kernel reads holds its values
    for kernel, row, main, lowered, model in variants:
        counts: dict = {}
        launch_in_order(module, program, lowered, buffers, counts)
        moved: dict = {}  # the row's kernels (a split's finishing kernel too), but not the fill before atomics
        fills = {k.name for k in lowered if isinstance(k.body[0], K.Fill)}
        for name_, per_buffer in counts.items():
            if name_ not in fills:
                for b, (r, w) in per_buffer.items():
                    if b != INDEX_FAULTS:
                        moved[b] = (moved.get(b, (0, 0))[0] + r, moved.get(b, (0, 0))[1] + w)
        index_tensors = {b.buffer for b in kernel_cost(kernel, sizes).buffers if b.index}
        where = (name, kernel.name, str(row))
        assert sum(w for _, w in moved.values()) == pytest.approx(model.written), where
        expected = dict(model.by_buffer)
        atomics = model.read - sum(expected.values())  # a split row's blocks read the output to add
        if atomics:
            expected[kernel.output] = expected.get(kernel.output, 0.0) + atomics
        for buffer in set(expected) | set(moved):
            read, predicted = moved.get(buffer, (0, 0))[0], expected.get(buffer, 0.0)
            if buffer in index_tensors:
                assert 0 < read <= predicted + 1e-6, (*where, buffer, read, predicted)
            else:
                assert read == pytest.approx(predicted), (*where, buffer, read, predicted)


def _counted(program, variants) -> list[dict]:
    """For each kernel of `variants` (one simulator build for all), (bytes read, bytes written)
    per buffer when it runs in the race-check simulator."""
    import emmy.sim as sim
    from emmy.kernel_ir.cuda import program_source
    from emmy.runtime import check_inputs, host_buffers, launch_in_order

    module = sim.load(program_source(variants, program.buffer_types, {}), "panels.cu", mode="racecheck")
    buffers = host_buffers(program, check_inputs(program, program.example_inputs))
    found = []
    for kernel in variants:
        counts: dict = {}
        launch_in_order(module, program, [kernel], buffers, counts)
        moved: dict = {}
        for per_buffer in counts.values():
            for b, (r, w) in per_buffer.items():
                if b != INDEX_FAULTS:
                    moved[b] = (moved.get(b, (0, 0))[0] + r, moved.get(b, (0, 0))[1] + w)
        found.append(moved)
    return found


@pytest.mark.parametrize("code", ["a=torch.randn(100,72); b=torch.randn(72,90); a @ b",  # ragged M, N and K
                                  "a=torch.randn(2,33,40); b=torch.randn(2,40,70); a @ b",  # batched
                                  "a=torch.randn(64,48); b=torch.randn(80,48); a @ b.t()"])  # B along K
def test_a_staged_contraction_reads_the_panel_bytes_the_model_sends_through_l2(code):
    """Every block reads its A panel (BM x K) and its B panel (K x BN): the model's L2 bytes
    (schedule.cost_model.contraction_traffic) are the bytes the emitted kernel requests, for
    micro-tiled and strided SIMT rows, as the simulator counts them."""
    from emmy.schedule.cost_model import contraction_traffic
    from emmy.extract.targets import get_target

    program = emmy.optimize(code, target="sm_90")
    types = program.buffer_types
    (kernel,) = program.loop_ir.kernels
    shape = kernel_shape(kernel)
    rows = [r for r in program.schedule_space().rows[kernel.name]
            if r.STAGE and not r.REDUCE and not r.TILE.startswith("mma")]
    picked = [r for r in rows if r.TILE.startswith("r")][:3] + [r for r in rows if r.TILE.startswith("f")][:2]
    assert any(r.TILE.startswith("r") for r in picked) and any(r.TILE.startswith("f") for r in picked)
    sizes = {n: (t.numel, t.dtype.itemsize) for n, t in types.items()}
    cost = kernel_cost(kernel, sizes)
    variants = [dataclasses.replace(k, name=f"{k.name}_row{i}")
                for i, row in enumerate(picked) for k in lower_kernel(tile_kernel(kernel, shape, row), types)]
    assert len(variants) == len(picked)
    for row, moved in zip(picked, _counted(program, variants)):
        _, through_l2 = contraction_traffic(shape, geometry(shape, row), cost, get_target("sm_90"), 1)
        counted = sum(r + w for r, w in moved.values())
        assert counted == pytest.approx(through_l2), (str(row), moved, through_l2)


def test_a_flash_row_whose_rounded_v_tile_overflows_shared_memory_is_not_offered():
    """Under mma atoms the V tile's rows round up to 16 (ldmatrix): with BN = 8 keys a step, head 896
    and 128 value columns, four stages need 102,400 bytes, over sm_89's 101,376 a block, though the
    unrounded formula (94,208) would admit them."""
    code = ("q=torch.randn(1,2,1024,896,dtype=torch.float16); k=torch.randn(1,2,1024,896,dtype=torch.float16); "
            "v=torch.randn(1,2,1024,128,dtype=torch.float16); F.scaled_dot_product_attention(q,k,v)")
    program = emmy.optimize(code, target="sm_89")
    (kernel,) = [k for k in program.loop_ir.kernels if kernel_shape(k).kind == "attention"]
    shape, rows = kernel_shape(kernel), program.schedule_space().rows[kernel.name]
    narrow = {str(r.STAGE) for r in rows if r.WORK == "w1x1" and r.TILE.endswith("/f1x1/k1")}
    assert "d3/smem-async" in narrow and "d4/smem-async" not in narrow
    for row in rows:
        tile = tile_kernel(kernel, shape, row)
        (main,) = [k for k in lower_kernel(tile, program.buffer_types) if k.name == kernel.name]
        assert _staged_bytes(main) == tile.geometry.smem_bytes <= program.target.smem_per_block, str(row)

"""Rows held in registers (STAGE=regs): a row's fold keeps the elements its sweep (or a later
fold) loads again, so the row is read from memory once. emmy.schedule.held says which loads those
are; the rules offer the row when a thread's share fits MAX_HELD_BYTES; the cost model drops the
re-read and counts the registers; the lowering keeps register arrays of constant index."""

from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest

import emmy
from emmy.errors import EmmyError
from emmy.schedule.held import held_loads

LAYER_NORM_BIG = "ln = nn.LayerNorm((64,256,256)); x = torch.randn(16,64,256,256); ln(x)"
LAYER_NORM_SMALL = "x=torch.randn(3,8,16,16); w=torch.randn(8,16,16); b=torch.randn(8,16,16); " \
                   "torch.nn.functional.layer_norm(x,(8,16,16),w,b)"
TWO_PASS = "x=torch.randn(6,512); m=x.mean(-1,keepdim=True); v=((x-m)**2).mean(-1,keepdim=True); (x-m)/torch.sqrt(v+1e-5)"


def _loads(program) -> dict:
    return held_loads(program.loop_ir.kernels[0].body)


def test_the_loads_a_row_makes_again_are_found_and_only_those():
    two_pass = emmy.optimize(TWO_PASS, stop_after="loop")
    held = _loads(two_pass)
    assert len(held) == 2 and len(set(held.values())) == 1  # the variance's fold and the sweep reread x
    # a row whose sweep reads another buffer than its fold loads nothing twice
    other = emmy.optimize("x=torch.randn(6,512); y=torch.randn(6,512); y / x.sum(-1, keepdim=True)", stop_after="loop")
    assert _loads(other) == {}


def _bytes_read(program, knobs: str) -> dict:
    """Bytes each buffer gives the kernel under `knobs`, counted by the race-check simulator."""
    import emmy.sim as sim
    from emmy.kernel_ir.cuda import program_source
    from emmy.runtime import check_inputs, host_buffers, launch_in_order

    pinned = emmy.optimize(program, target="sm_90", knobs=knobs)
    module = sim.load(program_source(list(pinned.kernel_ir), pinned.buffer_types, {}), "held.cu", mode="racecheck")
    buffers = host_buffers(pinned, check_inputs(pinned, pinned.example_inputs))
    for kernel in pinned.kernel_ir:
        buffers |= {p.name: np.zeros(p.scratch, p.dtype.numpy) for p in kernel.params if p.name not in buffers}
    counts: dict = {}
    launch_in_order(module, pinned, pinned.kernel_ir, buffers, counts)
    return {b: r for per_kernel in counts.values() for b, (r, _) in per_kernel.items()}


@pytest.mark.parametrize("reduce", ["REDUCE=g3s,WORK=t32,TILE=f2/v2", "REDUCE=coop,WORK=t64,TILE=f4/v4"])
def test_a_held_row_reads_its_input_once_and_runs_right_under_asan(reduce):
    x_bytes, w_bytes = 3 * 8 * 16 * 16 * 4, 8 * 16 * 16 * 4
    plain, held = (_bytes_read(LAYER_NORM_SMALL, f"{reduce},STAGE={stage}") for stage in ("", "regs"))
    assert plain["x"] == 2 * x_bytes and held["x"] == x_bytes
    assert plain["w"] == held["w"] == 3 * w_bytes  # every row reads the weight
    stage = "regs"
    if "g3s" in reduce:  # a grid's blocks keep their slices of both weights from the first row on
        kept = _bytes_read(LAYER_NORM_SMALL, f"{reduce},STAGE=regs/w2")
        assert kept["x"] == x_bytes and kept["w"] == kept["b"] == w_bytes
        stage = "regs/w2"
    result = subprocess.run([".venv/bin/emmy", "run", "--check", "--sim-mode", "asan", "--knobs", f"{reduce},STAGE={stage}",
                             "-c", LAYER_NORM_SMALL], capture_output=True, text=True)
    assert result.returncode == 0 and re.search(r"out0 .* ok", result.stdout), result.stdout + result.stderr


def test_kept_weights_survive_the_grid_barriers_in_the_simulator():
    """Each block's dynamic shared memory is its own across grid barriers (blocks take turns in the
    simulator): a weight loaded on the first row is read back on the third, so a simulator that
    lost it would give NaN."""
    from emmy.runtime import check_program

    program = emmy.optimize(LAYER_NORM_SMALL, target="sm_90", knobs="REDUCE=g3s,WORK=t32,TILE=f1,STAGE=regs/w2")
    (kernel,) = program.kernel_ir
    (tile,) = program.tile_ir.kernels
    assert kernel.dynamic_smem == tile.geometry.smem_bytes == 2 * 32 * 22 * 4  # 22 steps of one float a weight
    assert all(c.ok for c in check_program(program, mode="racecheck"))


def test_the_long_layer_norm_row_is_held_without_spilling_as_the_model_says():
    """H100, 16 rows of 4M: a grid of 1024-thread blocks holds 32 floats a thread; ptxas fits it in
    the 64 registers such a block allows, without spilling, and the model agrees."""
    program = emmy.optimize(LAYER_NORM_BIG, target="h100")
    (tile,) = program.tile_ir.kernels
    assert tile.row.STAGE == "regs/w1" and tile.row.reduce.grid and tile.row.work.threads == 1024
    # a block keeps 128 KB of one weight: both would not fit the H100's 227 KB
    assert tile.geometry.smem_bytes == 1024 * 32 * 4 == program.kernel_ir[0].dynamic_smem
    breakdowns = {}
    for stage in ("", "regs", "regs/w1"):
        pinned = emmy.optimize(LAYER_NORM_BIG, target="h100", knobs=f"{_pins(tile.row)},STAGE={stage}")
        breakdowns[stage] = pinned.tile_ir.kernels[0].breakdown
    assert not breakdowns["regs/w1"].spills and breakdowns["regs/w1"].registers <= 64
    # holding saves the row's second read of x (268 MB through L2); keeping the weight, the 15
    # later rows' reads of it (252 MB through L2): the sweep is bound by the L2 in all three
    l2 = program.target.l2_bandwidth
    row_bytes = 4194304 * 4
    assert breakdowns[""].memory_s - breakdowns["regs"].memory_s == pytest.approx(16 * row_bytes / l2, rel=1e-6)
    assert breakdowns["regs"].memory_s - breakdowns["regs/w1"].memory_s == pytest.approx(15 * row_bytes / l2,
                                                                                          rel=1e-6)
    resources = program.cubin().resources[tile.kernel.name]
    assert not resources.spills and resources.registers <= 64
    # the room the rules keep beside the weights holds the row's static arrays
    from emmy.rules.schedules import GRID_ROW_STATIC_SMEM

    assert 0 < resources.shared_bytes <= GRID_ROW_STATIC_SMEM
    assert resources.shared_bytes + tile.geometry.smem_bytes <= program.target.smem_per_block


def _pins(row) -> str:
    return ",".join(f"{k}={v}" for k, v in row.pinned().items() if k != "STAGE")


def test_a_row_too_long_to_hold_is_not_offered_and_a_pin_says_why():
    program = emmy.optimize(LAYER_NORM_BIG, target="a100", stop_after="loop")  # 108 blocks: 40 floats a thread
    rows = program.ranked_rows(program.loop_ir.kernels[0])
    assert any(r.row.reduce.split == 108 for r in rows)
    assert not any(r.row.reduce.split == 108 and r.row.stage.held for r in rows)
    with pytest.raises(EmmyError, match="STAGE=regs: one bf16 element at a time is not a vector the row can hold"):
        emmy.optimize("x=torch.randn(4,4096,dtype=torch.bfloat16); torch.softmax(x,-1)", target="sm_90",
                      knobs="REDUCE=g4s,WORK=t32,TILE=f1,STAGE=regs", stop_after="kernel")


@pytest.mark.parametrize("stage, sweep_loads", [("", True), ("regs", False)])
def test_only_a_held_row_leaves_its_sweep_without_global_loads_in_the_sass(stage, sweep_loads):
    """nvcc does not keep a cooperating block's row in registers by itself (its loops are not
    unrolled whole): the plain row's sweep, after the block's last barrier, loads x again; the
    held row's does not."""
    from emmy.nvcc import build_cubin, sass_opcodes

    program = emmy.optimize("x=torch.randn(64,4096); torch.softmax(x,-1)", target="sm_90",
                            knobs=f"REDUCE=coop,WORK=t128,TILE=f8/v4,STAGE={stage}")
    ops = sass_opcodes(build_cubin(program.cuda_source, "sm_90").path)["k_softmax"]
    last_barrier = max(i for i, op in enumerate(ops) if op.startswith("BAR.SYNC"))
    assert any(op.startswith("LDG") for op in ops[:last_barrier])  # the fold's loads
    assert any(op.startswith("LDG") for op in ops[last_barrier:]) == sweep_loads, ops[last_barrier:]
    assert any(op.startswith("STG.E.128") for op in ops[last_barrier:])


def test_a_half_precision_held_row_is_priced_a_register_an_element_and_what_is_chosen_does_not_spill():
    """A bf16 row held at 64 elements a thread (128 bytes: 32 registers packed) spilled when ptxas
    built it at t1024 (34 spill stores), where the model counted its packed registers and found it
    fit; priced a register an element, that row spills in the model too and is not chosen."""
    from emmy.nvcc import build_cubin
    from emmy.schedule.choose import loop_cost
    from emmy.schedule.cost_model import predict
    from emmy.schedule.knobs import parse_pins

    code = "x=torch.randn(16,65536,dtype=torch.bfloat16); torch.softmax(x,-1)"
    program = emmy.optimize(code, target="h200")
    (tile,) = program.tile_ir.kernels
    held_row = parse_pins("WORK=t1024,TILE=f8/v8,REDUCE=coop,STAGE=regs,RASTER=")
    assert held_row in {b.row for b in program.ranked_rows(tile.kernel)}  # offered, and priced as spilling
    breakdown = predict(tile.shape, held_row, program.target, loop_cost(tile.kernel, program.buffer_types))
    assert breakdown.spills and breakdown.registers > 64
    assert tile.row != held_row
    resources = build_cubin(program.cuda_source, "sm_90").resources[tile.kernel.name]
    assert resources.spill_stores == 0 and resources.spill_loads == 0

"""Choosing among a kernel's rows: every row's predicted (or measured) cost, cheapest first, and
why pins leave a kernel none."""

from __future__ import annotations

import dataclasses

from emmy.loop_ir.nodes import Kernel
from emmy.loop_ir.signature import signature
from emmy.rules.schedules import ATOM_DTYPE
from emmy.schedule.cost_model import predict
from emmy.schedule.knobs import Schedule, parse_value
from emmy.schedule.loop_cost import kernel_cost
from emmy.schedule.measured import current
from emmy.schedule.shape import KernelShape


def loop_cost(kernel: Kernel, types: dict):
    """The kernel's Loop IR work and traffic (emmy.schedule.loop_cost) under these buffer types."""
    return kernel_cost(kernel, {name: (t.numel, t.dtype.itemsize) for name, t in types.items()})


def ranked_rows(kernel: Kernel, shape: KernelShape, rows, target, types: dict) -> list:
    """Every row's cost breakdown (emmy.schedule.cost_model), cheapest first; ties keep the space's order.
    `types`: buffer name -> TensorType for the kernel's buffers (the program's `buffer_types`). A
    measured time for the kernel's signature (emmy.loop_ir.signature), the row and the target
    (emmy/schedule/measured.py) replaces the prediction."""
    cost = loop_cost(kernel, types)
    measurements = current()
    key = signature(kernel, types) if measurements.rows else ""
    predicted = []
    for row in rows:
        breakdown = predict(shape, row, target, cost)
        seconds = measurements.lookup(target.key, key, str(row)) if key else None
        if seconds is not None:
            breakdown = dataclasses.replace(breakdown, total_s=seconds, measured=True)
        predicted.append(breakdown)
    order = sorted(range(len(rows)), key=lambda i: (predicted[i].total_s, i))
    return [predicted[i] for i in order]


def no_row_message(shape: KernelShape, pins: Schedule, unpinned: tuple[Schedule, ...], target) -> str:
    """Why pins leave a kernel no legal row: each pinned value the kernel cannot take at all, with
    the values it can; or, when each could be legal alone, that they are not legal together."""
    pinned = pins.pinned()
    head = f"no legal schedule for kernel {shape.kernel} ({shape.describe()}) on {target.name} with {pins}"
    reasons = []
    tile = parse_value("TILE", pinned["TILE"]) if "TILE" in pinned else None
    if tile is not None and tile.mma:
        if not shape.mma:
            reasons.append(f"TILE={pinned['TILE']} needs a contraction of f16 or bf16 operands; this kernel is a "
                           f"{shape.describe()}")
        elif ATOM_DTYPE[tile.atom] != shape.mma:
            reasons.append(f"TILE={pinned['TILE']} multiplies {ATOM_DTYPE[tile.atom]} operands; this kernel's are "
                           f"{shape.mma}")
    for knob, value in pinned.items():
        legal = sorted({getattr(r, knob) for r in unpinned})
        if value not in legal and not (knob == "TILE" and reasons):
            shown = ", ".join(v if v else "(empty)" for v in legal[:12]) + (" ..." if len(legal) > 12 else "")
            reasons.append(f"{knob}={value} is not legal for this kernel; legal {knob} values here: {shown}")
    if "WORK" in pinned and tile is not None and parse_value("WORK", pinned["WORK"]).warps != tile.mma:
        reasons.append("WORK=t<N> (threads) goes with SIMT tiles f<N>[/v<V>], WORK=w<M>x<N> (warps) with mma tiles; "
                       f"WORK={pinned['WORK']} and TILE={pinned['TILE']} do not pair")
    if not reasons:
        reasons.append("each pinned value is legal alone but no legal row has them together "
                       "(tile sizes, shared memory or split limits; `emmy schedules` lists the rows)")
    return head + ": " + "; ".join(reasons)

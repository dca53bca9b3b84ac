"""Choosing among a kernel's rows: every row's predicted (or measured) cost, cheapest first, and
why pins leave a kernel none."""

from __future__ import annotations

import dataclasses

from emmy.loop_ir.nodes import Kernel
from emmy.loop_ir.signature import signature
from emmy.rules.schedules import ATOM_DTYPE, MAX_HELD_BYTES
from emmy.schedule.cost_model import predict
from emmy.schedule.geometry import held_bytes
from emmy.schedule.knobs import Schedule, parse_value
from emmy.schedule.loop_cost import kernel_cost
from emmy.schedule.measured import current
from emmy.schedule.shape import KernelShape


def loop_cost(kernel: Kernel, types: dict):
    """The kernel's Loop IR work and traffic (emmy.schedule.loop_cost) under these buffer types."""
    return kernel_cost(kernel, {name: (t.numel, t.dtype.itemsize) for name, t in types.items()})


def ranked_rows(kernel: Kernel, shape: KernelShape, rows, target, types: dict) -> list:
    """Every row's cost breakdown (emmy.schedule.cost_model), cheapest first; ties keep the space's order.
    `types`: buffer name -> TensorType for the kernel's buffers (the program's `buffer_types`).

    Where the kernel's signature (emmy.loop_ir.signature) has measured rows on the target
    (emmy/schedule/measured.py), a measured time replaces its row's prediction, the other rows'
    predictions are scaled by the median of measured over predicted time of the measured rows (the
    model's error on this kernel, so a measured row competes with like, not with the model's
    optimism), and rows measured wrong go last."""
    cost = loop_cost(kernel, types)
    measurements = current()
    key = signature(kernel, types) if measurements.rows or measurements.wrong else ""
    predicted = [predict(shape, row, target, cost) for row in rows]
    wrong = [bool(key) and measurements.is_wrong(target.key, key, str(row)) for row in rows]
    if key and measurements.has_signature(target.key, key):
        seconds = [measurements.lookup(target.key, key, str(row)) for row in rows]
        ratios = sorted(s / b.total_s for s, b in zip(seconds, predicted) if s is not None and b.total_s > 0)
        scale = ratios[len(ratios) // 2] if ratios else 1.0
        predicted = [dataclasses.replace(b, total_s=s, measured=True) if s is not None
                     else dataclasses.replace(b, total_s=b.total_s * scale, scale=scale)
                     for s, b in zip(seconds, predicted)]
    order = sorted(range(len(rows)), key=lambda i: (wrong[i], predicted[i].total_s, i))
    return [predicted[i] for i in order]


def _row_limit_reasons(shape: KernelShape, pinned: dict) -> list[str]:
    """Why pinned WORK, TILE and REDUCE values, each legal, pass a limit of a SIMT row together: a
    held row's registers (STAGE=regs) or a split row's slices narrower than a block's pass."""
    if shape.kind != "row" or not all(k in pinned for k in ("WORK", "TILE", "REDUCE")):
        return []
    work, tile, reduce = (parse_value(k, pinned[k]) for k in ("WORK", "TILE", "REDUCE"))
    if tile.mma or work.warps:
        return []
    reasons = []
    share = held_bytes(shape, work.threads, tile.elems, reduce.split)
    if "STAGE" in pinned and parse_value("STAGE", pinned["STAGE"]).held and share > MAX_HELD_BYTES:
        reasons.append(f"STAGE={pinned['STAGE']} keeps a thread's share of the row in registers, at most "
                       f"{MAX_HELD_BYTES} bytes; WORK={pinned['WORK']}, TILE={pinned['TILE']} and "
                       f"REDUCE={pinned['REDUCE']} give each thread {share} bytes of the {shape.red}-element row: "
                       f"more threads, or more blocks (a larger g<N>s), or STAGE= without regs")
    covered = work.threads * tile.elems * reduce.split
    if reduce.split > 1 and covered > shape.red:
        reasons.append(f"REDUCE={pinned['REDUCE']} splits each row among {reduce.split} blocks, each taking at "
                       f"least a pass of its {work.threads} threads x {tile.elems} elements: {covered} elements, "
                       f"more than the row's {shape.red}; fewer blocks, threads or elements a thread")
    return reasons


def no_row_message(shape: KernelShape, pins: Schedule, unpinned: tuple[Schedule, ...], target,
                   legal_alone=None) -> str:
    """Why pins leave a kernel no legal row: each pinned value the kernel cannot take at all, with
    the values it can; or, when each could be legal alone, that they are not legal together (and
    why, where a rule's limit says: a held row's registers, a split row's slices). `legal_alone(knob,
    value)` says whether a value outside the kernel's default candidates is legal with only itself
    pinned (pins widen a knob's candidates)."""
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
    limits = _row_limit_reasons(shape, pinned)
    reasons += limits
    for knob, value in pinned.items():
        legal = sorted({getattr(r, knob) for r in unpinned})
        if limits and knob in ("WORK", "TILE", "REDUCE", "STAGE"):
            continue  # values legal each, which together pass a rule's limit (said above)
        if value not in legal and legal_alone is not None and legal_alone(knob, value):
            continue  # outside the default candidates, but legal when pinned alone
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

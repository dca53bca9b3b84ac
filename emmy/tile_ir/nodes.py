"""Tile IR: a Loop IR kernel with its schedule, as a Fold tree.

A kernel is its free loops (placed on the grid and the threads), then a
sequence of parts: folds (a reduction loop: init, the lifted element, the
combine step), epilogue statements between them, and sweeps (free loops over
a row after its folds, writing outputs). The knob row is the one the
schedule space chose for it (cheapest, or the one pins left).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from emmy.loop_ir.nodes import Kernel, LoopProgram, Stmt
from emmy.schedule.cost_model import Breakdown
from emmy.schedule.geometry import Geometry
from emmy.schedule.knobs import Schedule
from emmy.schedule.shape import KernelShape


@dataclass(frozen=True)
class Placement:
    free: tuple[int, ...]  # loop variables with one output element (or row) each
    grid: tuple[str, ...]  # what each grid dimension walks, e.g. "a0" or "a0/16"
    work: str  # the WORK knob
    blocks: int
    threads: int


# The state of a twisted fold, by position of its Init statements: names for listings and merges.
TWIST_ROLES = {("softmax", 2): ("m", "d"), ("softmax", 3): ("m", "d", "z"), ("welford", 3): ("n", "mean", "m2")}


@dataclass(frozen=True)
class Fold:
    var: int
    extent: int
    twist: str  # "" | "softmax" | "welford": a fold whose state is stepped by Updates
    init: tuple[Stmt, ...]  # Init statements
    lift: tuple[Stmt, ...]  # statements computing the element (loads, ops)
    combine: tuple[Stmt, ...]  # Accumulate and Update statements


@dataclass(frozen=True)
class Sweep:
    var: int
    extent: int
    body: tuple[Stmt, ...]


@dataclass(frozen=True)
class Epilogue:
    body: tuple[Stmt, ...]  # statements after the folds, once per row


Part = Union[Fold, Sweep, Epilogue]


@dataclass(frozen=True)
class TileKernel:
    kernel: Kernel
    shape: KernelShape
    row: Schedule  # every knob set
    geometry: Geometry
    placement: Placement
    parts: tuple[Part, ...]
    legal_rows: int  # rows offered within the pins: the space the row was chosen from
    seconds: float  # the row's predicted time
    breakdown: Breakdown | None = None  # the chosen row's cost terms
    signature: str = ""  # the kernel's canonical signature (emmy.loop_ir.signature): keys measured times


@dataclass(frozen=True)
class TileProgram:
    kernels: tuple[TileKernel, ...]
    loops: LoopProgram

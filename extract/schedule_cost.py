"""A provisional per-row cost: enough to rank knob rows until the analytic
model of DESIGN.md section 4 (issue "cost model") replaces it.

time = launch + max(memory, compute) / wave efficiency (+ both, unoverlapped,
when tensor-core operands are not staged), where memory counts the re-reads a
tiling causes (A once per block column, B once per block row; less with
grouped rasterisation) and loads narrower than 16 bytes waste bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil

from emmy.knobs import KnobRow
from emmy.tile_ir.geometry import Geometry, geometry
from emmy.tile_ir.shape import KernelShape

SYNC = 2.0e-8  # s per block-wide barrier step


@dataclass(frozen=True)
class RowCost:
    seconds: float
    memory: float
    compute: float
    efficiency: float

    def render(self) -> str:
        return f"{self.seconds * 1e6:9.2f} us"


def row_cost(shape: KernelShape, row: KnobRow, target) -> RowCost:
    g = geometry(shape, row)
    bytes_moved = _bytes(shape, g, row)
    bandwidth = target.dram_bandwidth * min(1.0, 0.5 + g.vec * shape.itemsize / 32)
    memory = bytes_moved / bandwidth
    if shape.kind == "contraction":
        flops = 2.0 * shape.rows * shape.cols * shape.red * shape.batch
    elif shape.kind == "attention":  # q.k and the weighted sum
        flops = 2.0 * shape.rows * shape.red * (shape.inner + shape.cols) * shape.batch
    else:
        flops = float(shape.rows * max(shape.red, 1)) * (3 if shape.sweep else 1)
    tensor = target.bf16_tensor_flops if shape.mma == "bf16" else target.tensor_flops
    compute = flops / (tensor if g.mma else target.fp32_flops)
    efficiency = _wave_efficiency(g, target)
    overlap = max(memory, compute) if (not g.mma or g.stage_depth) else memory + compute
    if g.stage_how == "smem":
        overlap = 0.75 * max(memory, compute) + 0.25 * min(memory, compute)
    seconds = target.launch_seconds + overlap / efficiency
    if row.REDUCE == "coop":
        seconds += SYNC * max(1, g.threads.bit_length()) * ceil(g.blocks / (target.sms * 4))
    if row.REDUCE and row.REDUCE.endswith("k"):
        seconds += target.launch_seconds + shape.rows * shape.cols * shape.batch * g.split * 4 / target.dram_bandwidth
    return RowCost(seconds, memory, compute, efficiency)


def _bytes(shape: KernelShape, g: Geometry, row: KnobRow) -> float:
    isz = shape.itemsize
    if shape.kind == "map":
        return 2.0 * shape.rows * isz
    if shape.kind == "attention":  # q once; k and v once per block of query rows
        q = shape.rows * shape.inner * shape.batch * isz
        kv = shape.red * (shape.inner + shape.cols) * shape.batch * isz * ceil(shape.rows / g.tile_m)
        return q + kv * (1.0 if g.stage_depth else 1.5) + shape.rows * shape.cols * shape.batch * isz
    if shape.kind == "row":
        reread = 0.5 if shape.sweep else 0.0  # the sweep's second read mostly hits L2
        return shape.rows * shape.red * isz * (1 + reread) + shape.rows * isz
    a = shape.rows * shape.red * shape.batch * isz * ceil(shape.cols / g.tile_n)
    b = shape.red * shape.cols * shape.batch * isz * ceil(shape.rows / g.tile_m)
    reuse = 0.7 if g.raster_group else 1.0
    if not g.stage_depth:
        reuse *= 1.5  # operands re-fetched per warp rather than once per block
    return (a + b) * reuse + shape.rows * shape.cols * shape.batch * 4


def _wave_efficiency(g: Geometry, target) -> float:
    """The fraction of the GPU's issue capacity the launch keeps busy: SMs with work, threads
    resident on each (half the SM's maximum saturates memory), and the last wave's tail."""
    resident = min(target.blocks_per_sm, target.threads_per_sm // g.threads,
                   target.smem_per_sm // g.smem_bytes if g.smem_bytes else target.blocks_per_sm)
    resident = max(resident, 1)
    per_sm = min(resident, ceil(g.blocks / target.sms))
    waves = ceil(g.blocks / (target.sms * resident))
    spread = min(g.blocks, target.sms) / target.sms
    # tensor-core warps each keep far more work in flight: four a SM saturate the mma units
    saturating = 128 if g.mma else target.threads_per_sm / 2
    occupancy = min(1.0, per_sm * g.threads / saturating)
    tail = g.blocks / (waves * min(g.blocks, target.sms * resident))
    return max(spread * occupancy * tail, 1e-3)

"""What a knob row makes of a kernel: block size, block count, tiles, shared memory.

The schedule rules decide legality; this computes the launch a legal row
implies, for the Tile IR's placement line and for the schedule cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import ceil, isqrt

from emmy.schedule.knobs import Schedule
from emmy.schedule.shape import KernelShape

SIMT_K = 32  # K a staged SIMT contraction stages at a time
FLASH_SIMT_KEYS = 32  # keys a SIMT flash-attention block steps over at once
MICRO_K = 8  # K a register micro-tiled contraction stages at a time
MICRO_THREADS = (64, 128, 256)  # block sizes a micro-tiled contraction lays out (micro_layout)


def micro_layout(threads: int) -> tuple[int, int]:
    """(threads along N, threads along M) of a micro-tiled contraction's block: 16 lanes along N
    (two rows of a warp share each A vector, 16 B vectors fill a 256-byte B row), 8 under 128 threads."""
    along_n = 16 if threads >= 128 else 8
    return along_n, threads // along_n


def workspace_name(kernel: str) -> str:
    """The scratch buffer a split kernel's blocks leave their partial results in (REDUCE=g<N>k)."""
    return f"{kernel}_workspace"


def simt_tile(per_block: int) -> tuple[int, int]:
    """(BM, BN) of a SIMT contraction block of `per_block` outputs: square-ish, side x per_block // side."""
    side = max(1, isqrt(per_block))
    return side, max(1, per_block // side)


# Shared memory, one formula for the schedule rules' guards (called through egglog's PyObject), the
# geometry the cost model prices, and the tests that hold the lowerings to it.

def contraction_stage_bytes(bm: int, bn: int, bk: int, bytes_a: int, bytes_b: int) -> int:
    """One stage of a staged contraction: a BM x BK panel for each load on the A side, a BK x BN
    panel for each load on the B side (an operand prologue with several loads stages each);
    `bytes_a`, `bytes_b`: the element bytes of a side's loads, summed (KernelShape.panel_bytes)."""
    return bytes_a * bm * bk + bytes_b * bk * bn


def flash_bytes(bm: int, bn: int, inner: int, cols: int, itemsize: int, depth: int, mma: bool) -> int:
    """A flash-attention block's shared memory: K (BN x D) and V (BN x N) tiles `depth` deep, V's
    rows rounded up to 16 under mma atoms (ldmatrix reads 16 rows), and the Q tile (BM x D) once
    under mma atoms (the SIMT form keeps Q in registers)."""
    if not depth:
        return 0
    v_rows = -(-bn // 16) * 16 if mma else bn
    return depth * (bn * inner + v_rows * cols) * itemsize + (bm * inner * itemsize if mma else 0)


def fits(need: int, limit: int) -> str:
    """The rules' guard text: "yes" when `need` bytes fit `limit`, else "" (no row)."""
    return "yes" if need <= limit else ""


def simt_staged_fits(per_block: int, bytes_a: int, bytes_b: int, depth: int, limit: int) -> str:
    return fits(depth * contraction_stage_bytes(*simt_tile(per_block), SIMT_K, bytes_a, bytes_b), limit)


def flash_fits(bm: int, bn: int, inner: int, cols: int, itemsize: int, depth: int, mma: int, limit: int) -> str:
    return fits(flash_bytes(bm, bn, inner, cols, itemsize, depth, bool(mma)), limit)


def held_steps(shape: KernelShape, threads: int, elems: int, split: int) -> int:
    """The steps of `threads` x `elems` elements a thread takes in its block's slice of a row: the
    constant count a held row's element loops walk (STAGE=regs; the lowering's ElementLoop `steps`)."""
    return ceil(ceil(shape.red / (threads * elems)) / split)


def held_bytes(shape: KernelShape, threads: int, elems: int, split: int) -> int:
    """Bytes of one held operand a thread keeps under STAGE=regs: its `elems` elements in every
    held step, at the kernel's widest element (the rules' guard spells the same sum)."""
    return held_steps(shape, threads, elems, split) * elems * shape.itemsize


@dataclass(frozen=True)
class Geometry:
    threads: int  # per block
    blocks: int
    elems: int  # per thread per step (TILE f<N>), or outputs per thread
    vec: int  # vector width of loads
    smem_bytes: int
    split: int = 1  # blocks sharing one reduction (REDUCE g<N>)
    tile_m: int = 1  # output rows per block (contractions)
    tile_n: int = 1
    tile_k: int = 1
    mma: bool = False
    stage_depth: int = 0
    stage_how: str = ""  # smem | smem-async | smem-tma
    raster_group: int = 0
    micro_m: int = 0  # TILE r<RM>x<RN>: the outputs a thread holds, RM rows by RN columns
    micro_n: int = 0


@lru_cache(maxsize=65536)  # the schedule search asks for the same (shape, row) many times
def geometry(shape: KernelShape, row: Schedule) -> Geometry:
    work, tile, stage = row.work, row.tile, row.stage
    threads, split, depth, how = work.threads, row.reduce.split, stage.depth, stage.how
    group = row.raster.group
    if shape.kind == "attention":  # flash: BM query rows a block, BN keys a step
        if tile.mma:
            bm, bn = 16 * tile.frag_m * work.warps_m, 8 * tile.frag_n
        else:
            bm, bn = threads // 32 * tile.elems, min(FLASH_SIMT_KEYS, shape.red)
        smem = flash_bytes(bm, bn, shape.inner, shape.cols, shape.itemsize, depth, tile.mma)
        return Geometry(threads, ceil(shape.rows / bm) * shape.batch * split, tile.elems,
                        tile.vec, smem, split, bm, shape.cols, bn, tile.mma, depth, how, group)
    if tile.mma:
        bm = 16 * tile.frag_m * work.warps_m
        bn = 8 * tile.frag_n * work.warps_n
        bk = 16 * tile.k_chunks
        blocks = ceil(shape.rows / bm) * ceil(shape.cols / bn) * shape.batch * split
        smem = depth * contraction_stage_bytes(bm, bn, bk, *shape.panel_bytes)
        return Geometry(threads, blocks, tile.frag_m * tile.frag_n, 1, smem, split, bm, bn, bk, True,
                        depth, how, group)
    if tile.is_micro:  # SIMT contraction, register micro-tiles, K staged MICRO_K at a time
        rm, rn = tile.micro_m, tile.micro_n
        along_n, along_m = micro_layout(threads)
        bm, bn = along_m * rm, along_n * rn
        blocks = ceil(shape.rows / bm) * ceil(shape.cols / bn) * shape.batch * split
        smem = depth * contraction_stage_bytes(bm, bn, MICRO_K, *shape.panel_bytes)
        # panels fill 16 bytes at a time where the source is contiguous (the TILE promises no vectors)
        return Geometry(threads, blocks, rm * rn, 4, smem, split, bm, bn, MICRO_K, False, depth, how, group, rm, rn)
    elems, vec = tile.elems, tile.vec
    if shape.kind == "map":
        return Geometry(threads, ceil(shape.rows / (threads * elems)), elems, vec, 0)
    if shape.kind == "column":
        if row.reduce.serial:  # a thread an output, serial over its fold
            return Geometry(threads, ceil(shape.rows / threads), elems, vec, 0)
        # 32 outputs a block, a lane each; the block's warps share each output's fold (and
        # `split` blocks share it under g<N>a)
        return Geometry(threads, ceil(shape.rows / 32) * split, elems, vec, threads * 4, split)
    if shape.kind == "row":
        if row.reduce.serial:  # a thread a row
            return Geometry(threads, ceil(shape.rows / threads), elems, vec, 0)
        if row.reduce.grid:  # `split` blocks in all, taking every row in turn
            return Geometry(threads, split, elems, vec, stage.weights * threads * held_bytes(shape, threads, elems, split),
                            split)
        return Geometry(threads, shape.rows * split, elems, vec, 0, split)
    bm, bn = simt_tile(threads * elems)  # the Kernel IR lowering's tiles
    blocks = ceil(shape.rows / bm) * ceil(shape.cols / bn) * shape.batch * split
    smem = depth * contraction_stage_bytes(bm, bn, SIMT_K, *shape.panel_bytes)
    return Geometry(threads, blocks, elems, vec, smem, split, bm, bn, SIMT_K, False, depth, how, group)


def lane_access(shape: KernelShape, row: Schedule) -> str:
    """How a warp's 32 lanes read global memory under this row: "coalesced" when consecutive lanes
    read consecutive addresses (each 32-byte sector fetched once), "strided" when they are a stride
    apart (a sector for each lane's element). Lanes go along the fold in a cooperative row, along
    the outputs otherwise; contractions and attention stage tiles and are priced by their tiles."""
    if shape.kind in ("contraction", "attention", "column"):
        return "coalesced"
    if shape.kind == "row" and not row.reduce.serial:
        return "coalesced" if shape.fold_contiguous else "strided"
    return "coalesced" if shape.outputs_contiguous else "strided"

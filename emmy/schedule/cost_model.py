"""The analytic cost model: a kernel, one knob row and a target -> a predicted
time with every term that made it.

    total = launch + body + sync + extra
    body  = max(memory / (hiding * spread), compute / (spread * issue)) / tail

- memory: global-memory bytes, including the re-reads a tiling causes (A once
  per block column, B once per block row, less with grouped rasterisation;
  K and V once per block of query rows), over the bandwidth the access
  pattern achieves (narrow loads coalesce less well than 16-byte vectors);
  for maps and rows, every re-read the loop nest makes (a sweep reading its
  row again, a weight every row reads) at the bandwidth of the level its
  footprint fits in (L1, L2, DRAM), none for what a row held in registers
  (STAGE=regs) keeps; a grid-synced row phase by phase: its fold's DRAM
  reads, then its sweep, where DRAM and L2 traffic overlap;
- contractions: every block's A and B panels pass through the L2; DRAM
  serves A and B once when they fit the L2, else what each wave of blocks
  in flight needs (its panels), else every panel read;
- compute: the slowest of the FMA pipes (operations of the Loop IR kernel,
  counted per loop they depend on; an FMA is one), the tensor cores (the
  products an mma tile takes over, at the GPU's rate or at the rate shared
  memory feeds the atoms' fragments, whichever is slower: a warp of few
  atoms reads more fragment bytes a product), the special-function units (exp,
  rsqrt, ...) and instruction issue (the schedulers' one warp instruction
  a clock): for maps and reductions the FMA-pipe work plus the index
  math of their loads and stores (a floor division or modulo by a constant
  is 2-3 integer instructions, once per iteration of the loops it walks),
  for SIMT contractions FMAs, shared loads and index math;
- occupancy: blocks resident per SM from threads, shared memory and
  registers (an estimate from the tile's accumulators); `hiding` is the share
  of memory latency that resident warps or a cp.async/TMA pipeline hide;
  `spread` the share of SMs with work; `tail` the last wave's fill;
- latency: a contraction's K loop takes at least its chain of waits: a
  staged loop's copies spread over the stages in flight, chunk by chunk
  (staged_loop_seconds), an unstaged loop's loads a few K steps at a time
  (unstaged_loop_seconds);
- sync: a staged contraction's barrier a K chunk; barrier and shuffle
  steps of cooperative reductions (and, for a
  grid-synced row, per row a grid barrier and the first warp's merge of
  the blocks' partial states: N/32 reads a lane, then 5 shuffles); extra: the
  kernel a split reduction adds (the finishing kernel of a workspace split,
  the fill that sets the output before atomic adds).

A row whose register estimate exceeds the per-thread limit would spill: it
is marked and its memory term doubled, so it is never the cheapest.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from math import ceil, log2

from emmy.schedule.knobs import STAGE_ASYNC, STAGE_TMA, Schedule
from emmy.schedule.geometry import geometry, held_bytes, lane_access, workspace_name
from emmy.schedule.shape import KernelShape

SYNC_STEP = 2.0e-8  # s per barrier or shuffle step of a block
# A grid-wide barrier of a cooperative launch, one block an SM (an estimate of the order reported for
# cooperative_groups grid.sync on recent GPUs, about a microsecond or two; not yet measured here)
GRID_SYNC_SECONDS = 2.0e-6
# The first warp's merge of a grid-synced row's partial states: one L2 round trip after the barrier (the
# lanes' reads are independent), then a step per slice a lane folds and per shuffle (estimates)
GRID_MERGE_LATENCY = 5.0e-7
GRID_MERGE_STEP = 1.0e-8
BASE_REGS = 32  # registers a thread needs besides its accumulators and tiles
SECTOR_BYTES = 32  # the unit of a global-memory transaction


@dataclass(frozen=True)
class Breakdown:
    kernel: str
    row: Schedule
    bytes: float  # global memory, with the schedule's re-reads
    memory_s: float  # bytes over the achieved bandwidth
    arith_s: float  # FMA pipes
    tensor_s: float  # tensor cores
    special_s: float  # special-function units
    issue_s: float  # every instruction through the schedulers (SIMT contractions: FMAs, shared loads, index math)
    occupancy: float  # resident threads over the SM's maximum
    waves: int
    tail: float  # fill of the last wave
    spread: float  # share of SMs with work
    hiding: float  # share of memory latency hidden
    registers: int  # estimated registers a thread
    spills: bool
    body_s: float
    sync_s: float
    launch_s: float
    extra_s: float
    total_s: float
    measured: bool = False  # total_s is a measurement, not the sum
    scale: float = 1.0  # an unmeasured row of a measured kernel: total_s is the sum times the kernel's
    # measured/predicted ratio (emmy.schedule.choose.ranked_rows)

    @property
    def compute_s(self) -> float:
        return max(self.arith_s, self.tensor_s, self.special_s, self.issue_s)

    def terms(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("kernel", "row")}


def predict(shape: KernelShape, row: Schedule, target, loop_cost) -> Breakdown:
    """`loop_cost`: the kernel's extract.loop_cost.KernelCost (bytes and operation counts)."""
    g = geometry(shape, row)
    isz = shape.itemsize
    # a causal attention's blocks stop at their last unmasked key (emmy.schedule.key_bounds)
    live = shape.key_bound.fraction(g.tile_m, g.tile_k) if shape.kind == "attention" and shape.key_bound else 1.0
    moved = _bytes(shape, g, loop_cost, live)
    coalescing = 0.85 + 0.15 * min(1.0, g.vec * isz / 16)
    registers = _registers(shape, row, g, loop_cost)
    # a block of T threads gets at most the SM's registers over T each (64 at 1024 threads)
    spills = registers > min(target.regs_per_thread, target.regs_per_sm // g.threads)
    memory_s = moved / (target.dram_bandwidth * coalescing)
    sectors_s = 0.0
    if lane_access(shape, row) == "strided":  # a 32-byte sector per lane: the extra sectors come through L2
        sectors_s = loop_cost.bytes_read * (max(1, SECTOR_BYTES // isz) - 1) / target.l2_bandwidth
    memory_s += sectors_s

    tensor_flops = _tensor_flops(shape) if g.mma else 0.0
    rate = target.bf16_tensor_flops if shape.mma == "bf16" else target.tensor_flops
    tensor_s = tensor_flops * live / rate
    if shape.kind == "contraction" and g.mma and g.stage_depth:  # or the shared memory feeding its atoms
        tensor_s = max(tensor_s, mma_fragment_bytes(shape, row, g) / target.smem_bandwidth)
    # the products the tensor cores take over leave the FMA pipes (one FMA each: 2 FLOP)
    arith = loop_cost.arith_ops - tensor_flops / 2
    if shape.kind == "attention":
        # the Loop IR rescales z at every key; a flash block rescales once per BN keys
        arith -= shape.rows * shape.red * shape.cols * shape.batch * (1 - 1 / g.tile_k)
        arith *= live
    if shape.kind == "contraction" and g.mma and shape.prologue:
        arith += _fragment_prologue_ops(shape, row, g)
    arith = max(0.0, arith)
    arith_s = arith / (target.fp32_flops / 2) + loop_cost.f64_ops / (target.fp32_flops / 2 * target.fp64_fraction)
    special_s = loop_cost.special_ops * live / (target.fp32_flops / 2 * target.sfu_fraction)

    resident = max(1, min(target.blocks_per_sm, target.threads_per_sm // g.threads,
                          target.smem_per_sm // g.smem_bytes if g.smem_bytes else target.blocks_per_sm,
                          target.regs_per_sm // (min(registers, target.regs_per_thread) * g.threads)))
    occupancy = _blocks_an_sm(g, target, resident)[0] * g.threads / target.threads_per_sm
    slots = target.sms * resident
    issue_s = 0.0
    if shape.kind == "contraction":  # panels re-read through L2; DRAM serves what a wave's panels miss
        moved, through_l2 = contraction_traffic(shape, g, loop_cost, target, slots)
        memory_s = max(moved / (target.dram_bandwidth * coalescing), through_l2 / target.l2_bandwidth)
        if not g.mma:
            issue_s = simt_contraction_instructions(shape, g, loop_cost) / target.issue_rate
    elif shape.kind in ("map", "row", "column"):  # the FMA-pipe work and the index math share the issue
        issue_s = (max(0.0, arith) + loop_cost.f64_ops + loop_cost.index_ops) / target.issue_rate
    waves = ceil(g.blocks / slots)
    tail = g.blocks / (waves * min(g.blocks, slots))
    spread = min(1.0, 2.0 * min(g.blocks, target.sms) / target.sms)  # an SM draws up to twice its share
    pipeline = {STAGE_ASYNC: 0.25, STAGE_TMA: 0.3}.get(g.stage_how, 0.1 if g.stage_how else 0.0)
    hiding = min(1.0, occupancy / 0.5 + pipeline * g.stage_depth)
    issue = min(1.0, occupancy / (0.125 if g.mma else 0.25))
    if shape.kind in ("map", "row", "column"):  # contractions and attention price their re-reads by their tiles
        rows_per_block = 1 if shape.kind == "row" and not row.reduce.serial else g.threads
        in_flight = 1 if row.reduce.grid else min(shape.rows, slots * rows_per_block)  # a grid-synced row: one
        rereads = loop_cost.rereads
        if row.stage.held:  # the sweep takes the fold's elements from registers, kept weights from shared memory
            dropped = set(loop_cost.held_rereads) | {i for _, _, i in loop_cost.weights[:row.stage.weights]}
            rereads = tuple(r for i, r in enumerate(rereads) if i not in dropped)
        l1, l2, again = reread_levels(rereads, target, in_flight)
        if shape.kind == "row" and row.reduce.grid:
            memory_s = grid_row_memory(loop_cost, target, coalescing, l2, again) + l1 / target.l1_bandwidth + sectors_s
        else:
            memory_s += l1 / target.l1_bandwidth + l2 / target.l2_bandwidth + again / target.dram_bandwidth
        moved += again
    memory_s *= 2.0 if spills else 1.0
    compute_s = max(arith_s, tensor_s, special_s, issue_s)
    body_s = max(memory_s / (hiding * spread), compute_s / (spread * issue)) / tail
    staged_sync_s = 0.0
    if shape.kind == "contraction" and g.stage_depth:
        loop_s, staged_sync_s = staged_loop_seconds(shape, g, target, compute_s, memory_s, resident)
        body_s = max(body_s, loop_s)
    elif shape.kind == "contraction":
        body_s = max(body_s, unstaged_loop_seconds(shape, g, target, resident))

    sync_s = staged_sync_s
    if row.reduce.coop or shape.kind == "attention" or (g.split > 1 and shape.kind in ("row", "column")):
        steps = 5 + max(0, int(log2(max(g.threads, 32) // 32)))  # warp shuffles, then the block tree
        sync_s = SYNC_STEP * steps * waves
        if row.reduce.grid:  # every row in turn: its block trees, a grid barrier, the merge
            merge = ceil(g.split / 32) + 5  # a lane's slices, then the butterfly
            sync_s = shape.rows * (SYNC_STEP * steps + GRID_SYNC_SECONDS + GRID_MERGE_LATENCY + GRID_MERGE_STEP * merge)
    extra_s = 0.0
    if row.reduce.workspace:  # workspace out and back, and a finishing launch
        workspace = shape.rows * shape.cols * shape.batch * g.split * 4 * 2
        extra_s = target.launch_seconds + workspace / target.dram_bandwidth
    elif row.reduce.atomic:  # the fill kernel that sets the output first
        extra_s = target.launch_seconds + loop_cost.bytes_written / target.dram_bandwidth
    total = target.launch_seconds + body_s + sync_s + extra_s
    return Breakdown(shape.kernel, row, moved, memory_s, arith_s, tensor_s, special_s, issue_s, occupancy, waves, tail,
                     spread, hiding, registers, spills, body_s, sync_s, target.launch_seconds, extra_s, total)


def staged_loop_seconds(shape: KernelShape, g, target, compute_s: float, memory_s: float,
                        resident: int) -> tuple[float, float]:
    """(the time a staged contraction's K loop takes at least, its barriers' time). Every K chunk
    of BK ends in a barrier, and its copy must have landed first. With S stages a block has S - 1
    chunks in flight, so a copy's latency and transfer are spread over S - 1 chunks of compute;
    with one stage a block copies, waits and computes in turn. An SM's blocks share its tensor
    cores and its share of the L2 bandwidth, and one block's wait is covered by the others' work:
    a round of one chunk a block takes max(R x compute, R x transfer, one block's own path). The
    barriers (one a chunk) idle a lone block's SM and are shared among R: a shallow chunk (k1, 16
    of K) pays them, and the latency, every 16 products, which the throughput terms alone miss."""
    chunks = ceil(shape.red / g.split / g.tile_k)
    per_block_chunk = target.sms / (g.blocks * chunks)  # a whole SM's time for one block's chunk
    compute = compute_s * per_block_chunk
    transfer = memory_s * per_block_chunk
    latency = target.memory_latency_s
    if g.stage_depth > 1:
        own = max(compute, (latency + transfer) / (g.stage_depth - 1))
    else:  # copy, wait, compute; the stage is refilled only when every warp is done with it
        own = latency + transfer + compute
    blocks_per_sm, waves = _blocks_an_sm(g, target, resident)
    rounds = waves * chunks
    return (rounds * max(blocks_per_sm * compute, blocks_per_sm * transfer, own),
            rounds * SYNC_STEP * (2 if g.stage_depth == 1 else 1) / blocks_per_sm)


UNSTAGED_LOADS_IN_FLIGHT = 4  # K steps whose loads a thread issues together (nvcc unrolls a counted loop by 4)


def unstaged_loop_seconds(shape: KernelShape, g, target, resident: int) -> float:
    """The least time an unstaged contraction's K loop takes: each warp reads its operands from
    global memory as it goes (the block's re-reads hit the L1), a few K steps' loads in flight at
    once, so one warp's chain is a first L2 round trip and then an L1 hit every few steps; other
    warps run beside it, so a wave takes one chain. The staged loop's counterpart
    (staged_loop_seconds), so neither form is priced as if latency were free."""
    steps = ceil(shape.red / g.split / (16 if g.mma else 1))
    chain = target.memory_latency_s + ceil(steps / UNSTAGED_LOADS_IN_FLIGHT) * target.l1_latency_s
    return _blocks_an_sm(g, target, resident)[1] * chain


def _blocks_an_sm(g, target, resident: int) -> tuple[int, int]:
    """(blocks an SM runs at once: what fits, and no more than the grid gives it; waves of them)."""
    blocks_per_sm = max(1, min(resident, ceil(g.blocks / target.sms)))
    return blocks_per_sm, ceil(g.blocks / (target.sms * blocks_per_sm))


@dataclass(frozen=True)
class RequestedBytes:
    """Bytes the emitted kernel's threads request from global memory, before any cache (the
    simulator counts the same: tests/test_geometry.py)."""
    read: float
    written: float
    by_buffer: tuple[tuple[str, float], ...]  # reads per buffer (a split's atomics aside)


def requested_bytes(shape: KernelShape, row: Schedule, g, loop_cost) -> RequestedBytes:
    """What the threads of the kernel this row lowers to request from global memory (not part
    of `predict`, which prices every row: the check of the model's bytes asks for it), for maps,
    rows and column reductions (zero for tiled
    kernels, priced by their tiles): the Loop IR's loads, as each schedule runs them. A map's
    threads each recompute what the Loop IR hoisted; every thread of a cooperating block computes
    its row's epilogue (one thread stores it); a column block's lanes past the last output repeat
    it; a split row's blocks each fold a slice and add into the output (an atomic reads and
    writes it), or (g<N>k) leave their partial states in a workspace that a finishing kernel,
    a thread a row, merges before the row's epilogue: both kernels' bytes, the workspace's
    under its workspace_name."""
    if shape.kind not in ("map", "row", "column"):
        return RequestedBytes(0.0, 0.0, ())
    written = loop_cost.bytes_written
    kept = row.stage.held  # a row held in registers: its sweep does not load what its fold loaded
    if shape.kind == "row" and row.reduce.grid:  # each block's partial states out, every block reads them all
        states = loop_cost.accumulators * shape.rows * g.split * 4
        by_buffer = {b.buffer: b.loop - kept * b.held + b.row * (g.threads * g.split - 1) for b in loop_cost.buffers}
        for buffer, loaded, _ in loop_cost.weights[:row.stage.weights]:  # kept weights: the first row's reads
            by_buffer[buffer] -= loaded * (1 - 1 / shape.rows)
        by_buffer[workspace_name(shape.kernel)] = states * g.split
        return RequestedBytes(sum(by_buffer.values()), written + states, tuple(sorted(by_buffer.items())))
    if shape.kind == "row" and g.split > 1 and row.reduce.workspace:
        workspace = loop_cost.accumulators * shape.rows * g.split * 4
        by_buffer = {b.buffer: b.loop - b.row + (b.row - b.row_after) * g.threads * g.split + b.row
                     for b in loop_cost.buffers}
        by_buffer[workspace_name(shape.kernel)] = workspace  # written by the folding blocks, read by the finish
        return RequestedBytes(sum(by_buffer.values()), written + workspace, tuple(sorted(by_buffer.items())))
    by_buffer = {b.buffer: b.loop for b in loop_cost.buffers}
    if shape.kind == "map":
        by_buffer = {b.buffer: b.element for b in loop_cost.buffers}
    elif shape.kind == "column" and not row.reduce.serial:
        padded = ceil(shape.rows / 32) * 32 / shape.rows
        by_buffer = {b.buffer: (b.loop - b.row + b.row * g.threads // 32 * g.split) * padded for b in loop_cost.buffers}
    elif shape.kind == "row" and not row.reduce.serial:
        by_buffer = {b.buffer: b.loop - kept * b.held + b.row * (g.threads * g.split - 1) for b in loop_cost.buffers}
    read = sum(by_buffer.values())
    if g.split > 1:  # atomics (g<N>a): each block reads and writes its rows' results
        read, written = read + written * g.split, written * g.split
    return RequestedBytes(read, written, tuple(sorted(by_buffer.items())))


def _fragment_prologue_ops(shape: KernelShape, row: Schedule, g) -> float:
    """The change in operations when an operand's prologue runs on mma fragments instead of per
    output as the Loop IR counts it: each warp applies it to the elements it loads, so an A element
    is done once per block column and warp column, a B element once per block row and warp row."""
    warps = row.work
    per_a, per_b = shape.prologue_ops
    in_loop_ir = (per_a + per_b) * shape.rows * shape.cols * shape.red * shape.batch
    a = per_a * shape.rows * shape.red * shape.batch * ceil(shape.cols / g.tile_n) * warps.warps_n
    b = per_b * shape.cols * shape.red * shape.batch * ceil(shape.rows / g.tile_m) * warps.warps_m
    return a + b - in_loop_ir


def mma_fragment_bytes(shape: KernelShape, row: Schedule, g) -> float:
    """Bytes a staged mma tile's warps read from shared memory into fragments (ldmatrix): each
    warp, each K step of 16, its FM A fragments of 16 x 16 and FN B fragments of 16 x 8 (an
    m16n8k16 atom's operands). Few atoms a warp read more bytes a product: with one atom (FM = FN
    = 1) a warp's step moves 768 bytes for 4096 multiply-adds, more than an A100 or H100 SM's
    shared memory delivers in the time its tensor cores take."""
    tile = row.tile
    warps = row.work.warps_m * row.work.warps_n
    steps = ceil(shape.red / g.split / 16)  # a block's K steps of 16
    return g.blocks * steps * warps * (tile.frag_m * 16 * 16 + tile.frag_n * 16 * 8) * shape.itemsize


def reread_levels(rereads, target, rows_in_flight: int = 1) -> tuple[float, float, float]:
    """Reads beyond an element's first touch, each served by the smallest level its working set
    fits: an SM's L1, the L2, else DRAM again (emmy/schedule/loop_cost.py counts them). A row's own
    re-reads (a sweep after its fold) need every row in flight to keep its row: a softmax row of
    1.5 MB fits the L2 alone, not beside the hundreds of rows the other SMs are reading.
    Returns the bytes each level serves: (L1, L2, DRAM)."""
    l1 = l2 = dram = 0.0
    for moved, footprint, own_row in rereads:
        # an SM's L1 holds the rows that SM runs; the L2 holds every SM's
        per_sm = footprint * ceil(rows_in_flight / target.sms) if own_row else footprint
        everywhere = footprint * rows_in_flight if own_row else footprint
        if per_sm <= target.l1_reuse_bytes:
            l1 += moved
        elif everywhere <= target.l2_bytes:
            l2 += moved
        else:
            dram += moved
    return l1, l2, dram


def grid_row_memory(loop_cost, target, coalescing: float, l2_again: float, dram_again: float) -> float:
    """A grid-synced row's memory time, row phase by row phase (the grid barrier after each fold
    keeps the blocks in step): the fold reads its first touches from DRAM; the sweep's DRAM traffic
    (its first touches, its writes, what it reads again from DRAM) and its reads served by the L2
    overlap, bounded by the DRAM's rate and by the L2's rate for everything that passes it."""
    dram_rate = target.dram_bandwidth * coalescing
    fold = loop_cost.fold_read / dram_rate
    sweep_dram = loop_cost.bytes_read - loop_cost.fold_read + loop_cost.bytes_written + dram_again
    return fold + max(sweep_dram / dram_rate, (sweep_dram + l2_again) / target.l2_bandwidth)


def _tensor_flops(shape: KernelShape) -> float:
    if shape.kind == "contraction":
        return 2.0 * shape.rows * shape.cols * shape.red * shape.batch
    if shape.kind == "attention":
        return 2.0 * shape.rows * shape.red * (shape.inner + shape.cols) * shape.batch
    return 0.0


def _bytes(shape: KernelShape, g, loop_cost, live: float = 1.0) -> float:
    """`live`: the share of its keys an attention block walks."""
    isz = shape.itemsize
    base = loop_cost.bytes_read + loop_cost.bytes_written
    if shape.kind == "attention":
        q = shape.rows * shape.inner * shape.batch * isz
        per_key = (shape.inner + shape.cols) * isz + shape.key_bytes  # K, V and what is read per key beside them
        kv = shape.red * per_key * shape.batch * ceil(shape.rows / g.tile_m) * live
        scores = shape.rows * shape.red * shape.batch * shape.score_bytes * live  # a mask read per score
        return q + kv * (1.0 if g.stage_depth else 1.5) + scores + loop_cost.bytes_written
    return base


L2_SHARE = 0.5  # share of the L2 whole operands can count on staying in from wave to wave (estimate)
SIMT_INDEX_OPS = 3  # index and guard instructions per output per K step of a strided SIMT contraction


def contraction_traffic(shape: KernelShape, g, loop_cost, target, slots: int) -> tuple[float, float]:
    """(bytes from DRAM, bytes through L2) of a tiled contraction. Every block reads its A panel
    (BM x K) and B panel (K x BN) through the L2. The blocks in flight at once (a wave, walking the
    tiles row-major or in groups of `raster` tile rows) step along K together, so the blocks sharing
    a panel read each slice of it while it is in the L2: DRAM serves each wave its distinct panels
    once, and serves A and B once when both fit the L2 (and stay there from wave to wave)."""
    isz = shape.itemsize
    a_once = shape.rows * shape.red * shape.batch * isz
    b_once = shape.red * shape.cols * shape.batch * isz
    tiles_m, tiles_n = ceil(shape.rows / g.tile_m), ceil(shape.cols / g.tile_n)
    panels = a_once * tiles_n + b_once * tiles_m
    if not g.stage_depth:
        panels *= 1.5  # operands fetched per warp rather than once per block
    rest = max(0.0, loop_cost.bytes_read + loop_cost.bytes_written - a_once - b_once)  # epilogue reads, C
    wave = min(g.blocks, slots)
    if g.raster_group:
        wave_m = min(g.raster_group, tiles_m)
        wave_n = min(tiles_n, ceil(wave / wave_m))
    else:
        wave_n = min(tiles_n, wave)
        wave_m = ceil(wave / tiles_n)
    matrices = max(1, ceil(wave_m / tiles_m))
    working = matrices * (min(wave_m, tiles_m) * g.tile_m + wave_n * g.tile_n) * shape.red * isz
    if a_once + b_once <= target.l2_bytes * L2_SHARE:
        from_dram = a_once + b_once
    else:
        from_dram = max(a_once + b_once, min(panels, ceil(g.blocks / wave) * working))
    return from_dram + rest, panels + rest


def simt_contraction_instructions(shape: KernelShape, g, loop_cost) -> float:
    """Thread-instructions of a SIMT contraction. A micro-tiled thread's K step is its products'
    FMA-pipe work, (RM + RN) / 4 shared-memory vector loads and a loop step; its block's panel fill
    adds a global load, a shared store and index math per 4 elements. A strided thread reads both
    operands from shared memory for every output and recomputes its indices and guards."""
    products = shape.rows * shape.cols * shape.red * shape.batch
    per_product = loop_cost.arith_ops / products if products else 0.0
    if g.micro_m:
        steps = g.blocks * g.threads * shape.red / g.split  # thread K steps over the grid
        return steps * sum(micro_step_instructions(g, per_product).values())
    return products * (per_product + 2 + SIMT_INDEX_OPS)


def micro_step_instructions(g, per_product: float = 1.0) -> dict[str, float]:
    """A micro-tiled thread's instructions per K step, by kind (tests/test_nvcc.py holds them
    against the SASS nvcc emits): its products' FMA-pipe work, one 4-wide shared load per 4 rows
    or columns, and the rest: the loop step and, spread over the chunk's MICRO_K steps, the
    thread's share of the panel fill (a global load, a shared store and index math per 4 elements)."""
    fill = (g.tile_m + g.tile_n) * g.tile_k / 4 / g.threads
    return {"fma": g.micro_m * g.micro_n * per_product, "shared_loads": (g.micro_m + g.micro_n) / 4,
            "other": 1 + (fill * 4 + 4) / g.tile_k}


def _registers(shape: KernelShape, row: Schedule, g, loop_cost) -> int:
    tile = row.tile
    if tile.is_micro:  # accumulators, this K step's operands, the fill's vectors
        return BASE_REGS + g.micro_m * g.micro_n + 2 * (g.micro_m + g.micro_n)
    if tile.mma:
        fm, fn = tile.frag_m, tile.frag_n
        if shape.kind == "attention":  # S tile and the O accumulators (z over the value dimension)
            return BASE_REGS + fm * fn * 4 + fm * shape.cols // 2
        return BASE_REGS + fm * fn * 4 + (fm + fn) * 4  # accumulators and A/B fragments
    if shape.kind == "attention":  # each lane holds its share of a row's z, and m and d
        return BASE_REGS + tile.elems * (max(1, shape.cols // 32) + 2)
    if row.stage.held:
        # the fold's loads land in the held arrays: they are its loads in flight (ptxas fits a
        # t1024 LayerNorm row holding 32 floats a thread in 64 registers without spilling:
        # tests/test_held_rows.py). A register a held element, whatever its storage type: a bf16
        # softmax holding 64 elements a thread (32 registers packed) spilled at t1024 (34 spill
        # stores), the floats it converts them to being what stays live across its passes
        held = loop_cost.held_sources * held_bytes(shape, g.threads, g.elems, g.split) // shape.itemsize
        return BASE_REGS + max(2 * tile.elems + tile.vec, held)
    return BASE_REGS + 2 * tile.elems + tile.vec

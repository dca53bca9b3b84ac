"""Schedule rules: every legal knob row for a kernel.

The candidate values of each knob are data: relations filled from the
CANDIDATES table below (a pin or a tuner narrows or widens a knob by filling
its relation with other values). A kernel enters as a `kernel` fact keyed by
its name, with its kind and extents (emmy.schedule.shape) and positive
`kernel_flag` facts; the target as one `target` fact. No rule reads a term:
the rows depend on the shape alone, so the space is built in an e-graph of its
own (emmy.schedule.space). Each rule joins a kernel with candidate values
and guards the join with one legality condition per clause:

- threads: whole warps, at most 1024 a block (the WORK candidates hold only
  such values), and no block wider than the problem (idle blocks);
- vector loads: the width divides the contiguous extent and moves at most 16 bytes;
- register micro-tiles (SIMT, `r<RM>x<RN>`): a block of 64, 128 or 256
  threads laid out (micro_layout) TX along N by TY along M, a BM = TY*RM by
  BN = TX*RN tile within the extents, always staged (MICRO_K of K at a time);
- tensor cores: an mma atom's dtype matches the operands; the block tile
  (16*FM*WM x 8*FN*WN, K step 16*KC) fits the extents and K divides into
  steps (M and N tails are masked); at most 64 accumulator registers a thread;
- shared memory: stage depth x (an A panel per A-side load + a B panel per
  B-side load) fits the target's per-block limit, in the one formula the
  geometry and the lowerings use (schedule.geometry.contraction_stage_bytes,
  called through egglog's PyObject for SIMT blocks, spelt in egglog arithmetic
  for micro-tiles and mma blocks, held equal by the schedule tests);
- features: cp.async from sm_80, TMA from sm_90 (target flags);
- splits: a reduction splits across blocks only when there are fewer rows
  (or output tiles) than SMs, each block keeps work, and nothing reads the
  row after the fold; atomics (`g<N>a`) only for sum/max/min monoids whose
  accumulator is the output.

- column reductions (the fold strided, the outputs contiguous): a thread an
  output, or 32 outputs a block whose warps split each fold (coop), split
  across blocks with atomics (`g<N>a`) when the blocks of 32 are fewer than
  SMs; no vectors, as the fold's elements are a stride apart.

- attention (flash): a block takes BM query rows (16*FM*WM with mma atoms,
  warps side by side over rows, WN = 1; or FLASH_SIMT_ROWS*TILE f<N> rows a
  warp in SIMT), steps over the keys BN at a time (8*FN, or up to 32 in SIMT),
  keeps (m, d, z) in registers (S and O accumulators at most 128 registers a
  thread), K and V tiles staged depth-deep (smem: geometry.flash_bytes, V's
  rows rounded to 16 and the Q tile added under mma atoms), and may split the keys across blocks (split-KV, a workspace and a
  finishing merge) under the split clause.

`legal_row(kernel, WORK, TILE, REDUCE, STAGE, RASTER)` holds each legal row.
"""

from __future__ import annotations

from egglog import PyObject, String, eq, i64, ne, relation, rule, ruleset, vars_

from emmy.schedule.knobs import MMA_ATOMS

# Candidate values, one canonical spelling each (emmy.schedule.knobs parses them).
CANDIDATES = {
    "WORK_THREADS": (32, 64, 128, 256, 512, 1024),
    "WORK_WARPS": ((1, 1), (1, 2), (2, 1), (2, 2), (2, 4), (4, 2), (4, 4)),
    "TILE_SIMT": ((1, 1), (2, 1), (4, 1), (8, 1), (2, 2), (4, 4), (8, 4), (8, 8)),  # (elements, vector width)
    "TILE_MICRO": ((4, 4), (8, 4), (4, 8), (8, 8)),  # (RM, RN) register micro-tiles of SIMT contractions
    "TILE_MMA_FRAGMENTS": (1, 2, 4),
    "TILE_MMA_K": (1, 2, 4, 8),
    "REDUCE_SPLITS": (2, 4, 8, 16, 32, 64),  # contractions and attention take up to MAX_TILE_SPLIT
    # grids of a grid-synced row (g<N>s): one block an SM on each GPU extract.targets knows (A100 108,
    # RTX 4090 128, H100/H200 132, L40S 142, RTX 5090 170); a GPU takes those up to its own count
    # (a pin may ask for any other: g4s runs a small grid in the simulator)
    "REDUCE_GRID_BLOCKS": (108, 128, 132, 142, 170),
    "STAGE_WEIGHTS": (0, 1, 2),  # STAGE=regs, regs/w1, regs/w2 (a LayerNorm's weight and bias)
    "STAGE_PLAIN_DEPTHS": (1, 2),
    "STAGE_PIPELINE_DEPTHS": (2, 3, 4),
    "RASTER_GROUPS": (4, 8),
}
# Tiled kernels (contractions, attention) split K at most this many ways: their workspace and
# finishing kernel grow with the split, and wider splits are not priced against measurements yet.
# Rows and column reductions, whose partial results are one state per row, take every REDUCE_SPLITS value.
MAX_TILE_SPLIT = 8
ATOM_DTYPE = {"mma_m16n8k16_f16_f32": "f16", "mma_m16n8k16_bf16_f32": "bf16"}
assert set(ATOM_DTYPE) == set(MMA_ATOMS)
from emmy.schedule.geometry import (FLASH_SIMT_KEYS, MICRO_K, MICRO_THREADS, flash_fits,  # noqa: E402
                                   micro_layout, simt_staged_fits)  # one source for rules and geometry
MAX_ACC_REGS = 64
MAX_HELD_BYTES = 128  # a thread's share of a row held in registers (STAGE=regs): 32 registers
GRID_ROW_STATIC_SMEM = 1024  # room a grid-synced row's static arrays (its warps' partial states) keep beside its weights
MAX_FLASH_ACC_REGS = 128  # S tile + O accumulators a thread, flash attention


# A kernel is its name (a stand-in name per distinct shape when spaces are shared).
kernel = relation("kernel", String, String, i64, i64, i64, i64, i64, i64)  # name kind rows cols red inner itemsize batch
kernel_flag = relation("kernel_flag", String, String)  # foldonly | raw | atomic | held
kernel_panels = relation("kernel_panels", String, i64, i64)  # contraction: staged element bytes, A side, B side
kernel_mma = relation("kernel_mma", String, String)  # tensor-core operand dtype: f16 | bf16
target = relation("target", i64, i64, i64, i64)  # smem per block, SMs, has cp.async, has TMA
work_threads = relation("work_threads", String, i64)
work_warps = relation("work_warps", String, i64, i64)
tile_simt = relation("tile_simt", String, i64, i64)
tile_mma = relation("tile_mma", String, String, i64, i64, i64)  # spelling, dtype, FM, FN, KC
tile_micro = relation("tile_micro", String, i64, i64)  # spelling, RM, RN
micro_threads = relation("micro_threads", i64, i64, i64)  # threads, along N, along M (geometry.micro_layout)
reduce_split = relation("reduce_split", String, i64, String)  # spelling, blocks, a | k | s
stage_plain = relation("stage_plain", String, i64)  # d<D>/smem
stage_async = relation("stage_async", String, i64)  # d<D>/smem-async
stage_tma = relation("stage_tma", String, i64)  # d<D>/smem-tma
stage_none = relation("stage_none", String)
stage_regs = relation("stage_regs", String, i64)  # regs[/w<N>]: a row held in registers, N weights in shared memory
kernel_weights = relation("kernel_weights", String, i64)  # operands a row's sweep reads alike every row
reduce_none = relation("reduce_none", String)
reduce_coop = relation("reduce_coop", String)
raster_none = relation("raster_none", String)
raster_group = relation("raster_group", String, i64)
# Intermediate relations: a block shape, then a staged block, then rows.
simt_block = relation("simt_block", String, String, String, i64)  # kernel, WORK, TILE, outputs per block
mma_block = relation("mma_block", String, String, String, i64, i64, i64)  # kernel, WORK, TILE, BM, BN, BK
micro_block = relation("micro_block", String, String, String, i64, i64)  # kernel, WORK, TILE, BM, BN
staged = relation("staged", String, String, String, String, i64, i64, i64)  # + STAGE, rows of blocks, blocks, K steps
flash_block = relation("flash_block", String, String, String, i64, i64, i64)  # kernel, WORK, TILE, BM, BN, mma (0/1)
legal_row = relation("legal_row", String, String, String, String, String, String)

(k,) = vars_("k", String)
kind, w, t, r, s, g, dt = vars_("kind w t r s g dt", String)
rows, cols, red, inner, isz, batch = vars_("rows cols red inner isz batch", i64)
threads, elems, vec, wm, wn, fm, fn, kc, depth, split, group = vars_(
    "threads elems vec wm wn fm fn kc depth split group", i64)
rm, rn, tx, ty, pa, pb, fmma = vars_("rm rn tx ty pa pb fmma", i64)
bm, bn, bk, smem, sms, has_async, has_tma, per_block, brows, nblocks, ksteps = vars_(
    "bm bn bk smem sms has_async has_tma per_block brows nblocks ksteps", i64)
n, count = vars_("n count", i64)  # weights kept in shared memory, weights the kernel has

_K = kernel(k, kind, rows, cols, red, inner, isz, batch)


def micro_thread_facts() -> list:
    """How each micro-tile block size lays its threads out (one formula: geometry.micro_layout)."""
    return [micro_threads(n, *micro_layout(n)) for n in MICRO_THREADS]


def _vector_ok(extent, vector, itemsize):
    return [eq(extent % vector).to(i64(0)), vector * itemsize <= i64(16)]


def _held_bytes(blocks=None):
    """geometry.held_bytes in egglog arithmetic: a thread's whole steps of its block's slice of
    the row, at the widest element (`blocks`: the row's blocks, the split by default)."""
    blocks = split if blocks is None else blocks
    return ((red + threads * elems - 1) / (threads * elems) + blocks - 1) / blocks * elems * isz


map_rows = ruleset(
    rule(kernel(k, "map", rows, cols, red, inner, isz, batch), work_threads(w, threads), tile_simt(t, elems, vec),
         stage_none(s), reduce_none(r), raster_none(g),
         threads * elems <= rows + 31, *_vector_ok(inner, vec, isz)).then(legal_row(k, w, t, r, s, g)),
    name="map",
)

row_rows = ruleset(
    # one thread a row, serial over the row
    rule(kernel(k, "row", rows, cols, red, inner, isz, batch), work_threads(w, threads), tile_simt(t, elems, vec),
         stage_none(s), reduce_none(r), raster_none(g),
         threads <= rows + 31, elems <= red, *_vector_ok(inner, vec, isz)).then(legal_row(k, w, t, r, s, g)),
    # one block a row, cooperating (warp shuffles, then a shared-memory tree)
    rule(kernel(k, "row", rows, cols, red, inner, isz, batch), work_threads(w, threads), tile_simt(t, elems, vec),
         stage_none(s), reduce_coop(r), raster_none(g),
         threads * elems <= red, *_vector_ok(inner, vec, isz)).then(legal_row(k, w, t, r, s, g)),
    # a row split across blocks: a workspace and a finishing kernel
    rule(kernel(k, "row", rows, cols, red, inner, isz, batch), kernel_flag(k, "foldonly"), target(smem, sms, has_async, has_tma),
         work_threads(w, threads), tile_simt(t, elems, vec), stage_none(s), reduce_split(r, split, "k"), raster_none(g),
         rows < sms, threads * elems * split <= red, *_vector_ok(inner, vec, isz)).then(legal_row(k, w, t, r, s, g)),
    # ... or with atomics into the output
    rule(kernel(k, "row", rows, cols, red, inner, isz, batch), kernel_flag(k, "foldonly"), kernel_flag(k, "raw"),
         kernel_flag(k, "atomic"), target(smem, sms, has_async, has_tma),
         work_threads(w, threads), tile_simt(t, elems, vec), stage_none(s), reduce_split(r, split, "a"), raster_none(g),
         rows < sms, threads * elems * split <= red, *_vector_ok(inner, vec, isz)).then(legal_row(k, w, t, r, s, g)),
    # ... or a grid of `split` blocks, at most one an SM (a cooperative launch needs every block
    # resident), taking every row in turn: a slice of each row a block, a grid barrier after each
    # fold, so the row's sweep runs in the same kernel (few long rows: LayerNorm over (C, H, W))
    rule(kernel(k, "row", rows, cols, red, inner, isz, batch), target(smem, sms, has_async, has_tma),
         work_threads(w, threads), tile_simt(t, elems, vec), stage_none(s), reduce_split(r, split, "s"), raster_none(g),
         rows < sms, split <= sms, threads * elems * split <= red, *_vector_ok(inner, vec, isz)
         ).then(legal_row(k, w, t, r, s, g)),
    # a cooperating block, or a grid-synced row, whose fold keeps in registers the elements its
    # sweep (or a later fold) reads again (STAGE=regs), when a thread's share of them is at most
    # MAX_HELD_BYTES
    rule(kernel(k, "row", rows, cols, red, inner, isz, batch), kernel_flag(k, "held"), work_threads(w, threads),
         tile_simt(t, elems, vec), stage_regs(s, i64(0)), reduce_coop(r), raster_none(g),
         threads * elems <= red, *_vector_ok(inner, vec, isz), _held_bytes(i64(1)) <= i64(MAX_HELD_BYTES),
         ).then(legal_row(k, w, t, r, s, g)),
    rule(kernel(k, "row", rows, cols, red, inner, isz, batch), kernel_flag(k, "held"),
         target(smem, sms, has_async, has_tma), work_threads(w, threads), tile_simt(t, elems, vec),
         stage_regs(s, i64(0)), reduce_split(r, split, "s"), raster_none(g),
         rows < sms, split <= sms, threads * elems * split <= red, *_vector_ok(inner, vec, isz),
         _held_bytes() <= i64(MAX_HELD_BYTES),
         ).then(legal_row(k, w, t, r, s, g)),
    # ... and a grid's blocks keep their slices of the first N weights (operands every row reads
    # alike, the same slice each row) in shared memory, when they fit (geometry.held_bytes a
    # weight a thread, beside the row's static arrays)
    rule(kernel(k, "row", rows, cols, red, inner, isz, batch), kernel_flag(k, "held"), kernel_weights(k, count),
         target(smem, sms, has_async, has_tma), work_threads(w, threads), tile_simt(t, elems, vec),
         stage_regs(s, n), reduce_split(r, split, "s"), raster_none(g),
         rows < sms, split <= sms, threads * elems * split <= red, *_vector_ok(inner, vec, isz),
         _held_bytes() <= i64(MAX_HELD_BYTES), i64(1) <= n, n <= count,
         n * threads * _held_bytes() + i64(GRID_ROW_STATIC_SMEM) <= smem,
         ).then(legal_row(k, w, t, r, s, g)),
    name="row",
)

column_rows = ruleset(
    # a thread an output: lanes along the contiguous outputs (coalesced), serial over the fold;
    # TILE f<N> is the fold's unroll (loads in flight), never vectors (the fold is strided)
    rule(kernel(k, "column", rows, cols, red, inner, isz, batch), work_threads(w, threads), tile_simt(t, elems, vec),
         stage_none(s), reduce_none(r), raster_none(g), eq(vec).to(i64(1)),
         threads <= rows + 31, elems <= red).then(legal_row(k, w, t, r, s, g)),
    # 32 outputs a block, a lane each; the block's warps split each fold and combine in shared memory
    rule(kernel(k, "column", rows, cols, red, inner, isz, batch), work_threads(w, threads), tile_simt(t, elems, vec),
         stage_none(s), reduce_coop(r), raster_none(g), eq(vec).to(i64(1)),
         i64(64) <= threads, threads / 32 * elems <= red).then(legal_row(k, w, t, r, s, g)),
    # few outputs (fewer blocks of 32 than SMs): each block also takes a slice of the fold and
    # combines its partial results into the output atomically (a fill kernel sets it first)
    rule(kernel(k, "column", rows, cols, red, inner, isz, batch), kernel_flag(k, "raw"), kernel_flag(k, "atomic"),
         target(smem, sms, has_async, has_tma), work_threads(w, threads), tile_simt(t, elems, vec), stage_none(s),
         reduce_split(r, split, "a"), raster_none(g), eq(vec).to(i64(1)), i64(64) <= threads,
         (rows + 31) / 32 < sms, threads / 32 * elems * split <= red).then(legal_row(k, w, t, r, s, g)),
    name="column",
)

contraction_blocks = ruleset(
    # SIMT: each thread computes `elems` outputs; vector loads along K
    rule(kernel(k, "contraction", rows, cols, red, inner, isz, batch), work_threads(w, threads), tile_simt(t, elems, vec),
         threads * elems <= rows * cols * batch + 31, *_vector_ok(red, vec, isz),
         ).then(simt_block(k, w, t, threads * elems)),
    # tensor cores: WM x WN warps, each FM x FN atoms of 16 x 8, K in steps of 16*KC
    rule(kernel(k, "contraction", rows, cols, red, inner, isz, batch), kernel_mma(k, dt),
         work_warps(w, wm, wn), tile_mma(t, dt, fm, fn, kc),
         16 * fm * wm <= rows, 8 * fn * wn <= cols, 16 * kc <= red, eq(red % (16 * kc)).to(i64(0)),
         fm * fn * 4 <= i64(MAX_ACC_REGS)).then(mma_block(k, w, t, 16 * fm * wm, 8 * fn * wn, 16 * kc)),
    # SIMT register micro-tiles: TY x TX threads, each RM x RN outputs
    rule(kernel(k, "contraction", rows, cols, red, inner, isz, batch), work_threads(w, threads),
         micro_threads(threads, tx, ty), tile_micro(t, rm, rn), ty * rm <= rows, tx * rn <= cols,
         i64(MICRO_K) <= red).then(micro_block(k, w, t, ty * rm, tx * rn)),
    name="contraction blocks",
)


# A staged block: rows of blocks (for rasterisation), blocks (for splits), steps along K.
_SIMT_STAGED = staged(k, w, t, s, i64(1), (rows * cols * batch + per_block - 1) / per_block, red / 32)
_MMA_STAGED = staged(k, w, t, s, (rows + bm - 1) / bm, ((rows + bm - 1) / bm) * ((cols + bn - 1) / bn) * batch,
                     red / bk)


def _fits(fn, *sizes):
    """The guard that a shared-memory need (geometry's function `fn` of these sizes) fits."""
    return ne(PyObject(fn)(*(PyObject.from_int(n) for n in sizes)).to_string()).to(String(""))


def _tiled_stage_fits(block_m, block_n, block_k):
    """geometry.contraction_stage_bytes in egglog arithmetic: the micro-tile and mma guards run for
    every (block, stage) pair, and a PyObject call there doubles the time the space takes; the
    schedule tests hold this spelling to the geometry's on every offered row."""
    return depth * (pa * block_m * block_k + pb * block_k * block_n) <= smem


def _simt_staged(stage_atom, feature_guard):
    return rule(kernel(k, "contraction", rows, cols, red, inner, isz, batch), simt_block(k, w, t, per_block),
                kernel_panels(k, pa, pb), target(smem, sms, has_async, has_tma), stage_atom, *feature_guard,
                _fits(simt_staged_fits, per_block, pa, pb, depth, smem),
                ).then(_SIMT_STAGED)


_MICRO_STAGED = staged(k, w, t, s, (rows + bm - 1) / bm, ((rows + bm - 1) / bm) * ((cols + bn - 1) / bn) * batch,
                       red / MICRO_K)


def _micro_staged(stage_atom, feature_guard):
    return rule(kernel(k, "contraction", rows, cols, red, inner, isz, batch), micro_block(k, w, t, bm, bn),
                kernel_panels(k, pa, pb), target(smem, sms, has_async, has_tma), stage_atom, *feature_guard,
                _tiled_stage_fits(bm, bn, i64(MICRO_K)),
                ).then(_MICRO_STAGED)


def _mma_staged(stage_atom, feature_guard):
    return rule(kernel(k, "contraction", rows, cols, red, inner, isz, batch), mma_block(k, w, t, bm, bn, bk),
                kernel_panels(k, pa, pb), target(smem, sms, has_async, has_tma), stage_atom, *feature_guard,
                _tiled_stage_fits(bm, bn, bk),
                ).then(_MMA_STAGED)


contraction_staging = ruleset(
    rule(simt_block(k, w, t, per_block), kernel(k, kind, rows, cols, red, inner, isz, batch), stage_none(s)).then(
        _SIMT_STAGED),
    rule(mma_block(k, w, t, bm, bn, bk), kernel(k, kind, rows, cols, red, inner, isz, batch), stage_none(s)).then(
        _MMA_STAGED),
    _simt_staged(stage_plain(s, depth), []),
    _simt_staged(stage_async(s, depth), [eq(has_async).to(i64(1))]),
    _micro_staged(stage_plain(s, depth), []),
    _micro_staged(stage_async(s, depth), [eq(has_async).to(i64(1))]),
    _mma_staged(stage_plain(s, depth), []),
    _mma_staged(stage_async(s, depth), [eq(has_async).to(i64(1))]),
    _mma_staged(stage_tma(s, depth), [eq(has_tma).to(i64(1))]),
    name="contraction staging",
)

contraction_rows = ruleset(
    rule(staged(k, w, t, s, brows, nblocks, ksteps), reduce_none(r), raster_none(g)).then(legal_row(k, w, t, r, s, g)),
    # grouped launch order: only with at least two groups of block rows
    rule(staged(k, w, t, s, brows, nblocks, ksteps), reduce_none(r), raster_group(g, group),
         2 * group <= brows).then(legal_row(k, w, t, r, s, g)),
    # split-K: fewer output tiles than SMs, and each split keeps at least two K steps
    rule(staged(k, w, t, s, brows, nblocks, ksteps), target(smem, sms, has_async, has_tma), reduce_split(r, split, "k"),
         raster_none(g), nblocks < sms, 2 * split <= ksteps, split <= i64(MAX_TILE_SPLIT)).then(legal_row(k, w, t, r, s, g)),
    rule(staged(k, w, t, s, brows, nblocks, ksteps), kernel_flag(k, "raw"), kernel_flag(k, "atomic"),
         target(smem, sms, has_async, has_tma), reduce_split(r, split, "a"),
         raster_none(g), nblocks < sms, 2 * split <= ksteps, split <= i64(MAX_TILE_SPLIT)).then(legal_row(k, w, t, r, s, g)),
    name="contraction rows",
)

def _flash_rows(stage_atom, feature_guard):
    return rule(kernel(k, "attention", rows, cols, red, inner, isz, batch), flash_block(k, w, t, bm, bn, fmma),
                target(smem, sms, has_async, has_tma), stage_atom, reduce_none(r), raster_none(g), *feature_guard,
                _fits(flash_fits, bm, bn, inner, cols, isz, depth, fmma, smem),
                ).then(legal_row(k, w, t, r, s, g))


attention_rows = ruleset(
    # tensor cores for q.k and for the weighted sum: warps over query rows
    rule(kernel(k, "attention", rows, cols, red, inner, isz, batch), kernel_mma(k, dt),
         work_warps(w, wm, wn), tile_mma(t, dt, fm, fn, kc), eq(wn).to(i64(1)),
         16 * fm * wm <= rows, 8 * fn <= red, 16 * kc <= inner, eq(inner % (16 * kc)).to(i64(0)),
         fm * fn * 4 + fm * cols / 2 <= i64(MAX_FLASH_ACC_REGS)).then(flash_block(k, w, t, 16 * fm * wm, 8 * fn, i64(1))),
    # SIMT: each warp owns TILE query rows, vector loads along the head dimension
    rule(kernel(k, "attention", rows, cols, red, inner, isz, batch), work_threads(w, threads),
         tile_simt(t, elems, vec), threads / 32 * elems <= rows,
         *_vector_ok(cols, vec, isz), *_vector_ok(inner, vec, isz),
         ).then(flash_block(k, w, t, threads / 32 * elems, red.min(i64(FLASH_SIMT_KEYS)), i64(0))),
    rule(kernel(k, "attention", rows, cols, red, inner, isz, batch), flash_block(k, w, t, bm, bn, fmma),
         stage_none(s), reduce_none(r), raster_none(g)).then(legal_row(k, w, t, r, s, g)),
    _flash_rows(stage_plain(s, depth), []),
    _flash_rows(stage_async(s, depth), [eq(has_async).to(i64(1))]),
    _flash_rows(stage_tma(s, depth), [eq(has_tma).to(i64(1))]),
    # split-KV: fewer query blocks than SMs, each split keeps at least two key steps
    rule(kernel(k, "attention", rows, cols, red, inner, isz, batch), flash_block(k, w, t, bm, bn, fmma),
         target(smem, sms, has_async, has_tma), stage_none(s), reduce_split(r, split, "k"), raster_none(g),
         (rows + bm - 1) / bm * batch < sms, 2 * split <= red / bn, split <= i64(MAX_TILE_SPLIT),
         ).then(legal_row(k, w, t, r, s, g)),
    name="attention",
)

SCHEDULE_RULESETS = (map_rows, row_rows, column_rows, contraction_blocks, contraction_staging, contraction_rows, attention_rows)
# For `emmy rules`: each schedule ruleset and what its rules add.
SCHEDULE_DESCRIPTIONS = {
    "map": "elementwise kernels: threads x elements a thread, vector loads that divide the row",
    "row": "row reductions: a thread a row, a block a row (coop), split across blocks (g<N>k, g<N>a), or a "
           "grid of blocks taking each row in turn and meeting at grid barriers (g<N>s)",
    "column": "column reductions: a thread an output, or 32 outputs a block with its warps splitting the fold (coop), "
              "or that split across blocks too (g<N>a)",
    "contraction blocks": "matrix products: SIMT blocks, register micro-tiles, or mma atoms tiled by warps within the extents",
    "contraction staging": "operand staging: none (not for micro-tiles), shared memory, cp.async (sm_80+), TMA (sm_90+) within smem",
    "contraction rows": "launch order (grouped rasterisation) and split-K for matrix products",
    "attention": "flash attention: query-row blocks, mma or SIMT, K/V staging, split-KV",
}

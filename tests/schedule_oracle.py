"""An independent enumeration of the schedule rules in plain Python.

Written from the legality clauses in rules/schedules.py's docstring, with
loops and integer arithmetic instead of egglog joins, so a rule that is
mis-encoded in egglog (a wrong variable, a missing guard, a wrong relation)
shows up as a difference in the sets of rows.
"""

from __future__ import annotations

from math import ceil

from emmy.schedule.space import default_candidates
from emmy.schedule.knobs import Schedule, parse_value
from emmy.rules.schedules import (ATOM_DTYPE, GRID_ROW_STATIC_SMEM, MAX_ACC_REGS, MAX_FLASH_ACC_REGS, MAX_HELD_BYTES,
                                  MAX_TILE_SPLIT)
from emmy.schedule.geometry import (FLASH_SIMT_KEYS, MICRO_K, MICRO_THREADS, SIMT_K, contraction_stage_bytes,
                                   flash_bytes, micro_layout, simt_tile)


def _fields(value) -> dict:
    """A typed knob value as the fields its form spells (the oracle's own reading of each form)."""
    v = value
    forms = {"Work": lambda: {"warps_m": v.warps_m, "warps_n": v.warps_n} if v.warps else {"threads": v.threads},
             "Tile": lambda: ({"atom": v.atom, "frag_m": v.frag_m, "frag_n": v.frag_n, "k_chunks": v.k_chunks} if v.mma
                              else {"micro_m": v.micro_m, "micro_n": v.micro_n} if v.is_micro
                              else {"elems": v.elems, "vec": v.vec}),
             "Reduce": lambda: {"split": v.split, "mode": v.mode} if v.split > 1 else {},
             "Stage": lambda: ({"depth": v.depth, "how": v.how} if v.depth
                               else {"held": True, "weights": v.weights} if v.held else {}),
             "Raster": lambda: {"group": v.group} if v.group else {}}
    return forms[type(v).__name__]()


def _parsed(knob):
    return [(v, _fields(parse_value(knob, v))) for v in default_candidates()[knob]]


def enumerate_rows(shape, target) -> set[Schedule]:
    works, tiles = _parsed("WORK"), _parsed("TILE")
    reduces, stages, rasters = _parsed("REDUCE"), _parsed("STAGE"), _parsed("RASTER")
    threads_of = [(w, f["threads"]) for w, f in works if "threads" in f]
    warps_of = [(w, f["warps_m"], f["warps_n"]) for w, f in works if "warps_m" in f]
    simt = [(t, f["elems"], f.get("vec", 1)) for t, f in tiles if "elems" in f]
    micro = [(t, f["micro_m"], f["micro_n"]) for t, f in tiles if "micro_m" in f]
    mma = [(t, ATOM_DTYPE[f["atom"]], f["frag_m"], f["frag_n"], f["k_chunks"]) for t, f in tiles if "atom" in f]
    splits = [(r, f["split"], f["mode"]) for r, f in reduces if "split" in f]
    out: set[Schedule] = set()

    def add(work, tile, reduce="", stage="", raster=""):
        out.add(Schedule(work, tile, reduce, stage, raster))

    def vector_ok(extent, vec):
        return extent % vec == 0 and vec * shape.itemsize <= 16

    if shape.kind == "map":
        for w, threads in threads_of:
            for t, elems, vec in simt:
                if threads * elems <= shape.rows + 31 and vector_ok(shape.inner, vec):
                    add(w, t)
        return out
    (held,) = [s for s, f in stages if f.get("held") and not f.get("weights")]
    if shape.kind == "row":
        for w, threads in threads_of:
            for t, elems, vec in simt:
                if not vector_ok(shape.inner, vec):
                    continue
                if threads <= shape.rows + 31 and elems <= shape.red:
                    add(w, t)
                # a thread's share of a held row: its whole steps of the block's slice
                held_bytes = lambda split: ceil(ceil(shape.red / (threads * elems)) / split) * elems * shape.itemsize  # noqa: E731
                if threads * elems <= shape.red:
                    add(w, t, "coop")
                    if shape.held and held_bytes(1) <= MAX_HELD_BYTES:
                        add(w, t, "coop", held)
                for r, split, mode in splits:
                    if mode == "s":  # a grid-synced row: at most one block an SM
                        if shape.rows < target.sms and split <= target.sms and threads * elems * split <= shape.red:
                            add(w, t, r)
                            if shape.held and held_bytes(split) <= MAX_HELD_BYTES:
                                add(w, t, r, held)
                                # and the first N weights kept in shared memory, where they fit
                                for spelling, f in stages:
                                    weights = f.get("weights", 0)
                                    if f.get("held") and 1 <= weights <= shape.weights and \
                                            weights * threads * held_bytes(split) + GRID_ROW_STATIC_SMEM <= \
                                            target.smem_per_block:
                                        add(w, t, r, spelling)
                        continue
                    allowed = not shape.sweep and (mode == "k" or (not shape.epilogue and shape.atomic_ok))
                    if allowed and shape.rows < target.sms and threads * elems * split <= shape.red:
                        add(w, t, r)
        return out
    if shape.kind == "column":  # no vectors: the fold's elements are a stride apart
        for w, threads in threads_of:
            for t, elems, vec in simt:
                if vec != 1:
                    continue
                if threads <= shape.rows + 31 and elems <= shape.red:
                    add(w, t)
                if threads >= 64 and threads // 32 * elems <= shape.red:
                    add(w, t, "coop")
                for r, split, mode in splits:
                    if (mode == "a" and not shape.epilogue and shape.atomic_ok and threads >= 64
                            and ceil(shape.rows / 32) < target.sms and threads // 32 * elems * split <= shape.red):
                        add(w, t, r)
        return out
    if shape.kind == "attention":
        return _flash(shape, target, threads_of, warps_of, simt, mma, stages, splits, vector_ok)
    # contraction: blocks, then staging, then reduce and raster
    blocks = []  # (work, tile, smem bytes per stage depth, rows of blocks, blocks, K steps, kind)
    for w, threads in threads_of:
        for t, elems, vec in simt:
            per_block = threads * elems
            if per_block <= shape.rows * shape.cols * shape.batch + 31 and vector_ok(shape.red, vec):
                stage = contraction_stage_bytes(*simt_tile(per_block), SIMT_K, *shape.panel_bytes)
                blocks.append((w, t, stage, 1,
                               ceil(shape.rows * shape.cols * shape.batch / per_block), shape.red // 32, "simt"))
        if threads not in MICRO_THREADS:
            continue
        along_n, along_m = micro_layout(threads)
        for t, rm, rn in micro:  # register micro-tiles: always staged
            bm, bn = along_m * rm, along_n * rn
            if bm <= shape.rows and bn <= shape.cols and MICRO_K <= shape.red:
                brows = ceil(shape.rows / bm)
                blocks.append((w, t, contraction_stage_bytes(bm, bn, MICRO_K, *shape.panel_bytes), brows,
                               brows * ceil(shape.cols / bn) * shape.batch, shape.red // MICRO_K, "micro"))
    if shape.mma:
        for w, wm, wn in warps_of:
            for t, dtype, fm, fn, kc in mma:
                bm, bn, bk = 16 * fm * wm, 8 * fn * wn, 16 * kc
                if (dtype == shape.mma and bm <= shape.rows and bn <= shape.cols and bk <= shape.red
                        and shape.red % bk == 0 and fm * fn * 4 <= MAX_ACC_REGS):
                    brows = ceil(shape.rows / bm)
                    blocks.append((w, t, contraction_stage_bytes(bm, bn, bk, *shape.panel_bytes), brows,
                                   brows * ceil(shape.cols / bn) * shape.batch, shape.red // bk, "mma"))
    for w, t, smem_per_depth, brows, nblocks, ksteps, block_kind in blocks:
        staged = [] if block_kind == "micro" else [""]
        is_mma = block_kind == "mma"
        for s, f in stages:
            if not f.get("depth"):
                continue
            feature = {"smem": True, "smem-async": target.has_cp_async, "smem-tma": target.has_tma and is_mma}[f["how"]]
            if feature and f["depth"] * smem_per_depth <= target.smem_per_block:
                staged.append(s)
        for s in staged:
            add(w, t, "", s, "")
            for g, f in rasters:
                if g and 2 * f["group"] <= brows:
                    add(w, t, "", s, g)
            for r, split, mode in splits:
                if mode == "s" or (mode == "a" and (shape.epilogue or not shape.atomic_ok)):
                    continue
                if nblocks < target.sms and 2 * split <= ksteps and split <= MAX_TILE_SPLIT:
                    add(w, t, r, s, "")
    return out


def _flash(shape, target, threads_of, warps_of, simt, mma, stages, splits, vector_ok) -> set[Schedule]:
    blocks = []  # (work, tile, query rows a block, keys a step)
    if shape.mma:
        for w, wm, wn in warps_of:
            for t, dtype, fm, fn, kc in mma:
                if (wn == 1 and dtype == shape.mma and 16 * fm * wm <= shape.rows and 8 * fn <= shape.red
                        and 16 * kc <= shape.inner and shape.inner % (16 * kc) == 0
                        and fm * fn * 4 + fm * shape.cols // 2 <= MAX_FLASH_ACC_REGS):
                    blocks.append((w, t, 16 * fm * wm, 8 * fn, True))
    for w, threads in threads_of:
        for t, elems, vec in simt:
            rows = threads // 32 * elems
            if rows <= shape.rows and vector_ok(shape.cols, vec) and vector_ok(shape.inner, vec):
                blocks.append((w, t, rows, min(FLASH_SIMT_KEYS, shape.red), False))
    out = set()
    for w, t, bm, bn, is_mma in blocks:
        out.add(Schedule(w, t, "", "", ""))
        for s, f in stages:
            if not f.get("depth"):
                continue
            feature = {"smem": True, "smem-async": target.has_cp_async, "smem-tma": target.has_tma}[f["how"]]
            smem = flash_bytes(bm, bn, shape.inner, shape.cols, shape.itemsize, f["depth"], is_mma)
            if feature and smem <= target.smem_per_block:
                out.add(Schedule(w, t, "", s, ""))
        for r, split, mode in splits:
            if (mode == "k" and ceil(shape.rows / bm) * shape.batch < target.sms and 2 * split <= shape.red // bn
                    and split <= MAX_TILE_SPLIT):
                out.add(Schedule(w, t, r, "", ""))
    return out

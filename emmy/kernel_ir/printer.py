"""`--ir kernel`: each kernel's Kernel IR, one construct a line (scalar work in Loop IR form)."""

from __future__ import annotations

from emmy.kernel_ir import nodes as K
from emmy.kernel_ir.cuda import panel_copy
from emmy.kernel_ir.scalar_c import affine_c, store_index_c, stored_value_c, vector_index_c
from emmy.schedule.knobs import STAGE_ASYNC, STAGE_TMA
from emmy.loop_ir import nodes as L
from emmy.loop_ir.printer import padded_text, statement_text


def print_kernel_ir(kernels: list[K.KernelIR]) -> str:
    out: list[str] = []
    for index, k in enumerate(kernels):
        out.append(f"=== {index}: {k.name} ===")
        out.append(f"knobs {k.knobs}  ({k.summary})")
        out.append(_tile(k))
        out.append("params " + ", ".join(f"{p.name}: {p.dtype}{' (out)' if p.written else ''}" for p in k.params))
        out.append(f"launch grid {k.grid[0]} x block {k.block[0]}")
        for node in k.body:
            _node(node, k, 0, out)
    return "\n".join(out) + "\n"


def _tile(k: K.KernelIR) -> str:
    t = k.tile
    dims = ", ".join(t.dims)
    if isinstance(k.body[0], K.FlashMma):
        f = k.body[0]
        return (f"Tile[row, col] (keys={f.key_extent}) // {t.rows} query rows, {f.warps} warp(s) of {f.frag_m} x 16 "
                f"rows a block, {f.bn} keys a step on {f.atom}")
    if isinstance(k.body[0], K.FlashRows):
        f = k.body[0]
        return (f"Tile[row, col] (keys={f.key_extent}) // {t.rows} query rows, {f.warps} warp(s) of "
                f"{f.rows_per_warp} row(s) a block, lanes over the columns")
    if t.dims == ("m", "n") and isinstance(k.body[0], K.MmaTile):
        c = k.body[0]
        return (f"Tile[m, n] (K={c.k_extent}) // {t.rows} outputs in {c.bm} x {c.bn} tiles, {c.warps_m} x "
                f"{c.warps_n} warps of {c.frag_m} x {c.frag_n} {c.atom} atoms")
    if t.dims == ("m", "n"):
        (c,) = [n for n in k.body if isinstance(n, K.ContractionTile)]
        return (f"Tile[m, n] (K={c.k_extent}) // {t.rows} outputs in {c.bm} x {c.bn} tiles, {t.workers} workers, "
                f"{c.per_thread} output(s) each")
    if t.dims == ("element",):
        return f"Tile[{dims}] (N={t.rows}) // {t.extent} elements, {t.workers} workers per block"
    return f"Tile[{dims}] (N={t.extent}) // {t.rows} rows, {t.workers} workers per row"


def _node(n, k: K.KernelIR, depth: int, out: list[str]) -> None:
    pad = "  " * depth
    listing = _LISTINGS.get(type(n))
    if listing is None:
        raise TypeError(f"no listing for {type(n).__name__}")
    listing(n, k, pad, out)
    if depth == 0 and isinstance(n, K.WarpShuffle):
        smem = next(s for s in k.shared if s.name == n.smem)
        out.append(f"{pad}Smem {smem.dtype} {smem.name}[{smem.size}]")


def _mma(n: K.MmaTile, pad: str, out: list[str]) -> None:
    if n.raster:
        out.append(f"{pad}tiles in groups of {n.raster} tile rows (grouped raster)")
    if n.split > 1:
        how = f"writes its partial results to {n.workspace}" if n.workspace else "adds its partial result atomically"
        out.append(f"{pad}split K {n.split} ways (grid z); each block {how}")
    out.append(f"{pad}f32 acc[{n.frag_m}][{n.frag_n}][4] = 0  ({n.acc}: the mma accumulator fragments)")
    for o in n.operands:
        layout = "[rows][k]" if o.k_fast else "[k][rows]"
        if not n.depth:
            out.append(f"{pad}{o.side}: {o.name} = load {o.buffer}[{affine_c(o.index)}] into fragments (no staging)")
            continue
        fill = f"TMA box {o.rows} x {o.cols}" if o.tma else \
            ("cp.async 16 B" if n.how == STAGE_ASYNC and o.width > 1 else f"load.v{o.width}")
        out.append(f"{pad}Smem {o.dtype} {o.side}_panel[{n.depth}][{o.rows}][{o.cols}]  {layout}, {o.buffer} by {fill}")
    if n.depth:
        ahead = {STAGE_ASYNC: f"cp.async, {n.depth - 1} chunk(s) ahead", STAGE_TMA: f"TMA + mbarrier, {n.depth - 1} "
                 "chunk(s) ahead"}.get(n.how, "plain loads")
        out.append(f"{pad}for k0 in 0..{n.k_extent} step {n.bk}:  stage the panels ({ahead}), Sync")
        for o in n.operands:
            x = 4 if o.side == "a" else 2
            out.append(f"{pad}  ldmatrix.x{x}{'' if o.k_fast else '.trans'} {o.side}_frag <- {o.side}_panel")
    else:
        out.append(f"{pad}for k0 in 0..{n.k_extent} step {n.bk}:")
    out.append(f"{pad}  {n.atom}(acc[fm][fn], a_frag[fm], b_frag[fn])  for fm < {n.frag_m}, fn < {n.frag_n}")
    out.append(f"{pad}each accumulator element:" + (" (partial result out)" if n.split > 1 else ""))
    if n.split == 1:
        out += [padded_text(f"{pad}  ", s) for s in n.epilogue]


def _key_range(n, pad: str, out: list[str]) -> None:
    if n.key_range:
        guards = " and ".join(str(g) for g in n.key_range)
        out.append(f"{pad}keys for the block only where {guards} holds in one of its rows "
                   "(the rest only if a row has no unmasked key)")


def _flash(n: K.FlashRows, pad: str, out: list[str]) -> None:
    for i in n.inits:
        out.append(f"{pad}{statement_text(i)}  (f32 {i.acc}[{n.rows_per_warp}][{n.cols_per_lane}]: per owned row and column)")
    for s in n.held:
        out.append(f"{pad}{statement_text(s)}  (held: f32 {s.name}[{n.rows_per_warp}][{n.inner_per_lane}])")
    for p in n.panels:
        wide = f", load.v{p.width}" if p.width > 1 else ""
        out.append(f"{pad}Smem {p.dtype} {p.name}_panel[{n.depth}][{p.rows}][{p.cols}]  ({p.side}: {p.buffer}{wide})")
    _key_range(n, pad, out)
    if n.depth:
        how = f"cp.async, {n.depth - 1} chunk(s) ahead" if n.how == STAGE_ASYNC else "plain loads"
        out.append(f"{pad}for a{n.key_var} in 0..{n.key_extent} step {n.keys_step}:  stage the tiles ({how}), Sync")
    else:
        out.append(f"{pad}for a{n.key_var} in 0..{n.key_extent}:  K and V from global memory")
    out.append(f"{pad}  each owned row:")
    staged = {p.name for p in n.panels}
    for s in n.per_key:
        if isinstance(s, L.Loop):
            out.append(f"{pad}    for a{s.var} in lane..{s.extent} step 32:")
            out += [f"{pad}      " + (f"{x.name} = {x.name}_panel[stage][..]" if getattr(x, "name", None) in staged
                                     else statement_text(x)) for x in n.dot]
            acc = next(x.acc for x in s.body if isinstance(x, L.Accumulate))
            out.append(f"{pad}    WarpShuffle(sum, length=32) {acc}")
        else:
            out.append(padded_text(f"{pad}    ", s))
    out.append(f"{pad}    each owned column:")
    out += [f"{pad}      " + (f"{x.name} = {x.name}_panel[stage][..]" if getattr(x, "name", None) in staged
                             else statement_text(x)) for x in n.per_col]
    out.append(f"{pad}each owned output:")
    out += [padded_text(f"{pad}  ", s) for s in n.epilogue]


def _flash_mma(n: K.FlashMma, pad: str, out: list[str]) -> None:
    m, d, z = n.state
    out.append(f"{pad}f32 o[{n.frag_m}][..][4] = 0 ({z}), m[{n.frag_m}][2] = -inf ({m}), d[{n.frag_m}][2] = 0 ({d})")
    if n.depth:
        out.append(f"{pad}Smem {n.q.dtype} q_panel[{n.q.rows}][{n.q.cols}]  ({n.q.buffer}, once)")
        for o in (n.k, n.v):
            wide = "cp.async 16 B" if n.how == STAGE_ASYNC and o.width > 1 else f"load.v{o.width}"
            out.append(f"{pad}Smem {o.dtype} {o.side}_panel[{n.depth}][{o.rows}][{o.cols}]  ({o.buffer} by {wide})")
    _key_range(n, pad, out)
    if n.depth:
        out.append(f"{pad}for a{n.key_var} in 0..{n.key_extent} step {n.bn}:  stage K and V, Sync")
    else:
        out.append(f"{pad}for a{n.key_var} in 0..{n.key_extent} step {n.bn}:  fragments from global memory")
    out.append(f"{pad}  s = {n.atom}(q_frag, k_frag)  over a{n.inner_var} in 0..{n.inner_extent} step 16")
    out.append(f"{pad}  each s element ({n.dot_acc}):")
    out += [padded_text(f"{pad}    ", s) for s in n.scores]
    out.append(f"{pad}  m' = max(m, quad max of {n.score}); p = exp({n.score} - m'); d = d * exp(m - m') + sum p; "
               "o *= exp(m - m')")
    out.append(f"{pad}  o = {n.atom}(p_frag (p as {n.q.dtype}), ldmatrix.x2.trans v_panel)")
    out.append(f"{pad}d = quad sum of d; each output element:")
    out += [padded_text(f"{pad}  ", s) for s in n.epilogue]


def _list_row_index(n: K.RowIndex, k: K.KernelIR, pad: str, out: list[str]) -> None:
    who = {"block": "row = blockIdx.x", "column": "row = blockIdx.x * 32 + lane (32 outputs a block)"}.get(
        n.per, "row = blockIdx.x * blockDim.x + threadIdx.x")
    if n.split > 1:
        who = who.replace("blockIdx.x", f"blockIdx.x / {n.split}") + f", slice = blockIdx.x % {n.split}"
    out.append(pad + who + "".join(f"; a{v} in 0..{e}" for v, e in n.vars))


def _list_scalar(n: K.Scalar, k: K.KernelIR, pad: str, out: list[str]) -> None:
    out += [padded_text(pad, s) for s in n.stmts]


def _list_element_loop(n: K.ElementLoop, k: K.KernelIR, pad: str, out: list[str]) -> None:
    who = "tid" if n.workers > 1 else "0"
    held = f", {n.steps} steps unrolled" if n.steps else \
        f", sums merged every {n.chunk_steps} steps" if n.chunk_steps else ""
    out.append(f"{pad}for a{n.var} in {who}*{n.width}..{n.extent} step {n.workers * n.width}"
               f" ({n.unroll} per step{held}):")
    reused, staged = dict(n.reuse), dict(n.staged)
    for v in n.vectors:
        if v.dst in reused:
            out.append(f"{pad}  {v.dtype} {v.dst}[{v.width}] = {reused[v.dst]}_held[step]  (held: no load)")
            continue
        kept = f"  (kept in {v.dst}_held)" if v.dst in n.keep else \
            f"  (first row only: kept in shared memory at byte {staged[v.dst]})" if v.dst in staged else ""
        out.append(f"{pad}  {v.dtype} {v.dst}[{v.width}] = load.v{v.width} {v.buffer}[{vector_index_c(v)}]{kept}")
    if n.width > 1:
        out.append(f"{pad}  for u in 0..{n.width}:")
    inner = pad + ("    " if n.width > 1 else "  ")
    vectorised = {v.dst[:-2]: v.dst for v in n.vectors}
    for s in n.body:
        name = getattr(s, "name", None)
        out.append(inner + f"{name} = {vectorised[name]}[u]" if name in vectorised else padded_text(inner, s))
    if n.tail:
        out.append(f"{pad}for a{n.var} in {n.extent - n.extent % n.width}+{who}..{n.extent} step {n.workers}:"
                   "  (tail, scalar)")


def _list_map_elements(n: K.MapElements, k: K.KernelIR, pad: str, out: list[str]) -> None:
    out.append(f"{pad}for j in 0..{n.per_thread}: e = (block * {k.block[0]} + tid) * {n.per_thread} + j"
               + "".join(f"; a{v} in 0..{e}" for v, e in n.vars))
    out += [padded_text(pad + "  ", s) for s in n.body]


def _list_warp_shuffle(n: K.WarpShuffle, k: K.KernelIR, pad: str, out: list[str]) -> None:
    out.append(f"{pad}WarpShuffle({n.op}, length={n.length}) {', '.join(n.accs)} -> {n.smem}[warp]")


def _list_sync(n: K.Sync, k: K.KernelIR, pad: str, out: list[str]) -> None:
    out.append(pad + "Sync")


def _list_tree_halve(n: K.TreeHalve, k: K.KernelIR, pad: str, out: list[str]) -> None:
    out.append(f"{pad}TreeHalve({n.op}, length={n.length}) {n.smem}")


def _list_column_combine(n: K.ColumnCombine, k: K.KernelIR, pad: str, out: list[str]) -> None:
    out.append(f"{pad}ColumnCombine({n.op}, warps={n.warps}) {', '.join(n.accs)} via {n.smem}[warp][lane]")


def _list_broadcast(n: K.Broadcast, k: K.KernelIR, pad: str, out: list[str]) -> None:
    out.append(f"{pad}{', '.join(n.accs)} = {n.smem}[0..{len(n.accs)}]")


def _list_split_finish(n: K.SplitFinish, k: K.KernelIR, pad: str, out: list[str]) -> None:
    out.append(f"{pad}each output: " + ", ".join(f"{a} = {op} over {n.split} partials in {n.workspace}"
                                                 for a, op in n.accs))
    out += [padded_text(f"{pad}  ", s) for s in n.epilogue]


def _list_workspace_merge(n: K.WorkspaceMerge, k: K.KernelIR, pad: str, out: list[str]) -> None:
    out.append(f"{pad}this row: " + ", ".join(f"({', '.join(accs)}) = {op} over {n.split} partials"
                                              for op, accs in n.groups) + f" in {n.workspace}")


def _list_grid_rows(n: K.GridRows, k: K.KernelIR, pad: str, out: list[str]) -> None:
    out.append(f"{pad}for row in 0..{k.tile.rows} (every block in turn; slice = blockIdx.x of {k.grid[0]})"
               + "".join(f"; a{v} in 0..{e}" for v, e in n.vars) + ":")
    for child in n.body:
        _node(child, k, len(pad) // 2 + 1, out)


def _list_grid_merge(n: K.GridMerge, k: K.KernelIR, pad: str, out: list[str]) -> None:
    out.append(f"{pad}GridSync")
    out.append(f"{pad}this row: " + ", ".join(f"({', '.join(accs)}) = {op} over {n.split} partials"
                                              for op, accs in n.groups)
               + f" in {n.workspace}[row & 1] (first warp: 32 lanes, then shuffles), shared through {n.smem}")


def _list_fill(n: K.Fill, k: K.KernelIR, pad: str, out: list[str]) -> None:
    out.append(f"{pad}{n.buffer}[0..{n.total}] = {n.value}")


def _list_contraction_tile(n: K.ContractionTile, k: K.KernelIR, pad: str, out: list[str]) -> None:
    if n.split > 1:
        how = f"writes its partial results to {n.workspace}" if n.workspace else "adds its partial result atomically"
        out.append(f"{pad}split K {n.split} ways (grid z); each block {how}")
    for p in n.panels:
        wide = f", load.v{p.width} along K" if p.width > 1 else ""
        copy = panel_copy(p, n.how)
        if n.how == STAGE_ASYNC and not copy["async"]:
            wide += f", plain copies ({copy['bytes']} B is no cp.async size)"
        out.append(f"{pad}Smem {p.dtype} {p.name}_panel[{n.depth}][{p.rows}][{p.cols}]  ({p.side}: {p.buffer}{wide})")
    out += [pad + statement_text(s) + "  (one per owned output)" for s in n.inits]
    if n.depth:
        how = "cp.async, " + f"{n.depth - 1} chunk(s) ahead" if n.how == STAGE_ASYNC else "plain loads"
        out.append(f"{pad}for k0 in 0..{n.k_extent} step {n.bk}:  stage the panels ({how}), Sync")
    else:
        out.append(f"{pad}for k0 in 0..{n.k_extent} step {n.k_extent}:  operands from global memory")
        for v in n.vectors:
            out.append(f"{pad}  {v.dtype} {v.dst}[{v.width}] = load.v{v.width} {v.buffer}[{vector_index_c(v)}]  "
                       f"(a{n.k_var} in base..base+{v.width})")
    out.append(f"{pad}  for a{n.k_var} in k0..k0+{n.bk if n.depth else n.k_extent}, each owned output:")
    staged = {p.name: p for p in n.panels}
    for s in (*n.lift, *n.combine):
        name = getattr(s, "name", None)
        out.append(f"{pad}    {name} = {name}_panel[stage][..]" if name in staged else padded_text(f"{pad}    ", s))
    if n.workspace:
        out.append(f"{pad}each owned output: accumulators to {n.workspace}")
    else:
        out.append(f"{pad}each owned output:" + (" (atomic combine into the output)" if n.split > 1 else ""))
        out += [padded_text(f"{pad}  ", s) for s in n.epilogue]


def _list_mma_tile(n: K.MmaTile, k: K.KernelIR, pad: str, out: list[str]) -> None:
    _mma(n, pad, out)


def _list_flash_rows(n: K.FlashRows, k: K.KernelIR, pad: str, out: list[str]) -> None:
    _flash(n, pad, out)


def _list_flash_mma(n: K.FlashMma, k: K.KernelIR, pad: str, out: list[str]) -> None:
    _flash_mma(n, pad, out)


def _list_only_thread(n: K.OnlyThread, k: K.KernelIR, pad: str, out: list[str]) -> None:
    out.append(pad + ("thread 0:" if n.who == "first" else "the first warp's lanes that own an output:"))
    out += [f"{pad}  {s.buffer}[{store_index_c(s.index)}] = {stored_value_c(s.value)}" for s in n.body]


# One listing per Kernel IR node type.
_LISTINGS = {
    K.RowIndex: _list_row_index,
    K.Scalar: _list_scalar,
    K.ElementLoop: _list_element_loop,
    K.MapElements: _list_map_elements,
    K.WarpShuffle: _list_warp_shuffle,
    K.Sync: _list_sync,
    K.TreeHalve: _list_tree_halve,
    K.ColumnCombine: _list_column_combine,
    K.Broadcast: _list_broadcast,
    K.SplitFinish: _list_split_finish,
    K.WorkspaceMerge: _list_workspace_merge,
    K.GridRows: _list_grid_rows,
    K.GridMerge: _list_grid_merge,
    K.Fill: _list_fill,
    K.ContractionTile: _list_contraction_tile,
    K.MmaTile: _list_mma_tile,
    K.FlashRows: _list_flash_rows,
    K.FlashMma: _list_flash_mma,
    K.OnlyThread: _list_only_thread,
}

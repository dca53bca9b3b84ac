"""Kernel IR -> CUDA text, through the jinja2 templates in cuda_templates/kernel_ir/ (one per
Kernel IR construct). The output includes emmy_rt.cuh and compiles with nvcc, and with g++ in
the simulator."""

from __future__ import annotations

import functools
from math import prod
from pathlib import Path

from emmy.kernel_ir import nodes as K
from emmy.kernel_ir.lower_common import MONOID, flat_index
from emmy.kernel_ir.scalar_c import (ONLY_THREAD_C, REGISTER, STORAGE, WORKER_C, affine_c, buffer_c, guards_c, literal,
                                     merge_c, merge_chunk_c, micro_register_c, panel_element_c, statement,
                                     store_index_c, stored_value_c, vector_index_c)
from emmy.dtypes import DType
from emmy.schedule.key_bounds import bounds_keys_above, bounds_keys_below, key_coefficients
from emmy.schedule.knobs import STAGE_ASYNC
from emmy.loop_ir import nodes as L
from emmy.tensor_ir.scalar_ops import REDUCE_OPS

_IDENTITY = {"sum": 0.0, "max": float("-inf"), "min": float("inf"), "prod": 1.0}
_STATE_IDENTITY = {"softmax": (float("-inf"), 0.0), "welford": (0.0, 0.0, 0.0)}


@functools.lru_cache(maxsize=1)
def _environment():
    import jinja2

    import emmy.cuda_templates

    folder = Path(emmy.cuda_templates.__path__[0]) / "kernel_ir"
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(folder)), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=False, autoescape=False)
    env.filters["buf"] = buffer_c
    env.filters["c"] = affine_c
    env.filters["vector_index"] = vector_index_c
    return env


def program_source(kernels: list[K.KernelIR], types: dict, sources: dict[str, str]) -> str:
    """One translation unit with every kernel; `sources`: kernel name -> the source ops it computes."""
    parts = ['#include "emmy_rt.cuh"', ""]
    for k in kernels:
        parts += [kernel_source(k, types, sources.get(k.name, "")), ""]
    return "\n".join(parts)


def kernel_source(k: K.KernelIR, types: dict, sources: str) -> str:
    params = [(STORAGE[p.dtype], buffer_c(p.name), p.written) for p in k.params]
    body = "\n".join(_render(n, k, types) for n in k.body)
    shared = [(STORAGE[s.dtype], s.name, s.size) for s in k.shared]
    return _environment().get_template("KernelIR.j2").render(k=k, params=params, body=body, sources=sources,
                                                             shared=shared)


def _index_c(types):
    return lambda buffer, index: affine_c(flat_index(buffer, index, types))


def _lines(stmts, types, vector_of=None, stored_to=None, load_from=None) -> list[str]:
    return [statement(s, _index_c(types), types, vector_of, stored_to, load_from) for s in stmts]


def _decomposition(vars_) -> list[tuple[int, int, int]]:
    extents = [e for _, e in vars_]
    return [(v, e, prod(extents[i + 1:])) for i, (v, e) in enumerate(vars_)]


def _render_row_index(n: K.RowIndex, template, k: K.KernelIR, types) -> str:
    return template.render(n=n, rows=k.tile.rows, decomposition=_decomposition(n.vars))


def _render_scalar(n: K.Scalar, template, k, types) -> str:
    return template.render(lines=_lines(n.stmts, types))


def _render_elements(n, template, k, types) -> str:
    vector_of = {v.dst[:-2]: v.dst for v in n.vectors}
    stored_to = {v.buffer: v.src for v in n.stores}
    storage = {v.buffer: STORAGE[v.dtype] for v in (*n.vectors, *n.stores)}
    lines = _lines(n.body, types, vector_of, stored_to)
    if isinstance(n, K.MapElements):
        return template.render(n=n, decomposition=_decomposition(n.vars[:-1] if n.width > 1 else n.vars),
                               inner=n.vars[-1] if n.vars else None, storage=storage, lines=lines)
    main = n.extent - n.extent % n.width
    restarts = [(acc, literal(value, dtype), REGISTER[dtype]) for op, dtype, accs in n.restarted
                for acc, value in zip(accs, _identities(op, accs))]
    merges = [merge_chunk_c(op, accs) for op, _, accs in n.restarted]
    return template.render(n=n, main=main, storage=storage, lines=lines, tail_lines=_lines(n.body, types),
                           worker=WORKER_C[n.worker], restarts=restarts, merges=merges)


def _render_merging(n, template, k, types) -> str:
    return template.render(n=n, merge=merge_c(n.op, n.accs, ""), register=REGISTER[n.dtype])


def _render_tree(n: K.TreeHalve, template, k, types) -> str:
    accs = [(a, literal(i, n.dtype)) for a, i in zip(n.accs, _identities(n.op, n.accs))]
    return template.render(n=n, accs=accs, merge=merge_c(n.op, n.accs, "_w"), register=REGISTER[n.dtype])


def _identities(op: str, accs) -> tuple:
    """The starting values of a monoid's accumulators, or of a twisted state's (m, d[, z]), (n, mean, m2)."""
    if op in _STATE_IDENTITY:  # softmax's (m, d) or attention's (m, d, z): -inf then zeros
        return _STATE_IDENTITY[op] + (0.0,) * (len(accs) - len(_STATE_IDENTITY[op]))
    return (_IDENTITY[op],) * len(accs)


def _render_split_finish(n: K.SplitFinish, template, k, types) -> str:
    register = next(p.dtype for p in k.params if p.name == n.workspace)  # the partial results' type
    accs = [(acc, literal(REDUCE_OPS[op], register), merge_c(op, (acc,), "")) for acc, op in n.accs]
    return template.render(n=n, accs=accs, register=REGISTER[register], M=prod(e for _, e in n.m_vars),
                           N=prod(e for _, e in n.n_vars), B=prod(e for _, e in n.batch_vars), m_dec=_decomposition(n.m_vars),
                           n_dec=_decomposition(n.n_vars), b_dec=_decomposition(n.batch_vars),
                           epilogue=_lines(n.epilogue, types))


def _render_fill(n: K.Fill, template, k, types) -> str:
    return template.render(n=n, value=literal(n.value, DType.F32), storage=STORAGE[n.dtype])


def _merge_groups(groups) -> list:
    """(merge statement, [(accumulator, workspace slot)]) per group of a workspace's partial states."""
    slots = iter(range(sum(len(accs) for _, accs in groups)))
    return [(merge_c(op, accs, ""), [(acc, next(slots)) for acc in accs]) for op, accs in groups]


def _render_workspace_merge(n: K.WorkspaceMerge, template, k, types) -> str:
    return template.render(n=n, groups=_merge_groups(n.groups))


def _render_grid_rows(n: K.GridRows, template, k: K.KernelIR, types) -> str:
    body = "\n".join(_render(child, k, types) for child in n.body)
    return template.render(n=n, k=k, rows=k.tile.rows, decomposition=_decomposition(n.vars), body=body)


def _render_grid_merge(n: K.GridMerge, template, k, types) -> str:
    groups = []
    for (op, accs), (merge, slotted) in zip(n.groups, _merge_groups(n.groups)):
        identities = _identities(op, accs)  # a lane with no slice left
        groups.append((merge, [(acc, slot, literal(i, DType.F32)) for (acc, slot), i in zip(slotted, identities)]))
    return template.render(n=n, groups=groups, accs=[acc for _, accs in n.groups for acc in accs])


def _render_only_thread(n: K.OnlyThread, template, k, types) -> str:
    stores = [(buffer_c(s.buffer), store_index_c(s.index), stored_value_c(s.value), s.atomic, STORAGE[s.dtype])
              for s in n.body]
    return template.render(stores=stores, condition=ONLY_THREAD_C[n.who])


def _render_plain(n, template, k, types) -> str:
    return template.render(n=n)


def _render(n, k: K.KernelIR, types) -> str:
    renderer = _RENDERERS.get(type(n))
    if renderer is None:
        raise TypeError(f"no CUDA renderer for {type(n).__name__}")
    return renderer(n, _environment().get_template(f"{type(n).__name__}.j2"), k, types)


def panel_copy(panel, how: str) -> dict:
    """How a staged panel's (K.Panel or K.MmaOperand) `width` elements move: cp.async takes 4, 8 or 16 bytes; anything
    narrower (a 2-byte element) is a plain copy even in a cp.async pipeline."""
    size = panel.width * panel.dtype.itemsize
    return {"bytes": size, "async": how == STAGE_ASYNC and size in (4, 8, 16)}


def _atomic_stores(n, types) -> list[tuple]:
    """(buffer, index, value, monoid) of a split's epilogue stores, each combined atomically."""
    monoids = dict(n.atomics)
    return [(s.buffer, affine_c(flat_index(s.buffer, s.index, types)), s.value, monoids[s.value])
            for s in n.epilogue if n.atomics]


def _render_contraction(n: K.ContractionTile, template, k: K.KernelIR, types) -> str:
    total = lambda vars_: prod(e for _, e in vars_)  # noqa: E731
    load_from, panels = {}, []
    for p in n.panels:
        outer = "mm" if p.side == "a" else "nn"
        row, col = (outer, "kk") if p.k_fast else ("kk", outer)
        load_from[p.name] = micro_register_c(p.name, p.side) if n.micro_m else panel_element_c(p, row, col)
        stmt = next(s for s in n.lift if getattr(s, "name", None) == p.name)
        index = affine_c(flat_index(stmt.expr.buffer, stmt.expr.index, types))
        panels.append({"p": p, "index": index, "storage": STORAGE[p.dtype], **panel_copy(p, n.how), "guard": guards_c(p.guards),
                       "outer_dec": _decomposition(n.m_vars if p.side == "a" else n.n_vars),
                       "outer_total": total(n.m_vars if p.side == "a" else n.n_vars),
                       "outer_start": "m0" if p.side == "a" else "n0"})
    accs = [i.acc for i in n.inits]
    inits = {i.acc: literal(REDUCE_OPS[i.op], i.dtype.accumulator) for i in n.inits}
    registers = {i.acc: REGISTER[i.dtype.accumulator] for i in n.inits}
    extra = {}
    if n.micro_m:
        template = _environment().get_template("ContractionMicro.j2")
        ragged = total(n.m_vars) % n.bm or total(n.n_vars) % n.bn
        from_global = any(isinstance(getattr(s, "expr", None), L.Load) and s.name not in load_from for s in n.lift)
        extra = {"TX": n.bn // n.micro_n, "TY": n.bm // n.micro_m, "guard_products": bool(ragged and from_global)}
    return template.render(**extra,
        atomic_stores=_atomic_stores(n, types), n=n, M=total(n.m_vars), N=total(n.n_vars), tiles_n=-(-total(n.n_vars) // n.bn),
        tiles_m=-(-total(n.m_vars) // n.bm), m_dec=_decomposition(n.m_vars), n_dec=_decomposition(n.n_vars),
        b_dec=_decomposition(n.batch_vars), panels=panels, accs=accs, inits=inits, registers=registers,
        lift=_lines(n.lift, types, {v.dst[:-2]: v.dst for v in n.vectors}, load_from=load_from),
        combine=_lines(n.combine, types), vector_storage={v.buffer: STORAGE[v.dtype] for v in n.vectors},
        epilogue=_lines(n.epilogue, types))


def _render_mma(n: K.MmaTile, template, k: K.KernelIR, types) -> str:
    total = lambda vars_: prod(e for _, e in vars_)  # noqa: E731
    ops = []
    for o in n.operands:
        outer = n.m_vars if o.side == "a" else n.n_vars
        ops.append({"o": o, **panel_copy(o, n.how), "outer_dec": _decomposition(outer), "outer_total": total(outer),
                    "prologue": _lines(o.prologue, types), "guard": guards_c(o.guards)})
    tma_bytes = sum(o.rows * o.cols * o.dtype.itemsize for o in n.operands)
    return template.render(
        n=n, ops=ops, storage=STORAGE[n.operands[0].dtype], M=total(n.m_vars), N=total(n.n_vars),
        tiles_n=-(-total(n.n_vars) // n.bn), tiles_m=-(-total(n.m_vars) // n.bm), chunks_total=n.k_extent // n.bk,
        m_dec=_decomposition(n.m_vars), n_dec=_decomposition(n.n_vars), b_dec=_decomposition(n.batch_vars),
        tma_bytes=tma_bytes, atomic_stores=_atomic_stores(n, types), epilogue=_lines(n.epilogue, types))


_WARP_MONOID = {"sum": "Sum", "max": "Max", "min": "Min"}


def _live_chunks_c(guards, key_var: int, r_dec, block_rows: int, rows: int, key_step: int,
                   chunks: int) -> tuple[str, str]:
    """C expressions (the key steps of `key_step` a flash block walks before every key fails a
    guard bounding the keys from above in each of its rows, the first step in which a key holds
    every guard bounding them from below in one of its rows) (emmy.schedule.key_bounds); "" for
    either without such guards. A block's rows are the flat rows blockIdx.x * block_rows ..; each
    row variable's range over them is exact, or its whole extent where its digit wraps inside
    the block."""
    above = [g for g in guards if bounds_keys_above(g, key_var)]
    below = [g for g in guards if bounds_keys_below(g, key_var)]
    if not guards:
        return "", ""
    lines = [f"const long long rb0 = (long long)blockIdx.x * {block_rows};",
             f"const long long rb1 = (rb0 + {block_rows} < {rows} ? rb0 + {block_rows} : {rows}) - 1;"]
    row_vars = set()
    for var, extent, divisor in r_dec:
        row_vars.add(var)
        lines += [f"long long lo{var} = rb0 / {divisor}, hi{var} = rb1 / {divisor};",
                  f"if (hi{var} - lo{var} >= {extent} || lo{var} % {extent} > hi{var} % {extent}) "
                  f"{{ lo{var} = 0; hi{var} = {extent - 1}; }} else {{ lo{var} %= {extent}; hi{var} %= {extent}; }}"]

    def rest(others: dict, const: int, lowest: bool) -> str:  # the guard less its key term, at its least or most
        terms = [f"{c}LL * {('lo' if (c > 0) == lowest else 'hi') if v in row_vars else 'a'}{v}"
                 for v, c in sorted(others.items())]
        return "(" + " + ".join(terms + ([str(const)] if const or not terms else [])) + ")"

    def ceil_div(numerator: str, ck: int) -> str:
        return numerator if ck == 1 else f"emmy::index_floor_div({numerator} + {ck - 1}, {ck})"

    def floor_div(numerator: str, ck: int) -> str:
        return numerator if ck == 1 else f"emmy::index_floor_div({numerator}, {ck})"

    end_lines = [f"long long end = {chunks * key_step};"]
    for i, guard in enumerate(above):
        ck, others, const = key_coefficients(guard, key_var)
        if ck > 0:  # ck * key + rest < hi fails in every row from ceil((hi - least rest) / ck)
            bound = ceil_div(f"{guard.hi} - {rest(others, const, True)}", ck)
        else:  # rest - |ck| * key >= lo fails in every row past floor((most rest - lo) / |ck|)
            bound = floor_div(f"{rest(others, const, False)} - {guard.lo}", -ck) + " + 1"
        end_lines += [f"const long long bound{i} = {bound};", f"if (bound{i} < end) end = bound{i};"]
    end_lines.append(f"return end <= 0 ? 0 : (int)((end + {key_step - 1}) / {key_step});")
    start_lines = ["long long start = 0;"]
    for i, guard in enumerate(below):
        ck, others, const = key_coefficients(guard, key_var)
        if ck > 0:  # ck * key + rest >= lo holds in some row only from ceil((lo - most rest) / ck)
            bound = ceil_div(f"{guard.lo} - {rest(others, const, False)}", ck)
        else:  # rest - |ck| * key < hi holds in some row only past floor((least rest - hi) / |ck|)
            bound = floor_div(f"{rest(others, const, True)} - {guard.hi}", -ck) + " + 1"
        start_lines += [f"const long long bound{i} = {bound};", f"if (bound{i} > start) start = bound{i};"]
    start_lines.append(f"return (int)(start / {key_step});")

    def expression(body: list[str]) -> str:
        text = "\n    ".join(lines + body)
        return f"[&]() -> int {{\n    {text}\n  }}()"

    return (expression(end_lines) if above else f"{chunks}"), (expression(start_lines) if below else "")


def _render_flash(n: K.FlashRows, template, k: K.KernelIR, types) -> str:
    load_from, panels, offset = {}, [], 0
    for p in n.panels:
        load_from[p.name] = panel_element_c(p, "j", f"a{n.inner_var}" if p.side == "k" else "c")
        stmt = next(s for s in (*n.dot, *n.per_col) if getattr(s, "name", None) == p.name)
        panels.append({"p": p, "storage": STORAGE[p.dtype], "offset": offset, **panel_copy(p, n.how),
                       "index": affine_c(flat_index(stmt.expr.buffer, stmt.expr.index, types))})
        offset += n.depth * p.rows * p.cols * p.dtype.itemsize
    per_key = []
    for s in n.per_key:
        if isinstance(s, L.Loop):
            (acc,) = {a.acc for a in s.body if isinstance(a, L.Accumulate)}
            op = next(a.op for a in s.body if isinstance(a, L.Accumulate))
            per_key.append({"dot": True, "acc": acc, "monoid": _WARP_MONOID[MONOID[op]]})
        else:
            per_key.append({"dot": False, "line": _lines((s,), types)[0]})
    inits = [(i.acc, literal(REDUCE_OPS[i.op], i.dtype.accumulator), REGISTER[i.dtype.accumulator]) for i in n.inits]
    chunks = -(-n.key_extent // n.keys_step)
    live, live_start = _live_chunks_c(n.key_range, n.key_var, _decomposition(n.row_vars), n.warps * n.rows_per_warp,
                                      prod(e for _, e in n.row_vars), n.keys_step, chunks)
    return template.render(
        n=n, panels=panels, per_key=per_key, inits=inits, held=[(s.name, REGISTER[s.dtype]) for s in n.held],
        live_keys=live, live_start=live_start,
        held_lines=_lines(n.held, types), dot_lines=_lines(n.dot, types, load_from=load_from),
        col_lines=_lines(n.per_col, types, load_from=load_from), epilogue=_lines(n.epilogue, types),
        ROWS=prod(e for _, e in n.row_vars), COLS=prod(e for _, e in n.col_vars),
        chunks=chunks, r_dec=_decomposition(n.row_vars), c_dec=_decomposition(n.col_vars),
        b_dec=_decomposition(n.batch_vars))


def _render_flash_mma(n: K.FlashMma, template, k: K.KernelIR, types) -> str:
    cols = prod(e for _, e in n.col_vars)
    chunks = -(-n.key_extent // n.bn)
    live, live_start = _live_chunks_c(n.key_range, n.key_var, _decomposition(n.row_vars), n.bm,
                                      prod(e for _, e in n.row_vars), n.bn, chunks)
    return template.render(live_keys=live, live_start=live_start,
        n=n, T=STORAGE[n.q.dtype], ROWS=prod(e for _, e in n.row_vars), COLS=cols, D=n.inner_extent,
        NA=-(-cols // 8), chunks=chunks, panels=[{"o": o, **panel_copy(o, n.how)} for o in (n.k, n.v)],
        r_dec=_decomposition(n.row_vars), c_dec=_decomposition(n.col_vars), b_dec=_decomposition(n.batch_vars),
        score_lines=_lines(n.scores, types), epilogue=_lines(n.epilogue, types),
        score_loads=any(isinstance(x, L.Assign) and isinstance(x.expr, L.Load) for x in n.scores))


# One renderer per Kernel IR node type; each fills its node's template (cuda_templates/kernel_ir/<Type>.j2).
_RENDERERS = {
    K.RowIndex: _render_row_index, K.Scalar: _render_scalar, K.ElementLoop: _render_elements,
    K.MapElements: _render_elements, K.WarpShuffle: _render_merging, K.ColumnCombine: _render_merging,
    K.TreeHalve: _render_tree, K.SplitFinish: _render_split_finish, K.Fill: _render_fill,
    K.WorkspaceMerge: _render_workspace_merge, K.OnlyThread: _render_only_thread, K.Sync: _render_plain,
    K.Broadcast: _render_plain, K.GridRows: _render_grid_rows, K.GridMerge: _render_grid_merge,
    K.ContractionTile: _render_contraction, K.MmaTile: _render_mma, K.FlashRows: _render_flash,
    K.FlashMma: _render_flash_mma,
}

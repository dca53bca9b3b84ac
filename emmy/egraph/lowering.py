"""Extracted terms -> Loop IR kernels.

A kernel computes one materialized e-class: a loop per output axis of extent
above 1, and a reduction loop per reduce in its (fused) term. Every value is
emitted once per distinct coordinate tuple (CSE) and placed at the outermost
loop where everything it reads is bound, so a reduction whose result is
broadcast along an axis (RMSNorm's mean of squares) runs once per row,
before the sweep that uses it. Sibling statements are ordered by their data
dependencies.
"""

from __future__ import annotations

import dataclasses
import logging
import math

import heapq
from dataclasses import dataclass, field

from emmy.affine import Affine, Guard, gathered_atoms, gathered_buffers, recombined, row_major_offset, row_major_strides
from emmy.dtypes import DType
from emmy.egraph.encode import literal_of
from emmy.egraph.layout import decode_layout
from emmy.egraph.view import EGraphView, ENode, reaches
from emmy.loop_ir.bounds import unproven_axes
from emmy.loop_ir.nodes import (Accumulate, Assign, Init, Kernel, Lit, Load, Loop, Masked, Op, Store, Update,
                                substituted)
from emmy.loop_ir.validate import check_defined_before_use, check_fold_reads

log = logging.getLogger("emmy.egraph")


@dataclass
class _Item:
    seq: int
    stmt: object
    # The loop variable it belongs in (None: kernel top level). Until the loop
    # order is known this may be `_Deferred(deps)`: "the deepest of these".
    home: object
    defs: set = field(default_factory=set)
    uses: set = field(default_factory=set)


@dataclass(frozen=True)
class _Deferred:
    deps: frozenset


class KernelTooLarge(Exception):
    """A kernel's lowering passed its statement budget: its fused work is recomputed at so many
    coordinates (an unrolled recurrence's gates, each step reading the last at four slices) that
    the kernel grows exponentially with the depth fused into it."""


class KernelLowering:
    def __init__(self, view: EGraphView, choice: dict[str, ENode], buffer_of: dict[str, str],
                 max_statements: int | None = None, tables: dict[str, str] | None = None):
        self.view = view
        self.choice = choice
        self.buffer_of = buffer_of  # materialized e-class -> its buffer name
        self.max_statements = max_statements  # KernelTooLarge past it (None: no limit)
        # computed index tensors: Tensor IR name (as the layouts' Gathered atoms say) -> buffer name
        self.tables = tables or {}
        self._layouts: dict[str, object] = {}  # layout text -> its Layout reading those buffers

    def _layout(self, text: str):
        found = self._layouts.get(text)
        if found is None:
            found = self._layouts[text] = _with_tables(decode_layout(text), self.tables)
        return found

    def lower(self, root: str, name: str, output: str) -> Kernel:
        self.root = root
        self.extents: list[int] = []
        self.items: list[_Item] = []
        self.memo: dict = {}
        self.load_guards: dict[str, tuple] = {}  # load name -> the guards it is made under (reads 0 where they fail)
        self.reduction_deps: dict[int, frozenset] = {}
        self.siblings: dict[tuple, list] = {}
        self.reached: dict[tuple, bool] = {}
        self.counters = {"in": 0, "v": 0, "acc": 0}
        self.shortcut = None
        while self.choice[root].kind == "mat":  # a forced boundary at the root is the root itself
            root = self.root = self.choice[root].args[0]
        out_type = self.view.type(root)
        reshape = self._iteration_reshape(root)
        shape = self.view.type(reshape.args[0]).shape if reshape else out_type.shape
        loop_coords, free = [], []
        for extent in shape:
            if extent == 1:
                loop_coords.append(Affine.constant(0))
            else:
                free.append(len(self.extents))
                loop_coords.append(Affine.dim(len(self.extents)))
                self.extents.append(extent)
        loop_coords = tuple(loop_coords)
        coords = loop_coords
        if reshape:  # the output's coordinates from the loops' linear offset
            offset = row_major_offset(loop_coords, shape)
            coords = tuple(Affine.constant(0) if n == 1 else offset.digit(s, n, self.extents)
                           for n, s in zip(out_type.shape, row_major_strides(out_type.shape)))
            self.shortcut = (reshape.id, coords, loop_coords)
        value, deps = self._node_value(root, coords)
        self._emit(Store(output, coords, value), deps | _vars(loop_coords), uses=_names(value))
        body = _renumber(_coalesce_sweeps(self._nest(free), self.extents), self.extents)
        check_fold_reads(name, body)
        check_defined_before_use(name, body)
        return Kernel(name, output, out_type, body)

    def _iteration_reshape(self, root: str) -> ENode | None:
        """A reshape on the kernel's elementwise spine (the root, or an operand of its element
        functions, down to the first fold or buffer) whose source has fewer axes than the output
        and holds a fold: the kernel then loops over the source's shape and stores through the
        inverse map, so a norm over several axes (GroupNorm's channels and positions, LayerNorm
        over (C, H, W)) folds and sweeps one row of the row's full length instead of sweeping
        the output's axes one nested loop at a time."""
        out_shape = self.view.type(root).shape
        axes = sum(1 for n in out_shape if n > 1)
        pending, seen = [root], {root}
        while pending:
            cid = pending.pop()
            node = self.choice[cid]
            if node.kind == "reindex":
                source = node.args[0]
                source_shape = self.view.type(source).shape
                if (sum(1 for n in source_shape if n > 1) < axes and source not in self.buffer_of
                        and _is_reshape(decode_layout(node.args[1]), source_shape) and self._folds_within(source)):
                    return node
                continue
            if node.kind not in ("unary", "binary", "select"):
                continue
            for child in node.children:
                if child not in seen and child not in self.buffer_of and self.view.type(child).shape == out_shape:
                    seen.add(child)
                    pending.append(child)
        return None

    def _folds_within(self, cid: str) -> bool:
        """Whether the term this kernel computes for `cid` holds a fold (stopping at buffers)."""
        pending, seen = [cid], {cid}
        while pending:
            node = self.choice[pending.pop()]
            if node.kind in ("reduce", "online_sum", "welford_m2", "softmax_wsum"):
                return True
            for child in node.children:
                if child not in seen and child not in self.buffer_of:
                    seen.add(child)
                    pending.append(child)
        return False

    # -- emission -------------------------------------------------------------
    def _fresh(self, prefix: str) -> str:
        n = self.counters[prefix]
        self.counters[prefix] = n + 1
        return f"{prefix}{n}"

    def _emit(self, stmt, deps, uses=(), defs=(), home="auto") -> None:
        placed = _Deferred(frozenset(deps)) if home == "auto" else home
        if self.max_statements is not None and len(self.items) >= self.max_statements:
            raise KernelTooLarge(f"{self.root}: over {self.max_statements} statements")
        self.items.append(_Item(len(self.items), stmt, placed, set(defs), set(uses)))

    def _node_value(self, cid: str, coords: tuple) -> tuple:
        """The value of `cid` at `coords`, computed once per coordinate tuple. Terms are walked
        with an explicit stack of generators (each `_steps` generator yields the (class,
        coordinates) it needs and is sent the value), so a term thousands of ops deep lowers
        without recursion."""
        key = (cid, coords, ())
        if key in self.memo:
            return self.memo[key]
        stack = [(key, self._steps(cid, self.choice[cid], coords, ()))]
        sent = None
        while stack:
            key, steps = stack[-1]
            try:
                child, child_coords, *under = steps.send(sent)
            except StopIteration as done:
                self.memo[key] = done.value
                stack.pop()
                sent = done.value
                continue
            guards = key[2] + tuple(under[0]) if under else key[2]  # a guarded map's guards hold below it
            if child != self.root and child in self.buffer_of:
                sent = self._load(self.buffer_of[child], child_coords, self.view.type(child), guards)
            elif (child, child_coords, guards) in self.memo:
                sent = self.memo[(child, child_coords, guards)]
            else:
                stack.append(((child, child_coords, guards),
                              self._steps(child, self.choice[child], child_coords, guards)))
                sent = None
        return self.memo[(cid, coords, ())]

    def _load(self, buffer: str, coords: tuple, type_, guards: tuple = ()) -> tuple:
        """A load of buffer[coords] (`type_`: the buffer's TensorType), made only where `guards` hold
        (those of the guarded index maps it is read under) when its index may fall outside the
        buffer there."""
        dtype = type_.dtype
        if _inside(coords, type_.shape, self.extents):  # reading where the guards fail is harmless
            guards = ()
        else:
            guards = _needed(guards, coords)
            guards += self._unproven(buffer, coords, type_.shape, guards)
        key = ("load", buffer, coords, guards)
        if key not in self.memo:
            name = self._fresh("in")
            deps = _vars(coords) | frozenset().union(*(g.expr.dims() for g in guards))
            self._emit(Assign(name, dtype, Load(buffer, coords, guards)), deps, defs=[name])
            self.memo[key] = (name, deps)
            self.load_guards[name] = guards
        return self.memo[key]

    def _unproven(self, buffer: str, coords: tuple, shape: tuple, guards: tuple) -> tuple:
        """Guards that keep a load inside its buffer on the axes the interval proof
        (emmy.loop_ir.bounds) cannot: the index of a valid program stays inside, but a chain of
        views with concatenated pieces (a relative shift after a cat, three times over) can carry
        more than intervals see, and a kernel with an unproven access is never emitted. Such an
        axis is read where 0 <= index < size, checked at run time (never failing for a valid program)."""
        if not shape or len(shape) != len(coords):
            return ()
        variables = _vars(coords) | frozenset().union(*(g.expr.dims() for g in guards))
        axes = unproven_axes(coords, shape, guards, {v: (0, self.extents[v] - 1) for v in variables})
        if axes:
            log.debug("a load of %s is guarded at run time on axes %s: the proof cannot keep them inside",
                      buffer, axes)
        return tuple(Guard(coords[a], 0, shape[a]) for a in axes)

    def _op(self, op: str, dtype: DType, args: list[tuple]) -> tuple:
        deps = frozenset().union(*(d for _, d in args)) if args else frozenset()
        name = self._fresh("v")
        operands = tuple(v for v, _ in args)
        self._emit(Assign(name, dtype, Op(op, operands)), deps, defs=[name], uses=_names(*operands))
        return name, deps

    def _steps(self, cid: str, node: ENode, coords: tuple, guards: tuple = ()):
        """A generator computing `node` at `coords` (under `guards`: where they fail, the value is
        masked out, so its loads must not touch memory there): it yields (class, coordinates[,
        guards the operand is read under]) for each operand value it needs and returns the node's
        (value, loop variables it depends on)."""
        a = node.args
        kind = node.kind
        if kind == "buffer":
            return self._load(a[0], coords, self.view.type(cid), guards)
        if kind == "literal":
            dtype = DType(a[1])
            return Lit(literal_of(a[0], dtype), dtype), frozenset()
        if kind == "mat":  # a boundary that cannot be fused away: read the child's buffer
            return (yield a[0], coords)
        if kind in ("unary", "binary", "select"):
            args = []
            for child in node.children:  # a rank-0 operand (a constant) is read at no coordinates
                args.append((yield child, coords if self.view.type(child).shape else ()))
            return self._op("where", DType(a[0]), args) if kind == "select" else self._op(a[0], DType(a[1]), args)
        if kind == "reduce":
            return (yield from self._reduce(cid, a[0], a[1], a[2], coords))
        if kind == "online_sum":
            return (yield from self._online_sum(cid, a[0], a[1], coords))
        if kind == "welford_m2":
            return (yield from self._welford_m2(cid, a[0], a[1], coords))
        if kind == "softmax_wsum":
            return (yield from self._softmax_wsum(cid, a[0], a[1], a[2], coords))
        if kind == "reindex":
            layout = self._layout(a[1])
            sub = tuple(e.substitute(coords, self.extents) for e in layout.index)
            if self.shortcut and self.shortcut[:2] == (node.id, coords):  # the reshape the loops run over
                sub = self.shortcut[2]
            guards = tuple(Guard(g.expr.substitute(coords, self.extents), g.lo, g.hi) for g in layout.guards)
            guards = tuple(g for g in guards if not g.always(self.extents))
            fill = _constant_fill(guards, layout.fill, self.view.type(cid).dtype, self.extents)
            if fill is not None:  # read only where it never is (a class token's slot of the patches)
                return fill, frozenset()
            inner, deps = yield a[0], sub, guards
            if not guards or (_zero(layout.fill) and set(guards) <= set(self.load_guards.get(inner, ()))):
                # a buffer's element read under these guards: the load reads 0 where they fail
                return inner, deps
            name = self._fresh("v")
            deps = deps | frozenset().union(*(g.expr.dims() for g in guards))
            self._emit(Assign(name, self.view.type(cid).dtype, Masked(guards, inner, layout.fill)), deps,
                       defs=[name], uses=_names(inner))
            return name, deps
        raise ValueError(kind)

    def _reduce(self, cid: str, op: str, axis: int, body_cid: str, coords: tuple) -> tuple:
        extent = self.view.type(body_cid).shape[axis]
        if extent == 1:
            return (yield body_cid, coords)
        var, (acc,), inits, value, deps = yield from self._open_fold(cid, axis, body_cid, coords, (op,))
        self._emit(Accumulate(acc, op, value), deps | {var}, defs=[acc], uses=_names(value) | {acc + "@0"}, home=var)
        return acc, self._close_fold(var, inits, deps, [])

    def _open_fold(self, cid: str, axis: int, x_cid: str, coords: tuple, state: tuple[str, ...],
                   twisted: bool = False):
        """Open a loop over `axis` (or join a sibling's) with one accumulator per monoid in
        `state` (`twisted`: a state stepped by Updates); returns the loop variable, accumulators,
        their Init items, and x at the loop's element with its deps."""
        extent = self.view.type(x_cid).shape[axis]
        dtype = self.view.type(x_cid).dtype
        outer = _vars(c for k, c in enumerate(coords) if k != axis)
        var = self._sibling_loop(cid, x_cid, extent, outer, twisted)
        if var is None:
            var = len(self.extents)
            self.extents.append(extent)
        self.siblings.setdefault((extent, outer), []).append((var, cid, twisted))
        accs, inits = [], []
        for op in state:
            acc = self._fresh("acc")
            accs.append(acc)
            inits.append(_Item(len(self.items), Init(acc, op, dtype), None, {acc + "@0"}, set()))
            self.items.append(inits[-1])
        sub = list(coords)
        sub[axis] = Affine.dim(var)
        x, deps = yield x_cid, tuple(sub)
        # the fold's result stands at its coordinates' loops, even where x does not vary along one
        # of them: a loop shared with a sibling fold nests inside all of theirs, and so must its Init
        return var, accs, inits, x, deps | outer

    def _fold_loop(self, cid: str, axis: int, x_cid: str, coords: tuple, state: tuple[str, ...]):
        """`_open_fold` for a fold stepped by Update statements; adds an `op` helper that emits
        a step statement inside the loop, reading the state as it was before the element."""
        var, accs, inits, x, deps = yield from self._open_fold(cid, axis, x_cid, coords, state, twisted=True)
        dtype = self.view.type(x_cid).dtype
        here = deps | {var}

        def op(name, out_dtype, *args):
            value, _ = self._op(name, out_dtype, list(args))
            item = self.items[-1]
            # A step reads the state as it was before this element's Updates.
            read = {a for a in accs if a in item.stmt.expr.args}
            item.uses = (item.uses - read) | {a + "@0" for a in read}
            item.home = var
            return value, here

        return var, accs, inits, (x, here), dtype, here, deps, op

    def _close_fold(self, var: int, inits, deps, updates) -> frozenset:
        for acc, value, here in updates:
            self._emit(Update(acc, value), here, defs=[acc], uses={value, acc + "@0"}, home=var)
        result_deps = frozenset(deps - {var})
        self.reduction_deps[var] = self.reduction_deps.get(var, frozenset()) | result_deps
        for item in inits:
            item.home = _Deferred(result_deps)
        return result_deps

    def _welford_m2(self, cid: str, axis: int, x_cid: str, coords: tuple) -> tuple:
        """sum((x - mean)^2) in one pass: n += 1; delta = x - mean; mean += delta / n;
        m2 += delta * (x - mean), with the new mean in the last step (Welford, 1962)."""
        var, (n, mean, m2), inits, x_, dtype, here, deps, op = yield from self._fold_loop(
            cid, axis, x_cid, coords, ("sum", "sum", "sum"))
        n_new = op("add", dtype, (n, here), (Lit(1.0, dtype), frozenset()))
        delta = op("subtract", dtype, x_, (mean, here))
        mean_new = op("add", dtype, (mean, here), op("divide", dtype, delta, n_new))
        m2_new = op("add", dtype, (m2, here), op("multiply", dtype, delta, op("subtract", dtype, x_, mean_new)))
        result_deps = self._close_fold(var, inits, deps, [(m2, m2_new[0], here), (mean, mean_new[0], here),
                                                          (n, n_new[0], here)])
        return m2, result_deps

    def _online_sum(self, cid: str, axis: int, s_cid: str, coords: tuple) -> tuple:
        """sum(exp(s - max s)) in one pass, with state (m, d): m the running max and d the sum of
        exp(x - m) over every element but one maximum, whose term (1) is added after the fold.
        A step m' = max(m, x); lo = min(m, x); d' = d * rescale_exp(m - m') + exp(lo - m'): the
        element that is not the new max joins d by one exp, whether it is x or the old max.

        So every element reaches the sum as the consumer's numerator exp(x - max) does: by one
        exp (the maximum by none), times rescale factors that lean neither way (`rescale_exp`):
        where the GPU's exp leans a fraction of an ulp, numerators and sum lean alike and the
        quotient does not. (Kept in d, the max's term would be an exact 1 in the sum while its
        numerator leans; computed by exp, the rescales would pile their lean up in the sum alone.
        softmax_wsum's z and d share every factor, so there a lean cancels as it is.)

        Where m == m' the factor is 1, not exp(nan) (-inf - -inf), and where lo == m' (a tie, or
        a masked element in a masked row) the term is 1; a fully masked row ends with m = -inf
        and the consumer's exp(x - m) gives NaN, as PyTorch's softmax does.
        """
        var, (m, d), inits, x_, dtype, here, deps, op = yield from self._fold_loop(cid, axis, s_cid, coords,
                                                                                   ("max", "sum"))
        m_old = (m, here)
        m_new = op("maximum", dtype, m_old, x_)
        scale = _exp_or_one(op, dtype, m_old, m_new, "rescale_exp")
        term = _exp_or_one(op, dtype, op("minimum", dtype, m_old, x_), m_new)
        d_new = op("add", dtype, op("multiply", dtype, (d, here), scale), term)
        result_deps = self._close_fold(var, inits, deps, [(d, d_new[0], here), (m, m_new[0], here)])
        return self._op("add", dtype, [(d, result_deps), (Lit(1.0, dtype), frozenset())])  # the maximum's own term

    def _softmax_wsum(self, cid: str, axis: int, s_cid: str, w_cid: str, coords: tuple) -> tuple:
        """sum(softmax(s) * w) in one pass with state (m, d, z):
        m' = max(m, s); a = exp(m - m'); e = exp(s - m'); d' = d*a + e; z' = z*a + e*w; out z / d.

        As in `_online_sum`, equal maxima give the factor 1 rather than exp(nan);
        a fully masked row ends with m = -inf, and the output adds m - m (NaN
        there, 0 elsewhere) so it is NaN as PyTorch's softmax makes it.
        """
        var, (m, d, z), inits, s_, dtype, here, deps, op = yield from self._fold_loop(
            cid, axis, s_cid, coords, ("max", "sum", "sum"))
        sub = list(coords)
        sub[axis] = Affine.dim(var)
        w, w_deps = yield w_cid, tuple(sub)
        at = here | w_deps
        m_new, scale, term = _max_step(op, dtype, (m, here), s_)
        d_new = op("add", dtype, op("multiply", dtype, (d, here), scale), term)
        z_new = op("add", dtype, op("multiply", dtype, (z, at), scale), op("multiply", dtype, term, (w, at)))
        result_deps = self._close_fold(var, inits, deps | (w_deps - {var}),
                                       [(z, z_new[0], at), (d, d_new[0], here), (m, m_new[0], here)])
        ratio = self._op("divide", dtype, [(z, result_deps), (d, result_deps)])
        nan_if_masked = self._op("subtract", dtype, [(m, result_deps), (m, result_deps)])
        return self._op("add", dtype, [ratio, nan_if_masked])

    def _sibling_loop(self, cid: str, body_cid: str, extent: int, outer: frozenset, twisted: bool) -> int | None:
        """A reduction loop this one can share: the multi-output fold of sibling reductions.

        Two reductions over the same extent at the same place in the nest run as
        one loop with two accumulators (their common loads then happen once),
        unless one needs the other's result (softmax's sum needs its max), or both
        are twisted: a loop keeps one Update-stepped state, the one the kernel
        lowering merges across threads (emmy::merge_welford, merge_softmax).
        """
        members: dict[int, list[tuple[str, bool]]] = {}
        for var, other, other_twisted in self.siblings.get((extent, outer), []):
            members.setdefault(var, []).append((other, other_twisted))
        for var, others in members.items():  # a loop joins only if no fold already in it is a conflict
            if twisted and any(t for _, t in others):
                continue
            if not any(self._reaches(body_cid, other) or self._reaches(other, cid) for other, _ in others) \
                    and not self._needs_itself(cid, var):
                return var
        return None

    def _needs_itself(self, cid: str, var: int) -> bool:
        """Whether fold `cid` joining loop `var` would make that loop wait for itself: loops wait
        for the loops holding folds their folds read, and with `cid` in it, `var` would reach
        itself. Three norms of x, 2x and x + 1 in one kernel: the second pass of one norm joining
        the first pass of another, both ways, made two loops each waiting for the other (and a
        fold may join before the fold it reads, found while lowering its body, opens a loop)."""
        loops: dict[int, list[str]] = {}
        for entries in self.siblings.values():
            for v, other, _ in entries:
                loops.setdefault(v, []).append(other)
        loops.setdefault(var, []).append(cid)

        def waited_for(v: int) -> list[int]:
            return [w for w, folds in loops.items() if w != v
                    and any(self._reaches(m, f) for m in loops[v] for f in folds)]

        # from the loops `var` waits for (None: the start) back to `var`
        return reaches(None, var, lambda v: waited_for(var if v is None else v))

    def _reaches(self, start: str, goal: str) -> bool:
        """Whether this kernel computes `goal` on the way to `start` (a search that stops at buffers),
        kept for the kernel: the sibling checks ask about each pair of folds many times."""
        key = (start, goal)
        if key not in self.reached:
            self.reached[key] = reaches(start, goal, lambda cid: self.choice[cid].children
                                        if cid == self.root or cid not in self.buffer_of else ())
        return self.reached[key]

    # -- nesting ----------------------------------------------------------------
    def _nest(self, free: list[int]) -> tuple:
        needed = frozenset().union(*self.reduction_deps.values()) if self.reduction_deps else frozenset()
        chain = sorted(free, key=lambda v: (v not in needed, v))
        parent: dict[int, int | None] = {}
        for i, v in enumerate(chain):
            parent[v] = chain[i - 1] if i else None
        depth: dict[int, int] = {v: i + 1 for i, v in enumerate(chain)}

        def deepest(deps) -> int | None:
            return max(deps, key=depth.__getitem__) if deps else None

        # A reduction loop nests inside the deepest loop its result depends on (resolved with a
        # stack: dependent folds can chain as deep as the kernel's fused reductions).
        for var in self.reduction_deps:
            pending = [var]
            while pending:
                v = pending[-1]
                if v in depth:
                    pending.pop()
                    continue
                unresolved = [d for d in self.reduction_deps[v] if d not in depth]
                if unresolved:
                    pending.extend(unresolved)
                    continue
                parent[v] = deepest(self.reduction_deps[v])
                depth[v] = (depth[parent[v]] if parent[v] is not None else 0) + 1
                pending.pop()
        # a value no loop variable reaches (a scalar input's load, a constant's op) goes into the
        # outermost free loop, where kernels place their threads, unless a fold beside that loop
        # (a whole-tensor reduction a sweep reads) needs it too: then it stays above both
        beside = any(parent[v] is None for v in self.reduction_deps)
        for item in self.items:
            if isinstance(item.home, _Deferred):
                item.home = deepest(item.home.deps)
            if item.home is None and chain and isinstance(item.stmt, Assign) and not beside:
                item.home = chain[0]
        children: dict[int | None, list] = {}
        for item in self.items:
            children.setdefault(item.home, []).append(item)
        for var in list(depth):
            children.setdefault(parent[var], []).append(("loop", var))

        # Each level's statements and loops in dependency order, innermost levels first.
        built: dict = {}
        pending = [(None, False)]
        while pending:
            home, ready = pending.pop()
            if not ready:
                pending.append((home, True))
                pending.extend((e[1], False) for e in children.get(home, []) if isinstance(e, tuple))
                continue
            entries = []
            for entry in children.get(home, []):
                if isinstance(entry, tuple):
                    var = entry[1]
                    body, defs, uses, seq = built.pop(var)
                    loop = Loop(var, self.extents[var], body, reduction=var not in free)
                    entries.append((seq, loop, defs, uses - defs))
                else:
                    entries.append((entry.seq, entry.stmt, entry.defs, entry.uses))
            ordered = _topological(entries)
            defs = set().union(*(e[2] for e in entries)) if entries else set()
            uses = set().union(*(e[3] for e in entries)) if entries else set()
            seq = min((e[0] for e in entries), default=1 << 30)
            built[home] = (tuple(e[1] for e in ordered), defs, uses, seq)
        return built[None][0]


def _max_step(op, dtype: DType, m, x) -> tuple:
    """One element of softmax_wsum's running-max fold: m' = max(m, x), the factor exp(m - m')
    that rescales what was summed so far, and exp(x - m')."""
    m_new = op("maximum", dtype, m, x)
    return m_new, _exp_or_one(op, dtype, m, m_new), _exp_or_one(op, dtype, x, m_new)


def _exp_or_one(op, dtype: DType, value, top, exp: str = "exp"):
    """exp(value - top) by `exp`, and 1 where they are equal: not exp(nan) where both are -inf."""
    return op("where", dtype, op("equal", DType.BOOL, value, top), (Lit(1.0, dtype), frozenset()),
              op(exp, dtype, op("subtract", dtype, value, top)))


def _coalesce_sweeps(body: tuple, extents: list[int]) -> tuple:
    """A row's sweep over several axes as one loop: where a level of the nest holds a fold, each
    perfect nest of element loops beside it (a loop whose body is one element loop) becomes one
    loop over their product, its coordinates recovered by division and remainder (exact, and
    simplified away where the reads are contiguous). A norm over (C, H, W) then sweeps its row of
    C*H*W elements with every thread of the row's block, as its fold does, rather than spreading
    the block over C and running H and W serially. Appends the new loops' extents to `extents`."""
    out = []
    has_fold = any(isinstance(s, Loop) and s.reduction for s in body)
    for stmt in body:
        if isinstance(stmt, Loop):
            if has_fold and not stmt.reduction:
                stmt = _coalesced(stmt, extents)
            stmt = Loop(stmt.var, stmt.extent, _coalesce_sweeps(stmt.body, extents), stmt.reduction)
        out.append(stmt)
    return tuple(out)


def _coalesced(loop: Loop, extents: list[int]) -> Loop:
    """`loop` and the element loops nested in it as one; what a level computes before its inner
    loop (plain assignments: a per-channel weight's load) sinks into the element, computed there."""
    nest, sunk = [loop], []
    while True:
        inner = [s for s in nest[-1].body if isinstance(s, Loop)]
        if len(inner) != 1 or inner[0].reduction or inner[0] is not nest[-1].body[-1]:
            break
        if not all(isinstance(s, Assign) for s in nest[-1].body[:-1]):
            break
        sunk += nest[-1].body[:-1]
        nest.append(inner[0])
    if len(nest) == 1:
        return loop
    var = len(extents)
    extents.append(math.prod(n.extent for n in nest))
    merged = Affine.dim(var)
    dims = [Affine.dim(v) for v in range(len(extents))]
    stride = 1
    for n in reversed(nest):
        dims[n.var] = merged.digit(stride, n.extent, extents)
        stride *= n.extent
    return Loop(var, extents[var], substituted((*sunk, *nest[-1].body), dims, extents), False)


def _renumber(body: tuple, extents: list[int]) -> tuple:
    """Loop variables and SSA names numbered in the order the printed kernel
    introduces them (a0, a1, ...; in0, in1, v0, ...)."""
    mapping: dict[str, str] = {}
    counters: dict[str, int] = {}
    order: list[int] = []

    def collect(stmts: tuple) -> None:
        for stmt in stmts:
            if isinstance(stmt, Loop):
                order.append(stmt.var)
                collect(stmt.body)

    collect(body)
    new_of = {old: new for new, old in enumerate(order)}
    new_extents = [extents[old] for old in order]
    dims = [Affine.dim(new_of[v]) if v in new_of else Affine.dim(v) for v in range(len(extents))]

    def index(exprs: tuple) -> tuple:
        return tuple(e.substitute(dims, new_extents) for e in exprs)

    def define(name: str) -> str:
        prefix = name.rstrip("0123456789")
        mapping[name] = f"{prefix}{counters.get(prefix, 0)}"
        counters[prefix] = counters.get(prefix, 0) + 1
        return mapping[name]

    def use(value):
        return mapping.get(value, value) if isinstance(value, str) else value

    def walk(stmts: tuple) -> tuple:
        out = []
        for stmt in stmts:
            if isinstance(stmt, Loop):
                out.append(Loop(new_of[stmt.var], stmt.extent, walk(stmt.body), stmt.reduction))
            elif isinstance(stmt, Assign):
                expr = stmt.expr
                if isinstance(expr, Op):
                    expr = Op(expr.op, tuple(use(a) for a in expr.args))
                elif isinstance(expr, Masked):
                    guards = tuple(Guard(g.expr.substitute(dims, new_extents), g.lo, g.hi) for g in expr.guards)
                    expr = Masked(guards, use(expr.value), expr.fill)
                elif isinstance(expr, Load):
                    expr = Load(expr.buffer, index(expr.index),
                                tuple(Guard(g.expr.substitute(dims, new_extents), g.lo, g.hi) for g in expr.guards))
                out.append(Assign(define(stmt.name), stmt.dtype, expr))
            elif isinstance(stmt, Init):
                out.append(Init(define(stmt.acc), stmt.op, stmt.dtype))
            elif isinstance(stmt, Accumulate):
                out.append(Accumulate(use(stmt.acc), stmt.op, use(stmt.value)))
            elif isinstance(stmt, Update):
                out.append(Update(use(stmt.acc), use(stmt.value)))
            elif isinstance(stmt, Store):
                out.append(Store(stmt.buffer, index(stmt.index), use(stmt.value)))
        return tuple(out)

    return walk(body)


def _topological(entries: list) -> list:
    """Order by data dependency among siblings, emission order breaking ties: Kahn's algorithm
    taking the earliest-emitted ready entry each step. An entry is ready once every name it
    uses that a sibling defines is defined (by any sibling that defines it)."""
    defined_here = set().union(*(e[2] for e in entries)) if entries else set()
    users: dict[str, list[int]] = {}
    missing = []
    for i, e in enumerate(entries):
        needed = e[3] & defined_here
        missing.append(len(needed))
        for name in needed:
            users.setdefault(name, []).append(i)
    ready = [(e[0], i) for i, e in enumerate(entries) if not missing[i]]
    heapq.heapify(ready)
    available: set = set()
    done: list = []
    taken = [False] * len(entries)
    while len(done) < len(entries):
        if not ready:  # a cycle cannot happen for terms; keep emission order rather than stop
            done.extend(e for _, i, e in sorted((e[0], i, e) for i, e in enumerate(entries) if not taken[i]))
            break
        _, i = heapq.heappop(ready)
        taken[i] = True
        done.append(entries[i])
        for name in entries[i][2] - available:
            available.add(name)
            for user in users.get(name, ()):
                missing[user] -= 1
                if missing[user] == 0:
                    heapq.heappush(ready, (entries[user][0], user))
    return done


def _constant_fill(guards: tuple, fill, dtype: DType, extents) -> Lit | None:
    """The fill as a literal where some guard holds nowhere the loops reach (the element is the
    fill everywhere, and nothing under it need be computed or loaded); else None."""
    if not any(g.never(extents) for g in guards):
        return None
    if dtype is DType.BOOL:
        return Lit(bool(fill), dtype)
    if dtype.is_float:
        return Lit(float(fill), dtype)
    return Lit(int(fill), dtype) if math.isfinite(fill) else None  # an infinite integer fill stays a Masked


def _inside(coords: tuple, shape: tuple[int, ...], extents) -> bool:
    """Whether a load's index stays inside its buffer over every coordinate the loops reach, and
    each index tensor it reads is read inside too (an upsampling's table read at a padded
    convolution's coordinates)."""
    return bool(shape) and len(shape) == len(coords) and _within(coords, shape, extents) and all(
        _within(atom.index, atom.shape, extents) for atom in gathered_atoms(coords))


def _needed(guards: tuple, coords: tuple) -> tuple:
    """The guards a load that may leave its buffer must keep: those that share a loop variable with
    the index, without repeats. A guard on other variables only (a concatenation's piece, on the
    output channel, over a convolution's input) cannot keep the index inside, and would tie the
    load to loops it does not walk (a contraction's other side)."""
    if not guards:
        return ()
    walked = frozenset().union(*(e.dims() for e in coords))
    unique = []
    for g in guards:
        if g not in unique and g.expr.dims() & walked:
            unique.append(g)
    return tuple(unique)


def _within(index, shape, extents) -> bool:
    """Whether `index` stays inside `shape` over every coordinate the loops reach."""
    return all(0 <= lo and hi < n for (lo, hi), n in ((e.bounds(extents), n) for e, n in zip(index, shape)))


def _is_reshape(layout, source_shape) -> bool:
    """Whether `layout` reads `source_shape` as a row-major reshape: unguarded, in range, and the
    source offset of every output coordinate is that coordinate's own offset (so it is a bijection)."""
    if layout.guards or math.prod(layout.shape) != math.prod(source_shape) or len(layout.index) != len(source_shape):
        return False
    extents = list(layout.shape)
    coords = [Affine.constant(0) if n == 1 else Affine.dim(j) for j, n in enumerate(extents)]
    index = [e.substitute(coords, extents) for e in layout.index]
    if any(not (0 <= e.bounds(extents)[0] and e.bounds(extents)[1] < n) for e, n in zip(index, source_shape)):
        return False
    return recombined(row_major_offset(index, source_shape)) == row_major_offset(coords, extents)


def _vars(coords) -> frozenset:
    found: set = set()
    for e in coords:
        found |= e.dims()
    return frozenset(found)


def _with_tables(layout, tables: dict[str, str]):
    """`layout` reading its computed index tensors from their buffers (`tables`: name -> buffer)."""
    if not tables or not gathered_buffers((*layout.index, *(g.expr for g in layout.guards))) & tables.keys():
        return layout
    return dataclasses.replace(layout, index=tuple(e.with_tables(tables) for e in layout.index),
                               guards=tuple(Guard(g.expr.with_tables(tables), g.lo, g.hi) for g in layout.guards))


def _names(*operands) -> set:
    return {o for o in operands if isinstance(o, str)}


def _zero(fill) -> bool:
    """A fill a guarded load's 0 stands for (not -0.0, whose sign a load's 0 would lose)."""
    return fill is not None and fill == 0 and not (isinstance(fill, float) and math.copysign(1.0, fill) < 0)

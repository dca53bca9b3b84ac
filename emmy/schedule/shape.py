"""What a schedule needs to know about a Loop IR kernel: its kind and extents.

- map          no reduction: `numel` outputs, `inner` the innermost extent.
- row          a reduction per row: `rows` rows of `red` elements (folds of
               several monoids and twisted folds included); `sweep` when the
               row is read again after the fold (RMSNorm's scaling pass).
- column       a reduction over a non-contiguous axis (x.sum(dim=1) of a 3-D
               tensor): `rows` outputs, each folding `red` elements that lie
               a stride apart, while consecutive outputs read consecutive
               addresses. Threads go along the outputs (coalesced), not along
               the fold. `cols` is the contiguous output extent.
- contraction  sum over k of a[.., m, k] * b[.., k, n]: `rows` = M, `cols` = N,
               `red` = K, `batch` the extents both operands share. `mma` when
               both operands are loaded as f16 or bf16 (tensor-core atoms).
- attention    a twisted fold over keys (`red`) whose element is itself a
               contraction (`inner`, the q.k head dimension) and whose state
               has a vector over `cols` (the value head dimension): flash
               attention. `rows` = query rows, `batch` = the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from emmy.affine import Dim, FloorDiv, Mod
from emmy.dtypes import DType
from emmy.loop_ir.nodes import Accumulate, Assign, Kernel, Load, Loop, Op, Update, parallel_loops, statements
from emmy.schedule.held import held_loads, invariant_loads
from emmy.schedule.key_bounds import KeyBound, key_range_guards

_MMA_DTYPES = {DType.F16: "f16", DType.BF16: "bf16"}


@dataclass(frozen=True)
class KernelShape:
    kernel: str
    kind: str  # map | row | contraction
    rows: int  # map: numel; row: rows; contraction: M
    cols: int  # contraction: N; otherwise 1
    red: int  # reduced extent; 1 for map
    inner: int  # contiguous innermost extent read along (vector loads must divide it)
    itemsize: int  # bytes per element of the widest input
    batch: int = 1
    sweep: bool = False  # the row is read again after its fold
    held: bool = False  # a sweep or later fold loads what a fold loaded (STAGE=regs keeps it: emmy.schedule.held)
    weights: int = 0  # operands the sweep reads alike every row (STAGE=regs/w<N> keeps N: held.invariant_loads)
    epilogue: bool = False  # the output is not the raw accumulator
    atomic_ok: bool = False  # every fold is a sum/max/min monoid (blocks may combine with atomics)
    mma: str = ""  # "f16" | "bf16" when tensor-core atoms apply
    prologue: bool = False  # contraction: an operand is elementwise work on loads, not a load
    prologue_ops: tuple[int, int] = (0, 0)  # operations per element of the A and B operands' prologues
    free_vars: tuple[int, ...] = ()  # loop variables outside the folds (one output element or row each)
    # How the kernel's reads walk memory (emmy.schedule.geometry.lane_access decides per row whether
    # a warp's lanes read consecutive addresses): along the fold variable, along the innermost free one.
    fold_contiguous: bool = True
    outputs_contiguous: bool = True
    m_vars: tuple[int, ...] = ()  # contraction: free variables only the first operand reads
    n_vars: tuple[int, ...] = ()  # ... only the second operand reads
    panel_loads: tuple[int, int] = (1, 1)  # contraction: loads walking K on the A side, on the B side (staged each)
    panel_bytes: tuple[int, int] = (4, 4)  # the same loads' element bytes summed per side: a stage's bytes per row
    key_bound: KeyBound | None = None  # attention: a causal mask's bound on each block's keys (key_bounds)
    score_bytes: int = 0  # attention: bytes loaded per score beside q.k (a mask's or a bias's element)
    key_bytes: int = 0  # attention: bytes loaded per key beside k and v, alike for every query (a padding mask)

    def signature(self) -> str:
        """What a measurement of this kernel is keyed by, besides knobs and GPU: kind, extents, types."""
        flags = "".join(f" {name}" for name, on in (("sweep", self.sweep), ("epilogue", self.epilogue),
                                                   ("prologue", self.prologue)) if on)
        if self.prologue:
            flags += f" prologue_ops={self.prologue_ops[0]},{self.prologue_ops[1]}"
        if self.panel_loads != (1, 1):
            flags += f" panels={self.panel_loads[0]},{self.panel_loads[1]}"
        if self.key_bound is not None:
            flags += " key_bound"
        if self.score_bytes:
            flags += f" score_bytes={self.score_bytes}"
        if self.key_bytes:
            flags += f" key_bytes={self.key_bytes}"
        return (f"{self.kind} rows={self.rows} cols={self.cols} red={self.red} inner={self.inner} "
                f"batch={self.batch} itemsize={self.itemsize}" + (f" mma={self.mma}" if self.mma else "") + flags)

    def describe(self) -> str:
        if self.kind == "map":
            return f"map of {self.rows} elements"
        if self.kind == "row":
            return f"row reduction {self.rows} x {self.red}" + (" with sweep" if self.sweep else "")
        if self.kind == "column":
            return f"column reduction {self.rows} outputs x {self.red}"
        if self.kind == "attention":
            dims = f"{self.rows} queries x {self.red} keys, head {self.inner}, values {self.cols}"
            return f"attention {dims}" + (f" (batch {self.batch})" if self.batch > 1 else "") + \
                (f", {self.mma} operands" if self.mma else "") + (", causal" if self.key_bound else "")
        dims = f"{self.rows}x{self.cols}x{self.red}" + (f" (batch {self.batch})" if self.batch > 1 else "")
        return f"contraction {dims}" + (f", {self.mma} operands" if self.mma else "") + \
            (", elementwise operand prologue" if self.prologue else "")


def kernel_shape(kernel: Kernel) -> KernelShape:
    free, reductions, sweep = [], [], False
    _loops(kernel.body, free, reductions)
    loads = [s for s in statements(kernel.body) if isinstance(s, Assign) and isinstance(s.expr, Load)]
    itemsize = max([s.dtype.itemsize for s in loads] or [kernel.type.dtype.itemsize])
    inner_free = [l for l in free if l[2]]  # free loops inside a reduction's enclosing nest (sweeps)
    outer = [l for l in free if not l[2]]
    if not reductions:
        numel = prod(l[1] for l in free) if free else 1
        inner = free[-1][1] if free else 1
        along_outputs = _walk(loads, free[-1][0]) if free else "absent"
        return KernelShape(kernel.name, "map", numel, 1, 1, inner, itemsize,
                           free_vars=tuple(l[0] for l in free), outputs_contiguous=along_outputs != "strided")
    sweep = bool(inner_free)
    red = max(r.extent for r in reductions)
    stmts = list(statements(kernel.body))
    folds = [s for s in stmts if isinstance(s, (Accumulate, Update))]
    atomic_ok = all(isinstance(s, Accumulate) and s.op in ("sum", "max", "min") for s in folds)
    # raw: every store writes an accumulator as it is (a kernel that also stores an epilogue of it,
    # a conv's output saved for a backward beside its batch norm and ReLU, has an epilogue)
    output_is_acc = all(getattr(s, "value", None) in {f.acc for f in folds} for s in stmts if type(s).__name__ == "Store")
    # flash attention writes each row once, after its fold; a kernel that sweeps the keys again
    # (softmax probabilities written out, a bias over heads beside the q.k dot) is a row reduction
    attention = None if sweep else _attention(outer, reductions)
    if attention is not None:
        rows, cols, batch, inner, mma, m_vars, n_vars, key_bound, operand_size, score_bytes, key_bytes = attention
        return KernelShape(kernel.name, "attention", rows, cols, red, inner, operand_size, batch=batch, sweep=False,
                           epilogue=True, mma=mma, free_vars=tuple(l[0] for l in outer), m_vars=m_vars,
                           n_vars=n_vars, key_bound=key_bound, score_bytes=score_bytes, key_bytes=key_bytes)
    contraction = _contraction(kernel, stmts, outer, reductions)
    if contraction is not None:
        rows, cols, batch, mma, m_vars, n_vars, prologue_ops = contraction
        return KernelShape(kernel.name, "contraction", rows, cols, red, red, itemsize, batch=batch,
                           epilogue=not output_is_acc, atomic_ok=atomic_ok and len(folds) == 1, mma=mma,
                           free_vars=tuple(l[0] for l in outer), m_vars=m_vars, n_vars=n_vars,
                           prologue=prologue_ops is not None, prologue_ops=prologue_ops or (0, 0),
                           **_panels(reductions[0], m_vars, n_vars, [l[0] for l in outer]))
    rows = prod(l[1] for l in outer) if outer else 1
    folded = [s for fold in reductions for s in statements(fold.body)
              if isinstance(s, Assign) and isinstance(s.expr, Load) and fold.var in _vars(s.expr.index)]
    along_fold = _walk(folded, *{fold.var for fold in reductions}) if folded else "absent"
    along_outputs = _walk(folded, outer[-1][0]) if outer and folded else "absent"
    flags = dict(sweep=sweep, held=bool(held_loads(kernel.body)), weights=len(invariant_loads(kernel.body)),
                 epilogue=not output_is_acc, atomic_ok=atomic_ok,
                 free_vars=tuple(l[0] for l in outer),
                 fold_contiguous=along_fold != "strided", outputs_contiguous=along_outputs != "strided")
    if along_fold == "strided" and along_outputs == "contiguous" and not sweep:
        return KernelShape(kernel.name, "column", rows, outer[-1][1], red, 1, itemsize, **flags)
    return KernelShape(kernel.name, "row", rows, 1, red, red, itemsize, **flags)


def _walk(loads, *variables: int) -> str:
    """How `loads` walk memory as any of `variables` steps: "contiguous" when each load that
    depends on one reads it as its last index with stride 1 (directly, or as the last digit of a
    reshape, `v % q`), "absent" when none depends on them, "strided" otherwise."""
    found = "absent"
    for load in loads:
        index = load.expr.index
        if not _vars(index) & set(variables):
            continue
        last = index[-1] if index else None
        higher = index[-2] if len(index) > 1 else None
        # earlier axes may read the variable only as higher digits of a reshape (v // q)
        if last is None or not any(_unit_step(atom, c, variables, higher) for atom, c in last.terms) or \
                any(isinstance(atom, Dim) and atom.index in variables for e in index[:-1] for atom, _ in e.terms):
            return "strided"
        found = "contiguous"
    return found


def _unit_step(atom, coefficient: int, variables, higher=None) -> bool:
    if coefficient != 1:
        return False
    if isinstance(atom, Dim):
        return atom.index in variables
    if isinstance(atom, Mod):  # the last digit of a reshape: (v + q*rest) % q
        steps = [(a, c) for a, c in atom.expr.terms if isinstance(a, Dim) and a.index in variables]
        rest = [c for a, c in atom.expr.terms if (a, c) not in steps]
        if not (len(steps) == 1 and steps[0][1] == 1 and all(c % atom.divisor == 0 for c in rest)):
            return False
        # a long digit is a long contiguous run by itself; a short one (LayerNorm over (..., 7))
        # is contiguous only when the axis before carries on with the next digit, v // q
        return atom.divisor >= 8 or (higher is not None and _carries(higher, atom.expr, atom.divisor))
    return False


def _carries(index, expr, divisor: int) -> bool:
    """Whether `index` reads `expr // divisor` with coefficient 1, directly or as the lowest digit
    of a further reshape ((expr // divisor) % q)."""
    for atom, c in index.terms:
        if c != 1:
            continue
        inner = atom.expr.terms[0][0] if isinstance(atom, Mod) and len(atom.expr.terms) == 1 \
            and atom.expr.terms[0][1] == 1 and atom.expr.const == 0 else atom
        if isinstance(inner, FloorDiv) and inner.divisor == divisor and inner.expr == expr:
            return True
    return False


def _loops(body, free: list, reductions: list) -> None:
    """free: (var, extent, inside-a-row) for every non-reduction loop (emmy.loop_ir.nodes.parallel_loops
    says which own outputs; the rest are sweeps); reductions: the reduction loops."""
    outer = parallel_loops(body)
    free.extend((var, extent, False) for var, extent in outer)
    outer_vars = {var for var, _ in outer}
    for stmt in statements(body):
        if isinstance(stmt, Loop):
            if stmt.reduction:
                reductions.append(stmt)
            elif stmt.var not in outer_vars:
                free.append((stmt.var, stmt.extent, True))


def _contraction(kernel, stmts, outer, reductions):
    """(M, N, batch, mma dtype, M variables, N variables, prologue) when the kernel's one fold is a
    sum of a product of two operands, each a load (through casts), or elementwise work on loads
    of one side (a prologue: relu(x) @ w)."""
    if len(reductions) != 1:
        return None
    accs = [s for s in stmts if isinstance(s, Accumulate)]
    if len(accs) != 1 or accs[0].op != "sum" or any(isinstance(s, Update) for s in stmts):
        return None
    defs = {s.name: s for s in stmts if isinstance(s, Assign)}
    product = defs.get(accs[0].value)
    if product is None or not isinstance(product.expr, Op) or product.expr.op != "multiply":
        return None
    k = reductions[0].var
    direct = [_source_load(defs, a) for a in product.expr.args]
    prologue_ops = None
    if all(o is not None for o in direct):
        (a, a_dtype), (b, b_dtype) = direct
        uses_a, uses_b = load_vars(a), load_vars(b)
    else:
        sides = [_operand_vars(defs, a) for a in product.expr.args]
        if any(v is None for v in sides):
            return None
        uses_a, uses_b = sides
        chains = [mma_operand(defs, a) for a in product.expr.args]
        a_dtype, b_dtype = (c[0] if c else None for c in chains)
        prologue_ops = tuple(len(c[1]) if c else 0 for c in chains)
    if k not in uses_a or k not in uses_b:
        return None
    extents = {var: extent for var, extent, _ in outer}
    m_vars = [v for v in uses_a - uses_b if v in extents]
    n_vars = [v for v in uses_b - uses_a if v in extents]
    if not m_vars or not n_vars:
        return None
    rows, cols = prod(extents[v] for v in m_vars), prod(extents[v] for v in n_vars)
    batch = prod(extents[v] for v in extents if v not in m_vars and v not in n_vars)
    mma = _MMA_DTYPES.get(a_dtype, "") if a_dtype is not None and a_dtype == b_dtype else ""
    return rows, cols, batch, mma, tuple(m_vars), tuple(n_vars), prologue_ops


def mma_operand(defs, name):
    """(the 16-bit dtype a tensor core would multiply, the prologue's statements in order) when an
    operand of the product is f32 of a 16-bit value computed elementwise from one load of that
    dtype and literals (relu(x), gelu(x), x * c: work a warp can do on each element of its
    fragment); None otherwise (two loads, a mask on the indices, a rounding to another type)."""
    top = defs.get(name)
    if top is None or not (isinstance(top.expr, Op) and top.expr.op == "cast" and top.dtype is DType.F32):
        return None
    (value,) = top.expr.args
    source = defs.get(value) if isinstance(value, str) else None
    if source is None or source.dtype not in _MMA_DTYPES:
        return None
    found = _operand_statements(defs, value)
    if found is None:
        return None
    loads, ops, masks = found
    if masks or len(loads) != 1 or loads[0].dtype is not source.dtype:
        return None  # a Masked value depends on the indices, which a fragment element does not know
    order = {s.name: i for i, s in enumerate(defs.values())}
    return source.dtype, tuple(sorted(ops, key=lambda s: order[s.name]))


def _operand_vars(defs, name):
    """The loop variables an operand's loads index, when it is elementwise work (ops, masks) on
    loads and literals; None when it reads anything else (an accumulator, a value of the row)."""
    found = _operand_statements(defs, name)
    if found is None:
        return None
    loads, _, masks = found
    indexed = set().union(set(), *(load_vars(s.expr) for s in loads))
    return indexed.union(*(g.expr.dims() for m in masks for g in m.expr.guards))


def _operand_statements(defs, name):
    """(loads, ops, masks) an operand is computed from, walking back from `name` through the
    kernel's statements; None when it reads a value no statement assigns (an accumulator)."""
    loads, ops, masks = [], [], []
    stack, seen = [name], set()
    while stack:
        value = stack.pop()
        if not isinstance(value, str) or value in seen:
            continue
        seen.add(value)
        stmt = defs.get(value)
        if stmt is None:
            return None
        if isinstance(stmt.expr, Load):
            loads.append(stmt)
        elif isinstance(stmt.expr, Op):
            ops.append(stmt)
            stack.extend(stmt.expr.args)
        else:
            masks.append(stmt)
            stack.append(stmt.expr.value)
    return loads, ops, masks


def _attention(outer, reductions):
    """(rows, cols, batch, inner, mma dtype, row variables, col variables, causal bound, the q, k
    and v loads' widest element, the other loads' bytes per score, those per key alike for every
    query) for a twisted fold
    whose element holds a contraction: q.k inside, the weights v read beside it. The fold is the
    kernel's outermost: one nested in another fold (attention averaged over heads in the same
    kernel) is a row's work, which the flash template does not do."""
    inner_folds = {id(s) for r in reductions for s in statements(r.body) if isinstance(s, Loop) and s.reduction}
    for fold in reductions:
        if id(fold) in inner_folds or not any(isinstance(s, Update) for s in fold.body):
            continue
        nested = [s for s in fold.body if isinstance(s, Loop) and s.reduction]
        if len(nested) != 1:
            continue
        inside = [s for s in statements(nested[0].body) if isinstance(s, Assign) and isinstance(s.expr, Load)]
        beside = [s for s in fold.body if isinstance(s, Assign) and isinstance(s.expr, Load)]
        if not inside or not beside:
            continue
        extents = {var: extent for var, extent, _ in outer}
        qk_vars = set().union(*(_vars(s.expr.index) for s in inside))
        n_vars = tuple(v for v in extents if v not in qk_vars
                       and any(v in _vars(s.expr.index) for s in beside))
        # the weights are the loads beside q.k that read the value dimension (not a mask's)
        w_vars = set().union(set(), *(_vars(s.expr.index) for s in beside if _vars(s.expr.index) & set(n_vars)))
        m_vars = tuple(v for v in extents if v in qk_vars and v not in w_vars)
        if not m_vars or not n_vars:
            continue
        # a block shares each K tile among its query rows: K must not read a query-row variable
        if any(fold.var in _vars(s.expr.index) and _vars(s.expr.index) & set(m_vars) for s in inside):
            continue
        batch = prod(extents[v] for v in extents if v not in m_vars and v not in n_vars)
        # tensor cores take q, k and the weights; a mask or bias beside them (per query and key) is
        # read per score element whatever its type; one every query reads alike (a padding mask,
        # a key's position) per key, as K is
        operands = inside + [s for s in beside if _vars(s.expr.index) & set(n_vars)]
        itemsize = max(s.dtype.itemsize for s in operands)  # of the staged tiles
        others = [s for s in beside if s not in operands]
        score_bytes = sum(s.dtype.itemsize for s in others if _vars(s.expr.index) & set(m_vars))
        key_bytes = sum(s.dtype.itemsize for s in others if not _vars(s.expr.index) & set(m_vars))
        dtypes = {s.dtype for s in operands}
        mma = _MMA_DTYPES.get(dtypes.pop(), "") if len(dtypes) == 1 else ""
        batch_vars = tuple(v for v in extents if v not in m_vars and v not in n_vars)
        guards = key_range_guards(fold.body, fold.var, set(m_vars) | set(batch_vars))
        key_bound = KeyBound(guards, fold.var, fold.extent, tuple((v, extents[v]) for v in m_vars),
                             tuple((v, extents[v]) for v in batch_vars)) if guards else None
        return (prod(extents[v] for v in m_vars), prod(extents[v] for v in n_vars), batch, nested[0].extent, mma,
                m_vars, n_vars, key_bound, itemsize, score_bytes, key_bytes)
    return None


def _source_load(defs, name):
    """The load a value comes from through casts, with the loaded dtype."""
    seen = 0
    while name in defs and seen < 8:
        stmt = defs[name]
        if isinstance(stmt.expr, Load):
            return stmt.expr, stmt.dtype
        if isinstance(stmt.expr, Op) and stmt.expr.op == "cast" and len(stmt.expr.args) == 1:
            name = stmt.expr.args[0]
            seen += 1
            continue
        return None
    return None


def _panels(fold: Loop, m_vars, n_vars, free_vars) -> dict:
    """Loads of a contraction's fold staged in shared memory (panel_side), per side: a panel each
    (`panel_loads`), of its element's bytes (`panel_bytes`: operands of two dtypes stage both)."""
    batch = set(free_vars) - set(m_vars) - set(n_vars)
    staged = [(panel_side(load_vars(s.expr) - batch, fold.var, m_vars, n_vars), s.dtype.itemsize)
              for s in statements(fold.body) if isinstance(s, Assign) and isinstance(s.expr, Load)]
    return {"panel_loads": tuple(sum(1 for side, _ in staged if side == x) for x in "ab"),
            "panel_bytes": tuple(sum(size for side, size in staged if side == x) for x in "ab")}


def panel_side(deps: set[int], fold_var: int, m_vars, n_vars) -> str:
    """Which operand panel a contraction load whose index reads `deps` (batch variables aside)
    fills: "a" when it walks K and only M's variables, "b" when K and only N's, else "" (read from
    global memory). A guarded load (a convolution's padding) is staged too: its fill reads the
    element where the guards hold and leaves 0 elsewhere."""
    if fold_var not in deps:
        return ""
    outputs = deps - {fold_var}
    if outputs and outputs <= set(m_vars):
        return "a"
    if outputs and outputs <= set(n_vars):
        return "b"
    return ""


def _vars(index) -> set[int]:
    return set().union(*(e.dims() for e in index)) if index else set()


def load_vars(load: Load) -> set[int]:
    """The loop variables a load reads by: its index's and its guards' (a padded read tests both,
    so a guard on another side's variable ties the load to that side too)."""
    return _vars(load.index).union(*(g.expr.dims() for g in load.guards))

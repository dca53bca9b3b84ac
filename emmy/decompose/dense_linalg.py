"""Small dense linear algebra as unrolled elimination: solves, inverses, determinants, LU and
Cholesky factors, triangular solves (torch.linalg.solve/inv/det/slogdet/cholesky/lu_factor/
solve_triangular, torch.cholesky_solve, torch.triangular_solve ...).

A matrix's order n is static, so a factorization is n steps of whole-matrix elementwise work (and,
with pivoting, three folds down the rows: the column's largest magnitude, the first row holding it,
that row), over every matrix of a batch at once: Tensor IR with no loop of its own. The steps
follow LAPACK's unblocked algorithms, which torch calls on the CPU: getf2's partial pivoting (the
first row of the largest magnitude; the multipliers scaled by the pivot's reciprocal; a zero pivot
leaves its column as it is and sets info), trsm's substitutions, and a right-looking Cholesky.
Results agree with torch's to rounding, and the factors are laid out as torch's are: LU packed in
one matrix (unit L below the diagonal), 1-based int32 pivots, int32 info (the first zero pivot,
1-based, else 0).

torch raises where a matrix is singular (check_errors, linalg.solve); a compiled program cannot
stop, so it returns the infinities and NaNs the arithmetic gives, and info says which matrix.
Past MAX_ORDER the unrolled steps would be thousands of Tensor IR nodes: such a matrix is refused.
"""

from __future__ import annotations

import numpy as np

from emmy.affine import Affine, Guard
from emmy.decompose.registry import Context, lowers
from emmy.dtypes import DType
from emmy.errors import UnsupportedDtypeError, UnsupportedOpError

MAX_ORDER = 64  # the largest matrix order emmy unrolls (n steps of ~15 Tensor IR nodes each)


class _Stack:
    """A batch of matrices (*batch, rows, cols): rows on axis R, columns on axis C."""

    def __init__(self, ctx: Context, batch, n: int, dtype: DType):
        self.ctx, self.b = ctx, ctx.b
        self.batch, self.n, self.dtype = tuple(batch), n, dtype
        self.R, self.C = len(self.batch), len(self.batch) + 1
        self._positions = None

    def shape(self, rows: int, cols: int) -> tuple[int, ...]:
        return (*self.batch, rows, cols)

    def lead(self) -> list[Affine]:
        """The batch axes' coordinates, unchanged."""
        return [Affine.dim(i) for i in range(self.R)]

    def row(self, m: str, i: int) -> str:
        """Row i of m as (*batch, 1, cols)."""
        return self.b.index_map(m, self.shape(1, self.b.shape(m)[-1]),
                                self.lead() + [Affine.constant(i), Affine.dim(self.C)], suffix="row")

    def col(self, m: str, j: int) -> str:
        """Column j of m as (*batch, rows, 1)."""
        return self.b.index_map(m, self.shape(self.b.shape(m)[-2], 1),
                                self.lead() + [Affine.dim(self.R), Affine.constant(j)], suffix="col")

    def entry(self, m: str, i: int, j: int) -> str:
        return self.b.index_map(m, self.shape(1, 1), self.lead() + [Affine.constant(i), Affine.constant(j)],
                                suffix="entry")

    def spread(self, x: str, rows: int, cols: int) -> str:
        return self.b.broadcast_to(x, self.shape(rows, cols))

    def mask(self, rows: int, cols: int, row_range=(None, None), col_range=(None, None)) -> str:
        """True where lo <= row < hi and lo <= column < hi (a bound None: open)."""
        guards = [Guard(Affine.dim(axis), *bounds) for axis, bounds in ((self.R, row_range), (self.C, col_range))
                  if bounds != (None, None)]
        return self.b.index_map(self.b.const(True, DType.BOOL), self.shape(rows, cols), (), guards=guards,
                                fill=False, suffix="mask")

    def where(self, mask: str, a, b) -> str:
        return self.b.elementwise("where", mask, a, b, dtype=self.dtype)

    def op(self, name: str, *operands) -> str:
        return self.b.elementwise(name, *operands)

    def positions(self, cols: int) -> str:
        """Each element's row number, i64 (*batch, n, cols)."""
        if self._positions is None:
            self._positions = self.ctx.constant(np.arange(self.n).reshape(self.n, 1), DType.I64)
        return self.spread(self._positions, self.n, cols)

    def join(self, left: str, right: str) -> str:
        """[left | right]: two stacks of n rows side by side."""
        a, c = self.b.shape(left)[-1], self.b.shape(right)[-1]
        shape = self.shape(self.n, a + c)
        index, column = self.lead() + [Affine.dim(self.R)], Affine.dim(self.C)
        first = self.b.index_map(left, shape, index + [column], [Guard(column, None, a)], 0.0, suffix="left")
        second = self.b.index_map(right, shape, index + [column - a], [Guard(column, a, None)], 0.0, suffix="right")
        return self.where(self.mask(self.n, a + c, col_range=(None, a)), first, second)

    def columns(self, m: str, start: int, end: int) -> str:
        return self.b.slice(m, self.C, start, end, suffix="cols")

    def transposed(self, m: str) -> str:
        return self.b.permute(m, list(range(self.R)) + [self.C, self.R], suffix="mT")

    def eye(self) -> str:
        diagonal = self.b.index_map(self.b.const(1.0, self.dtype), (self.n, self.n), (),
                                    guards=[Guard(Affine.dim(0) - Affine.dim(1), 0, 1)], fill=0.0, suffix="eye")
        return self.b.broadcast_to(diagonal, self.shape(self.n, self.n))

    # -- LU with partial pivoting (getf2) ------------------------------------------------------------

    def pivot_row(self, m: str, k: int) -> str:
        """(*batch, 1, 1) i64: the first row at or below k whose column-k entry has the largest
        magnitude (k itself where none compares equal: a NaN column)."""
        n = self.n
        magnitude = self.op("abs", self.col(m, k))
        below = self.where(self.mask(n, 1, row_range=(k, None)), magnitude, -1.0)
        largest = self.b.reduce("max", below, self.R, suffix="largest")
        hit = self.op("equal", below, self.spread(largest, n, 1))
        rows = self.b.elementwise("where", hit, self.positions(1), n, dtype=DType.I64, suffix="candidate")
        first = self.b.reduce("min", rows, self.R, suffix="pivot_row")
        return self.b.elementwise("where", self.op("equal", first, n), k, first, dtype=DType.I64, suffix="pivot_row")

    def swap(self, m: str, k: int, p: str) -> str:
        """m with rows k and p (per matrix, p >= k) exchanged."""
        n, c = self.n, self.b.shape(m)[-1]
        at_p = self.op("equal", self.positions(c), self.spread(p, n, c))
        row_p = self.b.reduce("sum", self.where(at_p, m, 0.0), self.R, suffix="row_p")
        row_k = self.row(m, k)
        lower = self.where(at_p, self.spread(row_k, n, c), m)
        return self.where(self.mask(n, c, row_range=(k, k + 1)), self.spread(row_p, n, c), lower)

    def eliminate(self, m: str, k: int) -> str:
        """Step k of the elimination: the multipliers of column k below the pivot (scaled by its
        reciprocal, kept in column k), subtracted from the trailing rows; a zero pivot scales by 1
        (its column below is zero too: it was the largest)."""
        n, c = self.n, self.b.shape(m)[-1]
        if k == n - 1:
            return m
        pivot = self.entry(m, k, k)
        reciprocal = self.where(self.op("equal", pivot, 0.0), 1.0, self.b.elementwise("divide", 1.0, pivot))
        multipliers = self.op("multiply", self.col(m, k), self.spread(reciprocal, n, 1))
        spread = self.spread(multipliers, n, c)
        update = self.op("subtract", m, self.op("multiply", spread, self.spread(self.row(m, k), n, c)))
        kept = self.where(self.mask(n, c, row_range=(k + 1, None), col_range=(k, k + 1)), spread, m)
        return self.where(self.mask(n, c, row_range=(k + 1, None), col_range=(k + 1, None)), update, kept)

    def factor(self, m: str, pivoting: bool = True) -> tuple[str, list]:
        """LU of the first n columns of m (later columns carried along: L^-1 P^T applied to them);
        the rows chosen at each step, (*batch, 1, 1) i64 tensors (ints where not pivoting)."""
        chosen = []
        for k in range(self.n):
            if pivoting and k < self.n - 1:
                p = self.pivot_row(m, k)
                m = self.swap(m, k, p)
            else:
                p = k
            chosen.append(p)
            m = self.eliminate(m, k)
        return m, chosen

    def pivots(self, chosen: list) -> str:
        """The rows chosen as torch returns them: (*batch, n) int32, 1-based."""
        n = self.n
        out = self.b.fill(0, self.shape(1, n), DType.I64)
        for k, p in enumerate(chosen):
            value = self.spread(p, 1, n) if isinstance(p, str) else p
            out = self.b.elementwise("where", self.mask(1, n, col_range=(k, k + 1)), value, out, dtype=DType.I64,
                                     suffix="pivots")
        based = self.b.elementwise("add", out, 1, dtype=DType.I64, suffix="pivots")
        return self.b.cast(self.b.reshape(based, (*self.batch, n)), DType.I32)

    def swaps(self, chosen: list) -> str:
        """(*batch,) i64: how many steps exchanged two rows."""
        count = self.b.fill(0, self.shape(1, 1), DType.I64)
        for k, p in enumerate(chosen):
            if isinstance(p, str):
                moved = self.b.cast(self.op("not_equal", p, k), DType.I64)
                count = self.b.elementwise("add", count, moved, dtype=DType.I64, suffix="swaps")
        return self.b.reshape(count, self.batch)

    def diagonal(self, m: str) -> str:
        """(*batch, n): the diagonal of m's first n columns."""
        return self.b.index_map(m, (*self.batch, self.n), self.lead() + [Affine.dim(self.R), Affine.dim(self.R)],
                                suffix="diagonal")

    def info(self, lu: str) -> str:
        """(*batch,) int32: 1 + the first step whose pivot is zero, else 0 (getrf's info)."""
        zero = self.op("equal", self.diagonal(lu), 0.0)
        order = self.ctx.constant(np.arange(1, self.n + 1), DType.I64)
        numbered = self.b.elementwise("where", zero, self.b.broadcast_to(order, (*self.batch, self.n)), self.n + 1,
                                      dtype=DType.I64, suffix="zero_step")
        first = self.b.reduce_axes("min", numbered, [self.R], False, suffix="first_zero")
        found = self.b.elementwise("where", self.op("equal", first, self.n + 1), 0, first, dtype=DType.I64)
        return self.b.cast(found, DType.I32)

    # -- triangular solves (trsm) --------------------------------------------------------------------

    def upper_solve(self, u: str, y: str, unit: bool = False) -> str:
        """x with U x = y, U the upper triangle of u (its diagonal 1 where `unit`), bottom row first."""
        n, c = self.n, self.b.shape(y)[-1]
        for i in reversed(range(n)):
            x = self.row(y, i) if unit else self.op("divide", self.row(y, i), self.spread(self.entry(u, i, i), 1, c))
            spread = self.spread(x, n, c)
            done = self.where(self.mask(n, c, row_range=(i, i + 1)), spread, y)
            if i == 0:
                return done
            update = self.op("subtract", y, self.op("multiply", self.spread(self.col(u, i), n, c), spread))
            y = self.where(self.mask(n, c, row_range=(None, i)), update, done)
        return y

    def lower_solve(self, low: str, y: str, unit: bool = False) -> str:
        """x with L x = y, L the lower triangle of `low` (its diagonal 1 where `unit`), top row first."""
        n, c = self.n, self.b.shape(y)[-1]
        for i in range(n):
            x = self.row(y, i) if unit else self.op("divide", self.row(y, i), self.spread(self.entry(low, i, i), 1, c))
            spread = self.spread(x, n, c)
            done = self.where(self.mask(n, c, row_range=(i, i + 1)), spread, y)
            if i == n - 1:
                return done
            update = self.op("subtract", y, self.op("multiply", self.spread(self.col(low, i), n, c), spread))
            y = self.where(self.mask(n, c, row_range=(i + 1, None)), update, done)
        return y

    def triangular_solve(self, a: str, y: str, upper: bool, transpose: bool = False, unit: bool = False) -> str:
        """x with T x = y (T^T x = y where `transpose`), T a's upper or lower triangle."""
        if transpose:
            a, upper = self.transposed(a), not upper
        return self.upper_solve(a, y, unit) if upper else self.lower_solve(a, y, unit)

    # -- Cholesky ------------------------------------------------------------------------------------

    def cholesky(self, a: str) -> tuple[str, str]:
        """(L, info) with A = L L^T from A's lower triangle, right-looking: column j is the trailing
        column over the square root of its diagonal, then the trailing matrix loses its outer
        product. info: 1 + the first column whose diagonal is not positive (potf2's), else 0."""
        n = self.n
        m = a
        bad = []
        for j in range(n):
            diagonal = self.entry(m, j, j)
            bad.append(self.op("logical_not", self.op("greater", diagonal, 0.0)))
            root = self.op("sqrt", diagonal)
            column = self.op("divide", self.col(m, j), self.spread(root, n, 1))
            spread_col = self.spread(column, n, n)
            kept = self.where(self.mask(n, n, row_range=(j + 1, None), col_range=(j, j + 1)), spread_col, m)
            on_diagonal = self.mask(n, n, row_range=(j, j + 1), col_range=(j, j + 1))
            kept = self.where(on_diagonal, self.spread(root, n, n), kept)
            if j < n - 1:
                across = self.spread(self.transposed(column), n, n)
                update = self.op("subtract", m, self.op("multiply", spread_col, across))
                kept = self.where(self.mask(n, n, row_range=(j + 1, None), col_range=(j + 1, None)), update, kept)
            m = kept
        lower = self.b.index_map(m, self.shape(n, n), self.lead() + [Affine.dim(self.R), Affine.dim(self.C)],
                                 guards=[Guard(Affine.dim(self.R) - Affine.dim(self.C), 0, None)], fill=0.0,
                                 suffix="lower")
        info = self.b.fill(0, self.shape(1, 1), DType.I64)
        for j in reversed(range(n)):  # the first failing column wins: walked from the last
            info = self.b.elementwise("where", bad[j], j + 1, info, dtype=DType.I64, suffix="info")
        return lower, self.b.cast(self.b.reshape(info, self.batch), DType.I32)


def _stack(ctx: Context, a: str, what: str, batch=None) -> _Stack:
    """The _Stack of square matrices `a` (*batch, n, n), checked: a float type emmy computes in, an
    order it unrolls."""
    shape = ctx.b.shape(a)
    dtype = ctx.b.dtype(a)
    if len(shape) < 2 or shape[-1] != shape[-2]:
        raise UnsupportedOpError(f"unsupported op {ctx.where}: {what} of a {list(shape)} tensor; it takes square "
                                 "matrices (*, n, n)")
    if dtype not in (DType.F32, DType.F64):
        raise UnsupportedDtypeError(f"unsupported op {ctx.where}: {what} of {dtype} matrices; emmy solves f32 and f64")
    if shape[-1] > MAX_ORDER:
        raise UnsupportedOpError(f"unsupported op {ctx.where}: {what} of order {shape[-1]}; emmy unrolls the "
                                 f"elimination for matrices of order at most {MAX_ORDER}")
    return _Stack(ctx, shape[:-2] if batch is None else batch, shape[-1], dtype)


def _batched(ctx: Context, x: str, batch, dtype: DType) -> str:
    """x (*b, r, c) broadcast to (*batch, r, c) and cast to dtype."""
    return ctx.tensor(x, dtype, (*batch, *ctx.b.shape(x)[-2:]))


def _right_hand_side(ctx: Context, a: str, rhs: str, left: bool = True):
    """(stack, A, B as (*batch, n, k), vector): the batch broadcast between A and B as torch's
    solve does, a vector B ((*, n), or B of A's shape less its last axis) as one column."""
    b = ctx.b
    a_shape, b_shape = b.shape(a), b.shape(rhs)
    vector = len(b_shape) == 1 or (len(b_shape) == len(a_shape) - 1 and b_shape == a_shape[:-1])
    if vector:
        rhs = b.reshape(rhs, (*b_shape, 1), suffix="column")
        b_shape = b.shape(rhs)
    batch = tuple(np.broadcast_shapes(a_shape[:-2], b_shape[:-2]))
    stack = _stack(ctx, a, "a solve", batch)
    dtype = stack.dtype
    a = _batched(ctx, a, batch, dtype)
    rhs = _batched(ctx, rhs, batch, dtype)
    if not left:  # X A = B: A^T X^T = B^T
        a, rhs = stack.transposed(a), stack.transposed(rhs)
    return stack, a, rhs, vector


def _lu_solve(stack: _Stack, a: str, rhs: str):
    """(X, LU, pivots, info) for A X = B by getrf then getrs."""
    n, k = stack.n, stack.b.shape(rhs)[-1]
    joined, chosen = stack.factor(stack.join(a, rhs))
    lu = stack.columns(joined, 0, n)
    x = stack.upper_solve(lu, stack.columns(joined, n, n + k))
    return x, lu, stack.pivots(chosen), stack.info(lu)


def _solution(stack: _Stack, x: str, left: bool, out_shape) -> str:
    if not left:
        x = stack.transposed(x)
    return stack.b.reshape(x, out_shape, suffix="solution") if stack.b.shape(x) != tuple(out_shape) else x


@lowers("aten._linalg_solve_ex.default")
def solve(ctx: Context, a, rhs, left=True, check_errors=False):
    """torch.linalg.solve: (result, LU, pivots, info)."""
    stack, a_, b_, _ = _right_hand_side(ctx, a, rhs, left)
    x, lu, pivots, info = _lu_solve(stack, a_, b_)
    return _solution(stack, x, left, ctx.out_type(0).shape), lu, pivots, info


@lowers("aten.linalg_inv_ex.default")
def inverse(ctx: Context, a, check_errors=False):
    """torch.linalg.inv (and torch.inverse): A X = I by LU; (inverse, info)."""
    stack = _stack(ctx, a, "an inverse")
    x, _, _, info = _lu_solve(stack, a, stack.eye())
    return x, info


@lowers("aten.linalg_lu_factor_ex.default")
def lu_factor(ctx: Context, a, pivot=True, check_errors=False):
    """torch.linalg.lu_factor(_ex): (LU, pivots, info)."""
    stack = _stack(ctx, a, "an LU factorization")
    lu, chosen = stack.factor(a, pivoting=pivot)
    return lu, stack.pivots(chosen), stack.info(lu)


@lowers("aten.linalg_lu.default")
def lu(ctx: Context, a, pivot=True):
    """torch.linalg.lu: (P, L, U) with A = P L U; P from the same row exchanges applied to I."""
    stack = _stack(ctx, a, "an LU factorization")
    n = stack.n
    joined, chosen = stack.factor(stack.join(a, stack.eye()), pivoting=pivot)
    lu_ = stack.columns(joined, 0, n)
    # The identity's columns took the exchanges and the elimination: L^-1 P^T. P^T alone is the
    # exchanges of I, built again without the elimination.
    exchanged = stack.eye()
    for k, p in enumerate(chosen):
        if isinstance(p, str):
            exchanged = stack.swap(exchanged, k, p)
    b = ctx.b
    lead = stack.lead()
    square = stack.shape(n, n)
    lower = b.index_map(lu_, square, lead + [Affine.dim(stack.R), Affine.dim(stack.C)],
                        guards=[Guard(Affine.dim(stack.R) - Affine.dim(stack.C), 1, None)], fill=0.0, suffix="strict")
    lower = b.elementwise("add", lower, stack.eye(), suffix="unit_lower")  # the strict lower part is 0 there
    upper = b.index_map(lu_, square, lead + [Affine.dim(stack.R), Affine.dim(stack.C)],
                        guards=[Guard(Affine.dim(stack.C) - Affine.dim(stack.R), 0, None)], fill=0.0, suffix="upper")
    return stack.transposed(exchanged), lower, upper


@lowers("aten.linalg_lu_solve.default")
def lu_solve(ctx: Context, lu_, pivots, rhs, left=True, adjoint=False):
    """torch.linalg.lu_solve: B's rows exchanged as `pivots` say, then L's and U's substitutions
    (A^T X = B where `adjoint`: U^T's, L^T's, then the exchanges undone, last first)."""
    stack, lu_b, b_, _ = _right_hand_side(ctx, lu_, rhs, True)
    n = stack.n
    if not left:  # X A = B: A^T X^T = B^T, which is the adjoint solve of B^T
        b_, adjoint = stack.transposed(b_), not adjoint
    piv = ctx.tensor(pivots, DType.I64, (*stack.batch, n))
    chosen = []
    for k in range(n):
        at = ctx.b.index_map(piv, stack.shape(1, 1), stack.lead() + [Affine.constant(k)], suffix="pivot")
        chosen.append(ctx.b.elementwise("subtract", at, 1, dtype=DType.I64, suffix="pivot_row"))
    if not adjoint:
        for k, p in enumerate(chosen):
            b_ = stack.swap(b_, k, p)
        x = stack.upper_solve(lu_b, stack.lower_solve(lu_b, b_, unit=True))
    else:
        y = stack.lower_solve(stack.transposed(lu_b), b_)  # U^T y = b
        x = stack.upper_solve(stack.transposed(lu_b), y, unit=True)  # L^T x = y
        for k in reversed(range(n)):
            x = stack.swap(x, k, chosen[k])
    if not left:
        x = stack.transposed(x)
    return x


def _determinant_parts(ctx: Context, a):
    """(stack, LU, rows chosen, the exchanges' sign). torch factors A^T where A is contiguous (real
    A: LAPACK reads it column-major without a copy, and det(A^T) = det(A)), so its LU and pivots,
    which the backward reads, are of A^T then: the same here, by the strides torch traced."""
    stack = _stack(ctx, a, "a determinant")
    traced = ctx.node.args[0].meta.get("val") if hasattr(ctx.node.args[0], "meta") else None
    lu_, chosen = stack.factor(stack.transposed(a) if traced is not None and traced.is_contiguous() else a)
    odd = ctx.b.elementwise("remainder", stack.swaps(chosen), 2, dtype=DType.I64, suffix="odd")
    sign = ctx.b.elementwise("subtract", 1.0, ctx.b.elementwise("multiply", ctx.b.cast(odd, stack.dtype), 2.0),
                             suffix="exchange_sign")
    return stack, lu_, chosen, sign


@lowers("aten._linalg_det.default")
def det(ctx: Context, a):
    """torch.linalg.det: the product of U's diagonal, negated for an odd count of row exchanges;
    (det, LU, pivots)."""
    stack, lu_, chosen, sign = _determinant_parts(ctx, a)
    product = ctx.b.reduce_axes("prod", stack.diagonal(lu_), [stack.R], False, suffix="diagonal_product")
    return ctx.b.elementwise("multiply", product, sign, suffix="det"), lu_, stack.pivots(chosen)


@lowers("aten._linalg_slogdet.default")
def slogdet(ctx: Context, a):
    """torch.linalg.slogdet: (sign, log|det|, LU, pivots); a singular matrix: sign 0, -inf."""
    stack, lu_, chosen, sign = _determinant_parts(ctx, a)
    b = ctx.b
    diagonal = stack.diagonal(lu_)
    signs = b.elementwise("where", b.elementwise("less", diagonal, 0.0), -1.0,
                          b.elementwise("where", b.elementwise("greater", diagonal, 0.0), 1.0, 0.0, dtype=stack.dtype),
                          dtype=stack.dtype, suffix="signs")
    total_sign = b.elementwise("multiply", b.reduce_axes("prod", signs, [stack.R], False), sign, suffix="sign")
    logs = b.elementwise("log", b.elementwise("abs", diagonal))
    return total_sign, b.reduce_axes("sum", logs, [stack.R], False, suffix="logabsdet"), lu_, stack.pivots(chosen)


@lowers("aten.linalg_cholesky_ex.default")
def cholesky(ctx: Context, a, upper=False, check_errors=False):
    """torch.linalg.cholesky(_ex): (L, info), or (U = L^T, info) where `upper`; the matrix read
    from its lower triangle."""
    stack = _stack(ctx, a, "a Cholesky factorization")
    lower, info = stack.cholesky(a)
    return (stack.transposed(lower) if upper else lower), info


@lowers("aten.cholesky_solve.default")
def cholesky_solve(ctx: Context, rhs, factor, upper=False):
    """torch.cholesky_solve: X with A X = B, A = L L^T (U^T U where `upper`)."""
    stack, l_, b_, _ = _right_hand_side(ctx, factor, rhs, True)
    low = stack.transposed(l_) if upper else l_
    y = stack.lower_solve(low, b_)
    return stack.upper_solve(stack.transposed(low), y)


@lowers("aten.cholesky_inverse.default")
def cholesky_inverse(ctx: Context, factor, upper=False):
    """torch.cholesky_inverse: (L L^T)^-1, A X = I solved by the factor."""
    stack = _stack(ctx, factor, "a Cholesky inverse")
    low = stack.transposed(factor) if upper else factor
    return stack.upper_solve(stack.transposed(low), stack.lower_solve(low, stack.eye()))


@lowers("aten.linalg_solve_triangular.default")
def solve_triangular(ctx: Context, a, rhs, upper, left=True, unitriangular=False):
    """torch.linalg.solve_triangular: X with T X = B (X T = B where not `left`)."""
    stack, a_, b_, _ = _right_hand_side(ctx, a, rhs, True)
    if left:
        return stack.triangular_solve(a_, b_, upper, unit=unitriangular)
    x = stack.triangular_solve(a_, stack.transposed(b_), upper, transpose=True, unit=unitriangular)
    return stack.transposed(x)


@lowers("aten.triangular_solve.default")
def triangular_solve(ctx: Context, rhs, a, upper=True, transpose=False, unitriangular=False):
    """torch.triangular_solve (deprecated, still called): (X, A's copy)."""
    stack, a_, b_, _ = _right_hand_side(ctx, a, rhs, True)
    solution = stack.triangular_solve(a_, b_, upper, transpose, unitriangular)
    return solution, ctx.tensor(a, stack.dtype, ctx.out_type(1).shape)

"""Build a TensorGraph one node at a time, with torch-like shape helpers.

Decompositions call these helpers; each returns the name of the node it made.
Layout helpers (broadcast, permute, reshape, slice, ...) all make IndexMap
nodes, and skip the node when the map would be the identity.
"""

from __future__ import annotations

import math
from typing import Sequence, Union

from emmy.affine import Affine, Guard
from emmy.dtypes import DType
from emmy.tensor_ir.nodes import (
    Constant,
    Elementwise,
    IndexMap,
    Input,
    Node,
    Reduce,
    TensorGraph,
    TensorType,
    Weight,
)
from emmy.tensor_ir.scalar_ops import SCALAR_OPS

Scalar = Union[float, int, bool]
Operand = Union[str, Scalar]


class GraphBuilder:
    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.types: dict[str, TensorType] = {}
        self.by_name: dict[str, Node] = {}
        self._constants: dict[tuple, str] = {}
        self.origin = ""  # provenance stamped on every node made until changed
        self.base = "t"  # name stem for the nodes of the op being decomposed
        self._taken_below: dict[str, int] = {}  # stem -> k: the stem and stem_1 .. stem_<k-1> are taken

    # -- naming ---------------------------------------------------------
    def fresh(self, stem: str) -> str:
        """`stem`, else `stem_<k>` with the least k free (the name is not taken until a node has it).
        Names are never given back, so the search for a stem goes on from where its last one
        ended: a program of thousands of ops spelt alike would otherwise walk every earlier suffix
        each time."""
        k = self._taken_below.get(stem, 0)
        name = stem if k == 0 else f"{stem}_{k}"
        while name in self.types:
            k += 1
            name = f"{stem}_{k}"
        self._taken_below[stem] = k
        return name

    def _add(self, node: Node) -> str:
        self.nodes.append(node)
        self.types[node.name] = node.type
        self.by_name[node.name] = node
        return node.name

    def type(self, name: str) -> TensorType:
        return self.types[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return self.types[name].shape

    def dtype(self, name: str) -> DType:
        return self.types[name].dtype

    def _name(self, suffix: str | None, name: str | None) -> str:
        if name is not None:
            return self.fresh(name)
        return self.fresh(f"{self.base}_{suffix}" if suffix else self.base)

    # -- leaves -----------------------------------------------------------
    def input(self, name: str, type_: TensorType) -> str:
        return self._add(Input(self.fresh(name), type_, self.origin))

    def weight(self, name: str, type_: TensorType) -> str:
        return self._add(Weight(self.fresh(name), type_, self.origin))

    def const(self, value: Scalar, dtype: DType) -> str:
        value = _coerce(value, dtype)
        key = (repr(value), dtype)
        if key not in self._constants:
            self._constants[key] = self._add(Constant(self.fresh("c"), TensorType((), dtype), value))
        return self._constants[key]

    # -- primitives -------------------------------------------------------
    def elementwise(self, op: str, *operands: Operand, dtype: DType | None = None, suffix: str | None = None,
                    name: str | None = None) -> str:
        """op(operands); Python scalars become constants, tensors must share one shape."""
        kind = SCALAR_OPS[op].kind
        tensors = [o for o in operands if isinstance(o, str) and not isinstance(self.by_name[o], Constant)]
        if dtype is None:
            if kind in ("compare", "logic"):
                dtype = DType.BOOL
            else:
                named = [o for o in operands if isinstance(o, str)]
                pick = (tensors[-1] if op == "where" else tensors[0]) if tensors else named[0]
                dtype = self.dtype(pick)
        shape = self.shape(tensors[0]) if tensors else ()
        # a select's literals are of its result's type (two literals beside a bool condition: angle's pi)
        literal_dtype = dtype if kind == "arith" or op == "where" else self._operand_dtype(operands)
        names = tuple(o if isinstance(o, str) else self.const(o, literal_dtype) for o in operands)
        node = Elementwise(self._name(suffix or op, name), TensorType(shape, dtype), op, names, self.origin)
        return self._add(node)

    def _operand_dtype(self, operands) -> DType:
        for o in operands:
            if isinstance(o, str) and self.dtype(o) is not DType.BOOL:
                return self.dtype(o)
        return DType.F32

    def cast(self, x: str, dtype: DType, suffix: str = "cast") -> str:
        if self.dtype(x) is dtype:
            return x
        return self._add(Elementwise(self._name(suffix, None), TensorType(self.shape(x), dtype), "cast", (x,), self.origin))

    def reduce(self, op: str, x: str, axis: int, suffix: str | None = None, name: str | None = None) -> str:
        shape = list(self.shape(x))
        axis = axis % len(shape)
        shape[axis] = 1
        return self._add(Reduce(self._name(suffix or op, name), TensorType(tuple(shape), self.dtype(x)), op, x, axis, self.origin))

    def index_map(self, x: str, shape: Sequence[int], index: Sequence[Affine], guards: Sequence[Guard] = (),
                  fill: Scalar | None = None, suffix: str = "map", name: str | None = None) -> str:
        shape = tuple(int(s) for s in shape)
        guards = tuple(g for g in guards if not g.always(shape))
        if not guards:
            fill = None
        if name is None and not guards and shape == self.shape(x) and all(
            e.as_dim() == k for k, e in enumerate(index)
        ):
            return x  # the identity map
        return self._add(IndexMap(self._name(suffix, name), TensorType(shape, self.dtype(x)), x, tuple(index),
                                  tuple(guards), fill, self.origin))

    # -- layout helpers (torch semantics) ----------------------------------
    def broadcast_to(self, x: str, shape: Sequence[int], suffix: str = "bcast") -> str:
        src = self.shape(x)
        shape = tuple(shape)
        lead = len(shape) - len(src)
        if lead < 0:
            raise ValueError(f"cannot broadcast {src} to {shape}")
        index = []
        for k, s in enumerate(src):
            out_axis = lead + k
            if s == shape[out_axis]:
                index.append(Affine.dim(out_axis))
            elif s == 1:
                index.append(Affine.constant(0))
            else:
                raise ValueError(f"cannot broadcast {src} to {shape}")
        return self.index_map(x, shape, index, suffix=suffix)

    def permute(self, x: str, perm: Sequence[int], suffix: str = "perm", name: str | None = None) -> str:
        src = self.shape(x)
        perm = [p % len(src) for p in perm]
        index: list[Affine] = [Affine.constant(0)] * len(src)
        for out_axis, in_axis in enumerate(perm):
            index[in_axis] = Affine.dim(out_axis)
        return self.index_map(x, [src[p] for p in perm], index, suffix=suffix, name=name)

    def reshape(self, x: str, shape: Sequence[int], suffix: str = "view", name: str | None = None) -> str:
        src = self.shape(x)
        shape = _infer_shape(src, shape)
        return self.index_map(x, shape, reshape_index(src, shape), suffix=suffix, name=name)

    def slice(self, x: str, dim: int, start: int | None, end: int | None, step: int = 1, suffix: str = "slice",
              name: str | None = None) -> str:
        src = self.shape(x)
        dim %= len(src)
        start, end, step = slice(start, end, step).indices(src[dim])
        extent = max(0, -(-(end - start) // step))
        shape = list(src)
        shape[dim] = extent
        index = [Affine.dim(k) for k in range(len(src))]
        index[dim] = Affine.dim(dim) * step + start
        return self.index_map(x, shape, index, suffix=suffix, name=name)

    def select(self, x: str, dim: int, position: int, suffix: str = "select", name: str | None = None) -> str:
        src = self.shape(x)
        dim %= len(src)
        position %= src[dim]
        index = []
        for k in range(len(src)):
            if k < dim:
                index.append(Affine.dim(k))
            elif k == dim:
                index.append(Affine.constant(position))
            else:
                index.append(Affine.dim(k - 1))
        return self.index_map(x, src[:dim] + src[dim + 1 :], index, suffix=suffix, name=name)

    def keep_axes(self, x: str, axes: Sequence[int], suffix: str = "squeeze", name: str | None = None) -> str:
        """Drop every extent-1 axis not in `axes` (the inverse of keepdim)."""
        src = self.shape(x)
        kept = [k for k in range(len(src)) if k in set(axes)]
        index = []
        for k in range(len(src)):
            index.append(Affine.dim(kept.index(k)) if k in kept else Affine.constant(0))
        return self.index_map(x, [src[k] for k in kept], index, suffix=suffix, name=name)

    def reduce_axes(self, op: str, x: str, axes: Sequence[int], keepdim: bool, suffix: str | None = None,
                    name: str | None = None) -> str:
        rank = len(self.shape(x))
        axes = sorted({a % rank for a in axes}) if rank else []
        out = x
        runs = _adjacent_runs(axes)
        for k, run in enumerate(reversed(runs)):  # from the last run, so earlier axes keep their numbers
            last = k == len(runs) - 1
            out = self._reduce_run(op, out, run, suffix, name if (last and keepdim) else None)
        if not keepdim:
            out = self.keep_axes(out, [k for k in range(rank) if k not in axes], name=name)
        elif name is not None and out == x:
            out = self.index_map(x, self.shape(x), [Affine.dim(k) for k in range(rank)], name=name)
        return out

    def _reduce_run(self, op: str, x: str, run: Sequence[int], suffix: str | None, name: str | None) -> str:
        """Reduce over adjacent axes as one: the run merged into one axis by a reshape (a row of
        their product, read contiguously when they are the trailing axes), reduced, and the kept
        shape restored with an extent-1 axis for each. One fold of the right length, not a chain
        of folds each reading the last one's output."""
        if len(run) == 1:
            return self.reduce(op, x, run[0], suffix=suffix, name=name)
        shape = self.shape(x)
        lo, hi = run[0], run[-1] + 1
        merged = self.reshape(x, (*shape[:lo], math.prod(shape[lo:hi]), *shape[hi:]), suffix="merged")
        folded = self.reduce(op, merged, lo, suffix=suffix)
        return self.reshape(folded, (*shape[:lo], *[1] * (hi - lo), *shape[hi:]), suffix=suffix, name=name)

    def fill(self, value: Scalar, shape: Sequence[int], dtype: DType, name: str | None = None) -> str:
        c = self.const(value, dtype)
        return self.index_map(c, shape, (), suffix="full", name=name)

    def finish(self, outputs: Sequence[str]) -> TensorGraph:
        return TensorGraph(tuple(self.nodes), tuple(outputs)).validate()


def _coerce(value: Scalar, dtype: DType) -> Scalar:
    if dtype is DType.BOOL:
        return bool(value)
    if dtype.is_float:
        return float(value)
    # a Python int past the type's range wraps to it, as torch applies `int32_tensor + 2**31`
    bits = 8 * dtype.itemsize
    if dtype is DType.U8:
        return int(value) % (1 << bits)
    return (int(value) + (1 << (bits - 1))) % (1 << bits) - (1 << (bits - 1))


def _infer_shape(src: Sequence[int], shape: Sequence[int]) -> tuple[int, ...]:
    shape = [int(s) for s in shape]
    total = math.prod(src)
    if -1 in shape:
        k = shape.index(-1)
        rest = math.prod(s for i, s in enumerate(shape) if i != k)
        shape[k] = total // rest if rest else 0
    if math.prod(shape) != total:
        raise ValueError(f"cannot reshape {tuple(src)} to {tuple(shape)}")
    return tuple(shape)


def _adjacent_runs(axes: Sequence[int]) -> list[list[int]]:
    """Sorted axes grouped into runs of consecutive numbers: [1, 2, 3, 5] -> [[1, 2, 3], [5]]."""
    runs: list[list[int]] = []
    for axis in axes:
        if runs and runs[-1][-1] == axis - 1:
            runs[-1].append(axis)
        else:
            runs.append([axis])
    return runs


def reshape_index(src: Sequence[int], dst: Sequence[int]) -> list[Affine]:
    """Index expressions reading a row-major `src` as `dst`.

    Axes are matched in groups of equal product (as torch's view does), so a
    reshape that splits or merges neighbouring axes gives plain expressions
    like `3*d1 + d2` or `d0 // 6`, not one long linearisation.
    """
    index: list[Affine | None] = [None] * len(src)
    i = j = 0
    while i < len(src) or j < len(dst):
        if i < len(src) and src[i] == 1:
            index[i] = Affine.constant(0)
            i += 1
            continue
        if j < len(dst) and dst[j] == 1:
            j += 1
            continue
        gi, gj = [i], [j]
        pi, pj = src[i], dst[j]
        while pi != pj:
            if pi < pj:
                i += 1
                gi.append(i)
                pi *= src[i]
            else:
                j += 1
                gj.append(j)
                pj *= dst[j]
        # Linear position inside the group, over the output axes.
        linear = Affine.constant(0)
        for axis in gj:
            linear = linear * dst[axis] + Affine.dim(axis)
        stride = 1
        for axis in reversed(gi):
            index[axis] = linear.floordiv(stride, dst).mod(src[axis], dst)
            stride *= src[axis]
        i, j = gi[-1] + 1, gj[-1] + 1
    return [e if e is not None else Affine.constant(0) for e in index]

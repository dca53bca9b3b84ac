"""The plan of emmy.capture.value_sized: which value-sized selections a program makes, and how each
op their counts reach is rewritten to keep every element, or why it cannot be (`Refused`).

One pass in graph order. A count is the symbol torch.export gives a selection's size; an axis's
layout says which selections' masks (and fixed-size parts) its validity vector is made of.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from emmy.decompose.masked_regions import extreme, value_numbers
from emmy.dtypes import from_torch

_ASSERTS = {"aten._assert_scalar.default", "aten.sym_constrain_range_for_size.default",
            "aten.sym_constrain_range.default", "aten._assert_tensor_metadata.default"}
_SIZE_READS = {"aten.sym_size.int", "aten.sym_numel.default", "aten.sym_stride.int"}
# ops whose argument at the given position is a list of sizes (a count may stand in it)
_SIZED = {"aten.full.default": 0, "aten.zeros.default": 0, "aten.ones.default": 0, "aten.empty.memory_format": 0,
          "aten.new_zeros.default": 1, "aten.new_ones.default": 1, "aten.new_full.default": 1,
          "aten.new_empty.default": 1, "aten.view.default": 1, "aten.reshape.default": 1,
          "aten._unsafe_view.default": 1, "aten.expand.default": 1}
_FACTORIES = {"aten.full.default", "aten.zeros.default", "aten.ones.default", "aten.empty.memory_format",
              "aten.new_zeros.default", "aten.new_ones.default", "aten.new_full.default", "aten.new_empty.default"}
_VIEWS = {"aten.view.default", "aten.reshape.default", "aten._unsafe_view.default"}
# ops that move or add unit axes: a counted axis keeps its size wherever it goes
_REORDERS = {"aten.permute.default", "aten.transpose.int", "aten.t.default", "aten.unsqueeze.default",
             "aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default"}
_ANY_AXES = _REORDERS | {"aten.expand.default", "aten.clone.default", "aten.alias.default", "aten.contiguous.default",
                         "aten._to_copy.default", "aten.lift_fresh_copy.default", "aten.repeat.default"}
_AT_AXIS = {"aten.select.int": 1, "aten.slice.Tensor": 1, "aten._softmax.default": 1,
            "aten._log_softmax.default": 1, "aten.cumsum.default": 1, "aten.max.dim": 1, "aten.min.dim": 1,
            "aten.unbind.int": 1}
_REDUCTIONS = {"aten.sum.dim_IntList": "sum", "aten.sum.default": "sum", "aten.amax.default": "max",
               "aten.amin.default": "min", "aten.max.default": "max", "aten.min.default": "min"}
# reductions and normalizations computed along other axes than a counted one only
_ALONG_OTHER_AXES = {"aten.mean.dim", "aten.var.correction", "aten.var_mean.correction", "aten.prod.dim_int",
                     "aten.any.dim", "aten.any.dims", "aten.all.dim", "aten.logsumexp.default",
                     "aten.argmax.default", "aten.argmin.default"}
_MEANS = {"aten.mean.dim", "aten.mean.default"}
_GATHERS = {"aten.index_select.default": 2, "aten.embedding.default": 1, "aten.gather.default": 2}
_SCATTERS = {"aten.scatter_add.default", "aten.scatter.src", "aten.scatter.value", "aten.scatter_reduce.two",
             "aten.index_add.default"}
_PRODUCTS = {"aten.mm.default": (0, 1), "aten.addmm.default": (1, 2), "aten.bmm.default": (0, 1)}
_WHOLE = 2 ** 62  # a slice's end at or past this is "to the end"


class Refused(Exception):
    """The counts reach an op this module does not rewrite: the program stays as it was."""


@dataclass
class Plan:
    """What the planning pass found: the counts and how each touched node is rewritten."""

    dense: dict = field(default_factory=dict)  # count symbol -> the full axis's length
    # count symbol -> (its mask's node name, the size of the mask's own counted axis or None)
    masks: dict = field(default_factory=dict)
    layouts: dict = field(default_factory=dict)  # axis size expression -> its parts (a symbol or a fixed length)
    actions: dict = field(default_factory=dict)  # node name -> what the rewrite does to it


def val_of(node):
    return node.meta.get("val") if hasattr(node, "meta") else None


def _expr(size):
    """A size as a number or a sympy expression."""
    return size.node.expr if hasattr(size, "node") else int(size)


def symbols_of(value) -> set:
    """The free symbols of a fake tensor's shape, or of a symbolic number."""
    if hasattr(value, "shape"):
        return set().union(*(getattr(_expr(s), "free_symbols", set()) for s in value.shape))
    if hasattr(value, "node"):
        return set(value.node.expr.free_symbols)
    return set()


def dims_of(node) -> list:
    return [_expr(s) for s in val_of(node).shape]


def full_length(size, dense: dict) -> int:
    """A size's length at full size (`dense`: count -> its mask's length); a symbol no selection here
    made (another pass's) refuses."""
    if isinstance(size, int):
        return size
    value = size.xreplace(dense)  # a bare count comes back as the int it maps to
    if not isinstance(value, int) and not value.is_Integer:
        raise Refused(f"a size {size} holds a count this module does not rewrite")
    return int(value)


def _is_tensor(node) -> bool:
    return hasattr(val_of(node), "shape")


def _inputs(node) -> list:
    return list(node.all_input_nodes)


class _Planner:
    """Visits a graph's nodes in order, entering each selection's count and each op it reaches in a Plan."""

    def __init__(self, graph, leave):
        self.plan = Plan()
        self.leave = leave
        # the counts of the selections left to another pass (a second selection by the same mask
        # shares its symbol)
        self.left = set().union(*(symbols_of(val_of(node)) for node in graph.nodes if node.name in leave))
        self.numbers: set = set()  # nodes holding a number made from a count
        # a count of a mask computing the same value as an earlier one's (`~loop` written twice):
        # torch checks the two are equal where they meet; here they are one
        self.alias: dict = {}
        self.same = value_numbers(graph)

    def dims(self, node) -> list:
        return [size.xreplace(self.alias) if self.alias and not isinstance(size, int) else size
                for size in dims_of(node)]

    def ours(self, node) -> bool:
        symbols = symbols_of(val_of(node))
        mine = symbols & set(self.plan.dense)
        if mine and mine != symbols:
            raise Refused(f"{node.name} mixes a count with another symbol")
        return bool(mine)

    def axes(self, node) -> list[int]:
        """The axes of a tensor node sized by a count."""
        if not _is_tensor(node):
            return []
        return [d for d, size in enumerate(self.dims(node)) if getattr(size, "free_symbols", None)
                and size.free_symbols & set(self.plan.dense)]

    def visit(self, node) -> None:
        key = str(node.target)
        if node.op == "output":
            if any(self.ours(n) or n in self.numbers for n in _inputs(node)):
                raise Refused("a value-sized tensor or a count is returned")
            return
        if node.op != "call_function":
            return
        if key == "aten.index.Tensor" and self.selection(node):
            return
        if key == "aten.nonzero.default" and self.positions(node):
            return
        touched = [n for n in _inputs(node) if n in self.numbers or self.ours(n)]
        if not touched and not self.ours(node):
            return
        self.check_numbers(node, key)
        if key in _ASSERTS:
            self.check_assertion(node)
        elif not _is_tensor(node) and self.ours(node):
            self.numbers.add(node)  # sym_size, a sum of counts, a comparison for a check
        elif key in _SIZE_READS:
            self.numbers.add(node)
        else:
            self.tensor_op(node, key)

    def selection(self, node) -> bool:
        """`src[None, ..., mask]`: a new count; True if `node` is one."""
        source, indices = node.args
        if node.name in self.leave or not isinstance(indices, (list, tuple)) or not indices:
            return False
        *before, mask = indices
        if any(i is not None for i in before) or mask is None or not hasattr(mask, "meta"):
            return False
        import torch

        if getattr(val_of(mask), "dtype", None) != torch.bool:
            return False
        import sympy

        k, rank = len(before), len(val_of(mask).shape)
        out = self.dims(node)
        if rank == 0 or not isinstance(out[k], sympy.Symbol) or self.dims(source)[k:k + rank] != self.dims(mask):
            return False
        self.count(node, out[k], mask, ("select", k, rank, [self.dense(d) for d in self.dims(source)]))
        return True

    def positions(self, node) -> bool:
        """`mask.nonzero()` (torch.where(mask)) of a bool mask: a new count, the coordinates of every
        position kept, the mask their validity; True if `node` is one."""
        import sympy
        import torch

        mask = node.args[0]
        out = self.dims(node)
        if node.name in self.leave or getattr(val_of(mask), "dtype", None) != torch.bool or not isinstance(
                out[0], sympy.Symbol) or not val_of(mask).shape:
            return False
        if self.axes(mask):
            raise Refused(f"{node.name}: the positions of a value-sized mask")
        self.count(node, out[0], mask, ("coordinates", [self.dense(d) for d in self.dims(mask)]))
        return True

    def count(self, node, symbol, mask, action: tuple) -> None:
        """Enter a selection's count (`symbol`, of `mask`'s True values) and the rewrite of `node`."""
        if symbol in self.left:
            raise Refused(f"{node.name} shares its count with a selection computed elsewhere")
        if mask.name in self.plan.actions:
            raise Refused(f"{node.name} selects by a mask this module rewrites")
        twin = next((u for u, (name, _) in self.plan.masks.items() if self.same[name] == self.same[mask.name]), None)
        if symbol in self.plan.dense or twin is not None:  # a second selection by the same mask
            if twin is None or self.alias.get(symbol, symbol) not in (symbol, twin):
                raise Refused(f"{node.name}: two masks select the same count")
            if symbol != twin:
                self.alias[symbol] = twin
                self.plan.dense[symbol] = self.plan.dense[twin]
            self.plan.actions[node.name] = action
            return
        mask_axes = self.axes(mask)
        if mask_axes and len(self.dims(mask)) != 1:
            raise Refused(f"{node.name} selects by a mask of several axes, one sized by a count")
        inner = self.dims(mask)[0] if mask_axes else None
        if inner is not None:
            self.layout(inner, node)
        self.plan.dense[symbol] = math.prod(self.dense(size) for size in self.dims(mask))
        self.plan.masks[symbol] = (mask.name, inner)
        self.plan.layouts[symbol] = (symbol,)
        self.plan.actions[node.name] = action

    def dense(self, size) -> int:
        return full_length(size, self.plan.dense)

    def layout(self, size, node) -> tuple:
        if isinstance(size, int) or not size.free_symbols:
            return (int(size),)
        if size not in self.plan.layouts:
            raise Refused(f"{node.name}: no validity is known for an axis of size {size}")
        return self.plan.layouts[size]

    def check_numbers(self, node, key) -> None:
        """A count may stand in a tensor op only inside its list of sizes (`torch.ones(u0)`)."""
        if key in _ASSERTS or not _is_tensor(node) or not any(n in self.numbers for n in _inputs(node)):
            return
        position = _SIZED.get(key)
        for at, arg in [*enumerate(node.args), *node.kwargs.items()]:
            held = arg if isinstance(arg, (list, tuple)) else [arg]
            if at != position and any(item in self.numbers for item in held if hasattr(item, "meta")):
                raise Refused(f"{node.name} ({key}) uses a count as a value")

    def check_assertion(self, node) -> None:
        for arg in _inputs(node):
            symbols = {self.alias.get(s, s) for s in symbols_of(val_of(arg)) & set(self.plan.dense)}
            if len(symbols) > 1:
                raise Refused(f"{node.name} relates two counts")
        self.plan.actions[node.name] = ("drop",)

    def tensor_op(self, node, key) -> None:
        import torch

        args = node.args
        if key in _FACTORIES:
            return  # its values do not depend on where the kept elements sit
        if key in ("aten.index_put.default", "aten.index_put_.default"):
            return self.index_put(node)
        if key in _SCATTERS:
            return self.scatter(node, key)
        if key in _GATHERS or key == "aten.index.Tensor":
            return self.gather(node, key)
        if key == "aten.native_layer_norm.default":
            rank, normalized = len(self.dims(args[0])), len(args[1])
            if any(axis >= rank - normalized for axis in self.axes(args[0])):
                raise Refused(f"{node.name} normalizes over a value-sized axis")
            return
        if key in _REDUCTIONS or key in _ALONG_OTHER_AXES or key in _MEANS:
            return self.reduction(node, key)
        if key in _PRODUCTS:
            return self.product(node, *(args[i] for i in _PRODUCTS[key]))
        if key == "aten.cat.default":
            return self.cat(node)
        if key in _VIEWS:
            return self.view(node)
        if key in _AT_AXIS:
            return self.at_axis(node, args[0], args[_AT_AXIS[key]] if len(args) > 1 else 0, key)
        if key in _ANY_AXES or torch.Tag.pointwise in getattr(node.target, "tags", ()):
            return self.per_element(node)
        if key == "<built-in function getitem>" and isinstance(val_of(node.args[0]), (list, tuple)):
            return  # a result of max.dim, unbind or layer norm along another axis, already planned
        raise Refused(f"{node.name} ({key}) on a value-sized axis")

    def product(self, node, left, right) -> None:
        """A matrix product of counted rows, or a batched one over a counted batch axis."""
        rows = [len(self.dims(left)) - 2]
        by_rows = self.axes(left) == rows and not self.axes(right)
        batched = (self.axes(left) == self.axes(right) == [0] and len(self.dims(left)) == 3
                   and self.dims(left)[0] == self.dims(right)[0])
        bias = node.args[0] if str(node.target) == "aten.addmm.default" else None
        if not (by_rows or batched) or (bias is not None and self.axes(bias)):
            raise Refused(f"{node.name}: a matrix product over a value-sized axis")

    def per_element(self, node) -> None:
        """Each input's counted axes line up with the output's (right-aligned, as broadcasting does)."""
        if str(node.target) in _REORDERS:
            return self.same_sizes(node)
        out = self.dims(node)
        for arg in _inputs(node):
            if not _is_tensor(arg) or not self.ours(arg):
                continue
            dims = self.dims(arg)
            for d in self.axes(arg):
                at = len(out) - len(dims) + d
                if at < 0 or out[at] != dims[d]:
                    raise Refused(f"{node.name} moves a value-sized axis of {arg.name}")

    def same_sizes(self, node) -> None:
        """A reorder of axes keeps each counted axis whole."""
        source = node.args[0]
        counted_in = sorted(str(self.dims(source)[d]) for d in self.axes(source))
        counted_out = sorted(str(self.dims(node)[d]) for d in self.axes(node))
        if counted_in != counted_out:
            raise Refused(f"{node.name} changes a value-sized axis")

    def at_axis(self, node, source, dim, key) -> None:
        dims = self.dims(source)
        dim = dim % max(len(dims), 1)
        if dim in self.axes(source):
            whole = key == "aten.slice.Tensor" and _whole_slice(node.args, dims[dim])
            if not whole:
                raise Refused(f"{node.name} ({key}) works along a value-sized axis")

    def view(self, node) -> None:
        """A view keeps each counted axis whole (as many elements before it on both sides), merges it
        with the axes of fixed size after it (`x.view(-1, c)` before a matrix product: each element
        of the merged axis is valid where its row is), or splits such a merged axis back."""
        import sympy

        source = node.args[0]
        before, after = self.dims(source), self.dims(node)
        if len(self.axes(source)) != 1 or len(self.axes(node)) != 1:
            raise Refused(f"{node.name} reshapes across value-sized axes")
        (d_in,), (d_out,) = self.axes(source), self.axes(node)
        if sympy.expand(math.prod(before[:d_in]) - math.prod(after[:d_out])) != 0:
            raise Refused(f"{node.name} merges a value-sized axis with one before it")
        size_in, size_out = before[d_in], after[d_out]
        merged, split = sympy.cancel(size_out / size_in), sympy.cancel(size_in / size_out)
        if size_in == size_out:
            return
        if merged.is_Integer:
            self.layout(size_in, node)
            self.settle(size_out, (("repeat", size_in, int(merged)),), node)
        elif not (split.is_Integer and self.plan.layouts.get(size_in) == (("repeat", size_out, int(split)),)):
            raise Refused(f"{node.name} splits a value-sized axis")

    def settle(self, size, layout: tuple, node) -> None:
        """`size`'s axis is laid out as `layout`: the first op to make one decides, the rest agree."""
        known = self.plan.layouts.setdefault(size, layout)
        if known != layout:
            raise Refused(f"{node.name} lays out an axis of size {size} otherwise than an earlier op")

    def cat(self, node) -> None:
        parts = [p for p in node.args[0] if hasattr(p, "meta")]
        dim = node.args[1] if len(node.args) > 1 else 0
        out = self.dims(node)
        dim %= len(out)
        if dim not in self.axes(node):
            return self.per_element(node)
        kept = [p for p in parts if self.ours(p) or val_of(p).numel() != 0]  # torch skips an empty part
        joined = sum((self.layout(self.dims(p)[dim], node) for p in kept), ())
        self.settle(out[dim], joined, node)

    def gather(self, node, key) -> None:
        """Reads at counted positions: the dropped positions read at 0."""
        source = node.args[0]
        if key == "aten.index.Tensor":
            positions = [i for i, index in enumerate(node.args[1]) if index is not None and self.ours(index)]
            indices = [node.args[1][i] for i in positions]
        else:
            positions = [_GATHERS[key]] if self.ours(node.args[_GATHERS[key]]) else []
            indices = [node.args[i] for i in positions]
        along_axis = key in ("aten.index_select.default", "aten.gather.default")
        along = node.args[1] % len(self.dims(source)) if along_axis else None
        if not positions:
            if key == "aten.index_select.default" and along not in self.axes(source):
                return  # static positions along another axis
            raise Refused(f"{node.name} ({key}) reads along a value-sized axis")
        if self.ours(source) and not (key == "aten.gather.default" and along not in self.axes(source)
                                      and self.counted(source) == self.counted(indices[0])):
            raise Refused(f"{node.name} ({key}) reads a value-sized tensor at counted positions")
        self.plan.actions[node.name] = ("gather", [(p, *self.axis_of(i, node)) for p, i in zip(positions, indices)])

    def counted(self, node) -> list:
        return [(d, self.dims(node)[d]) for d in self.axes(node)]

    def axis_of(self, node, user) -> tuple:
        """(size, axis, rank) of a tensor's one counted axis, its validity known."""
        if len(self.axes(node)) != 1:
            raise Refused(f"{user.name}: {node.name} has {len(self.axes(node))} value-sized axes, not one")
        axis = self.axes(node)[0]
        self.layout(self.dims(node)[axis], user)
        return self.dims(node)[axis], axis, len(self.dims(node))

    def reduction(self, node, key) -> None:
        source = node.args[0]
        dims = self.dims(source)
        given = node.args[1] if len(node.args) > 1 else None
        given = [given] if isinstance(given, int) else given
        reduced = range(len(dims)) if given in (None, [], ()) else [d % len(dims) for d in given]
        counted = [d for d in self.axes(source) if d in reduced]
        if not counted:
            return  # along other axes: each counted position reduced apart
        if (key not in _REDUCTIONS and key not in _MEANS) or self.ours(node):
            raise Refused(f"{node.name} ({key}) reduces over a value-sized axis to a value-sized result, or"
                           " not by a sum, mean, max or min")
        if key in _MEANS:  # the sum over the kept elements, by their count times the other axes'
            others = math.prod(dims[d] for d in reduced if d not in counted)
            self.plan.actions[node.name] = ("mean", self.axis_of(source, node), others)
            return
        kind = _REDUCTIONS[key]
        identity = 0 if kind == "sum" else extreme(from_torch(val_of(source).dtype), lowest=kind == "max")
        self.plan.actions[node.name] = ("reduce", self.axis_of(source, node), identity)

    def scatter(self, node, key) -> None:
        """Dropped elements go to a spare slot past the end of a fixed-size destination."""
        target, dim, index = node.args[0], node.args[1], node.args[2]
        source = node.args[3] if len(node.args) > 3 and hasattr(node.args[3], "meta") else None
        dim %= len(self.dims(target))
        if self.ours(target) or self.ours(node):
            raise Refused(f"{node.name} ({key}) into a value-sized tensor")
        axes = self.axes(index)
        expected = [0] if key == "aten.index_add.default" else [dim]
        if axes != expected:
            raise Refused(f"{node.name} ({key}) scatters along another axis than the counted one")
        if source is not None and self.axes(source) != ([dim] if key == "aten.index_add.default" else axes):
            raise Refused(f"{node.name} ({key}) scatters a source counted along another axis")
        self.plan.actions[node.name] = ("spare_slot", [dim], 2, self.axis_of(index, node), self.dims(target),
                                        val_of(target).dtype)

    def index_put(self, node) -> None:
        target, indices, values = node.args[:3]
        import torch

        tensors = [i for i in indices if i is not None]
        if len(tensors) == 1 and val_of(tensors[0]).dtype == torch.bool:
            mask = tensors[0]
            symbols = {self.alias.get(s, s) for s in symbols_of(val_of(values)) if s in self.plan.dense}
            if indices[0] is not mask or any(self.same[self.plan.masks[s][0]] != self.same[mask.name] for s in symbols):
                raise Refused(f"{node.name} writes under a mask values selected by another one")
            if symbols and self.axes(values) != [0]:
                raise Refused(f"{node.name} writes values counted along another axis")
            self.plan.actions[node.name] = ("write_back", [self.dense(d) for d in self.dims(mask)],
                                            len(self.dims(target)) - len(self.dims(mask)),
                                            [self.dense(d) for d in self.dims(values)] if symbols else None)
            return
        # `out[i, j] = v` with i, j the coordinates of torch.where(mask): one counted axis each
        if self.ours(target) or not all(self.ours(t) and len(self.dims(t)) == 1 for t in tensors) or len(
                {str(self.dims(t)[0]) for t in tensors}) != 1:
            raise Refused(f"{node.name} (index_put) at positions it cannot keep apart")
        dims = [i for i, index in enumerate(indices) if index is not None]
        self.plan.actions[node.name] = ("spare_slot", dims, None, self.axis_of(tensors[0], node), self.dims(target),
                                        val_of(target).dtype)


def _whole_slice(args, size) -> bool:
    start = args[2] if len(args) > 2 else None
    end = args[3] if len(args) > 3 else None
    step = args[4] if len(args) > 4 else 1
    return start in (None, 0) and step == 1 and (end is None or (isinstance(end, int) and end >= _WHOLE)
                                                 or (hasattr(end, "meta") and _expr(val_of(end)) == size))


def plan(graph, leave) -> Plan | None:
    """The rewrite of every value-sized selection, or None if there is none (raises Refused)."""
    planner = _Planner(graph, leave)
    for node in graph.nodes:
        planner.visit(node)
    return planner.plan if planner.plan.dense else None

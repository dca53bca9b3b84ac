"""Masked selections computed in place: `out[mask] = f(a[mask], b[mask])` and `x[mask].mean()`.

`a[mask]` (a boolean mask) has as many elements as the mask has True values, a size known only at
run time, which a compiled program cannot have. Yet real code selects only to compute elementwise
on the selected values and then either write them back under the same mask (torchvision's box IoU
losses: `intsct[mask] = (x2[mask] - x1[mask]) * ...`) or reduce them all (`loss[valid].mean()`,
`F.cross_entropy(head(hidden[labelled]), labels[labelled])`).
Such a region is computed on every element instead, at the mask's shape:

- a selection `src[mask]` is `src` itself (its leading axes the mask's);
- an elementwise op over the region's tensors (and tensors that broadcast over the selected
  elements' trailing axes) is the same op on the full tensors; its values where the mask is False
  are computed and never used (an op that traps on them is not one a kernel runs: a float's NaN
  stays in its element, emmy's integer division by 0 gives 0);
- an op treating the selected axis as a batch axis (log_softmax or a reduction along a trailing axis,
  a gather along one by an index selected by the same mask, the selected rows times a matrix: a
  linear layer) is that op with its axes moved past the mask's; a gather's index is 0 in the rows
  not selected, whose labels need not be positions;
- `torch.where(mask)` (nonzero) is the grid of every position's coordinates; a static tensor read at
  them (`x[None, token]`), a view adding or dropping unit axes, and an accumulating index_put at
  them (`out.index_add_(0, token, y)`, each value added where the mask holds) make a mixture of
  experts' dispatch (HF's Mixtral, Qwen2-MoE, OLMoE) dense: every expert computes every token;
- `index_put(x, [mask], v)` is `where(mask, v, x)` (`x + where(mask, v, 0)` accumulating);
- a sum, mean, amax, amin, max or min over the selected elements' first axis is that reduction of
  `where(mask, v, identity)` over the mask's axes; a mean divides by the count of True values (no
  element: 0 / 0 = NaN, torch's mean of nothing);
- the region's size read for torch.export's runtime assertions (`u0 >= 0`), and its checks of a
  region tensor's dtype, are dropped.

A mask whose region reaches anything else (a selection returned, its size used as a number, a scan
or reshape along the selected axis) is left alone, and its selection is refused as before: nothing
is guessed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from emmy.decompose.registry import draws_random
from emmy.dtypes import DType

_SELECT = "aten.index.Tensor"
_WRITE_BACK = "aten.index_put.default"
_REDUCTIONS = {"aten.sum.default": "sum", "aten.sum.dim_IntList": "sum", "aten.mean.default": "mean",
               "aten.mean.dim": "mean", "aten.amax.default": "max", "aten.amin.default": "min",
               "aten.max.default": "max", "aten.min.default": "min"}
_CASTS = {"aten._to_copy.default", "aten.clone.default", "aten.alias.default"}  # not tagged pointwise
_SIZE_READS = {"aten.sym_size.int", "aten.sym_numel.default"}
_CHECKS = {"aten._assert_scalar.default", "aten.sym_constrain_range_for_size.default",
           "aten.sym_constrain_range.default"}


@dataclass(frozen=True)
class MaskedRegions:
    """The nodes computed at their mask's shape, each with its mask node's name."""

    selections: dict = field(default_factory=dict)  # index.Tensor node name -> (source name, mask name)
    computed: dict = field(default_factory=dict)  # elementwise node name -> mask node name
    sinks: dict = field(default_factory=dict)  # index_put or reduction node name -> mask node name
    dropped: frozenset = frozenset()  # size reads of region tensors and the assertions on them
    # region node name -> its shape computed in place (its selected axis replaced by the mask's axes)
    shapes: dict = field(default_factory=dict)
    # ops whose selected axis is a batch axis (a softmax along a trailing axis, a gather along one, a
    # product of the selected rows by a matrix): node name -> the mask's rank, by which their axes move
    row_wise: dict = field(default_factory=dict)
    # nonzero(mask) (torch.where(mask)): node name -> mask node name; computed as the grid of every
    # position's coordinates, the rows being the mask's True positions
    coordinates: dict = field(default_factory=dict)
    reshaped: frozenset = frozenset()  # views of region tensors that only add or drop unit axes
    positions: frozenset = frozenset()  # columns of nonzero's coordinates: in range everywhere, no masking

    def __bool__(self) -> bool:
        return bool(self.selections or self.coordinates)


def _val(node):
    return node.meta.get("val") if _is_node(node) else None


def sized_by_values(val) -> bool:
    """Whether a node's result (FakeTensor metadata, or a tuple of them) has a size torch.export could only
    name by a symbol (masked_select's count, nonzero's rows)."""
    vals = val if isinstance(val, (list, tuple)) else [val]
    return any(not isinstance(s, int) for v in vals if hasattr(v, "shape") for s in v.shape)


def _static_shape(val) -> tuple[int, ...] | None:
    if not hasattr(val, "shape") or sized_by_values(val):
        return None
    return tuple(int(s) for s in val.shape)


def _is_node(value) -> bool:
    import torch.fx

    return isinstance(value, torch.fx.Node)


def _node_args(node) -> list:
    found = []
    for arg in (*node.args, *node.kwargs.values()):
        for item in (arg if isinstance(arg, (list, tuple)) else [arg]):
            if _is_node(item):
                found.append(item)
    return found


def _selection_mask(node):
    """The mask node of `src[mask]` by one boolean mask over src's leading axes, else None."""
    if str(node.target) != _SELECT or len(node.args) != 2:
        return None
    source, indices = node.args
    if not isinstance(indices, (list, tuple)) or len(indices) != 1 or not _is_node(indices[0]):
        return None
    mask, src = _static_shape(_val(indices[0])), _static_shape(_val(source))
    if mask is None or src is None or getattr(_val(indices[0]), "dtype", None) is None:
        return None
    import torch

    if _val(indices[0]).dtype != torch.bool or not mask or src[:len(mask)] != mask:
        return None
    return indices[0]


def _pointwise(node) -> bool:
    import torch

    key = str(node.target)
    if key in _CASTS:
        return True
    tags = getattr(node.target, "tags", ())
    return torch.Tag.pointwise in tags


def masked_regions(graph) -> MaskedRegions:
    """The masked regions of an FX graph that can be computed in place (one pass in graph order,
    then one over each region's readers)."""
    if not any(str(n.target) in (_SELECT, "aten.nonzero.default") and sized_by_values(_val(n)) for n in graph.nodes):
        return MaskedRegions()  # no value-sized selection: nothing to plan
    region: dict = {}  # node name -> mask node
    selections, rows, coordinates, reshaped, positions = {}, set(), {}, set(), set()
    same = value_numbers(graph)  # `x[y > 0] = y[y > 0]` computes its mask twice: one mask
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        val = _val(node)
        mask = _selection_mask(node)
        if mask is not None and sized_by_values(val):
            region[node.name] = mask
            selections[node.name] = (node.args[0].name, mask.name)
            continue
        if str(node.target) == "aten.nonzero.default" and _static_shape(_val(node.args[0])):
            region[node.name] = node.args[0]
            coordinates[node.name] = node.args[0].name
            continue
        read = [a for a in _node_args(node) if a.name in region]
        if not read:
            continue
        masks = {same[region[a.name].name] for a in read}
        if not hasattr(val, "shape") or not sized_by_values(val) or len(masks) != 1:  # a tuple (split): not a region
            continue
        trailing = len(val.shape) - 1 - _selected_axis(val)
        if _pointwise(node) and all(_broadcasts_over(a, region, trailing) for a in _node_args(node)):
            region[node.name] = region[read[0].name]
        elif _reads_at_region_positions(node, region) or _drops_unit_axes(node, region):
            region[node.name] = region[read[0].name]
            if str(node.target) in _VIEWS:
                reshaped.add(node.name)
        elif _row_wise(node, region):
            region[node.name] = region[read[0].name]
            rows.add(node.name)
            if str(node.target) in _PICKS and (node.args[0].name in coordinates or node.args[0].name in positions):
                positions.add(node.name)  # a column of nonzero's coordinates: always a position
    # each region tensor's readers: its region, a sink, a size read for assertions; anything else
    # (a selection returned, reshaped, its size used) leaves that mask's region alone
    sinks, dropped = {}, set()
    by_name = {n.name: n for n in graph.nodes}
    spoiled: set = set()
    for name, mask in region.items():
        for user in by_name[name].users:
            if user.name in region:
                continue
            if _sink(user, name, mask, region, same):
                sinks[user.name] = mask.name
            elif str(user.target) in _SIZE_READS and _only_checks(user, dropped):
                dropped.add(user.name)
            elif str(user.target) == "aten._assert_tensor_metadata.default":  # export's check of its dtype
                dropped.add(user.name)
            else:
                spoiled.add(same[mask.name])
    keep = {name for name, mask in region.items() if same[mask.name] not in spoiled}
    selections = {k: v for k, v in selections.items() if k in keep}
    computed = {name: region[name].name for name in keep if name not in selections and name not in coordinates}
    row_wise = {name: len(_val(region[name]).shape) for name in keep if name in rows}
    sinks = {k: v for k, v in sinks.items() if same[v] not in spoiled}
    shapes = {name: _full_shape(_val(by_name[name]), _static_shape(_val(region[name]))) for name in keep}
    coordinates = {k: v for k, v in coordinates.items() if k in keep}
    reshaped = {k for k in reshaped if k in keep}
    positions = {k for k in positions if k in keep}
    if not selections and not coordinates:
        return MaskedRegions()
    return MaskedRegions(selections, computed, sinks, frozenset(dropped), shapes, row_wise, coordinates,
                         frozenset(reshaped), frozenset(positions))


# ops that treat the selected axis (0) as a batch axis, and the argument holding their axes
_AXES_AT = {"aten._log_softmax.default": 1, "aten._softmax.default": 1, "aten.unsqueeze.default": 1,
            "aten.slice.Tensor": 1,
            "aten.squeeze.dims": 1, "aten.squeeze.dim": 1, "aten.gather.default": 1, "aten.sum.dim_IntList": 1,
            "aten.mean.dim": 1, "aten.amax.default": 1, "aten.amin.default": 1}
_PRODUCTS = {"aten.mm.default": 0, "aten.addmm.default": 1}  # the selected rows' argument


def _row_wise(node, region: dict) -> bool:
    """Whether `node` computes each selected element (row) from that row alone: a reduction, softmax,
    gather or (un)squeeze along trailing axes of region tensors, or region rows times a matrix."""
    key = str(node.target)
    nodes = _node_args(node)
    if key in _PRODUCTS:
        rows = node.args[_PRODUCTS[key]]
        others = [a for a in nodes if a is not rows]
        return (_is_node(rows) and rows.name in region and _selected_axis(_val(rows)) == 0
                and all(a.name not in region and _static_shape(_val(a)) is not None for a in others))
    if key not in _AXES_AT or not nodes or nodes[0] is not node.args[0] or node.args[0].name not in region:
        return False
    if _selected_axis(_val(node.args[0])) != 0:  # its axes are numbered from a leading selected axis
        return False
    if key == "aten.gather.default":  # the index selected by the same mask
        if len(node.args) < 3 or not _is_node(node.args[2]) or node.args[2].name not in region:
            return False
    elif any(a.name in region for a in nodes[1:]):
        return False
    rank = len(_val(node).shape) if key == "aten.unsqueeze.default" else len(_val(node.args[0]).shape)
    axes = node.args[1] if len(node.args) > 1 else None
    axes = [axes] if isinstance(axes, int) else list(axes or [])
    return bool(axes) and all(isinstance(a, int) and a % rank != 0 for a in axes)


def row_wise_args(node, args: list, mask_rank: int) -> list:
    """A row-wise op's arguments at the mask's shape: its trailing axes moved past the mask's."""
    key = str(node.target)
    if key in _PRODUCTS or mask_rank == 1:
        return args
    rank = len(_val(node).shape) if key == "aten.unsqueeze.default" else len(_val(node.args[0]).shape)
    at = _AXES_AT[key]
    axes = args[at]
    moved = [a % rank + mask_rank - 1 for a in ([axes] if isinstance(axes, int) else axes)]
    return [*args[:at], moved[0] if isinstance(axes, int) else moved, *args[at + 1:]]


def _spread(b, mask: str, shape: tuple[int, ...]) -> str:
    """The mask (over a region's leading axes) broadcast over the trailing axes of `shape`."""
    rank = len(b.shape(mask))
    if len(shape) == rank:
        return mask
    return b.broadcast_to(b.reshape(mask, (*b.shape(mask), *[1] * (len(shape) - rank)), suffix="mask"), shape)


def masked_index(ctx, index: str, mask: str) -> str:
    """An index computed in place, 0 in the rows not selected: their values (an ignore_index of -1)
    need not be positions, and a gather, an indexed read or an index_add reaches inside its tensor only."""
    b = ctx.b
    shape = b.shape(index)
    chosen = ctx.tensor(_spread(b, mask, shape), DType.BOOL, shape)
    zero = ctx.tensor(b.const(0, b.dtype(index)), shape=shape)
    return b.elementwise("where", chosen, index, zero, dtype=b.dtype(index), suffix="selected_index")


def lower_row_product(ctx, node, args: list, mask_rank: int, lowering):
    """mm (addmm) of region rows at the mask's shape: the mask's axes flattened into one for the
    product, then put back."""
    b = ctx.b
    at = _PRODUCTS[str(node.target)]
    rows = args[at]
    shape = b.shape(rows)
    count = math.prod(shape[:mask_rank])
    flat = [*args]
    flat[at] = b.reshape(rows, (count, shape[-1]), suffix="rows")
    columns = ctx.out_shape[-1]
    product = lowering(dataclasses.replace(ctx, out_shape=(count, columns)), *flat)
    return b.reshape(product, (*shape[:mask_rank], columns))


_PICKS = {"aten.slice.Tensor", "aten.squeeze.dims", "aten.squeeze.dim"}  # a coordinate column stays one


_VIEWS = {"aten.view.default", "aten.reshape.default", "aten._unsafe_view.default"}


def _selected_axis(val) -> int:
    """The position of the value-sized axis (the selected rows) in a region tensor's shape."""
    return next(k for k, s in enumerate(val.shape) if not isinstance(s, int))


def _full_shape(val, mask_shape: tuple[int, ...]) -> tuple[int, ...]:
    """A region tensor's shape computed in place: its selected axis replaced by the mask's axes."""
    at = _selected_axis(val)
    return (*(int(s) for s in val.shape[:at]), *mask_shape, *(int(s) for s in val.shape[at + 1:]))


def _reads_at_region_positions(node, region: dict) -> bool:
    """`src[None, rows]`, `src[rows, cols]`: a static tensor read at positions held by region index
    tensors (a nonzero's coordinates), every index a region tensor or a full slice (None)."""
    if str(node.target) != _SELECT or len(node.args) != 2 or not _is_node(node.args[0]):
        return False
    source, indices = node.args
    import torch

    if source.name in region or _static_shape(_val(source)) is None:
        return False
    tensors = [i for i in indices if i is not None]
    return bool(tensors) and all(_is_node(i) and i.name in region for i in tensors) and \
        all(getattr(_val(i), "dtype", None) in (torch.int64, torch.int32) for i in tensors)


def _drops_unit_axes(node, region: dict) -> bool:
    """A view of a region tensor that only adds or drops axes of size 1 (`x[None, rows].view(-1, h)`)."""
    if str(node.target) not in _VIEWS or not _is_node(node.args[0]) or node.args[0].name not in region:
        return False

    def kept(val):
        return [("rows" if not isinstance(s, int) else int(s)) for s in val.shape if not isinstance(s, int) or s != 1]

    return kept(_val(node)) == kept(_val(node.args[0]))


def _broadcasts_over(arg, region: dict, trailing: int) -> bool:
    """Whether an operand of a region's elementwise op is in the region, or broadcasts over the
    selected elements' trailing axes alone (a number-like tensor, a bias row)."""
    if arg.name in region:
        return True
    shape = _static_shape(_val(arg))
    if shape is None:
        return False
    return len(shape) <= trailing or (len(shape) == trailing + 1 and shape[0] == 1)


def value_numbers(graph) -> dict:
    """Node name -> a number equal for nodes computing the same value: the same op of the same
    operands (one pass in graph order; an op drawing random numbers is its own)."""
    numbers, seen = {}, {}

    def number(value):
        if _is_node(value):
            return ("node", numbers[value.name])
        if isinstance(value, (list, tuple)):
            return tuple(number(v) for v in value)
        return ("value", repr(value))

    for node in graph.nodes:
        key = None
        if node.op == "call_function" and not draws_random(str(node.target)):
            key = (str(node.target), number(node.args), tuple(sorted((k, number(v)) for k, v in node.kwargs.items())))
        numbers[node.name] = seen.setdefault(key, len(seen)) if key is not None else ("own", node.name)
    return numbers


def _sink(user, name: str, mask, region: dict, same: dict) -> bool:
    key = str(user.target)
    if key == _WRITE_BACK:
        target, indices, values = user.args[:3]
        if not _is_node(values) or values.name not in region or target.name in region or \
                _static_shape(_val(target)) is None or not isinstance(indices, (list, tuple)):
            return False
        if _scatters_at_coordinates(user, region):
            return True
        mask_shape = tuple(_val(mask).shape)
        return (values.name == name and len(indices) == 1 and _is_node(indices[0])
                and same[indices[0].name] == same[mask.name]
                and _static_shape(_val(target))[:len(mask_shape)] == mask_shape)
    if key in _REDUCTIONS:
        return user.args[0].name == name and not sized_by_values(_val(user)) and \
            all(a.name not in region for a in _node_args(user)[1:])
    return False


def _scatters_at_coordinates(user, region: dict) -> bool:
    """`out.index_add_(0, rows, v)`: an accumulating index_put at region index tensors (a nonzero's
    coordinates) of region values; each value added where the mask holds, the others adding 0."""
    target, indices, values = user.args[:3]
    accumulate = user.args[3] if len(user.args) > 3 else user.kwargs.get("accumulate", False)
    tensors = [i for i in indices if i is not None]
    return bool(accumulate) and bool(tensors) and all(_is_node(i) and i.name in region for i in tensors) and \
        _selected_axis(_val(values)) == 0


def _only_checks(size_read, dropped: set) -> bool:
    """Whether a region tensor's size is read only for torch.export's runtime assertions (through
    Python comparisons): then those reads are dropped with it."""
    seen, stack = [], [size_read]
    while stack:
        node = stack.pop()
        for user in node.users:
            if str(user.target) in _CHECKS:
                seen.append(user)
            elif user.op == "call_function" and getattr(user.target, "__module__", None) in ("operator", "_operator"):
                if hasattr(_val(user), "node") and len(_val(user).node.expr.free_symbols) > 1:
                    return False  # a check relating two counts (`torch._check(a.size(0) <= b.size(0))`) is kept
                seen.append(user)
                stack.append(user)
            else:
                return False
    dropped.update(n.name for n in seen)
    return True


def _region_indices(indices, regions: MaskedRegions) -> bool:
    return any(_is_node(i) and i.name in regions.shapes for i in indices)  # region tensors, not the mask


def coordinate_grid(ctx, mask_shape: tuple[int, ...]) -> str:
    """nonzero(mask) computed in place: every position's coordinates, (*mask_shape, rank)."""
    import numpy as np

    return ctx.constant(np.stack(np.indices(mask_shape), axis=-1).astype(np.int64), DType.I64)


def lower_sink(ctx, node, regions: MaskedRegions, env: dict):
    """An index_put or reduction reading a region computed in place: `where(mask, v, x)` or the
    reduction of the masked full tensor over the mask's axes."""
    b = ctx.b
    mask = env[regions.sinks[node.name]]
    key = str(node.target)
    value = env[(node.args[2] if key == _WRITE_BACK else node.args[0]).name]
    full = b.shape(value)
    mask_rank = len(b.shape(mask))
    spread = _spread(b, mask, full)
    out = ctx.out_type()
    if key == _WRITE_BACK and _region_indices(node.args[1], regions):
        from emmy.decompose.registry import LOWERINGS

        zero = ctx.tensor(b.const(0, b.dtype(value)), shape=full)
        added = b.elementwise("where", ctx.tensor(spread, DType.BOOL, full), value, zero, dtype=b.dtype(value),
                              suffix="masked")
        indices = [None if i is None else env[i.name] if i.name in regions.positions else
                   masked_index(ctx, env[i.name], mask) for i in node.args[1]]
        return LOWERINGS[_WRITE_BACK](ctx, env[node.args[0].name], indices, added, True)
    if key == _WRITE_BACK:
        target = env[node.args[0].name]
        accumulate = bool(node.args[3]) if len(node.args) > 3 else bool(node.kwargs.get("accumulate", False))
        shape = b.shape(target)
        chosen = ctx.tensor(spread, DType.BOOL, shape)
        written = ctx.tensor(value, out.dtype, shape)
        if accumulate:
            zero = ctx.tensor(b.const(0, out.dtype), shape=shape)
            added = b.elementwise("where", chosen, written, zero, dtype=out.dtype, suffix="masked")
            return b.elementwise("add", ctx.tensor(target, out.dtype), added, dtype=out.dtype, name=ctx.name)
        return b.elementwise("where", chosen, written, ctx.tensor(target, out.dtype), dtype=out.dtype, name=ctx.name)
    op = _REDUCTIONS[key]
    region_rank = len(node.args[0].meta["val"].shape)
    dims = node.args[1] if len(node.args) > 1 and key.endswith(("dim_IntList", "mean.dim", "amax.default",
                                                                "amin.default")) else None
    dims = list(range(region_rank)) if not dims else [d % region_rank for d in dims]
    axes = sorted({a for d in dims for a in ((range(mask_rank)) if d == 0 else (d + mask_rank - 1,))})
    accumulator = out.dtype.accumulator if op in ("sum", "mean") else out.dtype
    if op in ("sum", "mean"):
        fill = b.const(0, accumulator)
        masked = b.elementwise("where", spread, ctx.tensor(value, accumulator), ctx.tensor(fill, shape=full),
                               dtype=accumulator, suffix="masked")
    else:
        fill = b.const(extreme(out.dtype, lowest=op == "max"), out.dtype)
        masked = b.elementwise("where", spread, ctx.tensor(value, out.dtype), ctx.tensor(fill, shape=full),
                               dtype=out.dtype, suffix="masked")
    result = b.reduce_axes(op if op != "mean" else "sum", masked, axes, False, suffix="reduced")
    if op == "mean":
        selected = b.reduce_axes("sum", b.cast(spread, accumulator), axes, False, suffix="count")
        result = b.elementwise("divide", result, selected, dtype=accumulator, suffix="mean")
    result = b.cast(result, out.dtype)
    if b.shape(result) != out.shape:  # keepdim: the region's kept axes, not the mask's
        result = b.reshape(result, out.shape)
    return result


def extreme(dtype: DType, lowest: bool):
    """The value no other of `dtype` is below (lowest) or above: a max's (min's) fill."""
    import numpy as np

    if dtype is DType.BOOL:
        return not lowest
    if not dtype.is_float:
        info = np.iinfo(dtype.numpy)
        return int(info.min if lowest else info.max)
    return float("-inf") if lowest else float("inf")

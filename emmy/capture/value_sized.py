"""Selections whose size depends on tensor values, kept at full size beside a vector saying which
elements they hold.

Graph code drops and adds edges before it aggregates: torch_geometric's GCN and GAT layers remove an
edge list's self loops (`edge_index[:, edge_index[0] != edge_index[1]]`), append one loop per node
(`torch.cat([edge_index, loops], 1)`), weigh each edge (`torch.ones(edge_index.size(1))`, a degree
gathered at each end) and sum the weighted messages into the nodes (`scatter_add`). The edge count
after the selection is known only when the program runs, and torch.export names it by a symbol
(`u0`) that a compiled program cannot have. Yet no value of the program depends on where the kept
edges sit: every op on them is per edge until a scatter or a reduction sums them away. Here such a
program is rewritten, on torch's graph, to keep every edge:

- a selection `x[..., mask]` is `x` itself (the mask's axes flattened into one), and the count
  `u0` is the mask's length; `mask.nonzero()` (`torch.where(mask)`) is every position's
  coordinates; each such axis has a validity vector, the mask (a cat's axis: the cat of its parts'
  vectors, True along a part of fixed size; an axis merged with the fixed axes after it: each
  row's validity repeated); selections by masks computed alike share one count;
- per-element ops (elementwise, views that keep the axis whole or merge it with the axes after
  it, reductions, softmaxes and layer norms along other axes, gathers along other axes, a matrix
  product of its rows or batched over it, a cat along another axis) run on the full axis; their
  values at the dropped positions are computed and never read;
- an op reading *at* values of such an axis (`x[index]`, index_select, embedding, gather) reads at
  index 0 where an element was dropped, so a dropped index out of range (padding, -1) reads nothing
  outside the tensor;
- a scatter, index_add or index_put into a tensor of fixed size writes dropped elements into one
  spare slot past the end, sliced off after; a sum, mean, amax or amin over the axis reduces the
  validity vector's elements alone; a write-back under the selection's mask (`x[m] = f(x[m])`) is
  a where;
- the sizes made from the count (`u0 + 10` for a cat, `torch.ones(u0)`) are the full axis's, and
  export's bound checks on the count (`0 <= u0 <= 30`) are dropped.

A program is rewritten only when every op the counts reach is one of these; anything else (a
selection returned, the count used as a number, an arange of it, a reorder or slice along the
axis, a check that relates two counts) leaves it unchanged, refused as before with its line.
`emmy.decompose.masked_regions` computes the simpler selections (a region feeding elementwise ops and
one sink) during decomposition, and those are left to it.

One pass in graph order plans (emmy.capture.value_sized_plan); one rewrites (here); one works out
again the shapes the counts held.
"""

from __future__ import annotations

import logging
import math

from emmy.capture.value_sized_plan import Plan, Refused, full_length, plan, symbols_of, val_of

logger = logging.getLogger(__name__)


def keep_value_sized_selections(program, leave=frozenset()):
    """`program` (an ExportedProgram) with its value-sized selections kept at full size where every
    op they reach allows it; the selections named in `leave` are another pass's. The program given
    is left as it was."""
    import torch

    selecting = (torch.ops.aten.index.Tensor, torch.ops.aten.nonzero.default)
    if not any(node.target in selecting and symbols_of(val_of(node)) for node in program.graph.nodes):
        return program
    try:
        found = plan(program.graph, leave)
    except Refused as why:
        logger.debug("value-sized selections kept as they are: %s", why)
        return program
    if found is None:
        return program
    from emmy.capture.constant_reads import copied, specialized

    module = copied(program.graph_module)
    rewrite = _Rewrite(module.graph, found)
    fresh = rewrite.run()
    counts = set(found.dense)
    stale = {node for node in module.graph.nodes if symbols_of(val_of(node)) & counts}
    specialized(module, {}, fresh | stale)
    logger.info("%d value-sized selection(s) kept at full size with a validity vector", len(found.masks))
    return program._update(module, _outputs_renamed(program.graph_signature, rewrite.renamed))


def _outputs_renamed(signature, renamed: dict):
    """The signature with the outputs a rewrite replaced named by their new nodes."""
    import dataclasses

    def spec(output):
        name = getattr(output.arg, "name", None)
        return dataclasses.replace(output, arg=dataclasses.replace(output.arg, name=renamed[name])) \
            if name in renamed else output

    return dataclasses.replace(signature, output_specs=[spec(output) for output in signature.output_specs])


class _Rewrite:
    """Applies a plan to a copy of the graph; returns the nodes it made."""

    def __init__(self, graph, plan: Plan):
        self.graph, self.plan = graph, plan
        self.fresh: set = set()
        self.validity: dict = {}  # axis size expression -> its bool vector node
        self.renamed: dict = {}  # a replaced node's name -> its replacement's
        self.by_name = {node.name: node for node in graph.nodes}

    def run(self) -> set:
        for node in list(self.graph.nodes):
            action = self.plan.actions.get(node.name)
            if action is not None:
                self.fresh.add(node)  # its arguments change: its value is worked out again
                getattr(self, "_" + action[0])(node, *action[1:])
        return self.fresh

    def op(self, target, *args, like=None, **kwargs):
        node = self.graph.call_function(target, args, kwargs)
        if like is not None and "stack_trace" in like.meta:
            node.meta["stack_trace"] = like.meta["stack_trace"]
        self.fresh.add(node)
        return node

    def dense(self, size) -> int:
        return full_length(size, self.plan.dense)

    def valid(self, size, like):
        """The bool vector of an axis (inserted before `like` the first time it is needed)."""
        import torch

        aten = torch.ops.aten
        if size in self.validity:
            return self.validity[size]
        parts = []
        for part in self.plan.layouts.get(size, (size,)) if not isinstance(size, int) else (size,):
            if isinstance(part, int):
                parts.append(self.op(aten.full.default, [part], True, like=like, dtype=torch.bool))
                continue
            if isinstance(part, tuple):  # ("repeat", rows, n): each row's validity n times over
                _, rows, times = part
                count = self.dense(rows)
                column = self.op(aten.view.default, self.valid(rows, like), [count, 1], like=like)
                spread = self.op(aten.expand.default, column, [count, times], like=like)
                laid_out = self.op(aten.clone.default, spread, like=like)
                parts.append(self.op(aten.view.default, laid_out, [count * times], like=like))
                continue
            mask_name, inner = self.plan.masks[part]
            mask = self.by_name[mask_name]
            vector = mask if len(val_of(mask).shape) == 1 else self.op(aten.view.default, mask, [-1], like=like)
            if inner is not None:
                vector = self.op(aten.logical_and.default, vector, self.valid(inner, like), like=like)
            parts.append(vector)
        vector = parts[0] if len(parts) == 1 else self.op(aten.cat.default, parts, like=like)
        self.validity[size] = vector
        return vector

    def spread(self, size, axis: int, rank: int, like):
        """The validity vector of `size` viewed to broadcast at `axis` of a tensor of `rank` axes."""
        import torch

        vector = self.valid(size, like)
        if rank == 1:
            return vector
        shape = [1] * rank
        shape[axis] = self.dense(size)
        return self.op(torch.ops.aten.view.default, vector, shape, like=like)

    def _select(self, node, k: int, rank: int, dims: list) -> None:
        import torch

        source = node.args[0]
        with self.graph.inserting_before(node):
            full = source
            if rank != 1:
                full = self.op(torch.ops.aten.view.default, source,
                               dims[:k] + [math.prod(dims[k:k + rank])] + dims[k + rank:], like=node)
        node.replace_all_uses_with(full)
        self.graph.erase_node(node)
        self.fresh.discard(node)

    def _coordinates(self, node, shape: list) -> None:
        """nonzero(mask) as every position's coordinates, in row-major order: (n, rank)."""
        import torch

        aten = torch.ops.aten
        count = math.prod(shape)
        with self.graph.inserting_before(node):
            flat = self.op(aten.arange.start_step, 0, count, 1, like=node, dtype=torch.int64)
            columns, stride = [], count
            for size in shape:
                stride //= size
                column = flat if stride == 1 else self.op(aten.div.Scalar_mode, flat, stride, like=node,
                                                          rounding_mode="floor")
                column = column if size * stride == count else self.op(aten.remainder.Scalar, column, size, like=node)
                columns.append(self.op(aten.view.default, column, [count, 1], like=node))
            grid = columns[0] if len(columns) == 1 else self.op(aten.cat.default, columns, 1, like=node)
        node.replace_all_uses_with(grid)
        self.graph.erase_node(node)
        self.fresh.discard(node)

    def _drop(self, node) -> None:
        self.graph.erase_node(node)
        self.fresh.discard(node)

    def _gather(self, node, positions) -> None:
        import torch

        aten = torch.ops.aten
        with self.graph.inserting_before(node):
            args = list(node.args)
            key = str(node.target)
            for position, *counted in positions:
                index = args[1][position] if key == "aten.index.Tensor" else args[position]
                safe = self.op(aten.where.ScalarOther, self.spread(*counted, node), index, 0, like=node)
                if key == "aten.index.Tensor":
                    args[1] = [safe if i == position else x for i, x in enumerate(args[1])]
                else:
                    args[position] = safe
            node.args = tuple(args)

    def _reduce(self, node, counted: tuple, identity) -> None:
        """The reduction over the kept elements: the dropped ones its identity (0, or the lowest or
        highest value of the dtype)."""
        import torch

        with self.graph.inserting_before(node):
            kept = self.op(torch.ops.aten.where.ScalarOther, self.spread(*counted, node), node.args[0], identity,
                           like=node)
        node.args = (kept, *node.args[1:])

    def _mean(self, node, counted: tuple, others: int) -> None:
        """mean(x, dims) over a counted axis: sum(where(valid, x, 0), dims) / (kept count * the other
        reduced axes' elements); no element kept: 0 / 0, NaN, as torch's mean of nothing."""
        import torch

        aten = torch.ops.aten
        self._reduce(node, counted, 0)
        node.target = aten.sum.dim_IntList if node.target is aten.mean.dim else aten.sum.default
        with self.graph.inserting_before(node.next):  # in order (inserting_after would reverse them)
            count = self.op(aten.sum.default, self.valid(counted[0], node), like=node)
            scaled = self.op(aten.mul.Scalar, count, others, like=node)
            mean = self.op(aten.div.Tensor, node, scaled, like=node)
        node.replace_all_uses_with(mean, delete_user_cb=lambda user: user is not mean)
        self.renamed[node.name] = mean.name

    def _spare_slot(self, node, dims: list, index_at, counted: tuple, shape: list, dtype) -> None:
        """The destination (of `shape`) one slot longer along the first indexed axis; a dropped
        element's index there is that slot, along the other indexed axes 0."""
        import torch

        aten = torch.ops.aten
        target = node.args[0]
        dim, length = dims[0], shape[dims[0]]
        args = list(node.args)
        indices = list(args[1]) if index_at is None else None
        with self.graph.inserting_before(node):
            spare = self.op(aten.full.default, shape[:dim] + [1] + shape[dim + 1:], 0, like=node, dtype=dtype)
            args[0] = self.op(aten.cat.default, [target, spare], dim, like=node)
            valid = self.spread(*counted, node)
            for axis in dims:
                index = args[index_at] if index_at is not None else indices[axis]
                # -1 is the last, as torch reads it
                wrapped = self.op(aten.remainder.Scalar, index, shape[axis], like=node)
                safe = self.op(aten.where.ScalarOther, valid, wrapped, length if axis == dim else 0, like=node)
                if index_at is not None:
                    args[index_at] = safe
                else:
                    indices[axis] = safe
        if indices is not None:
            args[1] = indices
        node.args = tuple(args)
        with self.graph.inserting_after(node):
            trimmed = self.op(aten.slice.Tensor, node, dim, 0, length, like=node)
        node.replace_all_uses_with(trimmed, delete_user_cb=lambda user: user is not trimmed)
        self.renamed[node.name] = trimmed.name

    def _write_back(self, node, mask_dims: list, trailing: int, selected: list | None) -> None:
        """`x[m] = v` with `v` selected by `m` (or broadcast): where(m, v, x); accumulating, x + where(m, v, 0)."""
        import torch

        aten = torch.ops.aten
        target, indices, values = node.args[:3]
        accumulate = node.args[3] if len(node.args) > 3 else False
        mask = indices[0]
        with self.graph.inserting_before(node):
            if trailing:
                mask = self.op(aten.view.default, mask, mask_dims + [1] * trailing, like=node)
            if selected is not None and len(mask_dims) != 1:  # the mask's axes were flattened into one
                values = self.op(aten.view.default, values, mask_dims + selected[1:], like=node)
            if accumulate:
                added = self.op(aten.where.ScalarOther, mask, values, 0, like=node)
                result = self.op(aten.add.Tensor, target, added, like=node)
            else:
                result = self.op(aten.where.self, mask, values, target, like=node)
        node.replace_all_uses_with(result)
        self.renamed[node.name] = result.name
        self.graph.erase_node(node)
        self.fresh.discard(node)


"""The extracted program as kernels: a representative per e-class, and a set of materialized classes.

`ChosenGraph` is the program the representatives spell: every class live from the outputs,
with its consumers, kept up to date as a representative changes (a fold's one-pass or
multi-pass form). `Kernels` cuts it at a set of materialized classes (the boundaries): a
kernel per live boundary, computing its region (the classes reachable from it without
crossing another boundary), lowered to Loop IR and priced. Every walk here is a loop over an
explicit stack: programs are thousands of ops deep.

Buffers of materialized classes have provisional names while boundaries are searched
(`%<class>`: never an input's name); `Kernels.program` names them after the Tensor IR values
they came from, as the printed program shows them.
"""

from __future__ import annotations

import logging

from emmy.affine import gathered_buffers
from emmy.egraph.layout import decode_layout
from emmy.egraph.representatives import HEAVY
from emmy.egraph.view import ClassRef, EGraphView, ENode, reaches
from emmy.egraph.lowering import KernelLowering, KernelTooLarge
from emmy.loop_ir.nodes import Kernel, LoopProgram, fresh_name, kernel_index_tensors
from emmy.loop_ir.validate import FoldReadError, UndefinedValueError
from emmy.schedule.pricing import KernelPrice
from emmy.tensor_ir.nodes import Input, TensorType, Weight

log = logging.getLogger("emmy.egraph")
LIGHT = ("unary", "binary", "select", "reindex")  # computed per element where they are used


class ChosenGraph:
    """The live part of the e-graph under a choice of representatives."""

    def __init__(self, view: EGraphView, choice: dict[str, ENode], graph):
        self.view = view
        self.choice = dict(choice)
        self.outputs = [(unwrap(self.choice, view.class_of_name(name)), name) for name in graph.outputs]
        self.buffer_kinds = {n.name: "input" if isinstance(n, Input) else "weight"
                             for n in graph.nodes if isinstance(n, (Input, Weight))}
        self.leaf_types = {n.name: n.type for n in graph.nodes if isinstance(n, (Input, Weight))}
        # Values the program indexes by (an argmax, clamped ids): kernels read them by name inside
        # index expressions, not as operands, so each is kept in a buffer like an output.
        self.kept = [(unwrap(self.choice, view.class_of_name(name)), name) for name in graph.index_tensors]
        self.kept_class = {name: cid for cid, name in self.kept}
        self.refs: dict[str, int] = {}  # live uses of a class: by live parents' nodes and as an output
        self.consumers: dict[str, dict[str, int]] = {}  # class -> live parent class -> uses
        for cid, _ in self.anchors():
            self._acquire(cid)

    def anchors(self) -> list[tuple[str, str]]:
        """(class, name) of every value a program keeps in memory whatever the cut: its outputs,
        then the values it indexes by."""
        return self.outputs + self.kept

    # -- liveness ---------------------------------------------------------------
    def live(self, cid: str) -> bool:
        return self.refs.get(cid, 0) > 0

    def _acquire(self, root: str) -> None:
        stack = [root]
        while stack:
            cid = stack.pop()
            self.refs[cid] = self.refs.get(cid, 0) + 1
            if self.refs[cid] == 1:  # born: its representative's operands are used now
                for child in self.choice[cid].children:
                    self.consumers.setdefault(child, {})
                    self.consumers[child][cid] = self.consumers[child].get(cid, 0) + 1
                    stack.append(child)

    def _release(self, root: str) -> None:
        stack = [root]
        while stack:
            cid = stack.pop()
            self.refs[cid] -= 1
            if self.refs[cid] == 0:  # dead: its operands lose this use
                for child in self.choice[cid].children:
                    self._forget_consumer(child, cid)
                    stack.append(child)

    def _forget_consumer(self, child: str, parent: str) -> None:
        uses = self.consumers[child]
        uses[parent] -= 1
        if uses[parent] == 0:
            del uses[parent]

    def set_choice(self, cid: str, node: ENode) -> None:
        """Make `node` the representative of live class `cid`, keeping liveness and consumers
        (the new operands are taken before the old ones are let go, so shared ones stay alive)."""
        old = self.choice[cid]
        self.choice[cid] = node
        for child in node.children:
            self.consumers.setdefault(child, {})
            self.consumers[child][cid] = self.consumers[child].get(cid, 0) + 1
            self._acquire(child)
        for child in old.children:
            self._forget_consumer(child, cid)
            self._release(child)

    def reaches(self, start: str, goal: str) -> bool:
        """Whether the representatives lead from `start` to `goal` (a cycle check for a new choice)."""
        return reaches(start, goal, lambda cid: self.choice[cid].children)

    # -- structure --------------------------------------------------------------
    def order(self) -> list[str]:
        """Live classes, operands before the classes that read them (a post-order from the outputs,
        in output order and operand order: a canonical order)."""
        done: set[str] = set()
        order: list[str] = []
        for root, _ in self.anchors():
            stack = [(root, False)]
            while stack:
                cid, expanded = stack.pop()
                if cid in done:
                    continue
                if expanded:
                    done.add(cid)
                    order.append(cid)
                    continue
                stack.append((cid, True))
                stack.extend((c, False) for c in reversed(self.choice[cid].children) if c not in done)
        return order

    def roots(self) -> frozenset:
        return frozenset(c for c, _ in self.anchors())

    def required(self) -> frozenset:
        """Boundaries every program has: the outputs, the values it indexes by, and classes whose
        only form is a kernel."""
        forced = {self.choice[c].args[0] for c in self.refs if self.refs[c] > 0 and self.choice[c].kind == "mat"}
        return self.roots() | forced

    def optional(self, cid: str) -> bool:
        """A class whose fused and materialized forms are equal (the fusion rules said so)."""
        return any(n.kind == "mat" and n.args[0] == cid for n in self.view.classes[cid])

    def is_heavy(self, cid: str) -> bool:
        return self.choice[cid].kind in HEAVY

    def numel(self, cid: str) -> int:
        return self.view.type(cid).numel

    def parents(self, cid: str) -> list[str]:
        return sorted(self.consumers.get(cid, {}))

    def buffer_type(self, name: str) -> TensorType:
        for cid in self.refs:
            node = self.choice[cid]
            if self.refs[cid] > 0 and node.kind == "buffer" and node.args[0] == name:
                return self.view.type(cid)
        raise KeyError(name)


class Kernels:
    """A cut of a ChosenGraph: the materialized classes, each live one a kernel, lowered and priced.

    `price(items)` prices [(Kernel, buffer types)] in one batch -> [KernelPrice]."""

    def __init__(self, chosen: ChosenGraph, boundaries, price):
        self.chosen = chosen
        self.boundaries: set[str] = set(boundaries)
        self.price_batch = price
        self.regions: dict[str, frozenset] = {}  # kernel root -> its region
        self.members: dict[str, set[str]] = {}  # class -> roots of the kernels whose region holds it
        self.prices: dict[str, KernelPrice] = {}
        self._lowered: dict[tuple, list] = {}  # region key -> [Kernel, KernelPrice or None]
        self.deferred: list | None = None  # while not None, new kernels are collected, not priced
        self._leaf_types: dict[str, TensorType] = {}
        self.lowered_count = 0  # kernels lowered (the search's work, for tests and reports)
        self.refused_count = 0  # ... of which past the statement budget (TOO_LARGE)
        self.unbudgeted = True  # the starting cut is lowered whatever its size; a move's kernels are not
        self.rebuild()
        self.unbudgeted = False

    # -- kernels ----------------------------------------------------------------
    def live_roots(self) -> set[str]:
        return {c for c in self.boundaries if self.chosen.live(c)}

    def region(self, root: str) -> frozenset:
        seen, stack = set(), [root]
        while stack:
            cid = stack.pop()
            if cid in seen:
                continue
            seen.add(cid)
            if cid != root and cid in self.boundaries:
                continue
            stack.extend(self.chosen.choice[cid].children)
        return frozenset(seen)

    def rebuild(self) -> None:
        """Every kernel from scratch (the initial cut)."""
        for root in list(self.regions):
            self._drop(root)
        roots = sorted(self.live_roots())
        self._add(roots)

    def _drop(self, root: str) -> None:
        for cid in self.regions.pop(root):
            self.members[cid].discard(root)
        self.prices.pop(root, None)

    def _add(self, roots) -> None:
        todo = []
        for root in roots:
            region = self.region(root)
            self.regions[root] = region
            for cid in region:
                self.members.setdefault(cid, set()).add(root)
            entry = self._entry(root, region)
            if entry[1] is None:
                todo.append((root, entry))
            else:
                self.prices[root] = entry[1]
        if not todo:
            return
        if self.deferred is not None:  # a speculative pass: price later, all at once
            for root, entry in todo:
                self.deferred.append(entry)
                self.prices[root] = PENDING
            return
        prices = self.price_batch([(entry[0], self.types_of(entry[0])) for _, entry in todo])
        for (root, entry), price in zip(todo, prices):
            entry[1] = price
            self.prices[root] = price

    def price_deferred(self) -> None:
        """Price every kernel a speculative pass lowered, in one batch (one schedule-space build for
        all their new shapes), then stop deferring."""
        entries, self.deferred = [e for e in (self.deferred or []) if e[1] is None], None
        unique = list({id(e): e for e in entries}.values())
        if unique:
            for entry, price in zip(unique, self.price_batch([(e[0], self.types_of(e[0])) for e in unique])):
                entry[1] = price

    def _entry(self, root: str, region: frozenset) -> list:
        """[the Loop IR kernel of `root` under the current cut (provisional buffer names), its price
        or None], memoized by the region's structure: a kernel of another layer that computes the
        same thing from buffers of the same types is not lowered again (its price, by signature,
        is the same; only the final program's kernels are lowered with their own names)."""
        deep = self._shared_chain(root, region) > MAX_SHARED_CHAIN  # depends on readers outside the region
        key = (self._structure(root), deep)
        found = self._lowered.get(key)
        if found is None and deep and not self.unbudgeted:  # the starting cut is taken as it is
            found = self._lowered[key] = [None, TOO_DEEP]
            self.refused_count += 1
        if found is None:
            choice = self.chosen.choice
            leaves = {c: provisional(c) for c in region if c in self.boundaries}
            budget = None if self.unbudgeted else STATEMENTS_PER_CLASS * len(region) + STATEMENTS_BASE
            tables = {name: provisional(cid) for cid, name in self.chosen.kept}
            lowering = KernelLowering(self.chosen.view, choice, leaves, max_statements=budget, tables=tables)
            try:
                found = [lowering.lower(root, f"k_{provisional(root)}", provisional(root)), None]
            except KernelTooLarge as refused:
                log.debug("a move's kernel recomputes too much: %s", refused)
                found = [None, TOO_LARGE]
                self.refused_count += 1
            except (FoldReadError, UndefinedValueError) as bug:
                # a candidate the lowering got wrong costs that candidate, not the compile; the final
                # program's kernels are lowered (and checked) again, so none of them can be one
                log.warning("a candidate kernel was refused (an emmy lowering bug): %s", bug)
                found = [None, KernelPrice(None, 0.0, 1, "", f"lowered wrong: {bug}")]
                self.refused_count += 1
            self._lowered[key] = found
            self.lowered_count += 1
        return found

    def _shared_chain(self, root: str, region: frozenset) -> int:
        """The most fused values with several consumers met on one path down the region: each is
        computed again in every kernel that reads it, and one inside another compounds (an LSTM's
        cell state, each step's kernel recomputing every step before it)."""
        chosen, boundaries = self.chosen, self.boundaries
        shared = {c for c in region if c != root and c not in boundaries and len(chosen.consumers.get(c, ())) > 1}
        if len(shared) <= MAX_SHARED_CHAIN:
            return len(shared)
        depth: dict[str, int] = {}
        stack = [(root, False)]
        while stack:  # children before parents, without recursion
            cid, ready = stack.pop()
            if cid in depth:
                continue
            inside = cid == root or cid not in boundaries
            children = [c for c in chosen.choice[cid].children if c in region] if inside else []
            if not ready:
                stack.append((cid, True))
                stack.extend((c, False) for c in children if c not in depth)
                continue
            depth[cid] = max((depth[c] for c in children), default=0) + (cid in shared)
        return depth[root]

    def _structure(self, root: str) -> tuple:
        """The region of `root` as a canonical tuple: its classes in a depth-first order from the root,
        each as its representative's kind and arguments (operands by position in that order), the
        materialized leaves by their types, input and weight buffers without their names."""
        choice, boundaries, view = self.chosen.choice, self.boundaries, self.chosen.view
        position: dict[str, int] = {}
        order: list[str] = []
        stack = [root]
        while stack:
            cid = stack.pop()
            if cid in position:
                continue
            position[cid] = len(order)
            order.append(cid)
            if cid == root or cid not in boundaries:
                stack.extend(reversed(choice[cid].children))
        parts = []
        for cid in order:
            if cid != root and cid in boundaries:
                parts.append(("leaf", view.type(cid)))
                continue
            node = choice[cid]
            args = tuple(position[a] if isinstance(a, ClassRef) else a for a in node.args)
            parts.append((node.kind, args[1:] if node.kind == "buffer" else args))
        return tuple(parts)

    def types_of(self, kernel: Kernel) -> dict[str, TensorType]:
        """Buffer name -> type for the buffers a kernel reads and writes, index tensors included."""
        from emmy.loop_ir.signature import buffers_of

        types = {name: self.chosen.view.type(name[1:]) if name.startswith("%") else self.chosen.leaf_types[name]
                 for name in kernel_index_tensors(kernel)}
        for name in buffers_of(kernel):
            if name.startswith("%"):
                types[name] = self.chosen.view.type(name[1:])
            else:
                if name not in self._leaf_types:
                    self._leaf_types[name] = self.chosen.buffer_type(name)
                types[name] = self._leaf_types[name]
        return types

    def total(self) -> tuple:
        """The program's price: (unpriceable kernels, seconds, bytes, launches, arithmetic seconds)."""
        unpriced = sum(1 for p in self.prices.values() if p.seconds is None)
        return (unpriced, sum(p.seconds or 0.0 for p in self.prices.values()),
                sum(p.bytes for p in self.prices.values()), sum(p.launches for p in self.prices.values()),
                sum(p.compute_seconds for p in self.prices.values()))

    # -- changes ----------------------------------------------------------------
    def affected(self, touched) -> set[str]:
        """Kernels whose region holds a touched class, and touched classes that are kernels."""
        found: set[str] = set()
        for cid in touched:
            found |= self.members.get(cid, set())
            if cid in self.regions:
                found.add(cid)
        return found

    def refresh(self, old_roots) -> None:
        """After the cut or the representatives changed: the kernels in `old_roots` (those whose
        region held a changed class) are rebuilt, kernels of boundaries that came alive are
        built, and kernels of boundaries no longer live are dropped."""
        for root in old_roots:
            if root in self.regions:
                self._drop(root)
        live = self.live_roots()
        for root in [r for r in self.regions if r not in live]:
            self._drop(root)
        self._add(sorted(live - set(self.regions)))

    # -- the final program ---------------------------------------------------------
    def program(self) -> LoopProgram:
        """The cut as a LoopProgram: buffers named after Tensor IR values, kernels in dependency order."""
        chosen = self.chosen
        roots = self.live_roots()
        names = self.buffer_names(roots)
        kernels = []
        kept = {name: names[cid] for cid, name in chosen.kept}
        for root in self.kernel_order(roots):
            lowering = KernelLowering(chosen.view, chosen.choice, {c: names[c] for c in roots}, tables=kept)
            kernels.append(lowering.lower(root, f"k_{names[root]}", names[root]))
        # index tensors are read inside index expressions (Gathered atoms), not as e-nodes
        tables = set().union(*(kernel_index_tensors(k) for k in kernels)) if kernels else set()

        def leaves(kind):
            found = set(self._leaves(kind)) | {t for t in tables if chosen.buffer_kinds.get(t) == kind}
            return tuple((n, chosen.leaf_types[n]) for n in sorted(found))

        return LoopProgram(tuple(kernels), leaves("input"), leaves("weight"),
                           tuple(names[cid] for cid, _ in chosen.outputs))

    def buffer_names(self, roots) -> dict[str, str]:
        chosen = self.chosen
        names: dict[str, str] = {}
        taken = set(chosen.buffer_kinds)
        for cid, name in chosen.outputs:
            if cid in names:
                continue  # two outputs with one value share its buffer
            # An output that is an input (or weight) as it stands still gets a buffer of its own.
            while name in taken:
                name += "_out"
            names[cid] = name
            taken.add(name)
        for cid, name in chosen.kept:  # a value indexed by keeps its Tensor IR name where it is free
            if cid not in names and name not in taken:
                names[cid] = name
                taken.add(name)
        for cid in sorted(roots):
            if cid in names:
                continue
            names[cid] = fresh_name(chosen.view.names.get(cid, "t"), taken)
            taken.add(names[cid])
        return names

    def kernel_order(self, roots) -> list[str]:
        """Kernels after the kernels they read: a post-order from the outputs (reads by class id)."""
        order: list[str] = []
        state: dict[str, int] = {}
        for output, _ in self.chosen.anchors():
            stack = [(output, False)]
            while stack:
                root, expanded = stack.pop()
                if expanded:
                    if state.get(root) != 2:
                        state[root] = 2
                        order.append(root)
                    continue
                if state.get(root):
                    continue
                state[root] = 1
                stack.append((root, True))
                region = self.region(root)
                deps = sorted((region & roots | self._indexed_by(region)) - {root})
                stack.extend((d, False) for d in reversed(deps) if not state.get(d))
        return order

    def _indexed_by(self, region) -> set[str]:
        """The classes of the computed values a region's index maps gather by."""
        kept = self.chosen.kept_class
        if not kept:
            return set()
        found = set()
        for cid in region:
            node = self.chosen.choice[cid]
            if node.kind == "reindex":
                layout = decode_layout(node.args[1])
                found |= {kept[n] for n in gathered_buffers((*layout.index, *(g.expr for g in layout.guards)))
                          if n in kept}
        return found

    def _leaves(self, kind: str) -> list[str]:
        chosen = self.chosen
        found = set()
        for cid, count in chosen.refs.items():
            node = chosen.choice[cid]
            if count > 0 and node.kind == "buffer" and chosen.buffer_kinds.get(node.args[0]) == kind:
                found.add(node.args[0])
        return sorted(found)


PENDING = KernelPrice(0.0, 0.0, 0, "", "not priced yet")
# A move's kernel may lower to at most this many statements per class of its region (plus a base):
# the reference workloads and a few hundred models stay under 12 per class, while fusing an unrolled
# LSTM's steps into one kernel recomputes each step at every slice the next reads (290 per class,
# growing fourfold a step). Such a kernel is priced as unpriceable, so no move keeps it.
STATEMENTS_PER_CLASS = 16
STATEMENTS_BASE = 256
TOO_LARGE = KernelPrice(None, 0.0, 1, "", "recomputes its fused work past the statement budget")
# A kernel may recompute shared values nested at most this deep (a value several kernels read,
# fused, whose own work holds another such value): deeper, the recomputation compounds along
# a chain as long as the program (an unrolled recurrence's state), in statements and in time.
MAX_SHARED_CHAIN = 3
TOO_DEEP = KernelPrice(None, 0.0, 1, "", "recomputes shared values nested past MAX_SHARED_CHAIN")


def provisional(cid: str) -> str:
    return f"%{cid}"


def unwrap(choice: dict[str, ENode], cid: str) -> str:
    """An output whose only form is mat(child) is computed by the child's kernel."""
    while choice[cid].kind == "mat":
        cid = choice[cid].args[0]
    return cid

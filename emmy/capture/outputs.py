"""What a captured program returns: the nesting of its outputs (a tensor, a tuple, a dict, ...) and
the name of each output tensor, so that a compiled program returns what the module returned and
tables name outputs as the user does, never by a decomposition temporary (`add_5`).

Names: a single tensor or a tuple/list of them is `out0`, `out1`, ...; a dict's or a named tuple's
entries keep their keys (`logits`, `cache.k` where nested). A complex output is computed as its
pairs (emmy.decompose.complex_pairs) and handed back as complex (torch.view_as_complex).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass


@dataclass(frozen=True)
class OutputStructure:
    spec: str | None  # torch.utils._pytree.treespec_dumps of the returned structure; None: flat tuple
    names: tuple[str, ...]  # the output tensors'
    # leaves that are no tensor (a None in place of a cache, a count): (leaf position, value), returned as they are
    constants: tuple[tuple[int, object], ...] = ()
    complex: tuple[int, ...] = ()  # positions among the output tensors computed as (.., 2) pairs of a complex one
    # torch's named results (torch.return_types.max) inside the structure, whose spec does not serialize: `spec`
    # holds a tuple there; each is (its child positions from the root, its type's name), rebuilt when packing
    structseqs: tuple[tuple[tuple[int, ...], str], ...] = ()

    @classmethod
    def flat(cls, count: int, complex: tuple[int, ...] = ()) -> OutputStructure:
        return cls(None, tuple(f"out{k}" for k in range(count)), (), complex)

    @classmethod
    def of_exported(cls, exported) -> OutputStructure:
        import torch.utils._pytree as pytree

        user = [s for s in exported.graph_signature.output_specs if s.kind.name in ("USER_OUTPUT", "LOSS_OUTPUT")]
        constants = tuple((k, s.arg.value) for k, s in enumerate(user) if type(s.arg).__name__ == "ConstantArgument")
        values = {n.name: n.meta.get("val") for n in exported.graph.nodes}
        tensors = [s for s in user if type(s.arg).__name__ != "ConstantArgument"]
        complex = tuple(k for k, s in enumerate(tensors) if _is_complex(values.get(getattr(s.arg, "name", None))))
        spec = exported.call_spec.out_spec
        if spec is None:
            return cls.flat(len(user) - len(constants), complex)
        plain, structseqs = _without_structseqs(spec)
        try:
            text = pytree.treespec_dumps(plain)
        except Exception:  # a container pytree cannot serialize: hand back a flat tuple
            return cls.flat(spec.num_leaves - len(constants), complex)
        paths = _with_field_names(spec, _leaf_paths(spec))
        fixed = {k for k, _ in constants}
        tensors = [k for k in range(len(paths)) if k not in fixed]
        return cls(text, tuple(_name(paths[k], n) for n, k in enumerate(tensors)), constants, complex, structseqs)

    def with_fixed_tensors(self, fixed: tuple) -> OutputStructure:
        """This structure with some output tensors handed back as they are, not computed (a tensor
        with no elements): `fixed` holds (position among the output tensors, the tensor)."""
        if not fixed:
            return self
        leaves = [k for k in range(len(self.names) + len(self.constants)) if k not in dict(self.constants)]
        chosen = dict(fixed)
        names = tuple(name for n, name in enumerate(self.names) if n not in chosen)
        constants = tuple(sorted(self.constants + tuple((leaves[n], t) for n, t in chosen.items())))
        computed = [n for n in range(len(self.names)) if n not in chosen]
        return OutputStructure(self.spec, names, constants,
                               tuple(computed.index(n) for n in self.complex if n not in chosen), self.structseqs)

    def pack(self, tensors: list):
        """The outputs in the structure the program returned them: a lone tensor as itself."""
        if self.complex:
            import torch

            tensors = [torch.view_as_complex(t.contiguous()) if n in self.complex else t for n, t in enumerate(tensors)]
        leaves, given, fixed = [], iter(tensors), dict(self.constants)
        for k in range(len(tensors) + len(fixed)):
            leaves.append(fixed[k] if k in fixed else next(given))
        if self.spec is None:
            return leaves[0] if len(leaves) == 1 else tuple(leaves)
        import torch.utils._pytree as pytree

        packed = pytree.tree_unflatten(leaves, pytree.treespec_loads(self.spec))
        for path, name in sorted(self.structseqs, key=lambda mark: -len(mark[0])):  # inner ones first
            packed = _rebuilt_at(packed, path, name)
        return packed


def _is_complex(value) -> bool:
    return bool(getattr(getattr(value, "dtype", None), "is_complex", False))


def _without_structseqs(spec):
    """`spec` with each of torch's named results (torch.return_types.*: pytree has no serialized name for
    them) replaced by a tuple of the same children, and where they were: (child positions, type name)."""
    import torch.return_types
    import torch.utils._pytree as pytree

    marks = []

    def plain(node, path):  # recursion as deep as the returned structure's nesting, never per op
        if node.is_leaf():
            return node
        children = [plain(child, path + (k,)) for k, child in enumerate(node.children())]
        kind = node.type
        if getattr(kind, "__module__", None) == "torch.return_types" and \
                getattr(torch.return_types, kind.__name__, None) is kind:
            marks.append((path, kind.__name__))
            return pytree.TreeSpec(tuple, None, children)
        return pytree.TreeSpec(kind, node.context, children)

    return plain(spec, ()), tuple(marks)


def _with_field_names(spec, paths: list[tuple]) -> list[tuple]:
    """Leaf paths whose steps into one of torch's named results use its field names (`values`,
    `indices`), as a named tuple's do, where pytree numbers them."""
    import torch.utils._pytree as pytree

    steps, stack = [], [(spec, ())]
    while stack:  # depth first, children in order: the leaves' order; each leaf's (node, child) steps
        node, trail = stack.pop()
        if node.is_leaf():
            steps.append(trail)
            continue
        stack.extend(reversed([(child, trail + ((node, k),)) for k, child in enumerate(node.children())]))
    named = []
    for path, trail in zip(paths, steps):
        keys = list(path)
        for depth, (node, k) in enumerate(trail):
            fields = getattr(node.type, "__match_args__", ())
            if node.type.__module__ == "torch.return_types" and k < len(fields) and depth < len(keys):
                keys[depth] = pytree.GetAttrKey(fields[k])
        named.append(tuple(keys))
    return named


def _rebuilt_at(value, path: tuple[int, ...], name: str):
    """`value` with the tuple at child positions `path` made torch.return_types.<name> again; the
    containers on the way (tuple, list, dict, named tuple: what pytree gives back) are copied."""
    if not path:
        import torch.return_types

        return getattr(torch.return_types, name)(value)
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        key = list(value)[head]
        rebuilt = copy.copy(value)
        rebuilt[key] = _rebuilt_at(value[key], rest, name)
        return rebuilt
    items = list(value)
    items[head] = _rebuilt_at(items[head], rest, name)
    if isinstance(value, list):
        return items
    return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)


def _leaf_paths(spec) -> list[tuple]:
    """Each leaf's path of keys through the returned structure, as pytree gives it; a container
    registered without key paths (transformers' ModelOutput: torch's pytree then refuses) has them
    read from its spec: a node whose context lists one string per child names them, as a dict's
    keys, else its children are numbered."""
    import torch.utils._pytree as pytree

    try:
        return [path for path, _ in pytree.tree_flatten_with_path(pytree.tree_unflatten(range(spec.num_leaves),
                                                                                          spec))[0]]
    except ValueError:
        paths, stack = [], [(spec, ())]
        while stack:  # depth first, children in order: the leaves' order
            node, prefix = stack.pop()
            if node.is_leaf():
                paths.append(prefix)
                continue
            children, context = node.children(), node.context
            named = isinstance(context, (list, tuple)) and len(context) == len(children) and \
                all(isinstance(c, str) for c in context)
            keys = [pytree.MappingKey(c) for c in context] if named else [pytree.SequenceKey(k)
                                                                         for k in range(len(children))]
            stack.extend(reversed([(child, prefix + (key,)) for child, key in zip(children, keys)]))
        return paths


def _name(path: tuple, position: int) -> str:
    # a dict entry has a key, a named tuple's or dataclass's field a name, a sequence entry an idx
    names = [getattr(key, "key", getattr(key, "name", None)) for key in path]
    if all(n is None for n in names):  # only positions: number the tensors in order
        return f"out{position}"
    parts = [str(n if n is not None else key.idx) for n, key in zip(names, path)]
    if names[0] is None:  # inside a returned tuple: `out1.values`, as its plain tensors are `out0`
        parts[0] = f"out{parts[0]}"
    return ".".join(parts)

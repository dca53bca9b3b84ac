"""What a captured program returns: the nesting of its outputs (a tensor, a tuple, a dict, ...) and
the name of each output tensor, so that a compiled program returns what the module returned and
tables name outputs as the user does, never by a decomposition temporary (`add_5`).

Names: a single tensor or a tuple/list of them is `out0`, `out1`, ...; a dict's or a named tuple's
entries keep their keys (`logits`, `cache.k` where nested). A complex output is computed as its
pairs (emmy.decompose.complex_pairs) and handed back as complex (torch.view_as_complex).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OutputStructure:
    spec: str | None  # torch.utils._pytree.treespec_dumps of the returned structure; None: flat tuple
    names: tuple[str, ...]  # the output tensors'
    # leaves that are no tensor (a None in place of a cache, a count): (leaf position, value), returned as they are
    constants: tuple[tuple[int, object], ...] = ()
    complex: tuple[int, ...] = ()  # positions among the output tensors computed as (.., 2) pairs of a complex one

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
        try:
            text = pytree.treespec_dumps(spec)
        except Exception:  # a container pytree cannot serialize: hand back a flat tuple
            structseq = _structseq_name(spec)
            if structseq and not constants:  # torch's own named result (torch.max(x, 1)): rebuilt by its name
                names = tuple(getattr(spec.type, "__match_args__", ()))  # its fields: values, indices
                if len(names) != spec.num_leaves:
                    names = tuple(f"out{k}" for k in range(spec.num_leaves))
                return cls(STRUCTSEQ + structseq, names, (), complex)
            return cls.flat(spec.num_leaves - len(constants), complex)
        paths = _leaf_paths(spec)
        fixed = {k for k, _ in constants}
        tensors = [k for k in range(len(paths)) if k not in fixed]
        return cls(text, tuple(_name(paths[k], n) for n, k in enumerate(tensors)), constants, complex)

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
                               tuple(computed.index(n) for n in self.complex if n not in chosen))

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
        if self.spec.startswith(STRUCTSEQ):
            import torch.return_types

            return getattr(torch.return_types, self.spec[len(STRUCTSEQ):])(leaves)
        import torch.utils._pytree as pytree

        return pytree.tree_unflatten(leaves, pytree.treespec_loads(self.spec))


def _is_complex(value) -> bool:
    return bool(getattr(getattr(value, "dtype", None), "is_complex", False))


STRUCTSEQ = "structseq:"  # a spec naming one of torch.return_types, whose tree spec does not serialize


def _structseq_name(spec) -> str | None:
    """The name of torch's named result type (torch.return_types.max) a spec of plain leaves is; else None."""
    kind = getattr(spec, "type", None)
    if getattr(kind, "__module__", None) != "torch.return_types" or any(not c.is_leaf() for c in spec.children()):
        return None
    import torch.return_types

    return kind.__name__ if getattr(torch.return_types, kind.__name__, None) is kind else None


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
    return ".".join(str(n if n is not None else key.idx) for n, key in zip(names, path))

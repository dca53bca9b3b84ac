"""torch's multi-tensor (`_foreach_*`) ops, one op per tensor.

An optimizer on CUDA tensors steps every parameter at once with `_foreach_*` ops (the default
there; `foreach=True` asks for it anywhere): `_foreach_mul(grads, 0.9)`, `_foreach_addcdiv(params,
m, v, -lr)`, .... torch.compile's graph of the step holds them; emmy lowers per-tensor ops, so each
is spelled as its op applied tensor by tensor. A list argument as long as the op's tensor lists is
taken element by element (tensors, or scalars of a ScalarList), anything else is passed to every
call (a Scalar, one Tensor, alpha); a 1-D tensor of per-tensor scalars (the `.Tensor` overloads of
addcmul and addcdiv) is read element by element too.
"""

from __future__ import annotations

import functools

import torch

aten = torch.ops.aten

# _foreach_<name> whose per-tensor op is not aten.<name>
_PER_TENSOR = {"zero": lambda x: torch.zeros_like(x), "norm": "linalg_vector_norm", "max": "amax",
               "copy": lambda self, src, non_blocking=False: src.to(self.dtype).expand_as(self).clone()}


def _count(args) -> int:
    """How many tensors the op steps: the length of its first tensor list."""
    return next(len(a) for a in args if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor))


def per_tensor(name: str, overload: str):
    """The decomposition of aten._foreach_<name>.<overload>."""
    single = _PER_TENSOR.get(name, name)
    if name in ("maximum", "minimum") and overload in ("Scalar", "ScalarList"):  # aten.maximum takes tensors
        single = "clamp_min" if name == "maximum" else "clamp_max"
    op = single if callable(single) else getattr(aten, single)
    scalars_in_a_tensor = name in ("addcmul", "addcdiv") and overload == "Tensor"

    def decomposed(*args, **kwargs):
        n = _count(args)
        results = []
        for i in range(n):
            taken = [a[i] if isinstance(a, (list, tuple)) and len(a) == n else a for a in args]
            if scalars_in_a_tensor:  # (self, tensor1, tensor2, scalars[n])
                self, first, second, scalars = taken
                term = first * second if name == "addcmul" else first / second
                results.append(self + scalars[i].to(self.dtype) * term)
            elif name == "max":
                results.append(op(taken[0]))
            elif name in ("addcmul", "addcdiv") and len(taken) == 4:  # value is keyword-only
                results.append(op(*taken[:3], value=taken[3], **kwargs))
            elif name == "norm":  # (self, ord, dtype): dtype is keyword-only in linalg_vector_norm
                results.append(op(taken[0], *taken[1:2], dtype=taken[2] if len(taken) > 2 else None, **kwargs))
            else:
                results.append(op(*taken, **kwargs))
        return results

    decomposed.__name__ = f"foreach_{name}_{overload}"
    return decomposed


@functools.cache  # torch's op schemas do not change in a process; every capture builds its table
def foreach_decompositions() -> dict:
    names = sorted({s.name.split("::")[1] for s in torch._C._jit_get_all_schemas()
                    if s.name.startswith("aten::_foreach_") and not s.name.endswith("_")})
    table = {}
    for full in names:
        name = full.removeprefix("_foreach_")
        if name in ("powsum", "mm"):  # no per-tensor aten op of that name
            continue
        packet = getattr(aten, full)
        for overload in packet.overloads():
            if overload == "out" or overload.endswith("_out"):
                continue
            table[getattr(packet, overload)] = per_tensor(name, overload)
    return table

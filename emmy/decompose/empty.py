"""Tensors with no elements: nothing to compute, so no kernel computes them.

Real programs meet them: an empty key/value cache at a first decoding step (Hugging Face's caches
start as `torch.tensor([])` and are concatenated with the new keys), a batch of 0, a slice past the
end. A value of the captured graph with no elements is an `EmptyTensor`, a marker carrying only its
shape and dtype, never a Tensor IR node:

- an op whose result has no elements gives an `EmptyTensor`, whatever it reads;
- a concatenation drops its empty pieces (they contribute nothing);
- an op with elements that reads only empty tensors (a sum over a length-0 dim, a matmul whose
  inner size is 0) gives values that depend on no data: torch computes them once, at compile time,
  and they become a constant of the program;
- addmm and its kin (addmv, baddbmm, addbmm) whose factors are empty beside a full bias give
  beta * bias: the product of an inner size of 0 is zeros (a layer with no input features);
- any other op with elements that reads an empty tensor beside one with elements is refused, named;
- an empty returned tensor is handed back as it is, with no kernel (emmy.capture.outputs); an
  empty tensor the module changes in place stays as it was (there is nothing in it to change).
"""

from __future__ import annotations

from dataclasses import dataclass

from emmy.errors import UnsupportedOpError


@dataclass(frozen=True)
class EmptyTensor:
    shape: tuple[int, ...]
    dtype: object  # torch.dtype

    @classmethod
    def of(cls, val) -> EmptyTensor:
        return cls(tuple(int(s) for s in val.shape), val.dtype)

    def materialized(self):
        import torch

        return torch.empty(self.shape, dtype=self.dtype)


def has_no_elements(val) -> bool:
    """`val` (a node's FakeTensor metadata) is a tensor, or a tuple of them, with no elements at all."""
    vals = val if isinstance(val, (list, tuple)) else [val]
    tensors = [v for v in vals if hasattr(v, "shape") and hasattr(v, "numel")]
    return bool(tensors) and len(tensors) == len(vals) and all(v.numel() == 0 for v in tensors)


def empty_result(val):
    """The EmptyTensor (or tuple of them) standing for a node whose result has no elements."""
    if isinstance(val, (list, tuple)):
        return tuple(EmptyTensor.of(v) for v in val)
    return EmptyTensor.of(val)


def reads_empty(values: list) -> bool:
    return any(isinstance(v, EmptyTensor) for v in values)


def without_empty_pieces(args: list) -> list:
    """A cat's arguments with its empty pieces dropped."""
    tensors, *rest = args
    return [[t for t in tensors if not isinstance(t, EmptyTensor)], *rest]


def mixed_reads(where: str) -> UnsupportedOpError:
    """The refusal of an op reading a tensor with no elements beside one with elements."""
    return UnsupportedOpError(f"unsupported op {where}: it reads a tensor with no elements beside one with "
                              "elements; emmy computes such an op only when every tensor it reads is empty")


def computed_from_empties(node, args: list, kwargs: dict, where: str, reads_full: bool):
    """The values of `node`, whose tensor arguments all have no elements, computed by torch: they
    depend on no data (a sum over nothing is 0). Refused when it reads a tensor with elements too
    (`reads_full`)."""
    if reads_full:
        raise mixed_reads(where)

    def real(value):
        if isinstance(value, EmptyTensor):
            return value.materialized()
        if isinstance(value, (list, tuple)):
            return type(value)(real(v) for v in value)
        return value

    try:
        return node.target(*real(args), **{k: real(v) for k, v in kwargs.items()})
    except Exception as err:
        raise UnsupportedOpError(f"unsupported op {where}: computing it from its empty inputs failed "
                                 f"({type(err).__name__}: {err})") from err

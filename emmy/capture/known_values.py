"""Tensors made from Python numbers alone, and constants of the code, keep their values while a
program is exported.

torch.export runs the program on fake tensors, which have shapes but no values, so code that reads
a value branches on an unknown and is refused, even where the value is fixed by the code: a cache's
positions (`cache_position = torch.arange(past, past + n)`, then `if cache_position[0] > 0:`), a
view sized by a table's entry (`x.reshape(b, -1, int(widths[-1]))`), a default tensor argument
validated (`if temperature <= 0: raise`).
torch's fake tensors can carry a value (`FakeTensor.constant`): a one-element `torch.tensor(...)`
literal does, and an op whose arguments all carry values computes its own where it has one element
(constant propagation: `positions[0] > 0` reads a number). While emmy exports, the factories below
called with numbers alone carry their values too (up to VALUE_LIMIT elements), and so does a real
tensor the code holds (a default argument, a plain attribute: not an input, parameter or buffer,
which export made fake before tracing). torch forgets a value when a tensor is written in place by
anything without one (its alias bookkeeping, which each value here is entered in); values never
come from inputs, weights or random draws; the graph torch records is unchanged. Propagation stays
at torch's one element: raised, it ran `new_empty` for real and gave its uninitialized memory as a
value (ViLT's patch selection then indexed with it); and torch forgets a value once a view of more
than one element is taken of it (it could not follow a write through the view). Such reads (an
axis order read by `.tolist()` from a cat of aranges, Jamba's branch on its reshaped cache
positions) make export fail, and are told their values by a second export after an eager run
(emmy.capture.guarded_reads).
"""

from __future__ import annotations

import contextlib
import functools

FACTORIES = ("arange", "zeros", "ones", "full", "linspace", "eye")
VALUE_LIMIT = 4096  # elements: a table of positions, not a tensor worth computing twice


@contextlib.contextmanager
def known_values():
    """torch's factories (FACTORIES) and the real tensors a trace meets carry their values, for the
    length of an export."""
    import torch
    from torch._subclasses import fake_tensor

    originals = {name: getattr(torch, name) for name in FACTORIES}
    converting = fake_tensor.FakeTensorMode.validate_and_convert_non_fake_tensors

    def converting_with_values(mode, func, converter, flat_args, args_spec):
        return converting(mode, func, _KeepingValues(converter), flat_args, args_spec)

    for name, factory in originals.items():
        setattr(torch, name, _with_value(factory))
    fake_tensor.FakeTensorMode.validate_and_convert_non_fake_tensors = converting_with_values
    try:
        yield
    finally:
        for name, factory in originals.items():
            setattr(torch, name, factory)
        fake_tensor.FakeTensorMode.validate_and_convert_non_fake_tensors = converting


class _KeepingValues:
    """torch's fake-tensor converter, giving a small real tensor met in the middle of a trace its
    value: export made inputs, parameters and buffers fake before tracing, so such a tensor is a
    constant of the code (kornia's `temperature: Tensor = tensor(1.0)` default, a plain tensor
    attribute), and emmy compiles it in as one."""

    def __init__(self, converter):
        self._converter = converter

    def __getattr__(self, name):
        return getattr(self._converter, name)

    def from_real_tensor(self, fake_mode, tensor, make_constant: bool = False, *args, **kwargs):
        import torch

        # not a view: torch makes a view's fake tensor from its base's, without the value, and then
        # refuses to enter it as a constant (neuralop's cached grids, unsqueezed)
        make_constant = make_constant or (type(tensor) is torch.Tensor and tensor.device.type == "cpu"
                                          and tensor.numel() <= VALUE_LIMIT and not tensor.requires_grad
                                          and tensor._base is None)
        return self._converter.from_real_tensor(fake_mode, tensor, make_constant, *args, **kwargs)


def _with_value(factory):
    @functools.wraps(factory)
    def made(*args, **kwargs):
        result = factory(*args, **kwargs)
        _give_value(result, factory, args, kwargs)
        return result

    return made


def _give_value(result, factory, args: tuple, kwargs: dict) -> None:
    """Give a fake factory result its value, where numbers alone (no tensor, no symbolic size) made it."""
    import torch
    from torch._subclasses.fake_tensor import is_fake
    from torch.utils import _pytree
    from torch.utils._python_dispatch import _disable_current_modes

    if not is_fake(result) or result.constant is not None or result.device.type != "cpu":
        return
    symbolic = (torch.Tensor, torch.SymInt, torch.SymFloat)
    if any(isinstance(leaf, symbolic) for leaf in _pytree.tree_leaves((args, kwargs))):
        return  # its size may be a symbol (a size read from a tensor): no comparison of it may guard
    if result.numel() > VALUE_LIMIT:
        return
    with _disable_current_modes():  # computed for real, and not traced into the program
        value = factory(*args, **kwargs)
    result.constant = value
    result.fake_mode.fake_tensor_converter.add_constant_storage_mapping(result)

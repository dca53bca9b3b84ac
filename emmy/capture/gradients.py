"""Programs that take gradients inside themselves (torch.autograd.grad, Tensor.backward, torch.func's
grad / vjp / jacrev): a saliency map, a physics-informed residual, a score's gradient, one step of
an inner optimisation loop. torch.export refuses them (torch 2.13: "a fake tensor in the exported
program constant's list", "Cannot access data pointer of Tensor that doesn't have storage").

Where export fails, the program is traced again by make_fx on fake tensors, with the decompositions
emmy's capture uses, watching for ops run by the autograd engine. A program that ran some is taken
as that ATen graph (its parameters and buffers as the program's weights); one that ran none keeps
export's error, since make_fx might accept what export rightly refuses. Plain tensor attributes
(not parameters or buffers) are real tensors make_fx's fake mode refuses: such a program is not
taken this way.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class _AutogradWatch(TorchDispatchMode):
    """Notes whether any op ran inside the autograd engine (a backward pass)."""

    def __init__(self):
        super().__init__()
        self.backward_ran = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch._C._current_autograd_node() is not None:
            self.backward_ran = True
        return func(*args, **(kwargs or {}))


def trace_gradient_program(module: torch.nn.Module, args: tuple, keywords: dict | None):
    """An AtenGraph of `module` called on `args` (and `keywords`), if it takes gradients; else None."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils import _pytree

    from emmy.capture.aten_graph import AtenGraph
    from emmy.capture.exporting import decomposition_table, quiet_torch

    named = [*module.named_parameters(), *module.named_buffers()]
    names, weights = [n for n, _ in named], [t for _, t in named]
    leaves, structure = _pytree.tree_flatten((tuple(args), dict(keywords or {})))
    watch = _AutogradWatch()

    def program(*flat):
        call_args, call_keywords = _pytree.tree_unflatten(list(flat[len(names):]), structure)
        with watch:
            return torch.func.functional_call(module, dict(zip(names, flat[:len(names)])), call_args, call_keywords)

    try:
        with quiet_torch():
            traced = make_fx(program, decomposition_table=decomposition_table(), tracing_mode="fake")(*weights, *leaves)
    except Exception:
        return None
    if not watch.backward_ran:
        return None
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    for node, name in zip(placeholders, _input_names(module, args, keywords, names)):
        node._rename(name)  # as export names them: weights p_..., inputs by the forward's parameters
    traced.recompile()
    return AtenGraph(traced, weights={node.name: (name, tensor.detach())
                                      for node, name, tensor in zip(placeholders, names, weights)})


def _input_names(module, args: tuple, keywords: dict | None, weight_names: list[str]) -> list[str]:
    """Placeholder names: p_<weight> for weights, then each input leaf by the forward's parameter
    (`h_0`, `h_1` for the leaves of a nested one)."""
    import inspect
    import re

    from torch.utils import _pytree

    names = ["p_" + re.sub(r"\W", "_", n) for n in weight_names]
    try:
        bound = inspect.signature(module.forward).bind(*args, **(keywords or {})).arguments
    except (TypeError, ValueError):
        bound = {f"arg{k}": a for k, a in enumerate(args)} | dict(keywords or {})
    for name, value in bound.items():
        leaves = _pytree.tree_leaves(value)
        names += [name] if len(leaves) == 1 and leaves[0] is value else [f"{name}_{k}" for k in range(len(leaves))]
    return names

"""The table of ATen ops emmy decomposes, and the context each decomposition sees."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Callable

from emmy.dtypes import DType, from_torch
from emmy.tensor_ir.builder import GraphBuilder
from emmy.tensor_ir.nodes import TensorType

LOWERINGS: dict[str, Callable] = {}


def registrar(table: dict):
    """A decorator factory filling `table`: @registrar(table)("aten.x.y", ...) registers a function
    for those ATen overloads."""

    def names_of(*names: str):
        def register(fn):
            for name in names:
                table[name] = fn
            return fn

        return register

    return names_of


lowers = registrar(LOWERINGS)  # a decomposition for ATen overloads such as "aten.add.Tensor"

RANDOM_OPS = frozenset({"rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "normal",
                        "uniform", "bernoulli", "multinomial", "exponential", "poisson", "native_dropout",
                        "random", "cauchy", "log_normal", "geometric"})  # ATen ops that draw random numbers


def draws_random(key: str) -> bool:
    """Whether the ATen op "aten.<packet>.<overload>" draws random numbers."""
    return (key.split(".") + [""])[1] in RANDOM_OPS


def scalars_as_vectors(fn: Callable) -> Callable:
    """For an op over (x, dim, ...) of a 0-d x, which torch computes as on a one-element vector along
    dim 0 (index_select, gather, the scatters): its 0-d tensor arguments viewed as (1,), the op
    decomposed on those, the result viewed as 0-d."""

    @functools.wraps(fn)
    def on_vectors(ctx: "Context", x, *args, **kwargs):
        if ctx.b.shape(x) != ():
            return fn(ctx, x, *args, **kwargs)

        def lifted(value, fx_arg):
            if hasattr(fx_arg, "op") and ctx.b.shape(value) == ():  # a tensor of the graph, not a str option
                return ctx.b.reshape(value, (1,), suffix="vector")
            return value

        fx_args = ctx.node.args
        args = [lifted(a, fx_args[k + 1] if k + 1 < len(fx_args) else None) for k, a in enumerate(args)]
        kwargs = {k: lifted(v, ctx.node.kwargs.get(k)) for k, v in kwargs.items()}
        vector = fn(dataclasses.replace(ctx, out_shape=(1,)), lifted(x, fx_args[0]), *args, **kwargs)
        return ctx.b.reshape(vector, (), suffix="scalar")

    return on_vectors


@dataclass
class Context:
    """What a decomposition needs: the builder, the FX node, and its types."""

    b: GraphBuilder
    node: object  # torch.fx.Node
    where: str  # "aten.mm.default at line 1: `x @ w`", for errors
    constants: dict | None = None  # weight name -> values: where a decomposition's constant tensors go
    pairs: set = field(default_factory=set)  # names holding complex tensors as (.., 2) f32 pairs
    out_shape: tuple[int, ...] | None = None  # the output's shape, where it is computed as another's

    @property
    def name(self) -> str:
        return self.b.base

    def out_type(self, index: int | None = None) -> TensorType:
        val = self.node.meta["val"]
        if index is not None:
            val = val[index]
        shape = self.out_shape if self.out_shape is not None and index is None else tuple(int(s) for s in val.shape)
        return TensorType(shape, from_torch(val.dtype, self.where))

    def promoted(self, *fx_args) -> DType:
        """torch's result dtype for these FX arguments (tensors or scalars)."""
        import torch

        values = [a.meta["val"] if hasattr(a, "meta") else a for a in fx_args]
        return from_torch(torch.result_type(*values), self.where)

    def tensor(self, value: str, dtype: DType | None = None, shape: tuple[int, ...] | None = None) -> str:
        """`value` cast to `dtype` (cast first: it is smaller) and broadcast to `shape`."""
        if dtype is not None:
            value = self.b.cast(value, dtype)
        if shape is not None and self.b.shape(value) != tuple(shape):
            value = self.b.broadcast_to(value, shape)
        return value

    def constant(self, values, dtype: DType) -> str:
        """A tensor of known values (an arange): a weight of the program, named after this op."""
        import numpy as np

        from emmy.dtypes import to_storage

        values = np.asarray(values)
        name = self.b.weight(self.b.fresh(f"{self.name}_values"), TensorType(tuple(values.shape), dtype))
        self.constants[name] = to_storage(values, dtype)
        return name

    def folded(self, value: str) -> str | None:
        """`value` as a constant of the program when it is computed from constants alone (index
        tensors made of aranges: an unfold's window positions, a roll's shifted positions), so that
        it can be gathered by like a weight; else None. The values come from the Tensor IR
        interpreter, so they are what the program would compute."""
        from emmy.tensor_ir.interpreter import evaluate
        from emmy.tensor_ir.nodes import Constant, Input, TensorGraph, Weight, operands_of

        if self.constants is None:
            return None
        needed, stack = {value}, [value]
        while stack:  # the subgraph `value` reads, which must end in constants only
            node = self.b.by_name[stack.pop()]
            if isinstance(node, Input) or (isinstance(node, Weight) and node.name not in self.constants):
                return None
            for operand in operands_of(node):
                if operand not in needed:
                    needed.add(operand)
                    stack.append(operand)
        if isinstance(self.b.by_name[value], (Weight, Constant)):
            return None  # nothing to fold
        nodes = tuple(n for n in self.b.nodes if n.name in needed)  # the builder's order is topological
        (values,) = evaluate(TensorGraph(nodes, (value,)), {}, {k: v for k, v in self.constants.items() if k in needed})
        return self.constant(values, self.b.dtype(value))

    def operand(self, value, dtype: DType, shape: tuple[int, ...]):
        """Tensors are prepared with `tensor`; Python scalars pass through as literals."""
        return self.tensor(value, dtype, shape) if isinstance(value, str) else value

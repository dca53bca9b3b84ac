"""Walk the exported FX graph and decompose each ATen op into Tensor IR.

Placeholders become Inputs (user inputs) or Weights (parameters, buffers and
lifted constants, named by their module path: `lin.weight` -> `lin_weight`),
and their values are kept beside the graph for the interpreter.
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass

import numpy as np

# Importing the op modules fills the registry.
from emmy.decompose import (dense_linalg, elementwise, indexing, layout, linalg, nn, reductions, resample,  # noqa: F401
                            quantize, scatter, searching, sorting, windows)
from emmy.decompose import fourier  # noqa: F401  (complex ops: Fourier transforms)
from emmy.decompose.complex_pairs import is_complex, lower_complex
from emmy.decompose.empty import (EmptyTensor, computed_from_empties, empty_result, has_no_elements, mixed_reads,
                                  reads_empty, without_empty_pieces)
from emmy.decompose.masked_regions import (MaskedRegions, coordinate_grid, lower_row_product, lower_sink, masked_index,
                                          masked_regions, row_wise_args, sized_by_values)
from emmy.decompose.registry import LOWERINGS, Context, draws_random
from emmy.dtypes import DType, from_torch, real_pairs, to_numpy
from emmy.errors import EmmyError, UnsupportedDtypeError, UnsupportedOpError
from emmy.tensor_ir.builder import GraphBuilder
from emmy.tensor_ir.guards import Guards
from emmy.tensor_ir.index_values import fold_index_values
from emmy.tensor_ir.nodes import TensorGraph, TensorType


@dataclass(frozen=True)
class TensorProgram:
    """Tensor IR plus the values of its weights."""

    graph: TensorGraph
    weights: dict  # weight name -> numpy array (interpreter storage)
    # what the graph's trailing outputs (after the returned ones) update: ("input", input name) for
    # an input the module changed in place, ("weight", weight name) for a buffer it changed
    mutations: tuple = ()
    # returned tensors with no elements, which no kernel computes: (position among the returned
    # tensors, an empty torch tensor of its shape and dtype); the graph's outputs leave them out
    empty_outputs: tuple = ()
    # numbers read from the inputs that the program was compiled for (emmy.tensor_ir.guards)
    guards: Guards | None = None


def _identifier(text: str) -> str:
    name = re.sub(r"\W", "_", text)
    return name if name and not name[0].isdigit() else f"w_{name}"


def weight_values(program) -> dict[str, object]:
    """Placeholder name -> tensor, for parameters, buffers and lifted constants."""
    found = {}
    for spec in program.graph_signature.input_specs:
        kind = spec.kind.name
        if kind == "USER_INPUT":
            continue
        target = spec.target
        if target in program.state_dict:
            found[spec.arg.name] = (target, program.state_dict[target])
        elif target in program.constants:
            found[spec.arg.name] = (target, program.constants[target])
    return found


def _located(captured, node) -> str:
    where = captured.source.locate(node.meta.get("stack_trace"))
    return f"{node.target} ({where})" if where else str(node.target)


def to_tensor_ir(captured) -> TensorProgram:
    program = captured.exported
    builder = GraphBuilder()
    env: dict[str, object] = {}
    weights = weight_values(program)
    weight_arrays: dict[str, np.ndarray] = {}
    outputs: list[str] = []
    pairs: set[str] = set()
    tokens = _effect_tokens(program)
    regions = masked_regions(program.graph)
    for node in program.graph.nodes:
        if node.name in tokens:  # torch.export's ordering of side effects: nothing to compute
            env[node.name] = _TOKEN
        elif regions and node.name in regions.dropped:  # a masked region's size, read for assertions
            env[node.name] = None
        elif regions and node.name in regions.selections:  # computed in place, at the mask's shape
            env[node.name] = env[regions.selections[node.name][0]]
        elif regions and node.name in regions.coordinates:  # nonzero(mask): every position's coordinates
            builder.base = builder.fresh(_short_stem(node.name))
            env[node.name] = coordinate_grid(Context(builder, node, str(node.target), weight_arrays, pairs),
                                             regions.shapes[node.name][:-1])
        elif regions and node.name in regions.reshaped:  # a view adding or dropping unit axes
            env[node.name] = builder.reshape(env[node.args[0].name], regions.shapes[node.name])
        elif node.op == "placeholder":
            val = node.meta["val"]
            builder.origin = ""
            if has_no_elements(val) and node.name in weights:  # an empty cache: nothing to store
                env[node.name] = EmptyTensor.of(val)
                continue
            if node.name in weights and is_complex(val):  # complex kept as its (.., 2) real pairs
                target, tensor = weights[node.name]
                name = builder.weight(_identifier(target), _pairs_type(val, f"weight {target}"))
                weight_arrays[name], _ = to_numpy(real_pairs(tensor))
                pairs.add(name)
            elif node.name in weights:
                target, tensor = weights[node.name]
                where = f"weight {target}"
                type_ = TensorType(tuple(int(s) for s in val.shape), from_torch(val.dtype, where))
                name = builder.weight(_identifier(target), type_)
                weight_arrays[name], _ = to_numpy(tensor)
            elif isinstance(val, (bool, int)) or val is None:  # a flag (or a fixed int) export made a constant
                env[node.name] = val
                continue
            elif is_complex(val):  # a complex input as its (.., 2) real pairs (runtime.check_inputs views it so)
                name = builder.input(node.name, _pairs_type(val, f"input {node.name}"))
                pairs.add(name)
            else:
                type_ = TensorType(tuple(int(s) for s in val.shape), from_torch(val.dtype, f"input {node.name}"))
                name = builder.input(node.name, type_)  # an empty one too: the program still takes it
                if has_no_elements(val):
                    name = EmptyTensor.of(val)
            env[node.name] = name
        elif node.op == "call_function":
            env[node.name] = _decompose_node(captured, builder, node, env, weight_arrays, pairs, regions)
        elif node.op == "output":
            results = node.args[0]
            for r in results if isinstance(results, (list, tuple)) else [results]:
                if not hasattr(r, "op") or env.get(r.name) is _TOKEN:  # a None or a number the module returns
                    continue  # (returned as it is), or an effect token
                value = env[r.name]  # a complex one as its pairs (capture.outputs hands it back complex)
                if not isinstance(value, (str, EmptyTensor)):
                    raise UnsupportedOpError(f"unsupported output of {_located(captured, r)}: not a single tensor")
                outputs.append(value)
    guards = _guards(captured, program.graph, env, builder.nodes, weight_arrays)
    returned, updates, mutations = _returned_then_updates(program, outputs)
    empties = tuple((k, v.materialized()) for k, v in enumerate(returned) if isinstance(v, EmptyTensor))
    kept = [(u, m) for u, m in zip(updates, mutations) if not isinstance(u, EmptyTensor)]
    returned = [v for v in returned if not isinstance(v, EmptyTensor)]
    mutated = {m[1] for _, m in kept if m[0] == "weight"}
    graph, weight_arrays = fold_index_values(builder.finish(returned + [u for u, _ in kept]), weight_arrays,
                                             set(weight_arrays) - mutated)
    return TensorProgram(graph, weight_arrays, tuple(m for _, m in kept), empties, guards)


def _guards(captured, graph, env: dict, nodes, weight_arrays: dict) -> Guards | None:
    """The values emmy.capture.guarded_reads marked (node.meta["emmy_guard"]): each call checks them."""
    marked = [node for node in graph.nodes if "emmy_guard" in node.meta]
    for node in marked:
        if not isinstance(env.get(node.name), str):
            raise UnsupportedOpError(f"unsupported op {_located(captured, node)}: a number read from the inputs "
                                     "that emmy cannot compute to check on each call")
    return Guards.of(nodes, [env[node.name] for node in marked], [node.meta["emmy_guard"] for node in marked],
                     weight_arrays)


def _pairs_type(val, where: str) -> TensorType:
    """A complex tensor's type as emmy holds it: (.., 2) pairs of f32 (complex64) or f64 (complex128)."""
    part = {"torch.complex64": DType.F32, "torch.complex128": DType.F64}.get(str(val.dtype))
    if part is None:
        raise UnsupportedDtypeError(f"unsupported dtype {str(val.dtype).removeprefix('torch.')} ({where}); emmy "
                                    "takes complex64 and complex128 as pairs of f32 and f64")
    return TensorType((*(int(s) for s in val.shape), 2), part)


_TOKEN = object()  # the value of torch.export's effect tokens
CHECKS_ONLY = frozenset({"_linalg_check_errors"})  # effectful ops that only check, and compute nothing


def _effect_tokens(program) -> set[str]:
    """The names of torch.export's effect tokens, the placeholder and output that order side effects
    (a linear-algebra op's error check); the `with_effects` nodes between hand them on."""
    signature = getattr(program, "graph_signature", None)
    specs = [*getattr(signature, "input_specs", ()), *getattr(signature, "output_specs", ())]
    return {spec.arg.name for spec in specs if spec.kind.name == "TOKEN"}


def _with_effects(ctx_where: str, node):
    """A `with_effects(token, op, ...)` node: (token, nothing) for an op that only checks; else refused."""
    op = node.args[1]
    name = getattr(op, "_opname", None) or getattr(op, "__name__", str(op))
    if name in CHECKS_ONLY:
        return (_TOKEN, None)
    raise UnsupportedOpError(f"unsupported op {ctx_where}: {op} has side effects, which a compiled program "
                             "does not run")


def _returned_then_updates(program, outputs: list[str]) -> tuple[list, list, tuple]:
    """The graph's outputs as (returned ones, in-place updates, what each update changes): torch.export
    lists a module's changes to its inputs and buffers first, as outputs of their new values."""
    specs = getattr(getattr(program, "graph_signature", None), "output_specs", None)
    if specs is not None:  # constants (a None, a number) are no tensor of the graph
        specs = [s for s in specs if type(s.arg).__name__ != "ConstantArgument" and s.kind.name != "TOKEN"]
    if specs is None or len(specs) != len(outputs):
        return outputs, [], ()
    returned, updates, mutations = [], [], []
    for spec, value in zip(specs, outputs):
        kind = spec.kind.name
        if kind == "USER_INPUT_MUTATION":  # its target is the input's placeholder, the Input's name
            updates.append(value)
            mutations.append(("input", spec.target))
        elif kind in ("BUFFER_MUTATION", "PARAMETER_MUTATION"):  # a parameter: nn.Embedding's max_norm
            updates.append(value)
            mutations.append(("weight", _identifier(spec.target)))
        elif kind in ("USER_OUTPUT", "LOSS_OUTPUT"):
            returned.append(value)
        else:
            raise UnsupportedOpError(f"unsupported output kind {kind} ({spec.arg.name}): emmy returns tensors and "
                                     "updates inputs, buffers and parameters in place")
    return returned, updates, tuple(mutations)


def _name_of(value) -> str | None:
    return getattr(value, "name", None)


def _resolve(value, env):
    if hasattr(value, "op") and hasattr(value, "name"):
        return env[value.name]
    if isinstance(value, (list, tuple)):
        return type(value)(_resolve(v, env) for v in value)
    return value


def _decompose_node(captured, builder: GraphBuilder, node, env, constants: dict, pairs: set,
                    regions: MaskedRegions | None = None):
    if node.target is operator.getitem:
        source, index = node.args
        return env[source.name][index]
    key = str(node.target)
    where = _located(captured, node)
    if key == "with_effects":
        return _with_effects(where, node)
    if key == "cond":
        return _cond(captured, builder, node, env, constants, pairs)
    in_place = regions.shapes.get(node.name) if regions else None  # a masked region's op, at the mask's shape
    if regions and node.name in regions.sinks:
        builder.origin = where
        builder.base = builder.fresh(_short_stem(node.name))
        return lower_sink(Context(builder, node, where, constants, pairs), node, regions, env)
    if sized_by_values(node.meta.get("val")) and in_place is None:
        raise UnsupportedOpError.sized_by_values(where)
    if in_place is None and has_no_elements(node.meta.get("val")):  # nothing to compute, whatever it reads
        return empty_result(node.meta["val"])
    read = _flat_args(node, env)
    empty_pieces = reads_empty(read)
    if empty_pieces and key != "aten.cat.default":  # a cat drops them, below
        return _from_empties(builder, node, env, read, constants, where)
    fn = LOWERINGS.get(key) or _view_behind_copy(key)
    on_complex = is_complex(node.meta.get("val")) or any(isinstance(a, str) and a in pairs for a in read)
    if fn is None and not on_complex:
        if draws_random(key):
            raise UnsupportedOpError(f"unsupported op {where}: {key} draws random numbers, which a compiled "
                                     "program does not; pass the random tensor in as an input (dropout: "
                                     "call model.eval())")
        if key == "aten._local_scalar_dense.default":
            raise UnsupportedOpError(f"unsupported op {where}: a tensor's value read into Python (.item(), int() "
                                     "or a tensor used as a size or count), which a compiled program cannot "
                                     "know before it runs; pass the number in as a Python value")
        raise UnsupportedOpError(f"unsupported op {where}: emmy has no decomposition for {key}")
    builder.origin = where
    builder.base = builder.fresh(_short_stem(node.name))
    args = [_resolve(a, env) for a in node.args]
    if empty_pieces:
        args = without_empty_pieces(args)
    kwargs = {k: _resolve(v, env) for k, v in node.kwargs.items() if k not in ("device", "layout", "pin_memory",
                                                                             "memory_format", "non_blocking")}
    # Result dtypes come from the node's metadata, never from a dtype argument.
    kwargs.pop("dtype", None)
    ctx = Context(builder, node, where, constants, pairs, out_shape=in_place)
    try:
        if on_complex:  # complex tensors as f32 pairs take their own table
            return lower_complex(ctx, key, args, kwargs, pairs)
        if regions and node.name in regions.row_wise:  # its axes move past the mask's
            mask_rank = regions.row_wise[node.name]
            if key in ("aten.mm.default", "aten.addmm.default"):
                return lower_row_product(ctx, node, args, mask_rank, fn)
            if key == "aten.gather.default":
                args = [*args[:2], masked_index(ctx, args[2], env[regions.computed[node.name]]), *args[3:]]
            return fn(ctx, *row_wise_args(node, args, mask_rank), **kwargs)
        if in_place is not None and key == "aten.index.Tensor":  # read at region positions: 0 where unselected
            mask = env[regions.computed[node.name]]
            args = [args[0], [i if i is None or _name_of(n) in regions.positions else masked_index(ctx, i, mask)
                              for i, n in zip(args[1], node.args[1])]]
        return _empty_parts_marked(fn(ctx, *args, **kwargs), node.meta.get("val"))
    except EmmyError:
        raise
    except TypeError as err:
        raise UnsupportedOpError(f"unsupported op {where}: unexpected arguments ({err})") from err


def _cond(captured, builder: GraphBuilder, node, env, constants: dict, pairs: set) -> list:
    """torch.cond(pred, true_fn, false_fn, operands): both branches computed (torch requires them
    pure and alike in their outputs' shapes and types) and each output taken from one by the
    predicate, as a where: a kernel has no branch a whole graph could take. A branch is walked as
    the graph is, so a cond inside one nests no deeper than the program's conds do."""
    pred, true_ref, false_ref, operands = node.args
    owner = node.graph.owning_module  # a nested cond's branches are attributes of its own branch
    values = [_resolve(o, env) for o in operands]
    branches = [_branch_outputs(captured, builder, getattr(owner, ref.target).graph, values, constants, pairs)
                for ref in (true_ref, false_ref)]
    chosen = _resolve(pred, env)
    if isinstance(chosen, bool):  # a predicate torch.export knew: that branch alone
        return branches[0] if chosen else branches[1]
    builder.origin = _located(captured, node)
    out = []
    for taken, other in zip(*branches):
        if isinstance(taken, EmptyTensor):
            out.append(taken)
            continue
        shape = builder.shape(taken)
        selected = builder.elementwise("where", builder.broadcast_to(chosen, shape), taken, other,
                                       dtype=builder.dtype(taken), suffix="cond")
        if taken in pairs:
            pairs.add(selected)
        out.append(selected)
    return out


def _branch_outputs(captured, builder: GraphBuilder, graph, operands: list, constants: dict, pairs: set) -> list:
    """The values a cond branch's graph returns, its placeholders bound to `operands` in order."""
    env: dict[str, object] = {}
    placeholders = iter(operands)
    for node in graph.nodes:
        if node.op == "placeholder":
            env[node.name] = next(placeholders)
        elif node.op == "call_function":
            env[node.name] = _decompose_node(captured, builder, node, env, constants, pairs)
        elif node.op == "output":
            results = node.args[0]
            return [env[r.name] for r in (results if isinstance(results, (list, tuple)) else [results])]
    raise UnsupportedOpError("a torch.cond branch without an output")


def _empty_parts_marked(result, val):
    """A tuple result's parts with no elements (split's piece of size 0) as EmptyTensor markers: no
    kernel computes nothing, and an output with none is handed back as it is."""
    if not isinstance(result, (list, tuple)) or not isinstance(val, (list, tuple)) or len(result) != len(val):
        return result
    return type(result)(EmptyTensor.of(v) if hasattr(v, "numel") and v.numel() == 0 else r
                        for r, v in zip(result, val))


def _from_empties(builder: GraphBuilder, node, env, read: list, constants: dict, where: str):
    """A node with elements that reads only tensors with none: its values, computed by torch now,
    as constants of the program (emmy.decompose.empty)."""
    builder.origin = where
    builder.base = builder.fresh(_short_stem(node.name))
    args = [_resolve(a, env) for a in node.args]
    kwargs = {k: _resolve(v, env) for k, v in node.kwargs.items()}
    graph_values = read + [env[v.name] for v in node.kwargs.values() if hasattr(v, "name")]
    reads_full = any(not isinstance(v, EmptyTensor) for v in graph_values)
    if reads_full and str(node.target) in BIASED_PRODUCTS:
        return _bias_of_empty_product(builder, node, args, kwargs, constants, where)
    ctx = Context(builder, node, where, constants, pairs=set())
    if str(node.target) in WRITES_INTO and not isinstance(read[0], EmptyTensor) \
            and all(isinstance(v, EmptyTensor) for v in graph_values[1:]):
        # nothing is written: the destination as it is (a shifted window's mask filled by an empty slice)
        return builder.cast(read[0], ctx.out_type().dtype)
    result = computed_from_empties(node, args, kwargs, where, reads_full)

    def constant(value):
        if not hasattr(value, "numel"):
            return value
        if value.numel() == 0:  # a part of the result with no elements (cholesky_ex's factor of a 0x0 matrix)
            return EmptyTensor.of(value)
        values, dtype = to_numpy(value)
        return ctx.constant(values, dtype)

    return tuple(constant(r) for r in result) if isinstance(result, (list, tuple)) else constant(result)


# ops that write their other tensors into their first (the destination) and return it
WRITES_INTO = frozenset({"aten.slice_scatter.default", "aten.select_scatter.default", "aten.diagonal_scatter.default",
                         "aten.index_put.default", "aten.index_copy.default", "aten.index_add.default",
                         "aten.index_fill.int_Scalar", "aten.index_fill.int_Tensor", "aten.scatter.src",
                         "aten.scatter.value", "aten.scatter_add.default", "aten.scatter_reduce.two",
                         "aten.masked_scatter.default"})


# beta * bias + alpha * (first factor @ second factor), in that argument order
BIASED_PRODUCTS = frozenset({"aten.addmm.default", "aten.addmv.default", "aten.baddbmm.default",
                             "aten.addbmm.default"})


def _bias_of_empty_product(builder: GraphBuilder, node, args: list, kwargs: dict, constants: dict, where: str):
    """addmm and its kin whose factors have no elements (an inner size of 0: a layer with no input
    features) beside a full bias: the product is zeros, so the result is beta * bias, broadcast and
    cast as torch gives it (the bias not read where beta is 0)."""
    bias, first, second = args[:3]
    if isinstance(bias, EmptyTensor) or not (isinstance(first, EmptyTensor) and isinstance(second, EmptyTensor)):
        raise mixed_reads(where)
    beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
    if not math.isfinite(float(alpha)):  # inf * 0 is NaN in every element: leave that to torch's own rules
        raise UnsupportedOpError(f"unsupported op {where}: a product with no elements scaled by alpha={alpha}")
    ctx = Context(builder, node, where, constants, pairs=set())
    out = ctx.out_type()
    if beta == 0:
        return builder.fill(0, out.shape, out.dtype, name=ctx.name)
    scaled = ctx.tensor(bias, out.dtype.accumulator, out.shape)
    if beta != 1:
        scaled = builder.elementwise("multiply", scaled, beta, suffix="beta")
    return builder.cast(scaled, out.dtype)


def _view_behind_copy(key: str):
    """A view op's `_copy` form (aten.permute_copy, narrow_copy, ...) computes the view's values:
    the view's decomposition, which makes a new value anyway."""
    parts = key.split(".")
    if len(parts) != 3 or parts[0] != "aten" or not parts[1].endswith("_copy"):
        return None
    return LOWERINGS.get(f"aten.{parts[1][:-len('_copy')]}.{parts[2]}")


def _flat_args(node, env) -> list:
    values = []
    for a in node.args:
        for item in a if isinstance(a, (list, tuple)) else [a]:
            if hasattr(item, "op") and hasattr(item, "name") and item.name in env:
                values.append(env[item.name])
    return values


# FX names follow ATen's; a few are long enough to drown the printed IR.
_STEMS = {"scaled_dot_product_attention": "sdpa", "native_layer_norm": "layer_norm", "_softmax": "softmax",
          "_log_softmax": "log_softmax", "_to_copy": "to", "_native_batch_norm_legit_no_training": "batch_norm",
          "_native_batch_norm_legit": "batch_norm", "native_group_norm": "group_norm",
          "linalg_vector_norm": "norm"}


def _short_stem(name: str) -> str:
    for long, short in _STEMS.items():
        if name == long or name.startswith(long + "_"):
            return short + name[len(long):]
    return name

"""Capture: any form of PyTorch program -> a core-ATen ExportedProgram.

Accepted forms: `-c` code (a string) or a program file (a path, `emmy -f`), an `nn.Module` (an `fx.GraphModule` is
one) or a plain function with example inputs, a `torch.export`
ExportedProgram, or the ATen graph torch.compile hands a backend (emmy.capture.aten_graph.AtenGraph).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from dataclasses import dataclass

from emmy.capture.outputs import OutputStructure
from emmy.capture.source import Source
from emmy.errors import EmmyError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Captured:
    exported: object  # torch.export.ExportedProgram, decomposed to core ATen
    source: Source
    example_inputs: tuple | None  # torch tensors, in the order of the user inputs
    outputs: OutputStructure | None = None  # what the program returns; set by `capture`
    # the keyword arguments the program takes, in the order captured: their values come last in
    # example_inputs, as one dict
    keywords: tuple[str, ...] = ()
    fixed_ints: bool = False  # Python int arguments are constants of the program (_captured_module)

    def __post_init__(self):
        if self.outputs is None:
            object.__setattr__(self, "outputs", OutputStructure.of_exported(self.exported))


def program_text(graph) -> tuple[str, str]:
    """(code, how messages name it) for -c code or a program file (`emmy -f`, a pathlib.Path)."""
    if isinstance(graph, str):
        return graph, "-c code"
    path = os.fspath(graph)
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read(), f"file {os.path.basename(path)}"
    except OSError as err:
        raise EmmyError(f"cannot read the program file {path}: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise EmmyError(f"the program file {path} is not UTF-8 text ({err.reason} at byte {err.start})") from None


def capture(graph, *example_inputs, example_kwargs: dict | None = None) -> Captured:
    import torch

    from emmy.capture.aten_graph import AtenGraph

    # keyword arguments (`model(ids, attention_mask=mask)`): torch.export takes them as they are, the
    # program takes them last, as one dict in the order given here
    keywords = dict(example_kwargs or {})
    if keywords and (isinstance(graph, (str, os.PathLike, AtenGraph, torch.export.ExportedProgram))
                     or not callable(graph)):
        raise EmmyError(f"example_kwargs are for an nn.Module or a function, not a {type(graph).__name__}")
    if not all(isinstance(k, str) and k.isidentifier() for k in keywords):
        raise EmmyError(f"example_kwargs must be named by identifiers, not {sorted(map(repr, keywords))}")

    if isinstance(graph, (str, os.PathLike)):
        from emmy.capture.code import capture_code

        if example_inputs:
            raise EmmyError("-c code makes its own inputs; pass no example inputs with a code string or file")
        code = capture_code(*program_text(graph))
        program = _exported_decomposed(code.module, code.example_inputs.shaped(), code.source,
                                       example_values=code.example_inputs, eager_args=code.example_inputs)
        return Captured(program, code.source, code.example_inputs)

    if isinstance(graph, AtenGraph):  # torch.compile's ATen graph: nothing to export or decompose
        if not example_inputs:
            raise EmmyError("emmy.optimize needs the example inputs of an ATen graph")
        return Captured(graph, Source(), tuple(example_inputs))

    if isinstance(graph, torch.export.ExportedProgram):
        inputs = example_inputs or _stored_inputs(graph)
        values = flat_inputs(inputs) if inputs else None  # to guard what the graph reads from them
        return Captured(_decomposed(graph, Source(), values), Source(), tuple(inputs) if inputs else None)

    if not example_inputs and not keywords:
        raise EmmyError(f"emmy.optimize needs example inputs to capture a {type(graph).__name__}")
    if isinstance(graph, torch.nn.Module):
        module = graph
    elif callable(graph):
        module = type("FunctionProgram", (torch.nn.Module,), {"forward": staticmethod(_as_forward(graph))})()
    else:
        raise EmmyError(
            f"emmy.optimize cannot capture a {type(graph).__name__}; give -c code, an nn.Module, "
            "a function, an fx.GraphModule or an ExportedProgram"
        )
    with _in_eval_mode(module):
        program, taken, fixed_ints = _captured_module(module, example_inputs, keywords)
    return Captured(program, Source(), taken, keywords=tuple(keywords), fixed_ints=fixed_ints)


def _as_forward(function):
    """A function as a module's forward. torch.export records where each op came from only below a
    frame named `forward` (so errors name the user's line), and takes input names from the signature,
    which the wrapper shows as the function's own; a builtin (torch.gcd) has none inspect can read."""

    def forward(*args, **kwargs):
        return function(*args, **kwargs)

    if _has_signature(function):
        functools.update_wrapper(forward, function)
    return forward


def _has_signature(function) -> bool:
    import inspect

    try:
        inspect.signature(function)
    except (TypeError, ValueError):
        return False
    return True


def _captured_module(module, example_inputs: tuple, keywords: dict) -> tuple:
    """(the decomposed program, the inputs as it takes them, whether Python ints are constants of it).

    A Python number is a rank-0 input (scalar_tensor), so a call may pass another. Where the module
    reads an int into Python (a size, a shift, a count: x[:, -n:], x.roll(n), topk(x, k)), no
    program can take it at run time: the capture is made again with every int argument a constant of
    the program, as a bool is, and a call must pass the same value (emmy.calling)."""
    has_ints = any(type(leaf) is int for leaf in _leaves((example_inputs, keywords)))
    try:
        program, taken = _exported_with(module, example_inputs, keywords, fixed_ints=False)
    except Exception as failure:  # torch may fail on a tensor used as a size before any graph is made
        if not has_ints:
            raise
        try:
            program, taken = _exported_with(module, example_inputs, keywords, fixed_ints=True)
        except Exception:
            raise failure from None  # the ints were not the cause: the first error says what was
    else:
        if not (has_ints and _reads_numbers(program)):
            return program, taken, False
        program, taken = _exported_with(module, example_inputs, keywords, fixed_ints=True)
    logger.info("the program reads an int argument as a number (a size, a shift or a count): every int "
                "argument is compiled in as a constant, and a call must pass the same value")
    return program, taken, True


def _exported_with(module, example_inputs: tuple, keywords: dict, fixed_ints: bool) -> tuple:
    # inputs may nest (an LSTM cell's (h, c)): torch.export takes the structure, the program its leaves
    number = functools.partial(scalar_tensor, fixed_ints=fixed_ints)
    given = flat_inputs((*example_inputs, keywords) if keywords else example_inputs, fixed_ints)
    example_inputs = tuple(_map_leaves(number, v) for v in example_inputs)
    keywords = {k: _map_leaves(number, v) for k, v in keywords.items()}
    taken = (*example_inputs, keywords) if keywords else example_inputs
    flat = flat_inputs(taken, fixed_ints)
    _check_inputs(flat)
    # an int argument read as a number makes a fixed-ints capture (_captured_module), not a guard
    numbers = frozenset(k for k, leaf in enumerate(given) if type(leaf) is int)
    try:
        program = _exported_decomposed(module, example_inputs, Source(), keywords or None, flat, numbers)
    except EmmyError:  # a program that takes gradients: export or its decompositions refuse it
        from emmy.capture.gradients import trace_gradient_program

        program = trace_gradient_program(module, example_inputs, keywords)
        if program is None:
            raise
    return program, taken


def _reads_numbers(program) -> bool:
    """Whether the graph reads a tensor's value into Python (.item(), int(t), a tensor as a size)."""
    graph = getattr(program, "graph", None)
    return graph is not None and any(str(node.target) == "aten._local_scalar_dense.default"
                                     for node in graph.nodes)


def _leaves(value) -> list:
    from torch.utils import _pytree

    return _pytree.tree_leaves(value)


@contextlib.contextmanager
def _in_eval_mode(module):
    """emmy compiles for inference: the module is captured in eval mode (dropout off, batch norm by
    its running statistics), saying so once if it was training, and left as the caller had it."""
    training = {m: m.training for m in module.modules()}
    if any(mode and _differs_in_training(m) for m, mode in training.items()):
        logger.warning("emmy compiles %s for inference: it is in training mode, so it is captured as in "
                       "eval mode (dropout off, batch norm by running statistics); call .eval() first to "
                       "say so", type(module).__name__)
    module.eval()
    try:
        yield
    finally:
        for m, mode in training.items():
            m.training = mode


def _differs_in_training(module) -> bool:
    """Whether torch's module computes differently in training mode: dropout, batch (and instance)
    norm's batch statistics, RReLU's random slopes, attention's dropout."""
    import torch

    nn = torch.nn
    return isinstance(module, (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._NormBase, nn.RReLU)) or \
        (isinstance(module, nn.MultiheadAttention) and module.dropout > 0)


def _stored_inputs(program) -> tuple | None:
    stored = getattr(program, "example_inputs", None)
    if not stored:
        return None
    args, kwargs = stored
    return tuple(args) if not kwargs else None


def scalar_tensor(value, fixed_ints: bool = False):
    """A Python number (a scale, an epsilon passed at call time) as a rank-0 tensor input: f32 for a
    float, i64 for an int. The program reads it as a one-element buffer, so calls may pass another
    number without a new compile. A bool is a flag (use_cache=False, return_dict=True), which code
    branches on: it stays a constant of the program (emmy.capture.flags_of), as an int does with
    `fixed_ints` (a program that reads one as a size). Anything else passes through."""
    import torch

    if is_flag(value, fixed_ints):
        return value
    if isinstance(value, int):
        return torch.tensor(value, dtype=torch.int64)
    if isinstance(value, float):
        return torch.tensor(value, dtype=torch.float32)
    return value


def is_flag(leaf, fixed_ints: bool = False) -> bool:
    """Whether an argument is compiled in as a constant rather than taken as an input: a bool, None
    (an optional argument left out: `added_cond_kwargs={"resolution": None}`), and an int where the
    program was captured with fixed ints (Signature.fixed_ints)."""
    return leaf is None or isinstance(leaf, bool) or (fixed_ints and type(leaf) is int)


def flat_inputs(inputs, fixed_ints: bool = False) -> list:
    """A program's inputs as it takes them: tuples, lists and dicts of tensors (a module's nested
    arguments) flattened in torch.export's order, so a call may pass them nested as the module takes
    them. Flags (bools; ints with fixed_ints) are no inputs: torch.export made them constants."""
    from torch.utils import _pytree

    return [leaf for leaf in _pytree.tree_leaves(list(inputs)) if not is_flag(leaf, fixed_ints)]


def flags_of(inputs, keywords: bool = False, fixed_ints: bool = False) -> tuple[tuple[str, object], ...]:
    """The flags (bools; ints with fixed_ints) among a call's arguments, each with where it is
    (`keyword 'use_cache'`, `argument 1`, `argument 0[2]` inside a list); `keywords`: the last argument
    is the dict of keyword arguments. The program was compiled for the captured values, and a call
    must pass the same."""
    from torch.utils import _pytree

    if inputs is None:
        return ()
    inputs = list(inputs)
    leaves, _ = _pytree.tree_flatten_with_path(inputs)
    found = []
    for path, leaf in leaves:
        if is_flag(leaf, fixed_ints):
            position = path[0].idx
            if keywords and position == len(inputs) - 1:
                found.append((f"keyword {path[1].key!r}{_pytree.keystr(path[2:])}", leaf))
            else:
                found.append((f"argument {position}{_pytree.keystr(path[1:])}", leaf))
    return tuple(found)


def _map_leaves(fn, value):
    from torch.utils import _pytree

    return _pytree.tree_map(fn, value)


def _check_inputs(inputs) -> None:
    import torch

    for k, value in enumerate(inputs):
        if not isinstance(value, torch.Tensor):
            raise EmmyError(f"example input {k} is a {type(value).__name__}, not a torch.Tensor")


def _export(module, args: tuple, source: Source, keywords: dict | None = None):
    from emmy.capture import exporting
    from emmy.capture.errors import explain_export_failure

    try:
        return exporting.export_module(module, args, keywords)
    except EmmyError:
        raise
    except Exception as err:
        raise explain_export_failure(err, source) from err


def _exported_decomposed(module, args: tuple, source: Source, keywords: dict | None = None,
                         example_values=None, numbers: frozenset = frozenset(), eager_args=None):
    """The module exported and decomposed, each integer it reads from its inputs compiled in as the
    example's value with a guard (emmy.capture.guarded_reads): where torch.export refuses a branch or
    size on such a read, the module runs once eagerly to learn the values, and is exported again
    with them. `example_values`: the user's tensor inputs, flat, with their values (default: `args`;
    -c code's may be made only when asked for); `numbers`: the positions among them of Python ints,
    whose reads are left to a fixed-ints capture; `eager_args`: what the eager run passes (default:
    `args`, which for -c code hold fake tensors for inputs not made yet)."""
    from emmy.capture.errors import is_data_dependent
    from emmy.capture.guarded_reads import input_branches, pinned_reads, recorded_reads

    values = args if example_values is None else example_values
    try:
        return _decomposed(_export(module, args, source, keywords), source, values, numbers)
    except EmmyError as refused:
        if refused.__cause__ is None or not is_data_dependent(refused.__cause__):
            raise
        first = refused
    logger.info("torch.export refused a branch or size on a value the program reads: running it once eagerly "
                "to learn the integers and bools it reads")
    try:
        reads = recorded_reads(module, args if eager_args is None else tuple(eager_args), keywords)
        if reads:
            with pinned_reads(reads):
                exported = _export(module, args, source, keywords)
            program = _decomposed(exported, source, values, numbers)
            if not input_branches(program):  # a branch an input decides stays refused
                return program
    except Exception:  # it does not run eagerly on its examples, or a read is no integer: refused as export was
        logger.debug("capturing with the integers read pinned failed too", exc_info=True)
    raise first  # outside the handler, so its cause stays torch's refusal


def _decomposed(program, source: Source, example_values=None, numbers: frozenset = frozenset()):
    """torch's decompositions run on the exported graph, their failures told as export's are (a
    decomposition may branch on values: torch.take wraps its indices). With `example_values` (the
    user inputs, flat), integers read from inputs become guarded constants (emmy.capture.guarded_reads),
    but for those read from the inputs at `numbers`."""
    from emmy.capture import exporting
    from emmy.capture.constant_reads import fold_constant_reads
    from emmy.capture.errors import explain_export_failure
    from emmy.capture.guarded_reads import guard_input_reads
    from emmy.capture.value_sized import keep_value_sized_selections
    from emmy.decompose.masked_regions import masked_regions

    try:
        program = fold_constant_reads(exporting.decompose(program))
        if example_values is not None:
            program = guard_input_reads(program, example_values, source, numbers)
        regions = masked_regions(program.graph)  # the selections it computes are its own
        return keep_value_sized_selections(program, leave=frozenset((*regions.selections, *regions.coordinates)))
    except EmmyError:
        raise
    except Exception as err:
        raise explain_export_failure(err, source) from err


__all__ = ["Captured", "capture"]

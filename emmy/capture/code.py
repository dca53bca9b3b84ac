"""Capture a program written as `-c` code.

The code runs like `python -c`, with `torch`, `nn`, `F` and `math` in scope;
its last statement is an expression whose value (a tensor, or a tuple of
tensors) is what emmy compiles. Tensors made by factory calls
(`torch.randn(4, 3)`, ...) become the program's inputs, named after the
variable they are assigned to; modules constructed in the code
(`nn.Linear(8, 16)`) keep their parameters, which become named weights.

The code runs twice. First on fake tensors (shapes and dtypes, no data),
with only factory calls and module constructions run for real: that makes
the example inputs and modules and catches ordinary Python errors at the
cost of a Python pass, however large the tensors. Then as the `forward` of a
module that torch.export traces, each factory call answered by the matching
input.
Because that `forward` is compiled from the user's code, every traced op
carries the line of `-c` code it came from.
"""

from __future__ import annotations

import ast
import contextlib
import math
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass

from emmy.capture.errors import explain_export_failure, is_data_dependent
from emmy.capture.exporting import quiet_torch
from emmy.capture.source import CODE_FILENAME, Location, Source, parse_program
from emmy.config import settings
from emmy.errors import CodeError, EmmyError, UnsupportedOpError

FACTORIES = frozenset(
    {
        "randn", "rand", "randint", "randperm", "randint_like", "normal", "ones", "zeros", "full", "empty", "tensor",
        "arange", "linspace", "eye", "randn_like", "rand_like", "ones_like",
        "zeros_like", "full_like", "empty_like", "as_tensor", "from_numpy",
    }
)

_INPUT = "__emmy_input__"
_CONSTRUCT = "__emmy_construct__"
_RESET = "__emmy_reset__"


@dataclass
class CodeCapture:
    """The pieces torch.export needs: a module, its example inputs and their names."""

    module: object
    example_inputs: tuple
    input_names: tuple[str, ...]
    source: Source


def _is_factory(func: ast.expr) -> bool:
    # torch.randn(...) and torch.Tensor-making calls spelled through the torch module.
    return (
        isinstance(func, ast.Attribute)
        and func.attr in FACTORIES
        and isinstance(func.value, ast.Name)
        and func.value.id == "torch"
    )


def _is_construction(func: ast.expr) -> bool:
    # Class-like callee (nn.Linear, torch.nn.LayerNorm, MyModule): may build a module.
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return bool(name) and name[0].isupper()


# Methods that keep a fresh tensor or module what it is (a dtype, a device, a mode): a factory or
# construction followed by them is one site, run for real, so `nn.Linear(8, 16).half()` converts
# real parameters and `torch.randn(4, 8).half()` is an f16 input.
CHAINED = frozenset({"half", "bfloat16", "float", "double", "long", "int", "short", "bool", "byte", "char", "to", "cuda",
                     "cpu", "contiguous", "eval", "requires_grad_"})


def _receiver(call: ast.Call) -> ast.Call | None:
    """The call a CHAINED method is called on (`torch.randn(4)` in `torch.randn(4).half()`)."""
    func = call.func
    chained = isinstance(func, ast.Attribute) and func.attr in CHAINED and isinstance(func.value, ast.Call)
    return func.value if chained else None


def _site_hook(call: ast.Call) -> str | None:
    if _is_factory(call.func):
        return _INPUT
    if _receiver(call) is not None:
        return _site_hook(_receiver(call))
    if _is_construction(call.func):
        return _CONSTRUCT
    return None


class _Rewriter(ast.NodeTransformer):
    """Routes factory and constructor calls through emmy's hooks, numbering each site."""

    def __init__(self):
        self.sites: list[str] = []  # hint name per site: the assigned variable, if any
        self._target: str | None = None

    def visit_Assign(self, node: ast.Assign):
        direct = isinstance(node.value, ast.Call) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
        self._target = node.targets[0].id if direct else None
        node.value = self.visit(node.value)
        self._target = None
        return node

    def visit_Call(self, node: ast.Call):
        hint, self._target = self._target, None
        hook = _site_hook(node)
        if hook is None:
            return self.generic_visit(node)
        # the chain's calls are this one site; their arguments may hold sites of their own
        call = node
        while call is not None:
            call.args = [self.visit(a) for a in call.args]
            call.keywords = [self.visit(k) for k in call.keywords]
            call = None if _is_factory(call.func) else _receiver(call)
        site = len(self.sites)
        self.sites.append(hint or "")
        thunk = ast.Lambda(
            args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
            body=node,
        )
        call = ast.Call(func=ast.Name(hook, ast.Load()), args=[ast.Constant(site), thunk], keywords=[])
        return ast.copy_location(call, node)


def _code_location(tb, source: Source) -> Location | None:
    frames = [f for f in traceback.extract_tb(tb) if f.filename == CODE_FILENAME]
    if not frames:
        return None
    line = frames[-1].lineno or 0
    return Location(CODE_FILENAME, line, source.line_text(CODE_FILENAME, line))


def _namespace() -> dict:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    return {"torch": torch, "nn": nn, "F": F, "math": math, "__name__": "__emmy__"}


def _build_forward(tree: ast.Module, params: list[str]) -> ast.Module:
    """def forward(self, <inputs>): <body>; return <last expression>."""
    # The first statement hands the inputs to the factory hook, in order.
    reset = ast.Expr(
        ast.Call(func=ast.Name(_RESET, ast.Load()), args=[ast.Name(p, ast.Load()) for p in params], keywords=[])
    )
    body = [ast.copy_location(reset, tree.body[0])] + list(tree.body[:-1])
    last = tree.body[-1]
    ret = ast.copy_location(ast.Return(value=last.value), last)
    body.append(ret)
    args = ast.arguments(
        posonlyargs=[],
        args=[ast.arg("self")] + [ast.arg(p) for p in params],
        kwonlyargs=[],
        kw_defaults=[],
        defaults=[],
    )
    fn = ast.FunctionDef(name="forward", args=args, body=body, decorator_list=[], returns=None, type_params=[])
    ast.copy_location(fn, tree.body[0])
    module = ast.Module(body=[fn], type_ignores=[])
    return ast.fix_missing_locations(module)


class ExampleInputs(Sequence):
    """The input tensors -c code makes, in order. One larger than EMMY_LAZY_INPUT_MB is made when
    first read (running or checking the program needs its values; compiling needs only its shape
    and dtype, so an 8 GB input costs neither the memory nor the time to compile): its factory
    call runs again with the random-number state it would have had."""

    def __init__(self, shaped: tuple, deferred: dict, label: str):
        self._values = list(shaped)
        self._deferred = dict(deferred)  # position -> (random-number state, the factory call)
        self._label = label

    def __len__(self) -> int:
        return len(self._values)

    @property
    def pending(self) -> int:
        """How many inputs are not made yet."""
        return len(self._deferred)

    def shaped(self) -> tuple:
        """The inputs as torch.export needs them: a deferred one as its fake tensor (shape, dtype)."""
        return tuple(self._values)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        index = range(len(self))[index]
        if index in self._deferred:
            import torch

            state, thunk = self._deferred.pop(index)
            with torch.random.fork_rng():
                torch.set_rng_state(state)
                value = thunk()
            shaped = self._values[index]
            if tuple(value.shape) != tuple(shaped.shape) or value.dtype != shaped.dtype:
                raise CodeError(f"input {index} of the {self._label} came out as {tuple(value.shape)} {value.dtype} "
                                f"when made again, not {tuple(shaped.shape)} {shaped.dtype}: its factory call reads "
                                "a name the code changes later")
            self._values[index] = value
        return self._values[index]


def capture_code(code: str, label: str = "-c code") -> CodeCapture:
    """`label` names the code in messages: "-c code", or "file prog.py" for `-f`."""
    import torch

    source = Source(code)
    tree = parse_program(code, label)
    rewriter = _Rewriter()
    tree = rewriter.visit(tree)
    ast.fix_missing_locations(tree)

    # Eager pass: plain Python, recording inputs and modules in call order.
    made_inputs: list[tuple[int, object]] = []
    made_modules: dict[tuple[int, int], object] = {}
    module_counts: dict[int, int] = {}

    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily

    deferred: dict[int, tuple] = {}

    def eager_input(site, thunk):
        shaped = thunk()  # under the fake mode: shape and dtype, no values, no random numbers drawn
        if isinstance(shaped, torch.Tensor) and shaped.numel() * shaped.element_size() > settings().lazy_input_bytes:
            deferred[len(made_inputs)] = (torch.get_rng_state(), thunk)  # made when a run needs its values
            made_inputs.append((site, shaped))
            return shaped
        with unset_fake_temporarily():
            value = thunk()
        if isinstance(value, torch.Tensor):
            made_inputs.append((site, value))
        return value

    def eager_construct(site, thunk):
        with unset_fake_temporarily():
            value = thunk()
        if isinstance(value, torch.nn.Module):
            k = module_counts.get(site, 0)
            module_counts[site] = k + 1
            value.eval()
            made_modules[(site, k)] = value
        return value

    eager_tree = ast.Module(
        body=list(tree.body[:-1]) + [ast.copy_location(ast.Assign(targets=[ast.Name("__emmy_result__", ast.Store())], value=tree.body[-1].value), tree.body[-1])],
        type_ignores=[],
    )
    ast.fix_missing_locations(eager_tree)
    from emmy.capture.substitutes import substituted

    def eager_pass(fake: bool) -> dict:
        made_inputs.clear(), made_modules.clear(), module_counts.clear(), deferred.clear()
        namespace = _namespace()
        namespace[_INPUT] = eager_input
        namespace[_CONSTRUCT] = eager_construct
        torch.manual_seed(0)
        computing = FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
        with quiet_torch(), substituted(), computing:
            exec(compile(eager_tree, CODE_FILENAME, "exec"), namespace)
        return namespace

    try:
        try:
            namespace = eager_pass(fake=True)
        except Exception as err:
            if not is_data_dependent(err):
                raise
            try:  # a value read into Python (int(lengths.max())), which a fake tensor has not: run for real
                namespace = eager_pass(fake=False)
            except Exception:
                raise err from None
    except EmmyError:
        raise
    except Exception as err:  # the user's code failed: report its line
        if is_data_dependent(err):
            raise explain_export_failure(err, source) from err
        where = _code_location(sys.exc_info()[2], source)
        at = f" at {where}" if where else ""
        if type(err).__name__ == "DynamicOutputShapeException":  # fake tensors cannot size its result
            raise UnsupportedOpError.sized_by_values(f"{_first_line(err)} ({str(where) if where else 'the code'})") \
                from err
        raise CodeError(f"the {label} raised {type(err).__name__}{at}: {_first_line(err)}") from err

    result = namespace["__emmy_result__"]
    last_line = tree.body[-1].lineno
    is_tuple = isinstance(result, (tuple, list))
    items = list(result) if is_tuple else [result]
    # tuples nest (a cummax's (values, indices) among other outputs): every leaf must be a tensor
    leaves = [leaf for item in items for leaf in
              (torch.utils._pytree.tree_leaves(item) if isinstance(item, (tuple, list)) else [item])]
    if not items or not leaves or not all(isinstance(r, torch.Tensor) for r in leaves):
        got = type(result).__name__ if not is_tuple else f"{type(result).__name__} of " + ", ".join(
            type(r).__name__ for r in items
        )
        raise CodeError(
            f"the last expression of {label} (line {last_line}) gives {got}, not a tensor; "
            "emmy compiles an expression whose value is a torch.Tensor (or a tuple of them, nested or not)"
        )

    names = _input_names(made_inputs, rewriter.sites)
    module = _traced_module(tree, names, made_inputs, made_modules, rewriter.sites, label)
    return CodeCapture(
        module=module,
        example_inputs=ExampleInputs(tuple(t for _, t in made_inputs), deferred, label),
        input_names=tuple(names),
        source=source,
    )


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _input_names(made_inputs, sites) -> list[str]:
    names: list[str] = []
    used: set[str] = set()
    for k, (site, _) in enumerate(made_inputs):
        base = sites[site] or f"arg{k}"
        name, n = base, 1
        while name in used or name in ("self", "torch", "nn", "F", "math"):
            name, n = f"{base}_{n}", n + 1
        used.add(name)
        names.append(name)
    return names


def _traced_module(tree, names, made_inputs, made_modules, sites, label):
    import torch

    forward_tree = _build_forward(tree, names)
    namespace = _namespace()
    order = [site for site, _ in made_inputs]
    state = {"queue": [], "modules": {}}

    def traced_input(site, thunk):
        if not state["queue"]:
            raise CodeError(f"the {label} made more input tensors while traced than when run; is its control flow data-dependent?")
        want_site, value = state["queue"].pop(0)
        if want_site != site:
            raise CodeError(f"the {label} made its input tensors in a different order while traced; is its control flow data-dependent?")
        return value

    def traced_construct(site, thunk):
        k = state["modules"].get(site, 0)
        state["modules"][site] = k + 1
        found = made_modules.get((site, k))
        return found if found is not None else thunk()

    def reset(*args):
        state["queue"] = list(zip(order, args))
        state["modules"] = {}

    namespace[_INPUT] = traced_input
    namespace[_CONSTRUCT] = traced_construct
    namespace[_RESET] = reset
    exec(compile(forward_tree, CODE_FILENAME, "exec"), namespace)
    # The module's forward is the function compiled from the code itself, so
    # torch.export attributes each traced op to its line of -c code.
    cls = type("CodeProgram", (torch.nn.Module,), {"forward": namespace["forward"]})
    module = cls()
    used: set[str] = set()
    for (site, k), sub in made_modules.items():
        base = sites[site] or f"m{site}"
        name = base if k == 0 else f"{base}_{k}"
        while name in used:
            name += "_"
        used.add(name)
        module.add_module(name, sub)
    return module


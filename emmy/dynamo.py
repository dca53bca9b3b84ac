"""`torch.compile(model, backend="emmy")`: emmy as a TorchDynamo backend.

Registered through the `torch_dynamo_backends` entry point (pyproject.toml), so the name works once
emmy is installed. Dynamo hands over an FX graph; AOTAutograd (with emmy's training decompositions,
emmy.capture.training) turns it into ATen graphs, a forward and, where gradients are wanted, a
backward; each is split into the parts emmy decomposes and the rest, which runs eagerly (one log
line per unsupported op, once per process). Each supported part
compiles to an emmy program the first time it runs with a given input signature (shapes, dtypes,
device), in a bounded cache per part:

- CUDA tensors run the program's kernels on their GPU;
- CPU tensors run eagerly, unless `options={"simulate": True}`, which runs the CUDA in the CPU
  simulator (a checking path, far slower than eager);
- anything that goes wrong inside emmy (an op it refuses at a shape, a build or run failure) makes
  that part run eagerly from then on, with one warning: emmy never breaks the user's program.

Dynamo's allow_rnn is turned on when this module is imported (see trace_recurrent_layers).

Options (`torch.compile(..., options={...})`): simulate (bool), sim_mode (plain/asan/racecheck),
target (sm_XX or a GPU name; default: the GPU's own architecture, else EMMY_TARGET), cache_size (input
signatures kept per part, default 8). emmy compiles static shapes: with `dynamic=False` each new
shape is a new Dynamo compile (Dynamo's recompile limit bounds them); a graph Dynamo made dynamic
(the default after a second shape) is traced again with each call's concrete shapes (`Specialized`).
"""

from __future__ import annotations

import logging
import operator
import threading
import warnings
from collections import OrderedDict

import torch  # only Dynamo imports this module, with torch loaded

from emmy.errors import EmmyError

log = logging.getLogger(__name__)

# Ops that only view or re-lay out data: a part made of nothing else runs eagerly (a copy kernel
# would be slower than a view, and its outputs would stop aliasing).
LAYOUT_OPS = frozenset({
    "aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.expand.default",
    "aten.permute.default", "aten.t.default", "aten.transpose.int", "aten.unsqueeze.default",
    "aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default", "aten.alias.default",
    "aten.slice.Tensor", "aten.select.int", "aten.clone.default", "aten.detach.default",
})

_REPORTED: set = set()  # unsupported ops already logged in this process
_LOCK = threading.Lock()


def trace_recurrent_layers() -> None:
    """Dynamo skips, whole, a frame that calls nn.RNN, nn.GRU or nn.LSTM unless its allow_rnn is on
    (off by default): a seq2seq model compiled with backend="emmy" ran wholly eagerly, its attention
    and heads too. emmy lowers those layers (torch's decompositions of their steps), so looking the
    backend up turns Dynamo's RNN tracing on for the process; EMMY_DYNAMO_RNN=0 leaves it as it is."""
    from emmy.config import settings

    if settings().dynamo_rnn and not torch._dynamo.config.allow_rnn:
        torch._dynamo.config.allow_rnn = True
        log.info("emmy: Dynamo's allow_rnn turned on, so nn.RNN, nn.GRU and nn.LSTM are traced and compiled "
                 "(EMMY_DYNAMO_RNN=0 leaves it off)")


trace_recurrent_layers()  # Dynamo imports this module when torch.compile looks the backend up


def emmy_backend(gm, example_inputs, options: dict | None = None):
    """The Dynamo backend: returns a callable that runs `gm` with emmy's parts compiled."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    from emmy.capture.training import training_decomposition_table

    settings = _Options.of(options)

    def compile_graph(fx_graph, fake_inputs):
        # AOTAutograd calls what a compiler returns with one list of arguments ("boxed")
        return make_boxed_func(partition(fx_graph, settings))

    def static_graph(inputs):
        # the backward graph (a training step's gradients) is ATen too: its parts compile as the forward's
        return aot_autograd(fw_compiler=compile_graph, bw_compiler=compile_graph,
                            decompositions=training_decomposition_table())(gm, inputs)

    if any(_is_symbolic(x) for x in example_inputs):
        return Specialized(gm, static_graph, settings)
    return static_graph(example_inputs)


class Specialized:
    """A graph Dynamo made dynamic (after a second shape, or `dynamic=True`): emmy compiles static
    shapes, so each call's concrete signature (shapes, sizes passed as numbers, dtypes, devices,
    whether gradients are wanted) is traced again through AOTAutograd with those values and
    compiled, in a bounded cache. Where emmy would not run the parts anyway (CPU tensors without
    `simulate`), the graph runs as Dynamo gave it."""

    def __init__(self, gm, static_graph, settings: _Options):
        self.gm, self.static_graph, self.settings = gm, static_graph, settings
        self.compiled: OrderedDict = OrderedDict()  # signature -> AOTAutograd's callable

    def __call__(self, *args):
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        if first is None or not (first.is_cuda or self.settings.simulate):
            return self.gm(*args)
        key = (torch.is_grad_enabled(), tuple((tuple(a.shape), a.dtype, str(a.device), a.requires_grad)
                                              if isinstance(a, torch.Tensor) else a for a in args))
        if key not in self.compiled:
            log.info("emmy: a dynamic graph compiled for %s", _describe(self.gm, args))
            self.compiled[key] = self.static_graph(list(args))
            if len(self.compiled) > self.settings.cache_size:
                self.compiled.popitem(last=False)
        self.compiled.move_to_end(key)
        return self.compiled[key](*args)


def _describe(gm, args) -> str:
    """The call's sizes and its inputs' shapes, by Dynamo's names (s0=2, x: 2x5x16 float32); a
    module's parameters and buffers, which do not change shape, are left out."""
    names = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
    if len(names) != len(args):
        names = [f"arg{i}" for i in range(len(args))]
    parts = []
    for name, a in zip(names, args):
        if not isinstance(a, torch.Tensor):
            parts.append(f"{name}={a!r}")
        elif "_parameters_" not in name and "_buffers_" not in name:
            label = name.removeprefix("L_").removesuffix("_")
            parts.append(f"{label}: " + "x".join(map(str, a.shape)) + f" {str(a.dtype).removeprefix('torch.')}")
    return ", ".join(parts)


class _Options:
    def __init__(self, simulate: bool, sim_mode: str | None, target: str | None, cache_size: int):
        self.simulate, self.sim_mode, self.target, self.cache_size = simulate, sim_mode, target, cache_size

    @classmethod
    def of(cls, options: dict | None) -> _Options:
        options = dict(options or {})
        known = {"simulate", "sim_mode", "target", "cache_size"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise EmmyError(f"unknown emmy backend option {unknown[0]!r}; options are {', '.join(sorted(known))}")
        cache_size = int(options.get("cache_size", 8))
        if cache_size < 1:
            raise EmmyError(f"emmy backend option cache_size must be at least 1, got {cache_size}")
        return cls(bool(options.get("simulate", False)), options.get("sim_mode"), options.get("target"), cache_size)


def partition(gm, settings: _Options):
    """`gm` (ATen ops) with each maximal part emmy supports replaced by an EmmyPart module."""
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner

    support = _Support()
    partitioner = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True)
    parts = partitioner.propose_partitions()
    for op in sorted(support.refused):
        with _LOCK:
            if op not in _REPORTED:
                _REPORTED.add(op)
                log.info("emmy: %s is not supported; it runs eagerly", op)
    parts = [p for p in parts if not all(str(n.target) in LAYOUT_OPS or n.target is operator.getitem
                                         for n in p.nodes)]
    if not parts:
        return gm
    fused = partitioner.fuse_partitions(parts)
    for node in fused.graph.nodes:
        if node.op == "call_module" and node.target.startswith("fused_"):
            setattr(fused, node.target, EmmyPart(getattr(fused, node.target), node.target, settings))
    fused.recompile()
    return fused


def _is_symbolic(value) -> bool:
    if isinstance(value, torch.SymInt):
        return True
    return isinstance(value, torch.Tensor) and any(not isinstance(s, int) for s in value.shape)


class _Support:
    """Which FX nodes emmy decomposes: an ATen op in its table, on dtypes it handles, at static shapes."""

    def __init__(self):
        from emmy.decompose.complex_pairs import COMPLEX_OPS
        from emmy.decompose.from_aten import LOWERINGS

        self.lowerings = LOWERINGS
        self.complex_ops = COMPLEX_OPS  # an op making or reading a complex tensor is lowered from these
        self.refused: set = set()

    def is_node_supported(self, submodules, node) -> bool:
        if node.op == "get_attr":  # a torch.cond branch: supported where every op in it is
            branch = submodules.get(node.target)
            inside = dict(branch.named_modules()) if isinstance(branch, torch.fx.GraphModule) else {}
            return bool(inside) and all(self.is_node_supported(inside, n) for n in branch.graph.nodes
                                        if n.op in ("call_function", "get_attr"))
        if node.op != "call_function":
            return False
        if node.target is operator.getitem:
            producer = node.args[0]
            return hasattr(producer, "op") and self.is_node_supported(submodules, producer)
        name = str(node.target)
        if name == "cond":  # both branches computed, the predicate selecting (emmy.decompose.from_aten)
            branches = node.args[1:3]
            return all(hasattr(b, "op") and self.is_node_supported(submodules, b) for b in branches) \
                and all(_plain(a.meta.get("val")) for a in node.all_input_nodes if a.op != "get_attr")
        values = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
        on_complex = any(_is_complex(v) for v in values)
        if name not in (self.complex_ops if on_complex else self.lowerings):
            self.refused.add(name if not on_complex else f"{name} on complex numbers")
            return False
        return all(_plain(v) for v in values)


def _plain(value) -> bool:
    from emmy.dtypes import _TORCH_NAMES

    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, torch.Tensor):  # complex ones as their real pairs (emmy.decompose.complex_pairs)
        return (str(value.dtype) in _TORCH_NAMES or _is_complex(value)) and all(isinstance(s, int) for s in value.shape)
    return value is None or isinstance(value, (int, float, bool))


def _is_complex(value) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_is_complex(v) for v in value)
    return isinstance(value, torch.Tensor) and value.dtype in (torch.complex64, torch.complex128)


def _traced_strides(graph_module) -> list:
    """The strides of each output as traced: AOTAutograd's code around a part (views, its eager ops)
    may rely on them, where emmy's outputs are contiguous."""
    (output,) = [n for n in graph_module.graph.nodes if n.op == "output"]
    values = output.args[0] if isinstance(output.args[0], (tuple, list)) else (output.args[0],)
    return [tuple(v.meta["val"].stride()) if hasattr(v, "meta") and isinstance(v.meta.get("val"), torch.Tensor)
            else None for v in values]


def _restrided(out, strides: list):
    """emmy's outputs laid out with the traced strides where those are a permutation of a dense
    layout (a transposed result); a copy only where they differ."""
    single = not isinstance(out, (tuple, list))
    values = [out] if single else list(out)
    for k, (value, stride) in enumerate(zip(values, strides)):
        if stride is not None and isinstance(value, torch.Tensor) and value.stride() != stride and \
                _dense(value.shape, stride):
            laid_out = torch.empty_strided(value.shape, stride, dtype=value.dtype, device=value.device)
            values[k] = laid_out.copy_(value)
    return values[0] if single else type(out)(values)


def _dense(shape, stride) -> bool:
    """Whether `stride` lays `shape` out in one block with no gaps or repeats (not a broadcast,
    which a copy into would write one place many times)."""
    step = 1
    for size, s in sorted(((n, s) for n, s in zip(shape, stride) if n > 1), key=lambda p: p[1]):
        if s != step:
            return False
        step *= size
    return True


class EmmyPart(torch.nn.Module):
    """One supported part: compiled by emmy per input signature on first use, else run eagerly."""

    def __init__(self, graph_module, name: str, settings: _Options):
        super().__init__()
        self.graph_module, self.name, self.settings = graph_module, name, settings
        self.strides = _traced_strides(graph_module)
        self.programs: OrderedDict = OrderedDict()  # signature -> Program, or None where emmy failed
        self.warned = False

    def forward(self, *args):
        if not args or not all(type(a) in (torch.Tensor, torch.nn.Parameter) for a in args):
            return self.graph_module(*args)  # being traced (fake or functional tensors), or odd inputs
        on_gpu = args[0].is_cuda
        if not on_gpu and not self.settings.simulate:
            return self.graph_module(*args)
        key = tuple((tuple(a.shape), a.dtype, str(a.device)) for a in args)
        if key not in self.programs:
            self.programs[key] = self._compile(args, on_gpu)
            if len(self.programs) > self.settings.cache_size:
                self.programs.popitem(last=False)
        self.programs.move_to_end(key)
        program = self.programs[key]
        if program is None:
            return self.graph_module(*args)
        try:
            out = program(*args, device="cuda" if on_gpu else "sim", sim_mode=self.settings.sim_mode)
        except Exception as err:  # emmy must never break the user's program
            self._fall_back(err)
            self.programs[key] = None
            return self.graph_module(*args)
        return _restrided(out, self.strides)

    def _compile(self, args, on_gpu: bool):
        import emmy
        from emmy.capture.aten_graph import AtenGraph

        try:
            target = self.settings.target
            if target is None and on_gpu:
                from emmy.calling import gpu_arch

                target = gpu_arch(args[0].device)
            program = emmy.optimize(AtenGraph(self.graph_module), *args, target=target)
            program.plan  # noqa: B018 - build every stage now, so a failure falls back here
            if on_gpu:
                program.gpu_library(args[0].device)
            log.info("emmy: compiled %s (%s) into %d kernels", self.name, program.signature.describe(),
                     len(program.kernel_ir))
            return program
        except Exception as err:
            self._fall_back(err)
            return None

    def _fall_back(self, err: Exception) -> None:
        if not self.warned:
            self.warned = True
            reason = err.render() if isinstance(err, EmmyError) else f"{type(err).__name__}: {err}"
            warnings.warn(f"emmy could not run {self.name}, so it runs eagerly: {reason.splitlines()[0]}",
                          RuntimeWarning, stacklevel=3)
        log.debug("emmy: %s falls back to eager", self.name, exc_info=err)

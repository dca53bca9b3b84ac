"""A compiled program: every pipeline stage built so far, printable by name."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from emmy.errors import EmmyError, StageNotBuiltError

STAGES = ("torch", "tensor", "loop", "tile", "kernel", "cuda")
BUILT_STAGES = ("torch", "tensor", "loop", "tile", "kernel", "cuda")


def pricer_for(target, pins=None, schedule_rules: tuple = ()):
    """A KernelPricer for `target` that offers the rows this Kernel IR lowering takes: the schedule wing
    is given the lowering's check here, above both, so neither imports the other."""
    from emmy.kernel_ir.lower import lowers_row
    from emmy.schedule.knobs import Schedule
    from emmy.schedule.pricing import KernelPricer

    return KernelPricer(target, lowers_row, pins or Schedule(), schedule_rules)


@dataclass(frozen=True, repr=False)
class Program:
    captured: object  # emmy.capture.Captured
    target: object  # emmy.extract.targets.Target
    rule_groups: tuple = ()  # emmy.rules.RuleGroup, built-in ones and any the user loaded
    budget: object = None  # emmy.egraph.driver.Budget
    knobs: object = None  # emmy.schedule.knobs.Schedule: pins for every kernel
    rows: tuple = ()  # (kernel name, Schedule): rows chosen for single kernels instead of the model's
    schedule_rules: tuple = ()  # emmy.rules.ScheduleRuleGroup the user loaded, beside the built-in ones

    @cached_property
    def tensor_program(self):
        from emmy.capture.cache import CachedCapture

        if isinstance(self.captured, CachedCapture):  # decomposed in an earlier run
            return self.captured.tensor_program
        from emmy.decompose import to_tensor_ir

        return to_tensor_ir(self.captured)

    @property
    def tensor_ir(self):
        return self.tensor_program.graph

    @cached_property
    def loop_result(self):
        """The e-graph's phases run on the Tensor IR, and the extracted Loop IR: kernel boundaries and
        fold forms chosen so that the sum of the kernels' best rows, as the cost model prices them,
        is lowest (emmy.egraph.search)."""
        from emmy.egraph import optimize_loops

        return optimize_loops(self.tensor_ir, list(self.rule_groups), self.budget, self.pricer)

    @cached_property
    def pricer(self):
        """The kernels' rows and prices (emmy.schedule.pricing.KernelPricer): extraction prices with it,
        and the Tile IR, the schedule space and `explain` read the rows it found, so each is found once."""
        return pricer_for(self.target, self.pins, self.schedule_rules)

    @property
    def pins(self):
        from emmy.schedule.knobs import Schedule

        return self.knobs or Schedule()

    @property
    def loop_ir(self):
        return self.loop_result.program

    @cached_property
    def tile_ir(self):
        """Each kernel with its cheapest offered knob row (within the pins) and its Fold tree."""
        from emmy.tile_ir.build import build_tile_program

        return build_tile_program(self.loop_result.program, self.pricer, dict(self.rows))

    def with_rows(self, rows: dict) -> Program:
        """The same program (its Loop IR reused) with these kernels' rows, kernel name -> Schedule,
        instead of the cost model's choice: each must be offered for its kernel (`schedule_space`)."""
        import dataclasses

        other = dataclasses.replace(self, rows=tuple(sorted({**dict(self.rows), **rows}.items())))
        for computed in ("tensor_program", "loop_result", "pricer", "_offered_space"):  # cached: shared, not rebuilt
            if computed in self.__dict__:
                other.__dict__[computed] = self.__dict__[computed]
        return other

    @property
    def buffer_types(self) -> dict:
        """Every buffer of the Loop IR program (inputs, weights, kernel outputs) -> TensorType."""
        from emmy.loop_ir.nodes import buffer_types

        return buffer_types(self.loop_ir)

    @cached_property
    def _lowered(self) -> tuple:
        """(Tile IR kernel, its Kernel IR launches) per kernel: a split row runs as more than one."""
        from emmy.kernel_ir.lower import lower_kernel

        return tuple((tk, tuple(lower_kernel(tk, self.buffer_types))) for tk in self.tile_ir.kernels)

    @cached_property
    def kernel_ir(self) -> list:
        """Each Tile IR kernel in hardware terms (emmy.kernel_ir)."""
        return [k for _, launches in self._lowered for k in launches]

    @cached_property
    def signature(self):
        """The inputs the program takes and the outputs it returns, with their names (emmy.plan.Signature)."""
        from emmy.capture.outputs import OutputStructure
        from emmy.plan import Signature

        graph = self.tensor_ir
        mutations = self.tensor_program.mutations
        empties = self.tensor_program.empty_outputs
        structure = (getattr(self.captured, "outputs", None)
                     or OutputStructure.flat(len(graph.outputs) - len(mutations) + len(empties)))
        structure = structure.with_fixed_tensors(empties)
        from emmy.capture import flags_of

        keywords = getattr(self.captured, "keywords", ())
        flags = flags_of(getattr(self.captured, "example_inputs", None), bool(keywords),
                         getattr(self.captured, "fixed_ints", False))
        return Signature(tuple((n.name, n.type) for n in graph.inputs), structure, mutations, keywords, flags,
                         self.tensor_program.guards)

    @cached_property
    def plan(self):
        """What running the program needs (emmy.plan.RunPlan): built kernels, buffers, signature."""
        from emmy.plan import plan_of

        return plan_of(self)

    @cached_property
    def kernels(self) -> tuple:
        """One emmy.calling.KernelInfo per kernel: its row, predicted and measured time, registers
        and shared memory (registers need nvcc: None without it)."""
        from emmy.calling import kernel_infos

        return kernel_infos(self)

    def __call__(self, *inputs, device: str | None = None, sim_mode: str | None = None, **keywords):
        """Run the program on torch tensors; returns torch tensors shaped and nested as the captured
        program returned them. CUDA tensors run the built kernels on their GPU. CPU tensors run the
        CUDA in the CPU simulator (a checking path, thousands of times slower than a GPU;
        `sim_mode`: plain, asan or racecheck) or, with device="interpret", Tensor IR in numpy.
        A program captured with example_kwargs takes those keywords again."""
        from emmy.calling import call, with_keywords

        return call(self, with_keywords(self.signature, inputs, keywords), device, sim_mode)

    def __repr__(self) -> str:
        """One line; builds nothing (the stages built so far say what is known)."""
        built = [stage for stage, attribute in (("tensor", "tensor_program"), ("loop", "loop_result"),
                                                ("tile", "tile_ir"), ("cuda", "cuda_source"))
                 if attribute in self.__dict__]
        shape = self.signature.describe() if "tensor_program" in self.__dict__ else "not decomposed yet"
        kernels = f", {len(self.tile_ir.kernels)} kernels" if "tile_ir" in self.__dict__ else ""
        return f"<emmy program {shape} for {self.target.name}{kernels}; built: {', '.join(built) or 'torch'}>"

    def gpu_library(self, device=None):
        """The path of the program's GPU library (built by nvcc, cached by content under
        EMMY_CACHE_DIR/gpu); with a torch `device`, refused when that GPU cannot run the target."""
        from emmy.calling import check_arch
        from emmy.config import settings
        from emmy.gpu import program_library

        if device is not None:
            check_arch(self.target.name, device)
        return program_library(self, settings().cache_dir / "gpu")

    def save(self, path, targets: tuple[str, ...] | None = None) -> None:
        """Write the program to `path` for emmy.load: the plan, the knob rows, the weights, the CUDA
        text, and per target (default: the program's) the cubin and the GPU library when nvcc is
        here. Load it with the same emmy version."""
        from emmy.saved import save

        save(self, path, targets)

    @cached_property
    def cuda_source(self) -> str:
        """One CUDA translation unit with every kernel (includes emmy_rt.cuh)."""
        from emmy.kernel_ir.cuda import program_source

        sources = {tk.kernel.name: f"{tk.kernel.name} writes {', '.join(n for n, _ in tk.kernel.outputs)}"
                   for tk in self.tile_ir.kernels}
        return program_source(self.kernel_ir, self.buffer_types, sources)

    def cubin(self, target: str | None = None):
        """The program's CUDA built by nvcc for `target` (default: the program's), cached; with each
        kernel's registers, shared memory and spills (emmy.nvcc.Cubin)."""
        from emmy.nvcc import build_cubin

        return build_cubin(self.cuda_source, target or self.target.name)

    def schedule_space(self):
        """Every knob row offered for every kernel, within the pins: legal (the schedule rules) and
        lowered by Kernel IR (the pricer's `offered`). Built once per program."""
        return self._offered_space

    @cached_property
    def _offered_space(self):
        import time

        from emmy.schedule.space import ScheduleSpace

        start = time.perf_counter()
        types = self.buffer_types
        rows = {k.name: self.pricer.offered(k, types) for k in self.loop_ir.kernels}
        return ScheduleSpace(rows, time.perf_counter() - start)

    def ranked_rows(self, kernel) -> list:
        """A Loop IR kernel's offered rows as cost breakdowns, cheapest first (emmy.schedule.choose)."""
        return self.pricer.ranked(kernel, self.buffer_types)

    def explain(self, top: int = 3):
        """Why the program came out as it did (emmy.explain.Explanation): budgets that ran out; per
        kernel boundary and fold form, what the program would cost with the other choice; per
        kernel, its chosen row and the next `top` rows with their cost breakdowns."""
        from emmy.explain import Explanation, KernelRows, closest_first

        tiles = {tk.kernel.name: tk for tk in self.tile_ir.kernels}
        kernels = tuple(KernelRows(k.name, tiles[k.name].signature, tuple(self.ranked_rows(k)[:top + 1]))
                        for k in self.loop_ir.kernels)
        result = self.loop_result
        return Explanation(self.target.title, sum(tk.seconds for tk in self.tile_ir.kernels), kernels,
                           closest_first(result.decisions), tuple(self.warnings), result.search)

    @property
    def warnings(self) -> list[str]:
        """One line per budget that ran out while optimizing (saturation phases, the boundary search);
        the program is then the best found within them."""
        return self.loop_result.warnings()

    @property
    def weights(self) -> dict[str, np.ndarray]:
        return self.tensor_program.weights

    @property
    def example_inputs(self) -> tuple | None:
        return self.captured.example_inputs

    def ir(self, stage: str) -> str:
        """The text of one stage (`torch`, `tensor`, ...)."""
        if stage not in STAGES:
            raise EmmyError(f"unknown IR stage {stage!r}; stages are {', '.join(STAGES)}")
        if stage == "torch":
            from emmy.capture.cache import CachedCapture
            from emmy.capture.printer import print_torch_ir

            if isinstance(self.captured, CachedCapture):
                return self.captured.torch_ir

            return print_torch_ir(self.captured)
        if stage == "tensor":
            from emmy.tensor_ir.printer import print_tensor_ir

            return print_tensor_ir(self.tensor_ir)
        if stage == "loop":
            from emmy.loop_ir.printer import print_loop_ir

            return print_loop_ir(self.loop_ir)
        if stage == "tile":
            from emmy.tile_ir.printer import print_tile_ir

            return print_tile_ir(self.tile_ir)
        if stage == "kernel":
            from emmy.kernel_ir.printer import print_kernel_ir

            return print_kernel_ir(self.kernel_ir)
        if stage == "cuda":
            return self.cuda_source
        raise StageNotBuiltError(f"the {stage} stage is not built yet; stages so far: {', '.join(BUILT_STAGES)}")

    def interpret(self, *inputs, stage: str = "tensor", updates: list | None = None) -> list:
        """Run a stage's numpy interpreter ("tensor" or "loop"); inputs and outputs are torch tensors.
        The returned outputs; `updates`, where given, gets the new values of what the program changes
        in place (signature.mutations)."""
        from emmy.dtypes import from_numpy, to_numpy
        from emmy.runtime import check_index_values, check_inputs
        from emmy.tensor_ir.interpreter import evaluate

        graph = self.tensor_ir
        given = check_inputs(self, inputs or self.example_inputs)
        check_index_values(self, given)
        arrays = {node.name: to_numpy(t)[0] for node, t in zip(graph.inputs, given)}
        if stage == "loop":
            from emmy.loop_ir.interpreter import run_program

            results = run_program(self.loop_ir, arrays, self.weights)
        elif stage == "tensor":
            results = evaluate(graph, arrays, self.weights)
        else:
            raise EmmyError(f"no interpreter for stage {stage!r}; use tensor or loop")
        values = [from_numpy(r, graph[name].type.dtype) for r, name in zip(results, graph.outputs)]
        returned = len(graph.outputs) - len(self.tensor_program.mutations)
        if updates is not None:
            updates.extend(values[returned:])
        return values[:returned]

"""What running a compiled program needs, and nothing of how it was found: the input signature,
the buffers, the Kernel IR launches in order, the CUDA text and the outputs' names and nesting.

A `Program` makes its plan once its kernels are built; a saved program (emmy.saved) stores one, so
a loaded program runs with neither torch.export nor egglog nor nvcc. The runtime (emmy.runtime,
emmy.gpu) runs plans.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from emmy.capture.outputs import OutputStructure


@dataclass(frozen=True)
class Signature:
    """The tensors a program takes and what it returns."""

    inputs: tuple  # (buffer name, emmy.tensor_ir.nodes.TensorType) per user input, in call order
    structure: OutputStructure  # the returned nesting and each output's name
    # what the outputs after the returned ones update in place (emmy.decompose.from_aten.TensorProgram)
    mutations: tuple = ()
    keywords: tuple[str, ...] = ()  # the keyword arguments a call passes, in the order the inputs take them
    flags: tuple = ()  # (where, value) of each bool argument, compiled in as a constant (emmy.capture.flags_of)
    guards: object = None  # emmy.tensor_ir.guards.Guards: numbers read from the inputs, checked on each call

    @property
    def fixed_ints(self) -> bool:
        """Whether int arguments are constants too: a program that reads one as a size was captured so."""
        return any(type(value) is int for _, value in self.flags)

    @property
    def output_names(self) -> tuple[str, ...]:
        return self.structure.names

    def describe(self) -> str:
        ins = ", ".join(f"{name}: {t.dtype}{list(t.shape)}" for name, t in self.inputs)
        read = "" if self.guards is None else \
            f"; compiled for {', '.join(str(r.expected) for r in self.guards.reads)} read from the inputs"
        return f"({ins}) -> {', '.join(self.output_names)}{read}"


@dataclass(frozen=True)
class RunPlan:
    target: str  # the sm_XX the CUDA was written for
    signature: Signature
    outputs: tuple[str, ...]  # the buffer holding each returned tensor, in order (may repeat)
    read_inputs: tuple[str, ...]  # the user inputs some kernel reads (the rest are not uploaded)
    weights: tuple  # (name, TensorType) of each weight a kernel reads
    kernel_outputs: tuple  # (name, TensorType) of every buffer a kernel writes, zeroed before a run
    kernels: tuple  # emmy.kernel_ir.nodes.KernelIR, launched in this order
    cuda_source: str
    buffer_types: dict = field(compare=False)  # every named buffer -> TensorType

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.signature.inputs)

    def named_outputs(self, fetch) -> dict:
        """The program's outputs by their names (emmy.capture.outputs), in interpreter storage (numpy);
        `fetch(buffer)` gives a buffer's values in kernel storage."""
        from emmy.dtypes import from_device

        return {name: from_device(fetch(buffer), self.buffer_types[buffer].dtype)
                for name, buffer in zip(self.signature.output_names, self.outputs)}

    def updates(self, fetch) -> list:
        """The new values of the inputs and buffers the program changes in place (signature.mutations),
        in interpreter storage."""
        from emmy.dtypes import from_device

        returned = len(self.signature.output_names)
        return [from_device(fetch(buffer), self.buffer_types[buffer].dtype) for buffer in self.outputs[returned:]]

    @cached_property
    def scratch(self) -> dict:
        """Buffers no Loop IR kernel names (a split's workspace, the index-fault record):
        name -> (element count, numpy dtype), zeroed before a run."""
        named = set(self.read_inputs) | {n for n, _ in self.weights} | {n for n, _ in self.kernel_outputs}
        found = {}
        for kernel in self.kernels:
            for p in kernel.params:
                if p.name not in named and p.name not in found:
                    found[p.name] = (p.scratch, p.dtype.numpy)
        return found


def plan_of(program) -> RunPlan:
    """The plan of an emmy.program.Program whose kernels are built."""
    loops = program.loop_ir
    types = program.buffer_types
    inputs = {name for name, _ in program.signature.inputs}
    read = [name for name, _ in loops.inputs] + [name for name in loops.outputs if name in inputs]
    return RunPlan(program.target.name, program.signature, tuple(loops.outputs), tuple(dict.fromkeys(read)),
                   tuple(loops.weights), tuple((name, t) for k in loops.kernels for name, t in k.outputs),
                   tuple(program.kernel_ir), program.cuda_source, dict(types))

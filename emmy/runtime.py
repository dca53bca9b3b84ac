"""Run a compiled program's kernels in order on a device, with every intermediate buffer
allocated, and compare its outputs with torch.

Devices: "sim" (the CPU simulator, emmy.sim, in a build mode: plain, asan or racecheck) and
"cuda" (a GPU, through an nvcc-built host library: emmy.gpu).
Buffers on a device hold the storage type: bf16 as its 16-bit patterns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from emmy.dtypes import DType
from emmy.errors import EmmyError, IndexOutOfRangeError, InputMismatchError
from emmy.kernel_ir.index_faults import INDEX_FAULTS, raise_recorded_fault, takes_faults

DEVICES = ("sim", "cuda")


def to_device(values: np.ndarray, dtype: DType) -> np.ndarray:
    """Interpreter storage (bf16 as float32 values) -> kernel storage (bf16 as uint16 bits)."""
    values = np.ascontiguousarray(values)
    if dtype is DType.BF16:
        return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return values.astype(dtype.numpy, copy=True)


def empty_buffer(type_) -> np.ndarray:
    storage = np.uint16 if type_.dtype is DType.BF16 else type_.dtype.numpy
    return np.zeros(type_.shape, storage)


def check_inputs(program, inputs, device: str = "cpu") -> list:
    """Each input must be what the program (emmy.program.Program or a loaded one) was compiled for: a
    torch tensor of the compiled shape and dtype on `device` ("cpu", or "cuda" for a GPU run; a
    strided view is read as the values it shows), or a Python number for a rank-0 input. One line
    says which input is wrong and what it expected (InputMismatchError). Returns the inputs as tensors."""
    import torch

    from emmy.dtypes import from_torch, real_pairs

    from emmy.capture import flat_inputs, scalar_tensor

    expected = program.signature.inputs
    inputs = None if inputs is None else flat_inputs(inputs, program.signature.fixed_ints)
    if inputs is None or len(inputs) != len(expected):
        raise InputMismatchError(f"the program takes {len(expected)} inputs ({', '.join(n for n, _ in expected)}), "
                                 f"got {0 if inputs is None else len(inputs)}")

    # a Python number where the program takes a rank-0 input
    inputs = [scalar_tensor(g) if not t.shape else g for (_, t), g in zip(expected, densified(inputs))]
    # a complex input is compiled as its (.., 2) real pairs: the same memory, viewed as real
    inputs = [real_pairs(g) if isinstance(g, torch.Tensor) and t.shape == (*g.shape, 2) else g
              for (_, t), g in zip(expected, inputs)]
    for position, ((name, type_), given) in enumerate(zip(expected, inputs)):
        where = f"input {position} ({name})"
        want = f"{type_.dtype}{list(type_.shape)}"
        if not isinstance(given, torch.Tensor):
            raise InputMismatchError(f"{where}: expected a torch tensor {want}, got {type(given).__name__}")
        if tuple(given.shape) != type_.shape:
            raise InputMismatchError(f"{where}: expected shape {list(type_.shape)}, got {list(given.shape)} "
                                     "(the program is compiled for one shape; compile again for another)")
        try:
            dtype = from_torch(given.dtype)
        except EmmyError:
            dtype = None
        if dtype is not type_.dtype:
            raise InputMismatchError(f"{where}: expected dtype {type_.dtype} ({want}), got {given.dtype}; "
                                     f"convert it with .to() first")
        if given.device.type != device:
            raise InputMismatchError(f"{where}: expected a {device.upper()} tensor like the other inputs, "
                                     f"got one on {given.device}")
        if given.layout is not torch.strided:
            raise InputMismatchError(f"{where}: expected a dense (strided) tensor, got layout {given.layout}")
    check_guards(program.signature, inputs)
    return inputs


def check_guards(signature, inputs: list) -> None:
    """Every number the program read from its inputs, and was compiled for, must be the same on these
    (torch tensors in the signature's order): computed here, before any kernel runs."""
    guards = signature.guards
    if guards is None:
        return
    from emmy.dtypes import to_numpy

    given = dict(zip((name for name, _ in signature.inputs), inputs))
    arrays = {name: to_numpy(given[name].detach().cpu())[0] for name in guards.input_names}
    said = guards.violation(arrays)
    if said:
        raise InputMismatchError(said)


def densified(inputs: list) -> list:
    """Sparse tensors (COO, CSR, ...) as their dense values: a program reads every input dense (a
    graph's sparse adjacency multiplied with torch.sparse.mm or @ is a dense product), at the memory
    of the dense matrix."""
    import torch

    return [x.to_dense() if isinstance(x, torch.Tensor) and x.layout is not torch.strided else x for x in inputs]


def check_index_values(program, inputs) -> None:
    """Every value an index input (embedding ids, gather indices) is read at must lie in the axis
    it indexes, for the interpreters: refused here, naming the input and value. (Compiled code
    clamps a bad one and records it on the device: emmy.kernel_ir.index_faults.)"""
    from emmy.affine import Gathered
    from emmy.tensor_ir.nodes import IndexMap

    position = {node.name: k for k, node in enumerate(program.tensor_ir.inputs) if not node.type.dtype.is_float}
    for node in program.tensor_ir.nodes:
        if not isinstance(node, IndexMap) or not position:
            continue
        atoms = [a for e in node.index for a, _ in e.terms if isinstance(a, Gathered) and a.buffer in position]
        if not atoms or not node.type.numel:
            continue
        tables = {a.buffer: np.asarray(inputs[position[a.buffer]]) for a in atoms}
        coords = np.indices(node.type.shape, sparse=True) if node.type.shape else ()
        for atom in atoms:
            values = tables[atom.buffer]
            read = np.zeros(values.shape, dtype=bool)
            read[tuple(np.asarray(e.evaluate(coords, tables), dtype=np.int64) for e in atom.index)] = True
            bad = read & atom.positions(values)[1]  # only the elements this map reads
            if bad.any():
                first = tuple(int(i) for i in np.argwhere(bad)[0])
                raise IndexOutOfRangeError(
                    f"input {position[atom.buffer]} ({atom.buffer}): index {int(values[first])} at {list(first)} is "
                    f"outside {atom.range_text()}, the axis it indexes (in {node.name})")


def host_buffers(program, inputs) -> dict[str, np.ndarray]:
    """Every buffer the program's kernels name, in kernel storage: inputs (torch tensors, in the
    signature's order), weights, zeroed kernel outputs and scratch (a split's workspace). `program`:
    an emmy.program.Program or a loaded one (anything with a `plan` and `weights`)."""
    from emmy.dtypes import to_numpy

    plan = program.plan
    by_name = dict(zip(plan.input_names, inputs))
    types = plan.buffer_types
    buffers = {name: to_device(to_numpy(by_name[name])[0], types[name].dtype) for name in plan.read_inputs}
    buffers |= {name: to_device(program.weights[name], t.dtype) for name, t in plan.weights}
    buffers |= {name: empty_buffer(t) for name, t in plan.kernel_outputs}
    buffers |= {name: np.zeros(count, dtype) for name, (count, dtype) in plan.scratch.items()}
    return buffers


@dataclass(frozen=True)
class Check:
    output: str
    dtype: DType
    max_abs: float
    max_rel: float  # over each value's scale (emmy.checking)
    ok: bool
    torch_abs: float | None = None  # torch's own largest error in the same dtype
    bias_ulps: float = 0.0
    why: str = ""


def run_program(program, inputs=None, device: str = "sim", mode: str | None = None,
                updates: list | None = None) -> dict[str, np.ndarray]:
    """Every kernel of `program` (an emmy.program.Program or a loaded one) in order; the program's
    outputs by name (`out0`, ... or the module's own names), in interpreter storage. `inputs`: CPU
    torch tensors (default: the example inputs). `mode`: the simulator build (default
    EMMY_SIM_MODE, else plain). `updates`: where given, the new values of what the program changes in
    place (signature.mutations) are appended to it."""
    if device not in DEVICES:
        raise EmmyError(f"unknown device {device!r}; devices: {', '.join(DEVICES)}")
    import emmy.sim as sim

    given = check_inputs(program, inputs if inputs is not None else program.example_inputs)
    buffers = host_buffers(program, given)
    if device == "cuda":
        from emmy.gpu import ProgramOnGpu

        on_gpu = ProgramOnGpu(program, buffers)
        try:
            on_gpu.run()
            if updates is not None:
                updates.extend(program.plan.updates(on_gpu.fetch))
            return on_gpu.outputs()
        finally:
            on_gpu.close()
    if mode is None:
        from emmy.config import settings

        mode = settings().sim_mode
    plan = program.plan
    if plan.kernels:  # none where every output has no elements or is an input as it is
        module = sim.load(plan.cuda_source, "program.cu", mode=mode)
        launch_in_order(module, plan, plan.kernels, buffers)
    if updates is not None:
        updates.extend(plan.updates(buffers.__getitem__))
    return plan.named_outputs(buffers.__getitem__)


def launch_in_order(module, program, kernels, buffers: dict[str, np.ndarray],
                    counts: dict | None = None, timings: dict | None = None) -> None:
    """Launch `kernels` (Kernel IR of `program`, a Program or its RunPlan, by name in the simulator `module`) one after another
    on `buffers`; a bad index value a kernel recorded is raised after its launch. With `counts` (a
    race-check module), counts[kernel][buffer] = (bytes read, bytes written) by each launch; with
    `timings`, timings[kernel] = the launch's wall seconds in the simulator."""
    import time

    import emmy.sim as sim

    for kernel in kernels:
        args = [buffers[p.name] for p in kernel.params]
        args += [sim.TensorMap(buffers[buffer].reshape(-1, row), box=(box_rows, box_cols))
                 for buffer, row, box_rows, box_cols in kernel.tensor_maps]
        if counts is None:
            start = time.perf_counter()
            module.launch(kernel.name, grid=kernel.grid, block=kernel.block, args=args,
                          shared_bytes=kernel.dynamic_smem)
            if timings is not None:
                timings[kernel.name] = time.perf_counter() - start
        else:
            moved = module.count(kernel.name, grid=kernel.grid, block=kernel.block, args=args,
                                 shared_bytes=kernel.dynamic_smem)
            counts[kernel.name] = {p.name: rw for p, rw in zip(kernel.params, moved)}
        if takes_faults(kernel):
            raise_recorded_fault(buffers[INDEX_FAULTS], kernel, getattr(program, "plan", program))


def count_accesses(program, kernels=None, inputs=None) -> dict[str, dict[str, tuple[int, int]]]:
    """Run `kernels` (default: the program's Kernel IR) in the simulator's race-check build and say,
    per kernel and buffer, how many bytes its threads read and wrote (each access counted, before
    any cache): what the cost model's requested bytes are checked against."""
    import emmy.sim as sim
    from emmy.kernel_ir.cuda import program_source

    kernels = program.kernel_ir if kernels is None else kernels
    buffers = host_buffers(program, check_inputs(program, inputs or program.example_inputs))
    for kernel in kernels:  # scratch of rows other than the chosen ones (a split's workspace)
        buffers |= {p.name: np.zeros(p.scratch, p.dtype.numpy) for p in kernel.params if p.name not in buffers}
    source = program_source(kernels, program.buffer_types, {})
    module = sim.load(source, "program.cu", mode="racecheck")
    counts: dict = {}
    launch_in_order(module, program, kernels, buffers, counts)
    return counts


def check_program(program, inputs=None, device: str = "sim", mode: str | None = None) -> list[Check]:
    """Run on `device` and compare every output with torch (float64), within the dtype's tolerance."""
    return compare_outputs(program, run_program(program, inputs, device, mode), inputs)


def compare_outputs(program, results: dict[str, np.ndarray], inputs=None, references=None) -> list[Check]:
    """The program's outputs (buffer name -> values in interpreter storage) against torch
    (`references`: emmy.checking.torch_comparison's, when already computed for these inputs)."""
    from emmy.checking import compare, torch_comparison
    from emmy.tile_ir.nodes import Fold

    references = references if references is not None else torch_comparison(program.captured, inputs)
    # kernels fold sequentially: the longest fold sets how far f32 rounding may drift
    longest = max((p.extent for k in program.tile_ir.kernels for p in k.parts if isinstance(p, Fold)), default=1)
    checks = []
    buffers = program.plan.outputs
    for (name, actual), buffer, (want, scale, theirs) in zip(results.items(), buffers, references):
        dtype = program.buffer_types[buffer].dtype
        c = compare(actual.astype(np.float64).reshape(want.shape), want, dtype, longest, scale, theirs)
        checks.append(Check(name, dtype, c.max_abs, c.max_rel, c.ok, c.torch_abs, c.bias_ulps, c.why))
    return checks

"""Calling a compiled program on torch tensors, and the table of its kernels.

Shared by emmy.program.Program and the programs emmy.load gives back (emmy.saved.LoadedProgram):
each has a `plan` (emmy.plan.RunPlan), `weights` and `signature`, and says where its GPU library is.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass

from emmy.errors import EmmyError, InputMismatchError

CALL_DEVICES = ("sim", "cuda", "interpret")


@dataclass(frozen=True)
class KernelInfo:
    """One kernel of a compiled program, as `program.kernels` lists it."""

    name: str  # the Loop IR kernel
    launches: tuple[str, ...]  # the CUDA kernels it runs as, in order (a split row runs as two)
    row: str  # its knob row (emmy.schedule.knobs)
    predicted_s: float  # the cost model's time for the row
    measured_s: float | None  # a measured time for this row on the target's GPU, if one is stored
    registers: int | None  # per thread, the most over its launches, as ptxas reports (None without nvcc)
    shared_bytes: int  # per block, static (from ptxas, when nvcc ran) plus dynamic

    def describe(self) -> str:
        measured = "-" if self.measured_s is None else f"{self.measured_s * 1e6:.1f} us"
        registers = "-" if self.registers is None else str(self.registers)
        return (f"{self.name}: {self.row}  predicted {self.predicted_s * 1e6:.1f} us, measured {measured}, "
                f"{registers} registers, {self.shared_bytes} B shared")


def kernel_infos(program) -> tuple[KernelInfo, ...]:
    """The kernels of an emmy.program.Program, registers from its cubin when nvcc is here."""
    from emmy.schedule.measured import current

    measurements = current()
    resources = program.cubin().resources if shutil.which("nvcc") else {}
    infos = []
    for tile, launches in program._lowered:
        found = [resources[k.name] for k in launches if k.name in resources]
        static = {k.name: resources[k.name].shared_bytes if k.name in resources else 0 for k in launches}
        measured = (measurements.lookup(program.target.key, tile.signature, str(tile.row))
                    if tile.signature else None)
        infos.append(KernelInfo(tile.kernel.name, tuple(k.name for k in launches), str(tile.row), tile.seconds,
                                measured, max((r.registers for r in found), default=None),
                                max((static[k.name] + k.dynamic_smem for k in launches), default=0)))
    return tuple(infos)


def with_keywords(signature, inputs: tuple, keywords: dict) -> tuple:
    """A call's positional inputs followed by its keyword ones, as the program takes them: one dict,
    in the order they were captured in."""
    expected = signature.keywords
    if not expected and not keywords:
        return inputs
    if set(keywords) != set(expected):
        missing, extra = [k for k in expected if k not in keywords], sorted(set(keywords) - set(expected))
        said = "; ".join(part for part in (f"missing {', '.join(missing)}" if missing else "",
                                            f"unexpected {', '.join(extra)}" if extra else "") if part)
        takes = f"takes the keywords {', '.join(expected)}" if expected else "was captured without keywords"
        raise InputMismatchError(f"the program {takes}: {said}")
    return (*inputs, {k: keywords[k] for k in expected})


def _check_flags(signature, inputs: tuple) -> None:
    """A call's flags (bool arguments, and int ones where the program read an int as a size) must be
    the ones the program was compiled with: code branched on them, or sized by them, while it was
    captured."""
    from emmy.capture import flags_of

    given = dict(flags_of(inputs, bool(signature.keywords), signature.fixed_ints))
    for where, value in signature.flags:
        got = given.get(where, value if value is not None else _NOT_A_FLAG)
        if got is _NOT_A_FLAG or got != value:
            said = "something other than None" if got is _NOT_A_FLAG else got
            raise InputMismatchError(f"{where} was {value} when the program was captured, and the program is "
                                     f"compiled for that value; got {said} (compile again for it)")


_NOT_A_FLAG = object()  # a call passing a tensor (or nothing) where the program was captured with None


def call(program, inputs: tuple, device: str | None, sim_mode: str | None):
    """program(*inputs): see emmy.program.Program.__call__."""
    import torch

    if device is None:
        device = "cuda" if any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs) else "sim"
    if device not in CALL_DEVICES:
        raise EmmyError(f"unknown device {device!r}; a program runs on {', '.join(CALL_DEVICES)} "
                        "(default: cuda for CUDA tensors, else sim)")
    signature = program.signature
    if not inputs and signature.inputs:  # never the example inputs in the user's stead
        from emmy.runtime import check_inputs

        check_inputs(program, [])  # refuses, naming the inputs
    _check_flags(signature, inputs)
    returned = len(signature.output_names)
    updates: list = []
    if device == "interpret":
        if not hasattr(program, "interpret"):
            raise EmmyError("a loaded program has no Tensor IR to interpret; run it with device='sim' "
                            "or on CUDA tensors")
        outputs = program.interpret(*inputs, updates=updates)
    elif device == "sim":
        from emmy.dtypes import from_numpy
        from emmy.runtime import run_program

        types = program.plan.buffer_types
        results = run_program(program, list(inputs), "sim", sim_mode, updates=updates)
        outputs = [from_numpy(values, types[buffer].dtype)
                   for values, buffer in zip(results.values(), program.plan.outputs)]
        updates = [from_numpy(values, types[buffer].dtype)
                   for values, buffer in zip(updates, program.plan.outputs[returned:])]
    elif not program.plan.outputs:  # nothing to compute (every output has no elements)
        outputs = []
    else:
        everything = _call_on_gpu(program, inputs)
        outputs, updates = everything[:returned], everything[returned:]
    _update_in_place(program, inputs, signature.mutations, updates)
    return signature.structure.pack(list(outputs))


def _update_in_place(program, inputs: tuple, mutations: tuple, values: list) -> None:
    """What the module changes in place, changed as eager PyTorch would: the caller's input tensors,
    and the program's own copy of each buffer (the next call reads the new values)."""
    if not mutations:
        return
    from emmy.capture import flat_inputs
    from emmy.dtypes import to_numpy

    taken = flat_inputs(inputs, program.signature.fixed_ints)
    given = dict(zip((name for name, _ in program.signature.inputs), taken))
    for (kind, name), value in zip(mutations, values):
        if kind == "input":
            given[name].copy_(value.to(given[name].device))
        else:
            program.weights[name] = to_numpy(value)[0]
            for on_device in program.__dict__.get("_weights_on", {}).values():
                on_device.pop(name, None)  # uploaded again, alone, on the next call on that GPU


def _call_on_gpu(program, inputs: tuple) -> list:
    import torch

    from emmy.capture import scalar_tensor
    from emmy.gpu import run_on_torch_cuda
    from emmy.runtime import check_inputs

    on = next((x.device for x in inputs if isinstance(x, torch.Tensor) and x.is_cuda), None)
    # a Python number for a rank-0 input goes to the GPU the tensors are on
    inputs = [x if isinstance(x, torch.Tensor) or on is None else scalar_tensor(x).to(on) for x in inputs]
    given = check_inputs(program, list(inputs), device="cuda")
    devices = {x.device for x in given}
    if len(devices) > 1:
        raise InputMismatchError(f"the inputs are on {len(devices)} GPUs ({', '.join(map(str, devices))}); "
                                 "a program runs on one")
    if not given:
        raise InputMismatchError("a program without inputs runs on the simulator (device='sim'), not on CUDA")
    device = given[0].device
    return run_on_torch_cuda(program, program.gpu_library(device), given, device_weights(program, device))


def gpu_arch(device) -> str:
    """The sm_XY of a torch CUDA device."""
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def check_arch(target: str, device) -> None:
    """Code built for `target` (sm_XY) runs on GPUs of that architecture or newer ones (through its PTX)."""
    have = gpu_arch(device)
    if int(have.removeprefix("sm_")) < int(target.removeprefix("sm_").rstrip("a")):
        raise EmmyError(f"the program is compiled for {target}, but {device} is {have}; compile it with "
                        f"target={have!r}")


def device_weights(program, device) -> dict:
    """The program's weights as torch tensors in kernel storage on `device`, uploaded on first use
    and kept on the program (a compiled program is called many times)."""
    import torch

    from emmy.runtime import to_device

    on_device = program.__dict__.setdefault("_weights_on", {}).setdefault(device, {})
    for name, t in program.plan.weights:  # a buffer the program changed in place was dropped: uploaded anew
        if name not in on_device:
            on_device[name] = torch.from_numpy(to_device(program.weights[name], t.dtype)).to(device)
    return on_device

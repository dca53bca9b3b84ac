"""The index-fault record: how a kernel that reads index tensors (embedding ids, gather indices)
tells the run that one of their values lies outside the axis it indexes.

Every such kernel takes one more buffer, `emmy_index_faults`, of FAULT_WORDS int64 words, zeroed
before the program runs. emmy_rt.cuh's `gather_index` clamps a bad value (so no access leaves the
gathered buffer) and the first thread to find one claims the record with an atomic compare-and-swap
and fills it: [claimed, tensor code, position in the index tensor, value, extent, wraps]. The
runtime reads the record after each launch (simulator and GPU alike) and raises
IndexOutOfRangeError naming the input, the element and the value."""

from __future__ import annotations

import zlib

import numpy as np

from emmy.dtypes import DType
from emmy.errors import IndexOutOfRangeError
from emmy.kernel_ir.nodes import KernelIR, Param

INDEX_FAULTS = "emmy_index_faults"
FAULT_WORDS = 6


def faults_param() -> Param:
    return Param(INDEX_FAULTS, DType.I64, True, FAULT_WORDS)


def tensor_code(buffer: str) -> int:
    """Which index tensor a record names: a 31-bit checksum of its buffer name (a kernel's code
    needs no table of the program's inputs; `raise_recorded_fault` looks the name up)."""
    return zlib.crc32(buffer.encode()) & 0x7FFFFFFF


def takes_faults(kernel: KernelIR) -> bool:
    return any(p.name == INDEX_FAULTS for p in kernel.params)


def raise_recorded_fault(record: np.ndarray, kernel: KernelIR, plan) -> None:
    """Raise IndexOutOfRangeError if `kernel` (of the emmy.plan.RunPlan `plan`) left a fault in
    `record`, naming the input, the element's coordinates and the value."""
    claimed, code, position, value, extent, wraps = (int(v) for v in np.asarray(record, np.int64)[:FAULT_WORDS])
    if not claimed:
        return
    inputs = list(plan.input_names)
    names = [n for n in inputs if tensor_code(n) == code] or \
        [n for n in plan.buffer_types if tensor_code(n) == code]  # a computed one: an argmax, clamped ids
    name = names[0] if len(names) == 1 else f"index tensor #{code}"
    where = f"input {inputs.index(name)} ({name})" if name in inputs else \
        f"{name} (computed by the program)" if name in plan.buffer_types else name
    shape = plan.buffer_types[name].shape if name in plan.buffer_types else ()
    at = [int(i) for i in np.unravel_index(position, shape)] if shape else []
    axis = f"[{-extent if wraps else 0}, {extent})"
    raise IndexOutOfRangeError(f"{where}: index {value} at {at} is outside {axis}, the axis it indexes "
                               f"(found on the device by kernel {kernel.name})")

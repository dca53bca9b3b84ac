"""The provisional cost of Loop IR: bytes moved plus operations, per kernel.

This is the simple model the fusion choice needs before the analytic,
per-target model exists: time = bytes / bandwidth + operations / rate +
launch overhead per kernel. Bytes are what each kernel reads (an element
read many times is counted once, as a cache would) and writes; operations
are counted with the number of times their loop nest runs them, so a value
recomputed inside a loop it does not depend on costs what it should.
"""

from __future__ import annotations

from dataclasses import dataclass

from emmy.loop_ir.nodes import Accumulate, Assign, Kernel, Load, Loop, Masked, Op

BANDWIDTH = 2.0e12  # bytes/s: an HBM-class GPU (order of magnitude; replaced per target later)
OP_RATE = 2.0e13  # scalar ops/s
LAUNCH = 3.0e-6  # s per kernel
EXPENSIVE = {"exp": 4, "log": 4, "sqrt": 4, "rsqrt": 4, "sigmoid": 4, "tanh": 4, "erf": 4, "divide": 4, "power": 8}


@dataclass(frozen=True)
class KernelCost:
    bytes_read: float
    bytes_written: float
    ops: float

    @property
    def time(self) -> float:
        return (self.bytes_read + self.bytes_written) / BANDWIDTH + self.ops / OP_RATE + LAUNCH


def kernel_cost(kernel: Kernel, buffer_sizes: dict[str, tuple[int, int]]) -> KernelCost:
    """buffer_sizes: name -> (elements, bytes per element)."""
    reads: dict[tuple, float] = {}
    ops = 0.0

    def walk(body, trips: float) -> None:
        nonlocal ops
        for stmt in body:
            if isinstance(stmt, Loop):
                walk(stmt.body, trips * stmt.extent)
            elif isinstance(stmt, Assign):
                if isinstance(stmt.expr, Load):
                    key = (stmt.expr.buffer,)
                    numel, size = buffer_sizes[stmt.expr.buffer]
                    reads[key] = reads.get(key, 0.0) + min(trips, numel) * size
                elif isinstance(stmt.expr, Op):
                    ops += trips * EXPENSIVE.get(stmt.expr.op, 1)
                elif isinstance(stmt.expr, Masked):
                    ops += trips
            elif isinstance(stmt, Accumulate):
                ops += trips

    walk(kernel.body, 1.0)
    # A buffer's elements are fetched at most once each, however many loads read them.
    read = sum(min(v, buffer_sizes[k[0]][0] * buffer_sizes[k[0]][1]) for k, v in reads.items())
    written = kernel.type.numel * kernel.type.dtype.itemsize
    return KernelCost(read, written, ops)

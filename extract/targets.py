"""The GPUs emmy compiles for: identity, features, and the limits that
decide which schedules are legal.

Limits are from the CUDA C++ Programming Guide's table of technical
specifications per compute capability (shared memory per block with opt-in,
per SM; threads and blocks per SM; 64K registers per SM throughout) and the
SM counts of the named GPUs' datasheets (A100 108, L40S 142, H100/H200 SXM
132, RTX 5090 170). Bandwidth and rates are datasheet leads for the first GPU
named (dense tensor-core f16 with f32 accumulate; the H200 for sm_90): the
provisional schedule cost uses them until measured ceilings replace them.
"""

from __future__ import annotations

from dataclasses import dataclass

from emmy.errors import UnknownTargetError


@dataclass(frozen=True)
class Target:
    name: str  # the nvcc architecture, e.g. "sm_90"
    compute_capability: tuple[int, int]
    gpus: tuple[str, ...]
    sms: int
    smem_per_block: int  # bytes a block may use (opt-in maximum)
    smem_per_sm: int  # bytes
    threads_per_sm: int
    blocks_per_sm: int
    dram_bandwidth: float  # bytes/s
    fp32_flops: float  # FLOP/s, SIMT
    tensor_flops: float  # FLOP/s, f16/bf16 mma with f32 accumulate, dense
    regs_per_sm: int = 65536
    max_threads_per_block: int = 1024

    @property
    def has_cp_async(self) -> bool:  # cp.async arrived with Ampere (PTX ISA 7.0)
        return self.compute_capability >= (8, 0)

    @property
    def has_tma(self) -> bool:  # the tensor memory accelerator arrived with Hopper
        return self.compute_capability >= (9, 0)


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("sm_80", (8, 0), ("A100",), sms=108, smem_per_block=163 * 1024, smem_per_sm=164 * 1024,
               threads_per_sm=2048, blocks_per_sm=32, dram_bandwidth=2.039e12, fp32_flops=19.5e12,
               tensor_flops=312e12),
        Target("sm_89", (8, 9), ("L40S", "RTX 4090"), sms=142, smem_per_block=99 * 1024, smem_per_sm=100 * 1024,
               threads_per_sm=1536, blocks_per_sm=24, dram_bandwidth=864e9, fp32_flops=91.6e12,
               tensor_flops=362e12),
        Target("sm_90", (9, 0), ("H100", "H200"), sms=132, smem_per_block=227 * 1024, smem_per_sm=228 * 1024,
               threads_per_sm=2048, blocks_per_sm=32, dram_bandwidth=4.8e12, fp32_flops=67e12,
               tensor_flops=989e12),
        Target("sm_120", (12, 0), ("RTX 5090",), sms=170, smem_per_block=99 * 1024, smem_per_sm=100 * 1024,
               threads_per_sm=1536, blocks_per_sm=32, dram_bandwidth=1.792e12, fp32_flops=104.8e12,
               tensor_flops=209.5e12),
    )
}


def get_target(name: str) -> Target:
    found = TARGETS.get(name)
    if found is None:
        raise UnknownTargetError(f"unknown target {name!r}; emmy knows {', '.join(TARGETS)}")
    return found

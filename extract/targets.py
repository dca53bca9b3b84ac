"""The GPUs emmy compiles for: identity, features, limits and rates, each
figure with its source.

A target is one nvcc architecture, described by the first GPU it names (the
H200 for sm_90, the GPU this project measures on). Figures come from three
kinds of source, cited per figure in `Target.sources`:

- the CUDA C++ Programming Guide's "technical specifications per compute
  capability" table (shared memory per SM and per block with opt-in, threads
  and blocks per SM, registers, threads per block);
- the GPU's datasheet or architecture whitepaper (SMs, L2, DRAM bandwidth,
  fp32 and dense f16/bf16 tensor-core rates with f32 accumulation);
- measurements, with their date, which override a datasheet ceiling
  (`MEASURED`; the measurement database of a later issue adds to it).

A figure marked "estimate" is neither; it says so and waits for a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from emmy.errors import UnknownTargetError

CUDA_GUIDE = "CUDA C++ Programming Guide, technical specifications per compute capability"
_KIB = 1024


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
    fp32_flops: float  # FLOP/s, SIMT FMA pipes (an FMA counts 2)
    tensor_flops: float  # FLOP/s, f16 mma with f32 accumulate, dense
    bf16_tensor_flops: float  # FLOP/s, bf16 mma with f32 accumulate, dense
    l2_bytes: int
    l2_bandwidth: float = 0.0  # bytes/s a kernel's re-reads of data resident in L2 achieve (estimate)
    l1_bandwidth: float = 0.0  # bytes/s over all SMs for re-reads an SM's L1 holds (estimate)
    l1_reuse_bytes: int = 64 * 1024  # footprint of re-reads that stay in an SM's L1 (estimate)
    regs_per_sm: int = 65536
    regs_per_block: int = 65536
    regs_per_thread: int = 255
    max_threads_per_block: int = 1024
    launch_seconds: float = 3.0e-6  # host-side launch overhead a kernel
    sfu_fraction: float = 1 / 8  # exp/rsqrt/... rate as a fraction of the fp32 FMA rate
    sources: dict = field(default_factory=dict, compare=False)  # figure name -> its source

    @property
    def has_cp_async(self) -> bool:  # cp.async arrived with Ampere (PTX ISA 7.0)
        return self.compute_capability >= (8, 0)

    @property
    def has_tma(self) -> bool:  # the tensor memory accelerator arrived with Hopper
        return self.compute_capability >= (9, 0)

    def figures(self) -> list[tuple[str, object, str]]:
        """(name, value, source) for every figure of the table."""
        skip = {"name", "compute_capability", "gpus", "sources"}
        return [(f.name, getattr(self, f.name), self.sources[f.name]) for f in fields(self) if f.name not in skip]


_GUIDE_COMMON = {name: CUDA_GUIDE for name in ("regs_per_sm", "regs_per_block", "regs_per_thread",
                                                "max_threads_per_block", "smem_per_block", "smem_per_sm",
                                                "threads_per_sm", "blocks_per_sm")}
_ESTIMATES = {
    "launch_seconds": "estimate: a few microseconds of launch overhead a kernel, until measured",
    "l2_bandwidth": "estimate: L2 read bandwidth, until measured (microbenchmarks of H100 report about 5.5 TB/s; "
                    "others scaled from their DRAM bandwidth and L2 size)",
    "l1_bandwidth": "estimate: 128 bytes per clock per SM at the boost clock, until measured",
    "l1_reuse_bytes": "estimate: the share of an SM's L1 (128-256 KB, CUDA guide) a block's re-reads can count on",
    "sfu_fraction": CUDA_GUIDE + " (arithmetic instruction throughput: 16 special-function results per "
                    "SM per clock against 128 fp32 FMAs)",
}


def _target(name, cc, gpus, datasheet: str, *, sms, smem_per_block_kib, smem_per_sm_kib, threads_per_sm,
            blocks_per_sm, bandwidth, fp32, tensor, bf16, l2_mib, l2_bandwidth, boost_ghz, notes=None) -> Target:
    sources = dict(_GUIDE_COMMON) | dict(_ESTIMATES)
    sources |= {key: datasheet for key in ("sms", "dram_bandwidth", "fp32_flops", "tensor_flops",
                                            "bf16_tensor_flops", "l2_bytes")}
    sources |= notes or {}
    return Target(name, cc, gpus, sms, smem_per_block_kib * _KIB, smem_per_sm_kib * _KIB, threads_per_sm,
                  blocks_per_sm, bandwidth, fp32, tensor, bf16, l2_mib * _KIB * _KIB, l2_bandwidth,
                  128 * sms * boost_ghz * 1e9, sources=sources)


DATASHEET_TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        _target("sm_80", (8, 0), ("A100",), "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB) and NVIDIA Ampere "
                "architecture whitepaper", sms=108, smem_per_block_kib=163, smem_per_sm_kib=164,
                threads_per_sm=2048, blocks_per_sm=32, bandwidth=2.039e12, fp32=19.5e12, tensor=312e12,
                bf16=312e12, l2_mib=40, l2_bandwidth=4.0e12, boost_ghz=1.41),
        _target("sm_89", (8, 9), ("L40S", "RTX 4090"), "NVIDIA L40S datasheet and NVIDIA Ada Lovelace architecture "
                "whitepaper", sms=142, smem_per_block_kib=99, smem_per_sm_kib=100, threads_per_sm=1536,
                blocks_per_sm=24, bandwidth=864e9, fp32=91.6e12, tensor=362.05e12, bf16=362.05e12, l2_mib=48,
                l2_bandwidth=3.0e12, boost_ghz=2.52,
                notes={"l2_bytes": "TechPowerUp GPU database, L40S (AD102 as configured): 48 MB"}),
        _target("sm_90", (9, 0), ("H200", "H100"), "NVIDIA H200 Tensor Core GPU datasheet (SXM; compute as H100 "
                "SXM5 in the NVIDIA H100 datasheet)", sms=132, smem_per_block_kib=227, smem_per_sm_kib=228,
                threads_per_sm=2048, blocks_per_sm=32, bandwidth=4.8e12, fp32=67e12, tensor=989.4e12,
                bf16=989.4e12, l2_mib=50, l2_bandwidth=5.5e12, boost_ghz=1.98),
        _target("sm_120", (12, 0), ("RTX 5090",), "NVIDIA GeForce RTX 5090 specifications and NVIDIA RTX Blackwell "
                "GPU architecture whitepaper", sms=170, smem_per_block_kib=99, smem_per_sm_kib=100,
                threads_per_sm=1536, blocks_per_sm=32, bandwidth=1.792e12, fp32=104.8e12, tensor=209.5e12,
                bf16=209.5e12, l2_mib=96, l2_bandwidth=5.0e12, boost_ghz=2.41,
                notes={"tensor_flops": "NVIDIA RTX Blackwell whitepaper: 419 TFLOPS dense f16 with f16 "
                                       "accumulate (838 sparse); GeForce parts run f32 accumulation at half "
                                       "that rate (estimate until measured)",
                       "bf16_tensor_flops": "as tensor_flops (estimate until measured)"}),
    )
}

# Measured ceilings, which replace datasheet figures: (value, source with date).
MEASURED: dict[str, dict[str, tuple[float, str]]] = {
    "sm_90": {
        "dram_bandwidth": (4.3e12, "measured device-to-device copy on one H200, about 4.3 TB/s "
                                   "(team measurement recorded in the design brief, section 4, before 2026-12)"),
        "bf16_tensor_flops": (790e12, "measured bf16 matrix product on one H200, about 790 TFLOP/s "
                                      "(team measurement recorded in the design brief, section 4, before 2026-12)"),
    },
}


def _with_measurements(target: Target) -> Target:
    measured = MEASURED.get(target.name, {})
    if not measured:
        return target
    sources = dict(target.sources) | {k: source for k, (_, source) in measured.items()}
    return replace(target, **{k: value for k, (value, _) in measured.items()}, sources=sources)


TARGETS: dict[str, Target] = {name: _with_measurements(t) for name, t in DATASHEET_TARGETS.items()}


def get_target(name: str) -> Target:
    found = TARGETS.get(name)
    if found is None:
        raise UnknownTargetError(f"unknown target {name!r}; emmy knows {', '.join(TARGETS)}")
    return found

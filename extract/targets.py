"""The GPUs emmy compiles for: identity, features, limits and rates, each
figure with its source.

A target is one GPU and the nvcc architecture it compiles for: `--target h100`
and `--target h200` both build sm_90 code, priced with each GPU's own memory
bandwidth and rates. An architecture names its default GPU (ARCH_DEFAULT_GPU:
sm_80 the A100, sm_89 the L40S, sm_90 the H200, the GPU this project measures
on, sm_120 the RTX 5090). Figures come from three kinds of source, cited per
figure in `Target.sources`:

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

import json
import logging
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from pathlib import Path

from emmy.errors import UnknownTargetError

CUDA_GUIDE = "CUDA C++ Programming Guide, technical specifications per compute capability"
_KIB = 1024


@dataclass(frozen=True)
class Target:
    name: str  # the nvcc architecture, e.g. "sm_90"
    compute_capability: tuple[int, int]
    gpus: tuple[str, ...]  # the GPU whose figures these are, as its maker names it
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
    fp64_fraction: float = 1 / 2  # f64 FMA rate as a fraction of the fp32 one
    clock_hz: float = 0.0  # boost clock: the instruction issue rate below
    memory_latency_cycles: float = 450.0  # a staged copy's round trip from issue to landing (estimate)
    l1_latency_cycles: float = 33.0  # a load that hits the SM's L1 (estimate)
    sources: dict = field(default_factory=dict, compare=False)  # figure name -> its source
    gpu: str = ""  # the GPU's key (`--target` name): h200, h100, a100, ...; keys prices and measurements

    @property
    def key(self) -> str:
        """What prices and measurements are kept under: the GPU (two sm_90 GPUs differ)."""
        return self.gpu or self.name

    @property
    def title(self) -> str:
        return f"{self.gpus[0]} ({self.name})" if self.gpus else self.name

    @property
    def issue_rate(self) -> float:
        """Thread-instructions a second: each SM's four schedulers issue one warp instruction a clock.
        An FMA pipe as wide as the issue (128 lanes an SM) leaves no slot for loads or index math."""
        return 4 * 32 * self.sms * self.clock_hz

    @property
    def memory_latency_s(self) -> float:
        """Seconds from issuing a global-to-shared copy to its landing, unloaded: what a staged loop's
        stages in flight must cover."""
        return self.memory_latency_cycles / self.clock_hz

    @property
    def l1_latency_s(self) -> float:
        return self.l1_latency_cycles / self.clock_hz

    @property
    def smem_bandwidth(self) -> float:
        """Bytes a second the SMs' shared memory delivers: 32 banks, each 4 bytes a clock, an SM
        (CUDA C++ Programming Guide, shared memory of compute capability 5.x and later)."""
        return 32 * 4 * self.sms * self.clock_hz

    @property
    def has_cp_async(self) -> bool:  # cp.async arrived with Ampere (PTX ISA 7.0)
        return self.compute_capability >= (8, 0)

    @property
    def has_tma(self) -> bool:  # the tensor memory accelerator arrived with Hopper
        return self.compute_capability >= (9, 0)

    def figures(self) -> list[tuple[str, object, str]]:
        """(name, value, source) for every figure of the table."""
        skip = {"name", "compute_capability", "gpus", "sources", "gpu"}
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
    "clock_hz": "the GPU's boost clock (its datasheet or whitepaper); four warp schedulers an SM each issue one "
                "warp instruction a clock (CUDA C++ Programming Guide, compute capability 7.x and later)",
    "memory_latency_cycles": "estimate: an L2 hit takes about 220-340 clocks by SM on an Ada L40 (arXiv "
                             "2606.22588, 'Non-Uniform L2 Cache Latency Across the Streaming Multiprocessors of "
                             "an NVIDIA L40'); with a DRAM share and the copy's issue, about 450, until measured",
    "l1_latency_cycles": "estimate: an L1 hit of about 28-33 clocks, as microbenchmarks report for Volta and "
                         "Turing (Jia et al., 'Dissecting the NVIDIA Volta GPU Architecture via "
                         "Microbenchmarking', 2018, and its Turing sequel, 2019), until measured",
    "sfu_fraction": CUDA_GUIDE + " (arithmetic instruction throughput: 16 special-function results per "
                    "SM per clock against 128 fp32 FMAs)",
    "fp64_fraction": CUDA_GUIDE + " (arithmetic instruction throughput, 64-bit floating-point add, multiply "
                     "and multiply-add per SM per clock: 32 against 64 fp32 on 8.0, 64 against 128 on 9.0, 2 "
                     "against 128 on 8.9 and 12.0)",
}


def _target(gpu, name, cc, gpus, datasheet: str, *, sms, smem_per_block_kib, smem_per_sm_kib, threads_per_sm,
            blocks_per_sm, bandwidth, fp32, tensor, bf16, l2_mib, l2_bandwidth, boost_ghz, notes=None) -> Target:
    sources = dict(_GUIDE_COMMON) | dict(_ESTIMATES)
    sources |= {key: datasheet for key in ("sms", "dram_bandwidth", "fp32_flops", "tensor_flops",
                                            "bf16_tensor_flops", "l2_bytes")}
    sources |= notes or {}
    return Target(name, cc, gpus, sms, smem_per_block_kib * _KIB, smem_per_sm_kib * _KIB, threads_per_sm,
                  blocks_per_sm, bandwidth, fp32, tensor, bf16, l2_mib * _KIB * _KIB, l2_bandwidth,
                  128 * sms * boost_ghz * 1e9, clock_hz=boost_ghz * 1e9, sources=sources, gpu=gpu,
                  fp64_fraction=_FP64_FRACTION[cc])


# 64-bit FMAs per SM per clock over 32-bit ones, by compute capability (CUDA guide, as fp64_fraction's source)
_FP64_FRACTION = {(8, 0): 32 / 64, (8, 9): 2 / 128, (9, 0): 64 / 128, (12, 0): 2 / 128}


# The H100 and H200 (SXM) share the GH100 chip's compute, caches and limits; memory differs.
_HOPPER_SXM = dict(sms=132, smem_per_block_kib=227, smem_per_sm_kib=228, threads_per_sm=2048, blocks_per_sm=32,
                   fp32=67e12, tensor=989.4e12, bf16=989.4e12, l2_mib=50, l2_bandwidth=5.5e12, boost_ghz=1.98)

DATASHEET_GPUS: dict[str, Target] = {
    t.gpu: t
    for t in (
        _target("a100", "sm_80", (8, 0), ("A100",), "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB) and NVIDIA "
                "Ampere architecture whitepaper", sms=108, smem_per_block_kib=163, smem_per_sm_kib=164,
                threads_per_sm=2048, blocks_per_sm=32, bandwidth=2.039e12, fp32=19.5e12, tensor=312e12,
                bf16=312e12, l2_mib=40, l2_bandwidth=4.0e12, boost_ghz=1.41),
        _target("l40s", "sm_89", (8, 9), ("L40S",), "NVIDIA L40S datasheet and NVIDIA Ada Lovelace architecture "
                "whitepaper", sms=142, smem_per_block_kib=99, smem_per_sm_kib=100, threads_per_sm=1536,
                blocks_per_sm=24, bandwidth=864e9, fp32=91.6e12, tensor=362.05e12, bf16=362.05e12, l2_mib=48,
                l2_bandwidth=3.0e12, boost_ghz=2.52,
                notes={"l2_bytes": "TechPowerUp GPU database, L40S (AD102 as configured): 48 MB"}),
        _target("rtx4090", "sm_89", (8, 9), ("RTX 4090",), "NVIDIA Ada Lovelace architecture whitepaper (GeForce "
                "RTX 4090: 128 SMs, 1008 GB/s, 82.6 TFLOPS FP32, 72 MB L2, 165.2 TFLOPS dense FP16 tensor with "
                "FP32 accumulate)", sms=128, smem_per_block_kib=99, smem_per_sm_kib=100, threads_per_sm=1536,
                blocks_per_sm=24, bandwidth=1.008e12, fp32=82.6e12, tensor=165.2e12, bf16=165.2e12, l2_mib=72,
                l2_bandwidth=3.5e12, boost_ghz=2.52),
        _target("h200", "sm_90", (9, 0), ("H200",), "NVIDIA H200 Tensor Core GPU datasheet (SXM; compute as H100 "
                "SXM5 in the NVIDIA H100 datasheet)", bandwidth=4.8e12, **_HOPPER_SXM),
        _target("h100", "sm_90", (9, 0), ("H100",), "NVIDIA H100 Tensor Core GPU datasheet (SXM5: 3.35 TB/s HBM3, "
                "67 TFLOPS FP32, 989.4 TFLOPS dense FP16/BF16 tensor) and NVIDIA Hopper architecture whitepaper "
                "(132 SMs, 50 MB L2)", bandwidth=3.35e12, **_HOPPER_SXM),
        _target("h100nvl", "sm_90", (9, 0), ("H100 NVL",), "NVIDIA H100 Tensor Core GPU datasheet (H100 NVL: "
                "3.9 TB/s HBM3, 60 TFLOPS FP32, 1,671 TFLOPS FP16/BF16 tensor with sparsity, half that dense; "
                "GH100 with 132 SMs and 50 MB L2 as the SXM5)", bandwidth=3.9e12,
                **(_HOPPER_SXM | dict(fp32=60e12, tensor=835.5e12, bf16=835.5e12, boost_ghz=1.785))),
        _target("rtx5090", "sm_120", (12, 0), ("RTX 5090",), "NVIDIA GeForce RTX 5090 specifications and NVIDIA RTX "
                "Blackwell GPU architecture whitepaper", sms=170, smem_per_block_kib=99, smem_per_sm_kib=100,
                threads_per_sm=1536, blocks_per_sm=32, bandwidth=1.792e12, fp32=104.8e12, tensor=209.5e12,
                bf16=209.5e12, l2_mib=96, l2_bandwidth=5.0e12, boost_ghz=2.41,
                notes={"tensor_flops": "NVIDIA RTX Blackwell whitepaper: 419 TFLOPS dense f16 with f16 "
                                       "accumulate (838 sparse); GeForce parts run f32 accumulation at half "
                                       "that rate (estimate until measured)",
                       "bf16_tensor_flops": "as tensor_flops (estimate until measured)"}),
    )
}

# The GPU an architecture names when `--target` is an architecture.
ARCH_DEFAULT_GPU = {"sm_80": "a100", "sm_89": "l40s", "sm_90": "h200", "sm_120": "rtx5090"}
DATASHEET_TARGETS: dict[str, Target] = {arch: DATASHEET_GPUS[gpu] for arch, gpu in ARCH_DEFAULT_GPU.items()}

# Measured ceilings, which replace datasheet figures, by GPU: (value, source with date).
MEASURED: dict[str, dict[str, tuple[float, str]]] = {
    "rtx5090": {
        # torch.mm reaches more than the estimate of half the f16-accumulate rate, so the estimate
        # cannot be the ceiling: the best public measurement stands in until the team measures
        "tensor_flops": (237.63e12, "measured in public: torch.mm f16 on an RTX 5090, 237.63 TFLOPS "
                                    "(github.com/zzc0721/torch-performance-test-data, database.md, 2025)"),
        "bf16_tensor_flops": (242.18e12, "measured in public: torch.mm bf16 on an RTX 5090, 242.18 TFLOPS "
                                         "(github.com/zzc0721/torch-performance-test-data, database.md, 2025)"),
    },
    "h200": {
        "dram_bandwidth": (4.27e12, "measured: a 2 GiB device-to-device copy through torch on one H200, 4.27 TB/s "
                                    "counting bytes read and written (benchmarks/results/2026-12-04-h200, "
                                    "benchmarks/gpu_session.py, 2026-12-04)"),
        "tensor_flops": (765e12, "measured: cuBLAS f16 8192^3 through torch on one H200, 765 TFLOP/s on random data "
                                 "(benchmarks/results/2026-12-04-h200, 2026-12-04)"),
        "bf16_tensor_flops": (790e12, "measured bf16 matrix product on one H200, about 790 TFLOP/s "
                                      "(team measurement, before 2026-12)"),
    },
}


def _with_measurements(target: Target) -> Target:
    measured = MEASURED.get(target.gpu, {})
    if not measured:
        return target
    sources = dict(target.sources) | {k: source for k, (_, source) in measured.items()}
    return replace(target, **{k: value for k, (value, _) in measured.items()}, sources=sources)


GPUS: dict[str, Target] = {gpu: _with_measurements(t) for gpu, t in DATASHEET_GPUS.items()}
TARGETS: dict[str, Target] = {arch: GPUS[gpu] for arch, gpu in ARCH_DEFAULT_GPU.items()}  # by architecture


def gpu_key(device_name: str) -> str | None:
    """emmy's key for a device as its driver names it ("NVIDIA H200" -> "h200"): the GPU whose maker's
    name is the longest found in it, or None for a GPU emmy has no figures for."""
    name = device_name.lower()
    found = [(len(g), key) for key, t in GPUS.items() for g in t.gpus if g.lower() in name]
    return max(found)[1] if found else None


def measurement_key(target: str) -> str:
    """A measurement's target as a GPU key: an architecture stands for its default GPU."""
    name = target.lower().replace(" ", "").replace("-", "")
    return ARCH_DEFAULT_GPU.get(name, name)


def get_target(name: str, calibrated: bool = True) -> Target:
    """A GPU (`h100`, `rtx4090`, ...) or an architecture (`sm_90`: its default GPU), with the factors
    `emmy calibrate` fitted for that GPU applied (`calibrated=False`: the figures as cited)."""
    key = name.lower().replace(" ", "").replace("-", "") if isinstance(name, str) else name
    found = TARGETS.get(key) or GPUS.get(key)
    if found is None:
        raise UnknownTargetError(f"unknown target {name!r}; emmy knows the architectures {', '.join(TARGETS)} "
                                 f"(each its default GPU: {', '.join(f'{a} {g}' for a, g in ARCH_DEFAULT_GPU.items())}) "
                                 f"and the GPUs {', '.join(GPUS)}")
    return _with_calibration(found) if calibrated else found


# Calibration: factors on a GPU's figures fitted to its measured rows (emmy.calibrate), in
# <gpu>.json files: shipped beside this table (calibration/), or written by `emmy calibrate` to
# EMMY_CALIBRATION_DIR (which wins). One factor moves both tensor-core rates.
CALIBRATED_FIELDS = ("dram_bandwidth", "l2_bandwidth", "fp32_flops", "tensor_flops", "launch_seconds",
                     "memory_latency_cycles")
_LINKED = {"tensor_flops": ("bf16_tensor_flops",)}
SHIPPED_CALIBRATION = Path(__file__).resolve().parent / "calibration"


def calibrated(target: Target, factors: dict[str, float], source: str = "") -> Target:
    """The target with its figures multiplied by the factors (CALIBRATED_FIELDS)."""
    changes, sources = {}, dict(target.sources)
    for name, factor in factors.items():
        for field_name in (name, *_LINKED.get(name, ())):
            changes[field_name] = getattr(target, field_name) * factor
            if source:
                sources[field_name] = f"{target.sources.get(field_name, '')}; times {factor:.3g} fitted ({source})"
    return replace(target, **changes, sources=sources)


def _with_calibration(target: Target) -> Target:
    from emmy.config import settings

    found = [p for p in (SHIPPED_CALIBRATION / f"{target.gpu}.json",
                         settings().calibration_dir / f"{target.gpu}.json") if p.exists()]
    if not found:
        return target
    return _calibrated_from(target.gpu, str(found[-1]), found[-1].stat().st_mtime_ns)


@lru_cache(maxsize=32)
def _calibrated_from(gpu: str, path: str, mtime: int) -> Target:
    target = GPUS[gpu]
    try:
        factors = json.loads(Path(path).read_text())["factors"]
        bad = [k for k, v in factors.items() if k not in CALIBRATED_FIELDS or not isinstance(v, (int, float))
               or not 0 < v < float("inf")]
        if bad:
            raise ValueError(f"factors {', '.join(map(str, bad))} are not positive factors of {', '.join(CALIBRATED_FIELDS)}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        logging.getLogger("emmy.extract").warning("calibration %s not used: %s", path, err)
        return target
    return calibrated(target, factors, path)

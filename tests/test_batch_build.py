"""Candidates built many to an nvcc call (emmy.batch_build) and loaded through the driver API
(emmy.module_gpu): real nvcc, the real simulator under ASan, no GPU."""

from __future__ import annotations

import dataclasses
import shutil

import pytest

import emmy
import emmy.batch_build as batch_build
import emmy.sim as sim
from emmy.batch_build import build_programs, merged_source
from emmy.dtypes import from_device
from emmy.errors import GpuError, KernelBuildError
from emmy.measure import GpuDevice
from emmy.nvcc import build_cubin
from emmy.runtime import compare_outputs, host_buffers, launch_in_order
from emmy.tune import _built_ahead, candidates

RMS = "x=torch.randn(8,1000); w=torch.randn(1000); F.rms_norm(x,(1000,),w,eps=1e-6)"
VAR = "x=torch.randn(4,5000); x.var(dim=-1)"  # few long rows, split through a workspace: two kernels
BAD = ('#include "emmy_rt.cuh"\n'
       'extern "C" __global__ void k_bad(float* __restrict__ g_out) { g_out[0] = no_such_value; }\n')

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")


def _programs():
    """Several RMSNorm candidates and a two-kernel split variance, as the tuner makes them."""
    rms = emmy.optimize(RMS, target="sm_90")
    variants = [rms.with_rows({c.kernel: c.row}) for c in candidates(rms, 5)]
    variants.append(emmy.optimize(VAR, target="sm_90", knobs="WORK=t128,TILE=f1,REDUCE=g4k"))
    assert len(variants[-1].kernel_ir) == 2
    return variants


def _sources(variants):
    return [(v.cuda_source, [k.name for k in v.kernel_ir]) for v in variants]


@needs_nvcc
def test_candidates_build_in_few_nvcc_calls_as_their_own_builds_would_and_are_cached(tmp_path, monkeypatch):
    variants = _programs()
    built = build_programs(_sources(variants), "sm_90", cache_dir=tmp_path, jobs=2)
    assert all(b.cubin is not None and not b.error for b in built)
    assert len({b.cubin for b in built}) == 2  # one unit a core
    for variant, entry in zip(variants, built):
        names = [k.name for k in variant.kernel_ir]
        assert sorted(entry.names) == sorted(names) and all(entry.names[n].startswith(n + "__b") for n in names)
        alone = build_cubin(variant.cuda_source, "sm_90", cache_dir=tmp_path / "alone").resources
        assert entry.resources == alone  # ptxas gives each kernel the same code in a unit as alone

    def no_nvcc(*args, **kwargs):
        raise AssertionError("a cached program was built again")

    monkeypatch.setattr(batch_build, "build_cubin", no_nvcc)
    assert build_programs(_sources(reversed(variants)), "sm_90", cache_dir=tmp_path) == built[::-1]


def test_a_unit_of_several_programs_runs_right_in_the_simulator_under_asan():
    """The merged text is what nvcc builds; run in the simulator, every program's renamed kernels
    give that program's outputs, with no access outside a buffer."""
    variants = _programs()
    text, renames = merged_source(_sources(variants))
    module = sim.load(text, "unit.cu", mode="asan")
    for variant, rename in zip(variants, renames):
        buffers = host_buffers(variant, variant.example_inputs)
        kernels = [dataclasses.replace(k, name=rename[k.name]) for k in variant.kernel_ir]
        launch_in_order(module, variant, kernels, buffers)
        types = variant.buffer_types
        outputs = {n: from_device(buffers[n], types[n].dtype) for n in variant.loop_ir.outputs}
        checks = compare_outputs(variant, outputs)
        assert checks and all(c.ok for c in checks), (str(variant.tile_ir.kernels[0].row), checks)


@needs_nvcc
def test_a_program_nvcc_refuses_costs_only_itself(tmp_path):
    variants = _programs()[:2]
    programs = [_sources(variants)[0], (BAD, ["k_bad"]), _sources(variants)[1]]
    built = build_programs(programs, "sm_90", cache_dir=tmp_path, jobs=1)
    assert built[1].cubin is None and "no_such_value" in built[1].error
    assert built[0].cubin is not None and built[2].cubin is not None and not built[0].error
    assert built[0].cubin != built[2].cubin or built[0].names != built[2].names


@needs_nvcc
def test_the_tuner_builds_its_candidates_ahead_and_a_gpu_load_without_a_driver_says_why():
    """GpuDevice.prepare is the batched build (no GPU needed); measuring without a driver fails in
    one GpuError that names what it was doing, which the tuner records as the candidate's row."""
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has a GPU")
    program = emmy.optimize(RMS, target="sm_90")
    chosen = candidates(program, 3)
    device = GpuDevice.__new__(GpuDevice)  # the build needs no GPU; the constructor asks nvidia-smi for one
    variants, built = _built_ahead(program, chosen, device)
    assert len(built) == 3 and all(b.cubin is not None for b in built)
    assert [str(v.tile_ir.kernels[0].row) for v in variants] == [str(c.row) for c in chosen]
    from emmy.module_gpu import ModuleGpu, loader_library

    assert loader_library().is_file()
    with pytest.raises(GpuError, match=r"loading .*\.cubin: CUDA error \d+"):
        ModuleGpu(built[0])
    # measuring: the loader's failure is remembered, the candidate falls back to a host library of
    # its own, which fails here for want of a GPU in its turn
    device.loader_failed, device._flush = "", None
    with pytest.raises(GpuError):
        device.measure(variants[0], variants[0].example_inputs, None, built[0])
    assert device.loader_failed.startswith("loading ")


def test_a_program_that_did_not_build_cannot_be_loaded():
    from emmy.batch_build import BuiltProgram
    from emmy.module_gpu import ModuleGpu

    with pytest.raises(KernelBuildError, match="did not build: nvcc said no"):
        ModuleGpu(BuiltProgram(None, "sm_90", error="nvcc said no"))

"""The target table: every figure has a source; measured ceilings override datasheet ones."""

import dataclasses

import pytest

from emmy.extract.targets import DATASHEET_GPUS, DATASHEET_TARGETS, GPUS, MEASURED, TARGETS, get_target


@pytest.mark.parametrize("name", sorted(TARGETS) + sorted(GPUS))
def test_every_figure_cites_its_source(name):
    target = get_target(name)
    figures = target.figures()
    numeric = [f.name for f in dataclasses.fields(target)
               if f.name not in ("name", "compute_capability", "gpus", "sources", "gpu")]
    assert [n for n, _, _ in figures] == numeric
    for figure, value, source in figures:
        assert value > 0, figure
        assert source.strip(), f"{name}.{figure} has no source"


def test_measured_ceilings_replace_datasheet_figures():
    assert MEASURED, "at least one measured ceiling is on record"
    for gpu, measured in MEASURED.items():
        for figure, (value, source) in measured.items():
            assert getattr(GPUS[gpu], figure) == value
            assert GPUS[gpu].sources[figure] == source and "measured" in source
            assert getattr(DATASHEET_GPUS[gpu], figure) != value  # the datasheet figure is kept apart
    # the H200 copies at about 4.3 TB/s against a 4.8 TB/s datasheet figure
    assert TARGETS["sm_90"].dram_bandwidth < DATASHEET_TARGETS["sm_90"].dram_bandwidth


def test_limits_follow_the_compute_capability():
    assert get_target("sm_90").smem_per_block > get_target("sm_80").smem_per_block > get_target("sm_120").smem_per_block
    assert get_target("sm_89").threads_per_sm == get_target("sm_120").threads_per_sm == 1536
    assert not get_target("sm_80").has_tma and get_target("sm_90").has_tma and get_target("sm_120").has_tma
    assert all(t.has_cp_async for t in TARGETS.values())


def test_a_gpu_is_a_target_with_its_own_figures_and_an_architecture_names_its_default_gpu():
    h100, h200 = get_target("h100"), get_target("H200")
    assert h100.name == h200.name == "sm_90" and get_target("sm_90") is h200
    assert (h100.gpu, h100.dram_bandwidth) == ("h100", 3.35e12)
    # the H200's bandwidth is the copy rate measured on one (not the datasheet's 4.8 TB/s), cited
    assert h200.dram_bandwidth == 4.27e12 and "2026-12-04-h200" in h200.sources["dram_bandwidth"]
    assert get_target("rtx4090").name == get_target("l40s").name == "sm_89"
    assert {"h100", "h200", "a100", "l40s", "rtx4090", "rtx5090"} <= set(GPUS)
    with pytest.raises(Exception, match="unknown target 'v100'.*GPUs a100, l40s, rtx4090, h200, h100, h100nvl, rtx5090"):
        get_target("v100")


def test_an_h100_compiles_sm_90_code_priced_at_its_own_bandwidth():
    import emmy

    code = "x=torch.randn(4096,8192); torch.softmax(x, -1)"
    on = {gpu: emmy.optimize(code, target=gpu) for gpu in ("h100", "h200")}
    assert on["h100"].target.name == on["h200"].target.name == "sm_90"
    seconds = {gpu: p.explain().predicted_seconds for gpu, p in on.items()}
    bound = 2 * 4096 * 8192 * 4 / 3.35e12  # read and write once, at the H100's bandwidth
    assert seconds["h100"] >= bound and seconds["h100"] > 1.2 * seconds["h200"]
    assert on["h100"].explain().target == "H100 (sm_90)"


def test_measurements_recorded_for_an_architecture_are_its_default_gpu_s(tmp_path):
    import json

    from emmy.schedule.measured import Measurements

    path = tmp_path / "m.json"
    path.write_text(json.dumps([{"target": "sm_90", "kernel": "s", "knobs": "k", "seconds": 1e-5},
                                {"target": "h100", "kernel": "s", "knobs": "k", "seconds": 2e-5}]))
    found = Measurements.load(path)
    assert found.lookup(get_target("sm_90").key, "s", "k") == 1e-5
    assert found.lookup(get_target("h100").key, "s", "k") == 2e-5

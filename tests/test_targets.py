"""The target table: every figure has a source; measured ceilings override datasheet ones."""

import dataclasses

import pytest

from emmy.extract.targets import DATASHEET_TARGETS, MEASURED, TARGETS, get_target


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_every_figure_cites_its_source(name):
    target = get_target(name)
    figures = target.figures()
    numeric = [f.name for f in dataclasses.fields(target)
               if f.name not in ("name", "compute_capability", "gpus", "sources")]
    assert [n for n, _, _ in figures] == numeric
    for figure, value, source in figures:
        assert value > 0, figure
        assert source.strip(), f"{name}.{figure} has no source"


def test_measured_ceilings_replace_datasheet_figures():
    assert MEASURED, "at least one measured ceiling is on record"
    for name, measured in MEASURED.items():
        for figure, (value, source) in measured.items():
            assert getattr(TARGETS[name], figure) == value
            assert TARGETS[name].sources[figure] == source and "measured" in source
            assert getattr(DATASHEET_TARGETS[name], figure) != value  # the datasheet figure is kept apart
    # the H200 copies at about 4.3 TB/s against a 4.8 TB/s datasheet figure
    assert TARGETS["sm_90"].dram_bandwidth < DATASHEET_TARGETS["sm_90"].dram_bandwidth


def test_limits_follow_the_compute_capability():
    assert get_target("sm_90").smem_per_block > get_target("sm_80").smem_per_block > get_target("sm_120").smem_per_block
    assert get_target("sm_89").threads_per_sm == get_target("sm_120").threads_per_sm == 1536
    assert not get_target("sm_80").has_tma and get_target("sm_90").has_tma and get_target("sm_120").has_tma
    assert all(t.has_cp_async for t in TARGETS.values())

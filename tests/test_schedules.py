"""The schedule space, Tile IR and the knob pins, checked end to end."""

import pytest

import emmy
from emmy.schedule.space import build_space
from emmy.extract.targets import TARGETS, get_target
from emmy.schedule.knobs import KNOB_NAMES, parse_pins
from emmy.schedule.shape import kernel_shape
from emmy.workloads import WORKLOADS
from tests.conftest import compiled, run_emmy
from tests.schedule_oracle import enumerate_rows

RMSNORM = "x=torch.randn(1,32,2048); w=torch.randn(2048); F.rms_norm(x,(2048,),w,eps=1e-6)"
MATMUL_128 = "a=torch.randn(128,128,dtype=torch.float16); b=torch.randn(128,128,dtype=torch.float16); a@b"
PINNED = "WORK=w1x2,TILE=mma_m16n8k16_f16_f32/f1x1/k8,REDUCE=,STAGE=d3/smem-tma,RASTER="


# Beyond the workloads: shapes below the tile sizes (a few keys, a short head dimension).
SMALL_PROGRAMS = {
    "small_attention": "q=torch.randn(1,2,16,8); k=torch.randn(1,2,16,8); v=torch.randn(1,2,16,8); "
                       "F.scaled_dot_product_attention(q, k, v)",
    "small_attention_f16": "q=torch.randn(1,2,6,8,dtype=torch.float16); k=torch.randn(1,2,6,8,dtype=torch.float16); "
                           "v=torch.randn(1,2,6,8,dtype=torch.float16); F.scaled_dot_product_attention(q, k, v)",
    "small_matmul_f16": "a=torch.randn(8,24,dtype=torch.float16); b=torch.randn(24,8,dtype=torch.float16); a@b",
    # column reductions: few outputs (splits offered), many, and a mean (an epilogue: no atomics)
    "column_few": "x=torch.randn(2000,40); x.sum(dim=0)",
    "column_many": "x=torch.randn(16,1024,1023); x.sum(dim=1)",
    "column_mean": "x=torch.randn(3000,24); x.mean(dim=0)",
}


@pytest.fixture(scope="module")
def shapes():
    programs = {w.name: w.code for w in WORKLOADS} | SMALL_PROGRAMS
    return {name: [kernel_shape(k) for k in emmy.optimize(code).loop_ir.kernels] for name, code in programs.items()}


def test_every_kernel_has_a_legal_schedule_on_every_target(shapes):
    for target in TARGETS:
        for name, kernel_shapes in shapes.items():
            space = build_space(kernel_shapes, get_target(target))
            assert all(space.rows[s.kernel] for s in kernel_shapes), (name, target)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_egglog_space_equals_an_independent_enumeration(shapes, target):
    t = get_target(target)
    for name, kernel_shapes in shapes.items():
        space = build_space(kernel_shapes, t)
        for shape in kernel_shapes:
            got = set(space.rows[shape.kernel])
            assert len(got) == len(space.rows[shape.kernel]), "rows are listed once each"
            expected = enumerate_rows(shape, t)
            assert got == expected, (name, shape.kernel, sorted(map(str, got ^ expected))[:5])


def test_each_space_is_built_once_and_each_row_checked_once(monkeypatch):
    """Extraction, the Tile IR, the offered space and `explain` share one pricer: a shape's space is
    built once (new shapes in batches, one e-graph run each) and the lowering is asked about each row
    of each kernel signature at most once."""
    from collections import Counter

    from emmy.kernel_ir.lower import lowers_row
    from emmy.loop_ir.signature import canonical
    from emmy.program import Program
    from emmy.schedule import space as schedule_space
    from emmy.schedule.pricing import KernelPricer

    built, asked = [], Counter()
    real_build = schedule_space.build_space

    def counting_build(shapes, *args, **kwargs):
        built.extend(schedule_space.unnamed(shape) for shape in shapes)
        return real_build(shapes, *args, **kwargs)

    def counting_lowers(kernel, shape, row, types, memo):
        asked[(canonical(kernel, types), row)] += 1
        return lowers_row(kernel, shape, row, types, memo)

    monkeypatch.setattr(schedule_space, "build_space", counting_build)
    schedule_space.forget_spaces()
    program = compiled(next(w.code for w in WORKLOADS if w.name == "llama_decoder"), "sm_90")
    program.__dict__["pricer"] = KernelPricer(program.target, counting_lowers)  # the program's own, counted
    assert isinstance(program, Program) and program.cuda_source
    program.explain()
    offered = program.schedule_space().rows
    assert built and len(built) == len(set(built))  # each shape's space built once, in batches
    assert asked and max(asked.values()) == 1
    kernels = program.loop_ir.kernels
    legal = dict(zip((k.name for k in kernels), schedule_space.legal_rows([kernel_shape(k) for k in kernels],
                                                                          program.target)))
    # what is offered is the legal rows the Kernel IR lowering takes
    assert all(set(offered[k.name]) <= set(legal[k.name]) for k in kernels)
    assert sum(map(len, offered.values())) < sum(map(len, legal.values()))


def test_space_sizes_match_the_design(shapes):
    sm_120 = get_target("sm_120")
    (rms,) = shapes["rmsnorm"]
    assert 24 <= len(build_space([rms], sm_120).rows[rms.kernel]) <= 96  # "tens of legal rows"
    for name in ("matmul_f16", "attention"):
        space = build_space(shapes[name], sm_120)
        assert max(len(rows) for rows in space.rows.values()) >= 200, name  # "hundreds or more"


def test_target_features_shape_the_space(shapes):
    (mm,) = shapes["matmul_f16"]
    by_target = {t: build_space([mm], get_target(t)).rows[mm.kernel] for t in ("sm_80", "sm_90")}
    assert not any(r.STAGE.endswith("smem-tma") for r in by_target["sm_80"])
    assert any(r.STAGE.endswith("smem-tma") for r in by_target["sm_90"])
    assert any(r.STAGE.endswith("smem-async") for r in by_target["sm_80"])


def test_every_row_is_canonical_and_round_trips(shapes):
    space = build_space(shapes["attention"], get_target("sm_90"))
    for rows in space.rows.values():
        for row in rows:
            assert set(row.pinned()) == set(KNOB_NAMES)
            assert parse_pins(str(row)) == row


def test_pins_narrow_the_space_to_the_matching_rows(shapes):
    (mm,) = shapes["matmul_f16"]
    target = get_target("sm_90")
    full = build_space([mm], target).rows[mm.kernel]
    pins = parse_pins("WORK=w2x2,STAGE=d3/smem-async")
    pinned = build_space([mm], target, pins).rows[mm.kernel]
    assert pinned and set(pinned) == {r for r in full if r.WORK == "w2x2" and r.STAGE == "d3/smem-async"}


def test_a_pin_outside_the_default_candidates_widens_the_space(shapes):
    (rms,) = shapes["rmsnorm"]
    rows = build_space([rms], get_target("sm_90"), parse_pins("WORK=t96,REDUCE=coop")).rows[rms.kernel]
    assert rows and all(r.WORK == "t96" for r in rows)


def test_tile_ir_of_rmsnorm_is_a_fold_and_a_sweep():
    program = emmy.optimize(RMSNORM, target="sm_120")
    legal = len(enumerate_rows(kernel_shape(program.loop_ir.kernels[0]), get_target("sm_120")))
    lines = program.ir("tile").splitlines()
    assert lines[0] == "=== 0: k_rms_norm ==="
    assert lines[1].startswith("knobs WORK=") and f"({legal} legal rows" in lines[1]
    assert lines[2].startswith("place free=(a0) ")
    assert any(line.startswith("Fold[a1 in 0..2048] reduce ⟨REDUCE=") for line in lines)
    assert any(line.startswith("└─ sweep(a2 in 0..2048)") for line in lines)


# rows too long to hold in registers, where the one-pass forms save a pass over memory (a held row
# takes the multi-pass form: tests/test_softmax_lean.py)
@pytest.mark.parametrize("code, twist, state", [
    ("x=torch.randn(16,65536); torch.softmax(x,-1)", "softmax", "(m, d) = (-inf, 0.0)"),
    ("ln = nn.LayerNorm(65536); x = torch.randn(16, 65536); ln(x)", "welford", "(n, mean, m2) = (0.0, 0.0, 0.0)")])
def test_tile_ir_shows_the_twisted_fold(code, twist, state):
    lines = emmy.optimize(code, target="sm_90").ir("tile").splitlines()
    (fold,) = [i for i, line in enumerate(lines) if line.startswith("Fold[")]
    assert lines[fold].endswith(f"<twist={twist}>")
    body = lines[fold + 1:]
    assert any(line.startswith(f"│ init     {state}  [") for line in body)
    merge = {"softmax": "online-softmax merge", "welford": "Chan's merge"}[twist]
    assert any(line.startswith(f"│ combine  {merge}") for line in body)
    assert any(line.startswith("│ step     ") for line in body)


def test_pinned_row_prints_through_the_cli():
    result = run_emmy("compile", "-c", MATMUL_128, "--target", "sm_120", "--ir", "tile", env={"EMMY_KNOBS": PINNED})
    assert result.returncode == 0, result.stderr
    assert f"knobs {PINNED}  (" in result.stdout
    assert "tile 16x16x128 by mma_m16n8k16_f16_f32, staged d3/smem-tma" in result.stdout


def test_a_pin_the_kernel_cannot_take_says_why():
    result = run_emmy("compile", "-c", MATMUL_128, "--target", "sm_90", "--ir", "tile",
                      "--knobs", "TILE=mma_m16n8k16_bf16_f32/f1x1/k1")
    assert result.returncode == 2
    assert "multiplies bf16 operands; this kernel's are f16" in result.stderr


def test_schedules_command_counts_and_lists_rows():
    result = run_emmy("schedules", "-c", RMSNORM, "--target", "sm_120", "--limit", "3")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "=== 0: k_rms_norm (row reduction 32 x 2048 with sweep) ==="
    legal = len(enumerate_rows(kernel_shape(emmy.optimize(RMSNORM).loop_ir.kernels[0]), get_target("sm_120")))
    assert lines[1] == f"{legal} legal rows on sm_120"
    assert lines[2].split() == ["est", "us", *KNOB_NAMES]
    costs = [float(line.split()[0]) for line in lines[3:6]]
    assert costs == sorted(costs)
    assert lines[6].strip() == f"({legal - 3} more; --limit 0 shows all)"


def test_every_schedule_ruleset_is_listed_by_emmy_rules():
    from emmy.rules.schedules import SCHEDULE_DESCRIPTIONS, SCHEDULE_RULESETS

    names = [str(r.ident).rsplit(".", 1)[-1] for r in SCHEDULE_RULESETS]
    assert names == list(SCHEDULE_DESCRIPTIONS)
    listing = run_emmy("rules")
    assert listing.returncode == 0, listing.stderr
    for name, description in SCHEDULE_DESCRIPTIONS.items():
        assert f"  {name.ljust(max(map(len, names)))}  {description}" in listing.stdout


def test_a_contraction_that_also_stores_an_epilogue_is_offered_no_atomic_split():
    """A kernel storing its accumulator raw and an epilogue of it (a training graph's convolution,
    saved for the backward, beside its batch norm and ReLU) was flagged raw: the space offered a
    split-K with atomics (chosen for 2x512 outputs over K=2304), which lowering refused. Every row
    it offers now lowers, and the program runs right."""
    import torch

    def saved_and_activated(x, w, s):
        y = x @ w
        return y, torch.relu(y * s + 1.0)

    x, w, s = torch.randn(2, 2304), torch.randn(2304, 512), torch.randn(512)
    program = emmy.optimize(saved_and_activated, x, w, s)
    (kernel,) = program.loop_ir.kernels
    assert kernel_shape(kernel).epilogue  # not "raw": atomics need the accumulator as the only store
    assert not any(r.row.reduce.atomic for r in program.ranked_rows(kernel))
    for got, want in zip(program(x, w, s), saved_and_activated(x, w, s)):
        torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-5)

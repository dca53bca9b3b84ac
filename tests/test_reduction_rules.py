"""Folds through layouts and folds over adjacent axes merged (rules/reductions.py): one kernel for a
chain of reductions, right in the simulator; the layouts the rules build; a wrong merge caught."""

import re

import pytest
from egglog import PyObject, String, eq, i64, ne, rewrite, vars_

import emmy
from emmy.affine import Affine
from emmy.egraph.layout import Layout, decode_layout, encode_layout
from emmy.egraph.terms import Term, shape_of
from emmy.rules import RuleGroup
from emmy.rules.reductions import carried_axis, layout_of_fold, merging_layout, splitting_layout
from emmy.runtime import check_program
from emmy.testing import check_ruleset

# (code, the elements one fold reads per output when the chain is merged)
CHAINS = [
    ("x = torch.randn(4,6,40); x.sum(-1).sum(-1)", 240),
    ("x = torch.randn(3,5,6,7); x.amax(-1).amax(-1).amax(-1)", 210),
    ("x = torch.randn(4,6,10); torch.sum(torch.sum(x, 2, keepdim=True), 1, keepdim=True)", 60),
    ("x = torch.randn(4,6,10); x.sum(1).sum(1)", 60),
    ("x = torch.randn(6,5,4); x.amin(0).amin(0)", 30),
    ("x = torch.randn(3,4,5,6) * 0.5 + 1; x.transpose(1, 3).prod(1).prod(1)", 30),
]


def _folds(program) -> list[int]:
    """The trip count of each fold loop (a loop holding an accumulator update) in the Loop IR."""
    lines = program.ir("loop").splitlines()
    depth = lambda line: len(line) - len(line.lstrip())  # noqa: E731
    found = set()
    for k, line in enumerate(lines):
        if re.match(r"\s*acc\d+ <-", line):
            loop = next(lines[j] for j in range(k - 1, -1, -1)
                        if depth(lines[j]) < depth(line) and lines[j].lstrip().startswith("for "))
            found.add(int(re.search(r"in 0\.\.(\d+)", loop).group(1)))
    return sorted(found)


@pytest.mark.parametrize("code,length", CHAINS, ids=[c.split("; ")[1] for c, _ in CHAINS])
def test_a_chain_of_folds_over_adjacent_axes_is_one_kernel_that_runs_right(code, length):
    program = emmy.optimize(code)
    assert len(program.loop_ir.kernels) == 1, program.ir("loop")
    assert length in _folds(program), program.ir("loop")
    assert all(c.ok for c in check_program(program, mode="asan")), code
    # merging rounds the partial folds once, not twice: an approximate rule, so --exact keeps the chain
    assert length not in _folds(emmy.optimize(code, exact=True))


def test_the_merged_chain_is_priced_as_one_row_below_the_two_kernels():
    code = "x = torch.randn(64,128,256); x.sum(-1).sum(-1)"
    merged, chained = emmy.optimize(code, target="h100"), emmy.optimize(code, target="h100", exact=True)
    assert [len(p.loop_ir.kernels) for p in (merged, chained)] == [1, 2]
    (tile,) = merged.tile_ir.kernels
    assert tile.breakdown.bytes == pytest.approx(64 * 128 * 256 * 4, rel=0.01)  # x read once
    seconds = [sum(t.seconds for t in p.tile_ir.kernels) for p in (merged, chained)]
    assert seconds[0] < 0.75 * seconds[1]
    # the merged row reads x plainly: x[a0, a1 // 256, a1 % 256], not a remainder of a remainder
    assert "x[a0, a1 // 256, a1 % 256]" in merged.ir("loop")


def test_folds_over_axes_that_are_not_neighbours_stay_apart():
    program = emmy.optimize("x = torch.randn(3,4,5,6); x.sum(1).sum(-1)")
    assert len(program.loop_ir.kernels) == 2 or sorted(_folds(program)) != [24]
    assert all(c.ok for c in check_program(program))


def _layout(shape, index) -> str:
    return encode_layout(Layout(tuple(shape), tuple(index)))


d0, d1, d2 = Affine.dim(0), Affine.dim(1), Affine.dim(2)


def test_a_fold_moves_only_through_a_layout_that_reads_its_axis_plainly_and_whole():
    squeeze = _layout((4, 6), (d0, d1, Affine.constant(0)))  # (4,6,1) read as (4,6)
    assert carried_axis(squeeze, 1, "4,6,1") == "1"
    assert decode_layout(layout_of_fold(squeeze, 1, "4,6,1")).shape == (4, 1)
    transpose = _layout((5, 4), (d1, d0))  # (4,5) read transposed
    assert carried_axis(transpose, 0, "4,5") == "1"
    assert carried_axis(transpose, 1, "4,5") == "0"
    assert carried_axis(_layout((4, 3), (d0, d1)), 1, "4,5") == ""  # a slice: the fold would read more
    assert carried_axis(_layout((4, 5), (d0, Affine.constant(0))), 1, "4,1") == ""  # a broadcast
    assert carried_axis(_layout((4, 5), (d0, d1 * 2)), 1, "4,10") == ""  # a strided read
    assert carried_axis(_layout((4, 5), (d0 + d1, d1)), 1, "9,5") == ""  # another axis depends on it


def test_the_merge_reads_the_two_axes_as_one_and_gives_their_shape_back():
    merge = decode_layout(merging_layout("2,3,4,5", 2, 1))
    assert merge.shape == (2, 12, 5)
    assert [str(e) for e in merge.index] == ["d0", "d1 // 4", "d1 % 4", "d2"]
    assert decode_layout(splitting_layout("2,3,4,5", 2, 1)).shape == (2, 1, 1, 5)
    assert merging_layout("2,3,4,5", 1, 3) == ""  # not neighbours
    assert merging_layout("2,3,4,5", 3, 4) == ""  # no axis 4


def test_the_soundness_check_catches_a_merge_of_two_different_monoids():
    (x,) = vars_("x", Term)
    a, b = vars_("a b", i64)
    (shape,) = vars_("shape", String)
    merging = PyObject(merging_layout)(PyObject.from_string(shape), PyObject.from_int(a), PyObject.from_int(b))
    splitting = PyObject(splitting_layout)(PyObject.from_string(shape), PyObject.from_int(a), PyObject.from_int(b))
    bad = RuleGroup("bad", "algebra", "merges a sum of maxima into one sum (it is not one)")
    bad.rule("merge_mixed", "sum(max(x)) over adjacent axes -> one sum",
             rewrite(Term.reduce("sum", a, Term.reduce("max", b, x))).to(
                 Term.reindex(Term.reduce("sum", a.min(b), Term.reindex(x, merging.to_string())),
                              splitting.to_string()),
                 eq(shape).to(shape_of(x)), ne(merging.to_string()).to(String(""))),
             approximate="nothing it should", ulps=1)
    result = check_ruleset(bad, corpus=["x=torch.randn(2,3,4,5); x.amax(1, keepdim=True).sum(2)"], variants=2)
    assert result.fired["merge_mixed"] > 0 and result.instantiated["merge_mixed"] > 0
    assert result.failures and "bad.merge_mixed" in result.failures[0]

"""The correctness oracle: a tolerance that follows the problem's conditioning, torch's own error
beside emmy's, and planted errors that still fail."""

import numpy as np
import pytest

import emmy
from emmy.checking import compare, torch_comparison
from emmy.dtypes import DType
from emmy.runtime import run_program
from tests.conftest import run_emmy

MLP = ("x=torch.randn(8,32); g=torch.randn(32,64); u=torch.randn(32,64); d=torch.randn(64,32); "
       "(F.silu(x@g)*(x@u))@d")


def test_the_mlp_that_torch_itself_failed_now_passes_and_shows_torch_s_error():
    result = run_emmy("run", "-c", MLP, "--check")
    assert result.returncode == 0, result.stdout + result.stderr
    header, row = [line.split() for line in result.stdout.splitlines() if line.strip().startswith(("output", "out0"))]
    assert "torch's" in header and "own" in header
    emmy_error, torch_error = float(row[2]), float(row[3])
    assert 0 < torch_error and emmy_error <= 4 * torch_error
    assert row[-1] == "ok"
    # judged against float64 with the old value-scaled tolerance, torch's own f32 result fails
    program = emmy.optimize(MLP, target="sm_90")
    ((want, scale, theirs),) = torch_comparison(program.captured)
    rtol, atol = 1.3e-6, 1e-5
    assert np.any(np.abs(theirs - want) > atol + rtol * np.abs(want))
    assert compare(theirs, want, DType.F32, 64, scale, theirs).ok


@pytest.fixture(scope="module")
def long_sum():
    """emmy's result for 2048 sums of 512 positive values, with the references."""
    program = emmy.optimize("x=torch.rand(2048,512); x.sum(-1)", target="sm_90")
    (actual,) = run_program(program).values()
    ((want, scale, theirs),) = torch_comparison(program.captured)
    return actual.astype(np.float64), want, scale, theirs


def test_emmy_s_long_sum_passes(long_sum):
    actual, want, scale, theirs = long_sum
    result = compare(actual, want, DType.F32, 512, scale, theirs)
    assert result.ok and abs(result.bias_ulps) < 0.25


def test_a_planted_one_ulp_bias_on_every_output_of_a_long_sum_fails(long_sum):
    actual, want, scale, theirs = long_sum
    biased = np.nextafter(actual.astype(np.float32), np.float32(np.inf)).astype(np.float64)
    assert np.max(np.abs(biased - actual)) < 1e-4  # each output moved by one ulp only
    result = compare(biased, want, DType.F32, 512, scale, theirs)
    assert not result.ok and result.why == "bias" and result.bias_ulps > 0.5


def test_a_planted_one_ulp_bias_on_every_summed_value_fails():
    """The same sums of values each one ulp too large: the error leans one way."""
    rng = np.random.default_rng(0)
    x = rng.random((2048, 512), dtype=np.float32)
    want = x.astype(np.float64).sum(-1)
    theirs = x.sum(-1, dtype=np.float32).astype(np.float64)
    planted = np.nextafter(x, np.float32(2)).sum(-1, dtype=np.float32).astype(np.float64)
    assert compare(theirs, want, DType.F32, 512, want, theirs).ok
    result = compare(planted, want, DType.F32, 512, want, theirs)
    assert not result.ok and result.why == "bias"


def test_one_wrong_element_fails(long_sum):
    actual, want, scale, theirs = long_sum
    wrong = actual.copy()
    wrong[7] += 0.05  # a few hundred ulps on one output of ~256
    result = compare(wrong, want, DType.F32, 512, scale, theirs)
    assert not result.ok and result.why == "tolerance"


def test_a_lean_in_more_outputs_than_the_lean_sample_is_still_caught(monkeypatch):
    """Past LEAN_SAMPLE outputs the lean is measured on an even stride of them (a 64M-element
    check took seconds on a GPU machine): a half-ulp lean on every output still fails, rounding
    alone still passes, and a wrong element anywhere (off the stride) still fails the tolerance."""
    import emmy.checking

    monkeypatch.setattr(emmy.checking, "LEAN_SAMPLE", 1000)
    rng = np.random.default_rng(1)
    want = rng.standard_normal(20_000)
    rounded = want.astype(np.float32).astype(np.float64)
    assert compare(rounded, want, DType.F32, 1, None, rounded).ok
    ulp = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    leaning = rounded - 0.5 * ulp * (rng.random(want.size) < 0.9)
    result = compare(leaning, want, DType.F32, 1, None, rounded)
    assert not result.ok and result.why == "bias" and result.bias_ulps < -0.25
    wrong = rounded.copy()
    wrong[12_345] += 1.0  # 12345 is not on the stride of 20
    assert compare(wrong, want, DType.F32, 1, None, rounded).why == "tolerance"


def test_errors_count_matching_nans_and_infinities_as_none_and_any_other_mismatch_as_infinite():
    from emmy.checking import _errors

    a = np.array([1.0, np.nan, np.inf, np.inf, np.nan, 2.0, -np.inf])
    e = np.array([1.5, np.nan, np.inf, -np.inf, 1.0, np.inf, -np.inf])
    np.testing.assert_array_equal(_errors(a, e), [0.5, 0.0, 0.0, np.inf, np.inf, np.inf, 0.0])


def _softmax_with_a_sequential_sum(seed: int):
    """64 rows of 1000: exp(x - max) over a sum of them added one by one in f32 (as one thread folds a
    row), the float64 reference and the result with an exact sum (a stand-in for torch's)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((64, 1000)).astype(np.float32)
    e = np.exp(x - x.max(1, keepdims=True)).astype(np.float32)
    d = np.zeros((64, 1), np.float32)
    for j in range(e.shape[1]):
        d = d + e[:, j:j + 1]
    exact = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    want = exact / exact.sum(1, keepdims=True)
    theirs = (e / e.astype(np.float64).sum(1, keepdims=True).astype(np.float32)).astype(np.float64)
    return (e / d).astype(np.float64), want, theirs


def test_rows_sharing_one_rounded_sum_are_not_a_lean():
    """A row's outputs all divide by its one sum, so its rounding moves the row one way; over 64 rows
    those roundings alone make a mean error of a few tenths of an ulp, of either sign. Measured
    against the spread of the rows' means, none is a lean (against single outputs' spread, four of
    these six were)."""
    results = []
    for seed in range(6):
        actual, want, theirs = _softmax_with_a_sequential_sum(seed)
        results.append(compare(actual, want, DType.F32, 1000, None, theirs))
    assert all(r.ok for r in results), results
    assert max(abs(r.bias_ulps) for r in results) > 0.25  # the shared roundings do move the mean that far


def test_a_lean_beneath_rows_sharing_one_rounded_sum_is_still_caught():
    actual, want, theirs = _softmax_with_a_sequential_sum(0)
    leaning = (want * (1 + 2.0 ** -24)).astype(np.float32).astype(np.float64)  # every output a little high
    result = compare(leaning, want, DType.F32, 1000, None, theirs)
    assert not result.ok and result.why == "bias" and result.bias_ulps > 0.5


def _scan_in_blocks(seed: int, rows: int, n: int, product: bool):
    """Running products (sums) of values near 1 in f32 computed in blocks of 13 (a blocked scan's
    order) and sequentially (torch's), with the float64 reference: each output's error is the one
    before's plus a rounding, so the errors walk."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, n)) * 0.1 + 1).astype(np.float32)
    scan = np.cumprod if product else np.cumsum
    want, sequential = scan(x.astype(np.float64), -1), scan(x, -1, dtype=np.float32)
    carried, parts = np.full((rows, 1), 1.0 if product else 0.0, np.float32), []
    for k in range(0, n, 13):
        block = scan(x[:, k:k + 13], -1, dtype=np.float32)
        parts.append((carried * block if product else carried + block).astype(np.float32))
        carried = parts[-1][:, -1:]
    return np.concatenate(parts, -1).astype(np.float64), want, sequential.astype(np.float64)


def test_a_scan_s_walking_rounding_is_not_a_lean_but_a_lean_on_it_is():
    """A long scan's errors accumulate along it, so their mean wanders by ulps either way; held
    against single outputs' spread, 3 of these 10 cumprods of values near 1 (1-D, 150 long) were
    reported as a bias. Over the walk's spread none is; one ulp planted on every output still is."""
    results = []
    for seed in range(10):
        actual, want, theirs = _scan_in_blocks(seed, 1, 150, product=True)
        results.append(compare(actual, want, DType.F32, 150, None, theirs))
    assert all(r.ok for r in results), [(r.why, round(r.bias_ulps, 2)) for r in results]
    actual, want, theirs = _scan_in_blocks(0, 64, 40, product=False)
    leaning = np.nextafter(want.astype(np.float32), np.float32(np.inf)).astype(np.float64)
    result = compare(leaning, want, DType.F32, 40, None, theirs)
    assert not result.ok and result.why == "bias", result

"""torch.special's scaled Bessel functions, erfcx, ndtri, log_ndtr, the Bessel functions of both
kinds, Hurwitz's zeta, polygamma of any order and the orthogonal polynomials: the CUDA (the runtime header's i0e, i1e and zeta,
CUDA's erfcx, normcdfinv, j0 ... y1, the simulator's stand-ins) in the simulator with ASan, and the
interpreter, against torch over tails, poles and infinities."""

import pytest
import torch
import torch.nn as nn

import emmy
import emmy.errors


class Special(nn.Module):
    def forward(self, x, p):
        return (torch.special.i0e(x * 30), torch.special.i1e(x * 30), torch.special.erfcx(x * 3),
                torch.special.ndtri(p), torch.special.log_ndtr(x * 5), torch.special.spherical_bessel_j0(x),
                torch.special.zeta(x.abs() + 1.5, p * 5 - 2), torch.special.zeta(3.0, x),
                torch.polygamma(1, x), torch.polygamma(3, x), torch.special.bessel_j0(x * 3),
                torch.special.bessel_j1(x * 3), torch.special.bessel_y0(x * 3), torch.special.bessel_y1(x * 3),
                torch.nextafter(x, p) - x)  # one step of the type: 0 if it rounded away


# torch's own Bessel functions of the first and second kind stray from the true values by up to
# ~2e-7 in f64 (at 5.43, j0) and ~1e-5 in f32; emmy's (CUDA's, C's) are closer to the truth, so
# they are compared at that distance
BESSEL_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-6}
# torch's f64 trigamma stops its asymptotic series at x^-7 after six steps of recurrence: ~1e-10
TRIGAMMA_TOLERANCE = {torch.float32: 2e-5, torch.float64: 1e-9}
TOLERANCE = {torch.float32: 2e-5, torch.float64: 1e-12}


def _inputs(dtype):
    torch.manual_seed(0)
    x = torch.randn(64, dtype=dtype) * 4
    # 0, a tiny value, the far tails, the infinities, a pole of zeta(3, x) at -2
    x[:8] = torch.tensor([0.0, 1e-3, 40.0, -40.0, float("inf"), -float("inf"), -2.0, 2.404825557695773], dtype=dtype)
    p = torch.rand(64, dtype=dtype) * 1.2 - 0.1  # past [0, 1] too: NaN
    p[:4] = torch.tensor([0.0, 1.0, 1e-30, 0.5], dtype=dtype)
    return x, p


def _check(got, want, dtype):
    for k, (g, w) in enumerate(zip(got, want)):
        tolerance = (BESSEL_TOLERANCE if 10 <= k < 14 else TRIGAMMA_TOLERANCE if k == 8 else TOLERANCE)[dtype]
        torch.testing.assert_close(g, w, rtol=tolerance, atol=tolerance, equal_nan=True,
                                   msg=lambda m: f"output {k}: {m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_special_functions_run_right_in_the_simulator_and_the_interpreter(dtype):
    x, p = _inputs(dtype)
    want = Special()(x, p)
    program = emmy.optimize(Special(), x, p)
    _check(program(x, p, sim_mode="asan"), want, dtype)
    _check(program(x, p, device="interpret"), want, dtype)


def test_nextafter_of_a_half_type_is_refused():
    """Computed in f32, a half's neighbour would round back to the value itself."""
    with pytest.raises(emmy.errors.UnsupportedDtypeError, match="nextafter of f16"):
        emmy.optimize("x=torch.randn(8,dtype=torch.float16); torch.nextafter(x, x + 1)")


POLYNOMIALS = ["chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v", "chebyshev_polynomial_w",
               "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
               "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he",
               "laguerre_polynomial_l", "legendre_polynomial_p"]
DEGREES = [-1, 0, 1, 2, 3, 6, 7, 8, 9, 12, 20, 33]  # past the degrees where torch turns trigonometric too


def _polynomial_points(dtype):
    """Inside, on and past [-1, 1] (and [0, 1], the shifted forms' interval), the ends and 0 exactly."""
    return torch.cat([torch.linspace(-1.5, 1.5, 61, dtype=dtype), torch.tensor([-1.0, 1.0, 0.0, 0.5], dtype=dtype)])


@pytest.mark.parametrize("name", POLYNOMIALS)
def test_each_polynomial_decomposition_is_torchs_in_double(name):
    from emmy.capture.polynomials import polynomial_decompositions

    spelled = polynomial_decompositions()[getattr(torch.ops.aten, f"special_{name}").n_scalar]
    x = _polynomial_points(torch.float64)
    for n in DEGREES + [3.0]:
        torch.testing.assert_close(spelled(x, n), getattr(torch.special, name)(x, n), rtol=1e-10, atol=1e-12)


def test_polynomials_run_right_in_the_simulator():
    def polynomials(x):
        return tuple(getattr(torch.special, name)(x, n) for name in POLYNOMIALS for n in (2, 5, 9))

    x = _polynomial_points(torch.float32)
    program = emmy.optimize(polynomials, x)
    for got, want in zip(program(x, sim_mode="asan"), polynomials(x)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_polynomial_of_too_high_a_degree_is_refused_by_name():
    from emmy.capture.polynomials import MAX_DEGREE

    with pytest.raises(emmy.errors.UnsupportedOpError, match="special_legendre_polynomial_p"):
        emmy.optimize(lambda x: torch.special.legendre_polynomial_p(x, MAX_DEGREE + 1), torch.rand(4))

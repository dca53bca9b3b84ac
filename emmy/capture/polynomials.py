"""torch.special's orthogonal polynomials of a fixed degree n, as the recurrences torch evaluates.

Chebyshev T, U, V, W (and their shifted forms, evaluated at 2x - 1), Hermite H and He, Laguerre L and
Legendre P of a tensor x and a Python integer n (the `n_scalar` overloads): the three-term
recurrence unrolled n - 1 times into elementwise ops, with torch's special cases kept (n < 0 gives
0; x = +-1 its closed form; for |x| < 1 and n above 6 (T) or 8 (U, V, W) the trigonometric form
torch switches to). Checked against torch in tests/test_special_functions.py. A degree above
MAX_DEGREE returns NotImplemented: torch keeps the op and emmy refuses it by name.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten

MAX_DEGREE = 256  # an unrolled recurrence of n steps: its chain of ops grows with n


def _recurrence(n: int, first, second, step):
    """p_n from p_0 = first, p_1 = second and p_{k+1} = step(k, p_{k-1}, p_k)."""
    if n == 0:
        return first
    previous, current = first, second
    for k in range(1, n):
        previous, current = current, step(k, previous, current)
    return current


def _at_ends(x, n: int, value_at_plus_one, value_at_minus_one, inside):
    """`inside` where |x| != 1; the closed forms at x = 1 and x = -1."""
    ends = torch.where(x > 0, torch.full_like(x, value_at_plus_one), torch.full_like(x, value_at_minus_one))
    return torch.where(x.abs() == 1, ends, inside)


def _chebyshev_step(x):
    return lambda k, previous, current: (x + x) * current - previous


def chebyshev_t(x, n: int):
    value = _recurrence(n, torch.ones_like(x), x, _chebyshev_step(x))
    if n > 6:
        value = torch.where(x.abs() < 1, torch.cos(n * torch.acos(x)), value)
    return _at_ends(x, n, 1.0, 1.0 if n % 2 == 0 else -1.0, value)


def chebyshev_u(x, n: int):
    value = _recurrence(n, torch.ones_like(x), x + x, _chebyshev_step(x))
    if n > 8:
        angle = torch.acos(x)
        sine = torch.sin(angle)
        trig = torch.where(sine != 0, torch.sin((n + 1) * angle) / sine, (n + 1) * torch.cos((n + 1) * angle) * x)
        value = torch.where(x.abs() < 1, trig, value)
    return _at_ends(x, n, float(n + 1), float(n + 1) if n % 2 == 0 else float(-(n + 1)), value)


def chebyshev_v(x, n: int):
    at_minus_one = float(2 * n + 1) if n % 2 == 0 else float(-(2 * n + 1))
    value = _recurrence(n, torch.ones_like(x), x + x - 1, _chebyshev_step(x))
    if n > 8:
        angle = torch.acos(x)
        trig = torch.where(torch.sin(angle / 2) != 1, torch.cos((n + 0.5) * angle) / torch.cos(angle / 2),
                           torch.full_like(x, at_minus_one))
        value = torch.where(x.abs() < 1, trig, value)
    return _at_ends(x, n, 1.0, at_minus_one, value)


def chebyshev_w(x, n: int):
    at_plus_one, at_minus_one = float(2 * n + 1), 1.0 if n % 2 == 0 else -1.0
    value = _recurrence(n, torch.ones_like(x), x + x + 1, _chebyshev_step(x))
    if n > 8:
        angle = torch.acos(x)
        ends = torch.where(x > 0, torch.full_like(x, at_plus_one), torch.full_like(x, at_minus_one))
        trig = torch.where(torch.cos(angle / 2) != 1, torch.sin((n + 0.5) * angle) / torch.sin(angle / 2), ends)
        value = torch.where(x.abs() < 1, trig, value)
    return _at_ends(x, n, at_plus_one, at_minus_one, value)


def hermite_h(x, n: int):
    """The physicists' Hermite polynomial: H_{k+1} = 2x H_k - 2k H_{k-1}."""
    return _recurrence(n, torch.ones_like(x), x + x, lambda k, previous, current: (x + x) * current - 2 * k * previous)


def hermite_he(x, n: int):
    """The probabilists' Hermite polynomial: He_{k+1} = x He_k - k He_{k-1}."""
    return _recurrence(n, torch.ones_like(x), x, lambda k, previous, current: x * current - k * previous)


def laguerre_l(x, n: int):
    """L_{k+1} = ((2k + 1 - x) L_k - k L_{k-1}) / (k + 1); 1 at x = 0."""
    value = _recurrence(n, torch.ones_like(x), 1 - x,
                        lambda k, previous, current: ((k + k + 1 - x) * current - k * previous) / (k + 1))
    return torch.where(x == 0, torch.ones_like(x), value)


def legendre_p(x, n: int):
    """P_{k+1} = ((2k + 1) x P_k - k P_{k-1}) / (k + 1)."""
    value = _recurrence(n, torch.ones_like(x), x,
                        lambda k, previous, current: ((k + k + 1) * x * current - k * previous) / (k + 1))
    return _at_ends(x, n, 1.0, 1.0 if n % 2 == 0 else -1.0, value)


def _shifted(polynomial):
    """The shifted form: the polynomial at 2x - 1 (so [0, 1] maps onto [-1, 1])."""
    return lambda x, n: polynomial(x + x - 1, n)


def _integral_degree(polynomial):
    """torch reads the degree as an int64 (a float degree truncated); a negative degree gives 0, and
    one above MAX_DEGREE is left to torch (NotImplemented)."""
    def decomposed(x, n):
        n = int(n)
        if n < 0:
            return torch.zeros_like(x)
        return NotImplemented if n > MAX_DEGREE else polynomial(x, n)

    return decomposed


def polynomial_decompositions() -> dict:
    """ATen `n_scalar` overload -> its decomposition."""
    table = {
        aten.special_chebyshev_polynomial_t: chebyshev_t,
        aten.special_chebyshev_polynomial_u: chebyshev_u,
        aten.special_chebyshev_polynomial_v: chebyshev_v,
        aten.special_chebyshev_polynomial_w: chebyshev_w,
        aten.special_shifted_chebyshev_polynomial_t: _shifted(chebyshev_t),
        aten.special_shifted_chebyshev_polynomial_u: _shifted(chebyshev_u),
        aten.special_shifted_chebyshev_polynomial_v: _shifted(chebyshev_v),
        aten.special_shifted_chebyshev_polynomial_w: _shifted(chebyshev_w),
        aten.special_hermite_polynomial_h: hermite_h,
        aten.special_hermite_polynomial_he: hermite_he,
        aten.special_laguerre_polynomial_l: laguerre_l,
        aten.special_legendre_polynomial_p: legendre_p,
    }
    return {packet.n_scalar: _integral_degree(polynomial) for packet, polynomial in table.items()}

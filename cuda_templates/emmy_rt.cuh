// emmy_rt.cuh: the device functions emitted kernels call for anything beyond
// plain C++. Each has its CUDA implementation and, when the compiler is not
// nvcc, a CPU twin for the simulator (emmy_sim.h) that follows the PTX
// fragment layouts exactly. Section names refer to the PTX ISA (version 8.x):
//   "Warp-level matrix fragments for mma.m16n8k16 with floating point type"
//     (Matrix Fragments for mma.m16n8k16),
//   "Warp-level matrix load instruction: ldmatrix",
//   "Data Movement and Conversion Instructions: cp.async",
//   "cp.async.bulk.tensor" and "Parallel Synchronization and Communication
//     Instructions: mbarrier".
#pragma once

#if defined(__CUDACC__)
#include <cuda.h>  // CUtensorMap
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#define EMMY_DEVICE __device__ __forceinline__
#include <cooperative_groups.h>
// a cooperative launch's grid-wide barrier
#define EMMY_GRID_SYNC() ::cooperative_groups::this_grid().sync()
#else
#include <source_location>

#include "emmy_sim.h"
#define EMMY_DEVICE inline
// the caller's line, for the simulator's reports (warp collectives, waits)
#define EMMY_CALLER std::source_location caller = std::source_location::current()
#define EMMY_GRID_SYNC() ::emmy_sim::grid_sync(__LINE__)
#endif

namespace emmy {

constexpr unsigned FULL_MASK = 0xffffffffu;

// ---- values in registers: float for f32, f16 and bf16, double for f64 -----------------------
// A half value is a float rounded to its type after every operation (as numpy rounds).
EMMY_DEVICE double to_reg(double x) { return x; }
EMMY_DEVICE float to_reg(float x) { return x; }
EMMY_DEVICE float to_reg(__half x) { return __half2float(x); }
EMMY_DEVICE float to_reg(__nv_bfloat16 x) { return __bfloat162float(x); }
EMMY_DEVICE long long to_reg(long long x) { return x; }
EMMY_DEVICE int to_reg(int x) { return x; }
EMMY_DEVICE bool to_reg(bool x) { return x; }
// A register's value into storage type T: integers stay integers (an int64 through a float would
// lose every bit past the 24th), floats round to the storage's precision.
template <class T, class R> EMMY_DEVICE T from_reg(R x) { return T(x); }
template <> EMMY_DEVICE __half from_reg<__half, float>(float x) { return __float2half_rn(x); }
template <> EMMY_DEVICE __nv_bfloat16 from_reg<__nv_bfloat16, float>(float x) { return __float2bfloat16_rn(x); }
EMMY_DEVICE float round_half(float x) { return __half2float(__float2half_rn(x)); }
EMMY_DEVICE float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
// An index tensor's element `index[position]` as a position along the axis it indexes (negative
// from the end when `wrap`; `ignore` read as `fallback`), clamped into [0, extent): a bad value reads
// a wrong element, never outside the buffer, and the first one found is recorded in the program's
// index-fault record (emmy/kernel_ir/index_faults.py), which the run reports. The position is an
// int, as every other index in emmy's kernels: 64-bit index arithmetic costs registers.
EMMY_DEVICE void record_index_fault(long long* faults, int tensor, int position, long long value, int extent,
                                    bool wrap) {
  if (atomicCAS(reinterpret_cast<unsigned long long*>(faults), 0ull, 1ull) == 0ull) {
    faults[1] = tensor;
    faults[2] = position;
    faults[3] = value;
    faults[4] = extent;
    faults[5] = wrap;
  }
}

EMMY_DEVICE int checked_position(long long v, int extent, bool wrap, long long* faults, int tensor, int position) {
  const long long given = v;
  if (wrap && v < 0) v += extent;
  if (v < 0 || v >= extent) {
    record_index_fault(faults, tensor, position, given, extent, wrap);
    return v < 0 ? 0 : extent - 1;
  }
  return int(v);
}

// `count` is the index tensor's size. A position outside it belongs to a lane whose value is thrown
// away: an expression evaluated under a guard that fails there (a concatenated piece's selector, read
// for every row though only its own rows keep it). Such a lane reads nothing and gets 0.
template <class I>
EMMY_DEVICE int gather_index(const I* index, int position, int count, int extent, bool wrap, long long* faults,
                             int tensor) {
  if (position < 0 || position >= count) return 0;
  return checked_position((long long)index[position], extent, wrap, faults, tensor, position);
}

template <class I>
EMMY_DEVICE int gather_index(const I* index, int position, int count, long long ignore, long long fallback,
                             int extent, bool wrap, long long* faults, int tensor) {
  if (position < 0 || position >= count) return 0;
  const long long v = (long long)index[position];
  return checked_position(v == ignore ? fallback : v, extent, wrap, faults, tensor, position);
}

// An index's floor division and remainder by a positive divisor, as emmy.affine defines them
// (Python's): C's / and % truncate toward zero, which differs where the dividend is negative (a
// position before a concatenated piece's start, read where the piece's guard fails).
EMMY_DEVICE long long index_floor_div(long long a, long long q) {
  const long long d = a / q;
  return (a % q < 0) ? d - 1 : d;
}
EMMY_DEVICE long long index_floor_mod(long long a, long long q) {
  const long long r = a % q;
  return r < 0 ? r + q : r;
}
// a * (e % q) + b * (e // q) (floor semantics) with e computed once: a reshape's digits side by
// side, whose e is itself such a sum in a chain of views (a relative shift); written out, each
// level would spell e twice and the text would double per level.
EMMY_DEVICE long long index_digits(long long e, long long q, long long a, long long b) {
  const long long t = index_floor_div(e, q);
  return a * (e - t * q) + b * t;
}

// numpy's maximum and minimum: NaN wins
EMMY_DEVICE float maximum(float a, float b) { return (a != a || a > b) ? a : b; }
EMMY_DEVICE float minimum(float a, float b) { return (a != a || a < b) ? a : b; }
EMMY_DEVICE double maximum(double a, double b) { return (a != a || a > b) ? a : b; }
EMMY_DEVICE double minimum(double a, double b) { return (a != a || a < b) ? a : b; }
EMMY_DEVICE long long maximum(long long a, long long b) { return a > b ? a : b; }
EMMY_DEVICE long long minimum(long long a, long long b) { return a < b ? a : b; }
EMMY_DEVICE int maximum(int a, int b) { return a > b ? a : b; }
EMMY_DEVICE int minimum(int a, int b) { return a < b ? a : b; }

// Floor division and remainders as torch computes them. Of floats: from fmod, which is exact, the
// quotient rounded to the nearest integer it must be; of integers: C truncates, so a quotient of
// operands of unlike signs with a remainder steps down one. Dividing an integer by 0 gives 0 (torch
// raises; a kernel cannot) and by -1 never divides (INT_MIN / -1 traps).
EMMY_DEVICE float fmod(float a, float b) { return fmodf(a, b); }
EMMY_DEVICE double fmod(double a, double b) { return ::fmod(a, b); }
EMMY_DEVICE float floor_of(float a) { return floorf(a); }
EMMY_DEVICE double floor_of(double a) { return ::floor(a); }
EMMY_DEVICE float copysign_of(float a, float b) { return copysignf(a, b); }
EMMY_DEVICE double copysign_of(double a, double b) { return ::copysign(a, b); }
template <class F> EMMY_DEVICE F floor_divide_float(F a, F b) {
  if (b == F(0)) return a / b;
  const F mod = fmod(a, b);
  F div = (a - mod) / b;
  if (mod != F(0) && ((b < F(0)) != (mod < F(0)))) div -= F(1);
  if (div == F(0)) return copysign_of(F(0), a / b);
  const F whole = floor_of(div);
  return div - whole > F(0.5) ? whole + F(1) : whole;
}
template <class F> EMMY_DEVICE F remainder_float(F a, F b) {
  const F mod = fmod(a, b);
  return (mod != F(0) && ((b < F(0)) != (mod < F(0)))) ? mod + b : mod;
}
EMMY_DEVICE float floor_divide(float a, float b) { return floor_divide_float(a, b); }
EMMY_DEVICE double floor_divide(double a, double b) { return floor_divide_float(a, b); }
EMMY_DEVICE float remainder(float a, float b) { return remainder_float(a, b); }
EMMY_DEVICE double remainder(double a, double b) { return remainder_float(a, b); }
EMMY_DEVICE float trunc_divide(float a, float b) { return truncf(a / b); }
EMMY_DEVICE double trunc_divide(double a, double b) { return ::trunc(a / b); }
// digamma (torch.digamma): CUDA's math library has none. Negative arguments by reflection,
// psi(x) = psi(1 - x) - pi / tan(pi x) (a pole, NaN, at each non-positive integer; -inf at 0 as
// torch), then the recurrence psi(x) = psi(x + 1) - 1/x up to x >= 6 and the asymptotic series
// ln x - 1/(2x) - sum B_2k / (2k x^2k), whose first omitted term is under 1e-9 there.
EMMY_DEVICE float digamma(float x) {
  if (x == 0.0f) return -INFINITY;
  float result = 0.0f;
  if (x < 0.0f) {
    if (x == floorf(x)) return NAN;
    const float pi = 3.14159265358979f;
    result = -pi / tanf(pi * x);
    x = 1.0f - x;
  }
  while (x < 6.0f) {
    result -= 1.0f / x;
    x += 1.0f;
  }
  const float f = 1.0f / (x * x);
  const float series = f * (-1.0f / 12.0f + f * (1.0f / 120.0f + f * (-1.0f / 252.0f + f * (1.0f / 240.0f + f * (-1.0f / 132.0f)))));
  return result + logf(x) - 0.5f / x + series;
}
// f64: the same steps up to x >= 10, where the series' first omitted term (x^-16) is under 1e-16
EMMY_DEVICE double digamma(double x) {
  if (x == 0.0) return -INFINITY;
  double result = 0.0;
  if (x < 0.0) {
    if (x == ::floor(x)) return NAN;
    const double pi = 3.141592653589793;
    result = -pi / ::tan(pi * x);
    x = 1.0 - x;
  }
  while (x < 10.0) {
    result -= 1.0 / x;
    x += 1.0;
  }
  const double f = 1.0 / (x * x);
  const double series = f * (-1.0 / 12.0 + f * (1.0 / 120.0 + f * (-1.0 / 252.0 + f * (1.0 / 240.0 + f * (-1.0 / 132.0
      + f * (691.0 / 32760.0 + f * (-1.0 / 12.0)))))));
  return result + ::log(x) - 0.5 / x + series;
}

// i0e, i1e (torch.special.i0e / i1e): the modified Bessel functions of the first kind scaled by
// exp(-|x|), finite for every x. In double: CUDA's cyl_bessel_i0 / i1 times the exponential while
// both stay finite (|x| < 700), past that the asymptotic series
//   e^-x I_v(x) ~ (2 pi x)^-1/2 (1 + sum_k prod_{j<=k} -(4v^2 - (2j-1)^2) / (8 j x)),
// whose twelfth term at x = 700 is far below a double's rounding.
EMMY_DEVICE double scaled_bessel_tail(double x, int order) {
  const double mu = 4.0 * order * order;
  double term = 1.0, sum = 1.0;
  for (int k = 1; k <= 12; ++k) {
    const double odd = 2.0 * k - 1.0;
    term *= -(mu - odd * odd) / (8.0 * k * x);
    sum += term;
  }
  return sum / ::sqrt(2.0 * 3.141592653589793 * x);
}
EMMY_DEVICE double i0e(double x) {
  const double a = ::fabs(x);
  return a < 700.0 ? cyl_bessel_i0(a) * ::exp(-a) : scaled_bessel_tail(a, 0);
}
EMMY_DEVICE double i1e(double x) {
  const double a = ::fabs(x);
  return ::copysign(a < 700.0 ? cyl_bessel_i1(a) * ::exp(-a) : scaled_bessel_tail(a, 1), x);
}
EMMY_DEVICE float i0e(float x) { return (float)i0e((double)x); }
EMMY_DEVICE float i1e(float x) { return (float)i1e((double)x); }
// Hurwitz's zeta(s, q) = sum_{k>=0} (q + k)^-s (torch.special.zeta; polygamma(n, x) is
// (-1)^(n+1) n! zeta(n + 1, x)), in double. Its first n terms are summed directly, n at least 9 and
// enough that x = q + n >= 10 (fewer where a term falls below the sum's rounding); the rest by the
// Euler-Maclaurin formula,
//   x^(1-s) / (s-1) + x^-s / 2 + sum_j B_2j / (2j)! s (s+1) ... (s+2j-2) x^(-s-2j+1),
// twelve terms of it. s = 1 is a pole (inf), s < 1 is NaN (torch's domain); at q <= 0 an integer q
// is a pole, and a non-integer q needs an integer s (a negative base to a real power).
EMMY_DEVICE double zeta(double s, double q) {
  if (s == 1.0) return INFINITY;
  if (s < 1.0) return NAN;
  if (q <= 0.0) {
    if (q == ::floor(q)) return INFINITY;
    if (s != ::floor(s)) return NAN;
  }
  const double bernoulli_terms[12] = {
      0.08333333333333333, -0.001388888888888889, 3.306878306878307e-05, -8.267195767195768e-07,
      2.08767569878681e-08, -5.284190138687493e-10, 1.3382536530684679e-11, -3.3896802963225827e-13,
      8.586062056277845e-15, -2.174868698558062e-16, 5.5090028283602295e-18, -1.3954464685812522e-19};
  double direct = 0.0, x = q;
  for (int k = 0; k < 9 || x < 10.0; ++k, x += 1.0) {
    const double term = ::pow(x, -s);
    direct += term;
    // a large s: the terms fall below the sum's rounding before the tail is needed (and s = inf
    // gives torch's values: inf below q = 1, 1 at it)
    if (k > 0 && ::fabs(term) < 1.1e-16 * ::fabs(direct)) return direct;
  }
  const double power = ::pow(x, -s);  // x^-s, then x^(-s-2j+1) as the series goes
  double tail = power * x / (s - 1.0) + 0.5 * power, rising = s, falling = power / x;
  for (int j = 0; j < 12; ++j) {
    const double term = bernoulli_terms[j] * rising * falling;
    tail += term;
    if (::fabs(term) <= 1e-17 * ::fabs(direct + tail)) break;
    rising *= (s + 2 * j + 1) * (s + 2 * j + 2);
    falling /= x * x;
  }
  return direct + tail;
}
EMMY_DEVICE float zeta(float s, float q) { return (float)zeta((double)s, (double)q); }

template <class I>
EMMY_DEVICE I negated(I a) { return (I)(0ULL - (unsigned long long)a); }  // wraps like numpy, no UB
#define EMMY_INTEGER_DIVISION(I)                                                                 \
  EMMY_DEVICE I trunc_divide(I a, I b) { return b == 0 ? 0 : b == -1 ? negated(a) : a / b; }    \
  EMMY_DEVICE I floor_divide(I a, I b) {                                                        \
    if (b == 0) return 0;                                                                       \
    if (b == -1) return negated(a);                                                             \
    const I q = a / b;                                                                          \
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;                                    \
  }                                                                                             \
  EMMY_DEVICE I fmod(I a, I b) { return (b == 0 || b == -1) ? 0 : a % b; }                      \
  EMMY_DEVICE I remainder(I a, I b) {                                                           \
    const I mod = fmod(a, b);                                                                   \
    return (mod != 0 && ((b < 0) != (mod < 0))) ? mod + b : mod;                                \
  }
EMMY_INTEGER_DIVISION(long long)
EMMY_INTEGER_DIVISION(int)

// Shifts as torch's (and numpy's): a count outside [0, the type's bits) shifts every bit out, leaving
// 0 (or -1, a negative value shifted right). The left shift is done unsigned (no signed overflow).
template <typename I, typename J> EMMY_DEVICE I shift_left(I a, J b) {
  if (b < 0 || b >= J(8 * sizeof(I))) return I(0);
  return I((unsigned long long)a << b);
}
template <typename I, typename J> EMMY_DEVICE I shift_right(I a, J b) {
  if (b < 0 || b >= J(8 * sizeof(I))) return a < I(0) ? I(-1) : I(0);
  return I(a >> b);
}
#undef EMMY_INTEGER_DIVISION

// Integer abs and power as torch's: exact (fabsf and powf round past 2^24), wrapping like numpy
// (abs of the most negative value is itself; products wrap, multiplied unsigned: no UB). A negative
// exponent gives 0 but for a base of 1 or -1, as torch's integer pow.
template <class I> EMMY_DEVICE I integer_abs(I a) { return a < I(0) ? negated(a) : a; }
template <class I, class J> EMMY_DEVICE I integer_power(I a, J b) {
  if (b < J(0)) return a == I(1) ? I(1) : a == I(-1) ? ((b % J(2)) != J(0) ? I(-1) : I(1)) : I(0);
  unsigned long long result = 1ULL, base = (unsigned long long)a;
  for (unsigned long long e = (unsigned long long)b; e != 0ULL; e >>= 1) {
    if (e & 1ULL) result *= base;
    base *= base;
  }
  return I(result);
}
// Greatest common divisor as torch's: Euclid's on the magnitudes, gcd(0, 0) = 0.
template <class I> EMMY_DEVICE I gcd(I a, I b) {
  a = integer_abs(a);
  b = integer_abs(b);
  while (a != I(0)) {
    const I c = a;
    a = I(b % a);
    b = c;
  }
  return b;
}

// An arg-reduction's (value, position) as one int64 ordered by value, then by the earlier position:
// a max (min) fold of these keys is argmax (argmin) in one pass (emmy/tensor_ir/scalar_ops.py says
// why the key is built so). -0 is read as +0; NaN ranks above every value for max, below for min.
EMMY_DEVICE long long value_key(float x, long long nan_key) {
  const float y = x + 0.0f;
  const int bits = __float_as_int(y);
  return y != y ? nan_key : (long long)(bits >= 0 ? bits : bits ^ 0x7fffffff);
}
EMMY_DEVICE long long max_key(float x, long long position) {
  return value_key(x, 0x7fffffffLL) * 4294967296LL + (4294967295LL - position);
}
EMMY_DEVICE long long min_key(float x, long long position) {
  return value_key(x, -0x80000000LL) * 4294967296LL + position;
}
EMMY_DEVICE long long max_key_position(long long key) { return 4294967295LL - (key & 4294967295LL); }
EMMY_DEVICE long long min_key_position(long long key) { return key & 4294967295LL; }

// Atomic combines of a split reduction's partial results into its output.
EMMY_DEVICE void atomic_sum(float* p, float v) { atomicAdd(p, v); }
#if defined(__CUDACC__)
// No float atomicMax/atomicMin in hardware: compare and swap until the stored value is combined.
template <float (*Combine)(float, float)>
EMMY_DEVICE void atomic_combine(float* p, float v) {
  int* word = reinterpret_cast<int*>(p);
  int seen = *word;
  while (Combine(__int_as_float(seen), v) != __int_as_float(seen)) {
    const int before = atomicCAS(word, seen, __float_as_int(Combine(__int_as_float(seen), v)));
    if (before == seen) break;
    seen = before;
  }
}
EMMY_DEVICE void atomic_max(float* p, float v) { atomic_combine<maximum>(p, v); }
EMMY_DEVICE void atomic_min(float* p, float v) { atomic_combine<minimum>(p, v); }
#else
inline void atomic_max(float* p, float v) { *p = maximum(*p, v); }  // one fiber runs at a time
inline void atomic_min(float* p, float v) { *p = minimum(*p, v); }
#endif

// exp(x) for an online softmax's rescale factor exp(m_old - m_new): within an ulp and leaning
// neither way (mean signed error 0.001 ulp over every float in [-20, 0]; at most 0.87 ulp on
// [-104, 0]), computed on the FMA pipes. The special-function unit's exp (expf's MUFU.EX2) leans a
// fraction of an ulp; in a normaliser every term is multiplied by a chain of rescales, so their
// lean adds up in the sum while the numerators exp(x - max) carry it once, and the quotient leans
// (an expf planted in the simulator, rounding toward zero, made a one-pass softmax of 65536-long
// rows lean 2.6 ulp; tests/test_softmax_lean.py). x = k ln2 + r (ln2 in two parts, Cody
// and Waite; k rounded by the 1.5 * 2^23 shift), exp(r) by its Taylor series to r^8/8! (2e-10 on
// |r| <= ln2/2), 2^k as two normal factors so the first product is exact and the second rounds
// once, subnormal results included.
EMMY_DEVICE float rescale_exp(float x) {
  if (!(x >= -104.0f)) return x == x ? 0.0f : x;  // below 2^-150 (and -inf): 0; NaN stays NaN
  x = fminf(x, 100.0f);                            // exp(100) is inf already; k stays small
  const float shifted = fmaf(x, 1.44269504f, 12582912.0f);
  const float k = shifted - 12582912.0f;
  float r = fmaf(k, -0.693145751953125f, x);  // k * ln2_hi is exact
  r = fmaf(k, -1.42860677e-6f, r);
  float p = 2.48015873e-5f;
  p = fmaf(p, r, 1.98412698e-4f);
  p = fmaf(p, r, 1.38888889e-3f);
  p = fmaf(p, r, 8.33333333e-3f);
  p = fmaf(p, r, 4.16666667e-2f);
  p = fmaf(p, r, 1.66666667e-1f);
  p = fmaf(p, r, 0.5f);
  p = fmaf(p, r, 1.0f);
  p = fmaf(p, r, 1.0f);
  const int ki = __float_as_int(shifted) - 0x4B400000, k1 = ki >> 1, k2 = ki - k1;
  return p * __int_as_float((k1 + 127) << 23) * __int_as_float((k2 + 127) << 23);
}

// Merges of twisted fold states (associative; the identity merges as a no-op).
// Online softmax (m, d): the running max and the sum of exp(x - m) over every element but one
// maximum (emmy/egraph/lowering.py's _online_sum says why). The lower state's maximum joins the sum
// by one exp, its sum by a rescale; equal maxima add the second maximum's term, 1. An identity
// (-inf, 0) adds 0 to a state with a finite max (its rescale and exp are 0).
// (f64 states merge by the same steps in double, exp for both exps.)
EMMY_DEVICE double rescale_exp(double x) { return ::exp(x); }
EMMY_DEVICE float exp_of(float x) { return expf(x); }
EMMY_DEVICE double exp_of(double x) { return ::exp(x); }
template <class F> EMMY_DEVICE void merge_softmax(F& m, F& d, F m_other, F d_other) {
  const F top = maximum(m, m_other);
  const bool mine_on_top = !(m_other > m);
  const F high_d = mine_on_top ? d : d_other, low_d = mine_on_top ? d_other : d;
  const F low_m = mine_on_top ? m_other : m;
  d = low_m == top ? high_d + low_d + F(1) : high_d + low_d * rescale_exp(low_m - top) + exp_of(low_m - top);
  m = top;
}
// Attention's online softmax (m, d, z): d and z sum every term, the maximum's included (lowering.py's
// _softmax_wsum), z weighted by the values; each state is rescaled to the larger maximum, a state on
// top by exactly 1 (an identity (-inf, 0, 0) then stays 0 beside another identity).
template <class F> EMMY_DEVICE void merge_softmax_wsum(F& m, F& d, F& z, F m_other, F d_other, F z_other) {
  const F top = maximum(m, m_other);
  const F mine = m == top ? F(1) : exp_of(m - top), theirs = m_other == top ? F(1) : exp_of(m_other - top);
  d = d * mine + d_other * theirs;
  z = z * mine + z_other * theirs;
  m = top;
}
// Welford (n, mean, m2), Chan et al.'s parallel merge.
template <class F> EMMY_DEVICE void merge_welford(F& n, F& mean, F& m2, F n_other, F mean_other, F m2_other) {
  const F total = n + n_other;
  if (total == F(0)) return;
  const F delta = mean_other - mean;
  mean = mean + delta * (n_other / total);
  m2 = m2 + m2_other + delta * delta * (n * n_other / total);
  n = total;
}

// ---- warp and block reductions ----------------------------------------------
struct Sum { template <class T> EMMY_DEVICE static T apply(T a, T b) { return a + b; } };
struct Max { template <class T> EMMY_DEVICE static T apply(T a, T b) { return a < b ? b : a; } };
struct Min { template <class T> EMMY_DEVICE static T apply(T a, T b) { return b < a ? b : a; } };

// Butterfly over the warp (xor shuffles): every lane ends with the result.
template <class Op, class T>
EMMY_DEVICE T warp_reduce(T value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value = Op::apply(value, __shfl_xor_sync(FULL_MASK, value, offset));
  return value;
}

// `lane`'s value, in every lane of the warp.
template <class T>
EMMY_DEVICE T warp_broadcast(T value, int lane) {
  return __shfl_sync(FULL_MASK, value, lane);
}

// Every thread's value combined over the block; every thread gets the result.
// `scratch` holds one value per warp (blockDim.x / 32 of them, at most 32).
// Warps reduce by shuffles, lane 0 of each writes its warp's value, then the
// first warp reduces those (a shared-memory tree halving the count).
template <class Op, class T>
EMMY_DEVICE T block_reduce(T value, T* scratch, T identity) {
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  value = warp_reduce<Op>(value);
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  if (warp == 0) {
    T v = lane < warps ? scratch[lane] : identity;
    v = warp_reduce<Op>(v);
    if (lane == 0) scratch[0] = v;
  }
  __syncthreads();
  T result = scratch[0];
  __syncthreads();  // scratch may be reused by the caller right away
  return result;
}

// ---- vector loads and stores ---------------------------------------------------
// N consecutive elements at p (p aligned to N * sizeof(T)) in one access.
template <int N, class T> struct Vec { T v[N]; };
// A value another block wrote before a grid barrier: read from L2, past this SM's L1 (which may
// hold the slot as an earlier row left it).
EMMY_DEVICE float load_fresh(const float* p) {
#if defined(__CUDACC__)
  return __ldcg(p);
#else
  return *p;
#endif
}

template <int N, class T>
EMMY_DEVICE Vec<N, T> load_vec(const T* p) {
  static_assert(N * sizeof(T) == 4 || N * sizeof(T) == 8 || N * sizeof(T) == 16, "4, 8 or 16 bytes");
  Vec<N, T> out;
  if constexpr (N * sizeof(T) == 16) {
    uint4 raw = *reinterpret_cast<const uint4*>(p);
    __builtin_memcpy(&out, &raw, 16);
  } else if constexpr (N * sizeof(T) == 8) {
    uint2 raw = *reinterpret_cast<const uint2*>(p);
    __builtin_memcpy(&out, &raw, 8);
  } else {
    unsigned raw = *reinterpret_cast<const unsigned*>(p);
    __builtin_memcpy(&out, &raw, 4);
  }
  return out;
}
template <int N, class T>
EMMY_DEVICE void store_vec(T* p, const Vec<N, T>& value) {
  static_assert(N * sizeof(T) == 4 || N * sizeof(T) == 8 || N * sizeof(T) == 16, "4, 8 or 16 bytes");
  if constexpr (N * sizeof(T) == 16) {
    uint4 raw;
    __builtin_memcpy(&raw, &value, 16);
    *reinterpret_cast<uint4*>(p) = raw;
  } else if constexpr (N * sizeof(T) == 8) {
    uint2 raw;
    __builtin_memcpy(&raw, &value, 8);
    *reinterpret_cast<uint2*>(p) = raw;
  } else {
    unsigned raw;
    __builtin_memcpy(&raw, &value, 4);
    *reinterpret_cast<unsigned*>(p) = raw;
  }
}

// ---- shared-memory addresses -----------------------------------------------------
#if defined(__CUDACC__)
EMMY_DEVICE unsigned smem_address(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }
#endif

// ---- mma.sync m16n8k16, f16 or bf16 operands, f32 accumulators ----------------------------
// d = a * b + c for a 16x16 (row-major) A, 16x8 (column-major) B and 16x8 C/D, one
// fragment per lane. With g = lane / 4 and t = lane % 4 (PTX ISA, "Matrix Fragments for
// mma.m16n8k16 with floating point type"):
//   a[r] holds A[g + 8 * (r % 2)][2t + 8 * (r / 2) + {0, 1}]   (low half first)
//   b[r] holds B[2t + 8r + {0, 1}][g]
//   c[i] is C[g + 8 * (i / 2)][2t + i % 2]
#if !defined(__CUDACC__)
struct MmaOffer { uint32_t a[4], b[2]; };

template <class T>
inline float fragment_half(uint32_t reg, int which) {
  uint16_t bits = uint16_t(reg >> (16 * which));
  T value;
  __builtin_memcpy(&value, &bits, 2);
  return float(value);
}

template <class T>
inline void mma_twin(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4], int line) {
  MmaOffer mine;
  for (int i = 0; i < 4; ++i) mine.a[i] = a[i];
  for (int i = 0; i < 2; ++i) mine.b[i] = b[i];
  float out[4];
  const unsigned lane = threadIdx.x % 32;  // lanes are consecutive threads: blockDim.x is a multiple of 32
  emmy_sim::exchange(FULL_MASK, line, "mma.sync", mine, [&](auto offer) {
    float A[16][16], B[16][8];
    for (unsigned l = 0; l < 32; ++l) {
      const MmaOffer& o = offer(l);
      const unsigned g = l / 4, t = l % 4;
      for (int r = 0; r < 4; ++r)
        for (int h = 0; h < 2; ++h) A[g + 8 * (r % 2)][2 * t + 8 * (r / 2) + h] = fragment_half<T>(o.a[r], h);
      for (int r = 0; r < 2; ++r)
        for (int h = 0; h < 2; ++h) B[2 * t + 8 * r + h][g] = fragment_half<T>(o.b[r], h);
    }
    const unsigned g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) {
      const unsigned row = g + 8 * (i / 2), col = 2 * t + i % 2;
      float acc = c[i];
      for (int k = 0; k < 16; ++k) acc += A[row][k] * B[k][col];  // products of halves are exact in f32
      out[i] = acc;
    }
  });
  for (int i = 0; i < 4; ++i) d[i] = out[i];
}
#endif

#if defined(__CUDACC__)
// one asm statement for both operand types: TYPE is "f16" or "bf16"
#define EMMY_MMA_M16N8K16(TYPE)                                                                              \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, " \
               "{%8,%9}, {%10,%11,%12,%13};\n"                                                               \
               : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])                                              \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),     \
                 "f"(c[2]), "f"(c[3]))
EMMY_DEVICE void mma_m16n8k16_f16_f32(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
  EMMY_MMA_M16N8K16("f16");
}
EMMY_DEVICE void mma_m16n8k16_bf16_f32(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
  EMMY_MMA_M16N8K16("bf16");
}
#else
inline void mma_m16n8k16_f16_f32(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4], EMMY_CALLER) {
  mma_twin<__half>(d, a, b, c, int(caller.line()));
}
inline void mma_m16n8k16_bf16_f32(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4],
                                  EMMY_CALLER) {
  mma_twin<__nv_bfloat16>(d, a, b, c, int(caller.line()));
}
#endif

// Two 16-bit values in one fragment register, `lo` in the low half (the order of the mma fragments).
template <class T>
EMMY_DEVICE uint32_t pack2(T lo, T hi) {
  uint16_t l, h;
  __builtin_memcpy(&l, &lo, 2);
  __builtin_memcpy(&h, &hi, 2);
  return uint32_t(l) | (uint32_t(h) << 16);
}

// A fragment register's two 16-bit values through `f` (an operand's elementwise prologue: it takes
// and returns registers as float, rounded to T as its last statement is), repacked.
template <class T, class F>
EMMY_DEVICE uint32_t map_pair(uint32_t packed, F f) {
  const uint16_t l = uint16_t(packed & 0xffffu), h = uint16_t(packed >> 16);
  T lo, hi;
  __builtin_memcpy(&lo, &l, 2);
  __builtin_memcpy(&hi, &h, 2);
  return pack2(from_reg<T>(f(to_reg(lo))), from_reg<T>(f(to_reg(hi))));
}

// ---- ldmatrix: 8x8 matrices of 16-bit elements from shared memory ------------------------
// Lanes 8j..8j+7 give the addresses of the 8 rows (16 bytes each) of matrix j (j < X).
// Lane l receives in r[j] row l / 4, columns 2 (l % 4) + {0, 1} of matrix j; with .trans,
// rows 2 (l % 4) + {0, 1} of column l / 4 (PTX ISA, "Warp-level matrix load instruction: ldmatrix").
#if defined(__CUDACC__)
template <int X, bool Trans>
EMMY_DEVICE void ldmatrix(uint32_t (&r)[X], const void* row) {
  const unsigned address = smem_address(row);
  if constexpr (X == 1 && !Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(address));
  else if constexpr (X == 1)
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(address));
  else if constexpr (X == 2 && !Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(address));
  else if constexpr (X == 2)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(address));
  else if constexpr (!Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address));
}
#else
template <int X, bool Trans>
inline void ldmatrix(uint32_t (&r)[X], const void* row, EMMY_CALLER) {
  const int line = int(caller.line());
  static_assert(X == 1 || X == 2 || X == 4, "ldmatrix loads 1, 2 or 4 matrices");
  const unsigned lane = threadIdx.x % 32;
  uint32_t out[X];
  const uint16_t* mine = static_cast<const uint16_t*>(row);
  emmy_sim::exchange(FULL_MASK, line, "ldmatrix", mine, [&](auto offer) {
    for (int j = 0; j < X; ++j) {
      uint16_t lo, hi;
      if (!Trans) {
        const uint16_t* src = offer(8 * j + lane / 4);
        lo = src[2 * (lane % 4)];
        hi = src[2 * (lane % 4) + 1];
      } else {
        lo = offer(8 * j + 2 * (lane % 4))[lane / 4];
        hi = offer(8 * j + 2 * (lane % 4) + 1)[lane / 4];
      }
      out[j] = uint32_t(lo) | (uint32_t(hi) << 16);
    }
  });
  for (int j = 0; j < X; ++j) r[j] = out[j];
}
#endif

// ---- cp.async: global -> shared copies that complete at a wait ---------------------------
// 4, 8 or 16 bytes; `source_bytes` < bytes reads that many and zero-fills the rest (masked
// tails). Groups: commit closes the copies issued so far into a group; wait<N> returns when
// at most N of the most recent groups are still pending (PTX ISA, "cp.async",
// "cp.async.commit_group", "cp.async.wait_group"). The CPU twin copies at the wait, so a read
// of the destination before its wait sees the old contents, as a GPU may.
template <int Bytes>
EMMY_DEVICE void cp_async(void* smem_dst, const void* gmem_src, unsigned source_bytes = Bytes) {
  static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "cp.async copies 4, 8 or 16 bytes");
#if defined(__CUDACC__)
  if constexpr (Bytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem_dst)), "l"(gmem_src),
                 "r"(source_bytes));
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(smem_address(smem_dst)), "l"(gmem_src),
                 "n"(Bytes), "r"(source_bytes));
#else
  emmy_sim::issue_copy(smem_dst, gmem_src, unsigned(Bytes), source_bytes);
#endif
}

EMMY_DEVICE void cp_async_commit() {
#if defined(__CUDACC__)
  asm volatile("cp.async.commit_group;\n" ::);
#else
  emmy_sim::commit_copies();
#endif
}

template <int N>
EMMY_DEVICE void cp_async_wait() {
#if defined(__CUDACC__)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#else
  emmy_sim::complete_copies(emmy_sim::me(), N);
#endif
}

// ---- mbarrier and TMA (sm_90) ---------------------------------------------------------------
// mbarrier: `count` arrivals and the expected transaction bytes complete a phase; waiters poll
// the phase parity (PTX ISA, "mbarrier"). A TMA 2-D tile load copies a box of the tensor map's
// tensor into shared memory (out-of-bounds elements zero) and completes its bytes on the
// mbarrier ("cp.async.bulk.tensor"). Coordinates: c0 along the contiguous dimension, c1 the other.
#if defined(__CUDACC__)
EMMY_DEVICE void mbarrier_init(uint64_t* bar, unsigned count) {
#if __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(count));
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::);
#else
  __trap();
#endif
}
EMMY_DEVICE void mbarrier_arrive_expect_tx(uint64_t* bar, unsigned bytes) {
#if __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes));
#else
  __trap();
#endif
}
EMMY_DEVICE void mbarrier_arrive(uint64_t* bar) {
#if __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)));
#else
  __trap();
#endif
}
EMMY_DEVICE void mbarrier_wait(uint64_t* bar, unsigned parity) {
#if __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n .reg .pred done;\n"
      "EMMY_WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra EMMY_WAIT_%=;\n}\n" ::"r"(smem_address(bar)), "r"(parity));
#else
  __trap();
#endif
}
EMMY_DEVICE void tma_load_2d(void* smem_dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
#if __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(smem_address(smem_dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_address(bar))
      : "memory");
#else
  __trap();
#endif
}
#else
}  // namespace emmy
// The simulator's tensor map: what cuTensorMapEncodeTiled would encode, in the same 128 bytes
// (emmy.sim.TensorMap builds it on the host side).
struct alignas(64) CUtensorMap {
  void* base;
  uint64_t rows, cols;       // extents: cols along the contiguous dimension
  uint64_t row_stride_bytes;
  uint32_t box_rows, box_cols, element_bytes, reserved;
  char padding[128 - 48];
};
static_assert(sizeof(CUtensorMap) == 128, "a tensor map is 128 bytes");
namespace emmy {

// The twins keep their bookkeeping out of the race check (EMMY_SIM_INLINE: not instrumented).
struct MbarrierState { unsigned count = 0, pending = 0; long tx = 0; unsigned phase = 0; };
EMMY_SIM_INLINE MbarrierState& mbarrier_state(uint64_t* bar) {
  static std::vector<std::pair<uint64_t*, MbarrierState>> states;  // few barriers per block
  for (auto& s : states)
    if (s.first == bar) return s.second;
  emmy_sim::mute(true);
  states.push_back({bar, MbarrierState{}});
  emmy_sim::mute(false);
  return states.back().second;
}
EMMY_SIM_INLINE void mbarrier_settle(MbarrierState& s) {
  if (s.pending == 0 && s.tx == 0) { s.phase ^= 1u; s.pending = s.count; }
  emmy_sim::event();
}
EMMY_SIM_INLINE void mbarrier_init(uint64_t* bar, unsigned count) {
  MbarrierState& s = mbarrier_state(bar);
  s = MbarrierState{count, count, 0, 0};
  *bar = 0;
}
EMMY_SIM_INLINE void mbarrier_arrive_expect_tx(uint64_t* bar, unsigned bytes) {
  MbarrierState& s = mbarrier_state(bar);
  s.tx += bytes;
  --s.pending;
  mbarrier_settle(s);
}
EMMY_SIM_INLINE void mbarrier_arrive(uint64_t* bar) {
  MbarrierState& s = mbarrier_state(bar);
  --s.pending;
  mbarrier_settle(s);
}
EMMY_SIM_INLINE void mbarrier_wait(uint64_t* bar, unsigned parity, EMMY_CALLER) {
  // the phase with this parity has completed once the barrier's current phase differs from it
  while (mbarrier_state(bar).phase == (parity & 1u)) emmy_sim::poll(int(caller.line()), "mbarrier wait");
}
EMMY_SIM_INLINE void tma_load_2d(void* smem_dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
  char* dst = static_cast<char*>(smem_dst);
  const size_t e = map->element_bytes;
  for (uint32_t r = 0; r < map->box_rows; ++r)
    for (uint32_t c = 0; c < map->box_cols; ++c) {
      const long row = long(c1) + r, col = long(c0) + c;
      char* out = dst + (size_t(r) * map->box_cols + c) * e;
      if (row < 0 || col < 0 || uint64_t(row) >= map->rows || uint64_t(col) >= map->cols)
        __builtin_memset(out, 0, e);
      else
        __builtin_memcpy(out, static_cast<const char*>(map->base) + row * map->row_stride_bytes + col * e, e);
    }
  MbarrierState& s = mbarrier_state(bar);
  s.tx -= long(map->box_rows) * map->box_cols * e;
  mbarrier_settle(s);
}
#endif

}  // namespace emmy

// emmy_sim.h: the CUDA built-ins for g++, so that an unmodified kernel source
// runs on the CPU. emmy_rt.cuh includes it when the
// compiler is not nvcc; kernel sources include emmy_rt.cuh only.
//
// Execution model. Blocks run one after another. The threads of a block are
// fibers run in order of their linear index; a thread runs until
// it reaches __syncthreads, a warp collective (__shfl*_sync, __ballot_sync,
// __syncwarp, ...) or its end. When every thread is waiting, complete warp
// collectives are resolved first, then the block barrier is released. A state
// where nothing can move is a deadlock and is reported (which threads wait
// where, and which are missing) instead of hanging.
//
// A grid-wide barrier (emmy::grid_sync, a cooperative launch's grid.sync): a
// block whose threads all wait there is parked, its fibers kept, and the next
// block starts on stacks of its own; once every block is parked, they are
// released and resumed one after another, up to the next grid barrier. Blocks
// take turns in one OS thread, so their static __shared__ arrays are one
// storage: a kernel must not keep static shared memory live across a grid
// barrier. Dynamic shared memory is each block's own, as on a GPU: a parked
// block's bytes are saved and given back when it resumes (a block's first
// turn starts with 0xff bytes, NaN floats).
//
// Modes (chosen by the launcher, emmy/sim/): plain; EMMY_SIM_ASAN (built with
// -fsanitize=address: out-of-bounds accesses are ASan reports); and
// EMMY_SIM_RACECHECK (built with -fsanitize=thread but linked without the TSan
// runtime: emmy_sim_runtime.cpp defines the __tsan_* hooks, so every load and store the
// kernel makes comes here, and two threads touching one address between
// barriers, one of them writing, is a reported race).
// A macro guard, not #pragma once: builds take this header precompiled, with a copy of it beside
// the .gch (emmy/sim/build.py), which #pragma once would take for another file.
#ifndef EMMY_SIM_H_INCLUDED
#define EMMY_SIM_H_INCLUDED

#if !defined(__x86_64__)
#include <ucontext.h>  // fibers switch with ucontext off x86-64
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

// The simulator's own code must not report on itself in race-check mode.
#define EMMY_SIM_INTERNAL __attribute__((no_sanitize_thread, noinline))
#define EMMY_SIM_INLINE __attribute__((no_sanitize_thread)) inline

// ---- CUDA keywords --------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __grid_constant__
#define __constant__ static
// Shared memory is per block; blocks run one at a time, so a function-local
// static (thread_local: legal with `extern` too) is one block's shared memory.
// `extern __shared__ T name[]` gets its storage from the launcher (dynamic).
#define __shared__ thread_local

// ---- vector types ---------------------------------------------------------
struct uint3 { unsigned x, y, z; };
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
#define EMMY_SIM_VEC2(T, N, A) struct alignas(A) N { T x, y; }; \
  inline N make_##N(T x, T y) { return N{x, y}; }
#define EMMY_SIM_VEC4(T, N, A) struct alignas(A) N { T x, y, z, w; }; \
  inline N make_##N(T x, T y, T z, T w) { return N{x, y, z, w}; }
EMMY_SIM_VEC2(float, float2, 8)
EMMY_SIM_VEC4(float, float4, 16)
EMMY_SIM_VEC2(int, int2, 8)
EMMY_SIM_VEC4(int, int4, 16)
EMMY_SIM_VEC2(unsigned, uint2, 8)
EMMY_SIM_VEC4(unsigned, uint4, 16)
EMMY_SIM_VEC2(double, double2, 16)
struct alignas(4) short2 { short x, y; };
struct float3 { float x, y, z; };
inline float3 make_float3(float x, float y, float z) { return float3{x, y, z}; }

// ---- half and bfloat16 ----------------------------------------------------
// __half is the compiler's IEEE binary16; conversions round to nearest even.
typedef _Float16 __half;
struct alignas(4) __half2 { __half x, y; };
struct __nv_bfloat16 {
  uint16_t bits;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) : bits(from_float(f)) {}
  operator float() const { uint32_t u = uint32_t(bits) << 16; float f; std::memcpy(&f, &u, 4); return f; }
  static uint16_t from_float(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN stays NaN (quiet)
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
    return uint16_t(u >> 16);
  }
};
struct alignas(4) __nv_bfloat162 { __nv_bfloat16 x, y; };
typedef __half half;
typedef __half2 half2;

inline __half __float2half(float f) { return (__half)f; }
inline __half __float2half_rn(float f) { return (__half)f; }
inline float __half2float(__half h) { return (float)h; }
inline __half2 __floats2half2_rn(float a, float b) { return __half2{(__half)a, (__half)b}; }
inline __half2 __float2half2_rn(float a) { return __half2{(__half)a, (__half)a}; }
inline float2 __half22float2(__half2 h) { return float2{(float)h.x, (float)h.y}; }
inline __half __low2half(__half2 h) { return h.x; }
inline __half __high2half(__half2 h) { return h.y; }
inline __half __hadd(__half a, __half b) { return (__half)((float)a + (float)b); }
inline __half __hmul(__half a, __half b) { return (__half)((float)a * (float)b); }
inline __half __hsub(__half a, __half b) { return (__half)((float)a - (float)b); }
inline __half __hfma(__half a, __half b, __half c) { return (__half)std::fma((float)a, (float)b, (float)c); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 b) { return float(b); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return __nv_bfloat162{a, b}; }
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return float2{float(h.x), float(h.y)}; }

// Packed pairs as <cuda_fp16.h> and <cuda_bf16.h> define them, for plain CUDA files: each lane is
// computed in float and rounded to its type, as the hardware's paired instructions do.
template <class P, class F> inline P emmy_sim_pair_map(P a, P b, F f) {
  using E = decltype(a.x);
  return P{E(f(float(a.x), float(b.x))), E(f(float(a.y), float(b.y)))};
}
#define EMMY_SIM_PAIR_OPS(P, E, S)                                                                       \
  inline P operator+(P a, P b) { return emmy_sim_pair_map(a, b, [](float u, float v) { return u + v; }); } \
  inline P operator-(P a, P b) { return emmy_sim_pair_map(a, b, [](float u, float v) { return u - v; }); } \
  inline P operator*(P a, P b) { return emmy_sim_pair_map(a, b, [](float u, float v) { return u * v; }); } \
  inline P operator/(P a, P b) { return emmy_sim_pair_map(a, b, [](float u, float v) { return u / v; }); } \
  inline P& operator+=(P& a, P b) { return a = a + b; }                                                  \
  inline P& operator*=(P& a, P b) { return a = a * b; }                                                  \
  inline P operator-(P a) { return P{E(-float(a.x)), E(-float(a.y))}; }                                 \
  inline P __hadd2(P a, P b) { return a + b; }                                                           \
  inline P __hsub2(P a, P b) { return a - b; }                                                           \
  inline P __hmul2(P a, P b) { return a * b; }                                                           \
  inline P __h2div(P a, P b) { return a / b; }                                                           \
  inline P __hneg2(P a) { return -a; }                                                                   \
  inline P __habs2(P a) { return P{E(std::fabs(float(a.x))), E(std::fabs(float(a.y)))}; }              \
  inline P __hfma2(P a, P b, P c) {                                                                      \
    return P{E(std::fma(float(a.x), float(b.x), float(c.x))), E(std::fma(float(a.y), float(b.y), float(c.y)))}; \
  }                                                                                                      \
  inline P __hmax2(P a, P b) { return emmy_sim_pair_map(a, b, [](float u, float v) { return std::fmax(u, v); }); } \
  inline P __hmin2(P a, P b) { return emmy_sim_pair_map(a, b, [](float u, float v) { return std::fmin(u, v); }); } \
  inline P __halves2##S##2(E a, E b) { return P{a, b}; }                                                 \
  inline P __lows2##S##2(P a, P b) { return P{a.x, b.x}; }                                               \
  inline P __highs2##S##2(P a, P b) { return P{a.y, b.y}; }                                              \
  inline P __low2##S##2(P a) { return P{a.x, a.x}; }                                                     \
  inline P __high2##S##2(P a) { return P{a.y, a.y}; }                                                    \
  inline float __low2float(P a) { return float(a.x); }                                                   \
  inline float __high2float(P a) { return float(a.y); }
EMMY_SIM_PAIR_OPS(__half2, __half, half)
EMMY_SIM_PAIR_OPS(__nv_bfloat162, __nv_bfloat16, bfloat16)
#undef EMMY_SIM_PAIR_OPS
inline __half2 __half2half2(__half a) { return __half2{a, a}; }
inline __nv_bfloat162 __bfloat162bfloat162(__nv_bfloat16 a) { return __nv_bfloat162{a, a}; }
inline __half2 make_half2(__half x, __half y) { return __half2{x, y}; }
inline __nv_bfloat162 make_bfloat162(__nv_bfloat16 x, __nv_bfloat16 y) { return __nv_bfloat162{x, y}; }
inline __half2 __float22half2_rn(float2 f) { return __half2{(__half)f.x, (__half)f.y}; }
inline __nv_bfloat162 __float22bfloat162_rn(float2 f) { return __nv_bfloat162{f.x, f.y}; }
inline __nv_bfloat16 __low2bfloat16(__nv_bfloat162 h) { return h.x; }
inline __nv_bfloat16 __high2bfloat16(__nv_bfloat162 h) { return h.y; }
inline __half __hdiv(__half a, __half b) { return (__half)((float)a / (float)b); }
inline __half __hneg(__half a) { return (__half)(-(float)a); }
inline __half __habs(__half a) { return (__half)std::fabs((float)a); }
inline __half __hmax(__half a, __half b) { return (__half)std::fmax((float)a, (float)b); }
inline __half __hmin(__half a, __half b) { return (__half)std::fmin((float)a, (float)b); }
inline bool __hisnan(__half a) { return std::isnan((float)a); }
inline bool __heq(__half a, __half b) { return (float)a == (float)b; }
inline bool __hlt(__half a, __half b) { return (float)a < (float)b; }
inline bool __hgt(__half a, __half b) { return (float)a > (float)b; }
inline __half hexp(__half a) { return (__half)std::exp((float)a); }
inline __half hsqrt(__half a) { return (__half)std::sqrt((float)a); }
inline __half hrsqrt(__half a) { return (__half)(1.0f / std::sqrt((float)a)); }
inline __half __int2half_rn(int i) { return (__half)(float)i; }
inline int __half2int_rn(__half h) { return (int)std::nearbyint((float)h); }

// ---- math intrinsics ------------------------------------------------------
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __log2f(float x) { return std::log2(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __tanhf(float x) { return std::tanh(x); }
inline float __powf(float a, float b) { return std::pow(a, b); }
inline float exp10f(float x) { return std::pow(10.0f, x); }
// CUDA math functions C++ lacks or names otherwise. erfinv: Winitzki's closed form (within 2e-3)
// refined by Newton steps on std::erf (quadratic: 2e-3, 4e-6, 2e-11, then double precision).
inline double erfinv(double y) {
  if (!(y >= -1.0 && y <= 1.0)) return NAN;
  if (y == 1.0 || y == -1.0) return y > 0 ? INFINITY : -INFINITY;
  const double a = 0.147, pi = 3.141592653589793, ln = std::log((1.0 - y) * (1.0 + y));
  const double first = 2.0 / (pi * a) + ln / 2.0;
  double x = std::copysign(std::sqrt(std::sqrt(first * first - ln / a) - first), y);
  for (int step = 0; step < 5; ++step) x -= (std::erf(x) - y) / (2.0 / std::sqrt(pi) * std::exp(-x * x));
  return x;
}
inline float erfinvf(float y) { return (float)erfinv(y); }
inline double cyl_bessel_i0(double x) { return std::cyl_bessel_i(0.0, std::fabs(x)); }
inline double cyl_bessel_i1(double x) { return std::copysign(std::cyl_bessel_i(1.0, std::fabs(x)), x); }
inline float cyl_bessel_i0f(float x) { return (float)cyl_bessel_i0(x); }
inline float cyl_bessel_i1f(float x) { return (float)cyl_bessel_i1(x); }
// erfcx (exp(x^2) erfc(x)): the product in double while erfc(x) stays normal (x < 26), past that its
// asymptotic series 1/(x sqrt(pi)) sum_n (-1)^n (2n-1)!! / (2x^2)^n (eight terms: under 1e-18 there);
// below 0 by erfcx(x) = 2 exp(x^2) - erfcx(-x).
inline double erfcx(double x) {
  if (std::isnan(x)) return x;
  if (x < 0.0) return x < -26.7 ? INFINITY : 2.0 * std::exp(x * x) - erfcx(-x);
  if (x < 26.0) return std::exp(x * x) * std::erfc(x);
  const double v = 1.0 / (2.0 * x * x);
  double sum = 1.0, term = 1.0;
  for (int n = 1; n <= 8; ++n) sum += (term *= -(2.0 * n - 1.0) * v);
  return sum / (x * 1.7724538509055160);
}
inline float erfcxf(float x) { return (float)erfcx(x); }
// normcdfinv (the standard normal's quantile): Abramowitz and Stegun's 26.2.23 (within 5e-4) refined
// by Newton steps on the normal CDF (quadratic: four reach double precision).
inline double normcdfinv(double p) {
  if (!(p >= 0.0 && p <= 1.0)) return NAN;
  if (p == 0.0 || p == 1.0) return p == 0.0 ? -INFINITY : INFINITY;
  const double t = std::sqrt(-2.0 * std::log(p < 0.5 ? p : 1.0 - p));
  double x = t - (2.515517 + t * (0.802853 + t * 0.010328)) / (1.0 + t * (1.432788 + t * (0.189269 + t * 0.001308)));
  if (p < 0.5) x = -x;
  for (int step = 0; step < 4; ++step)
    x -= (0.5 * std::erfc(-x / 1.4142135623730951) - p) / (std::exp(-0.5 * x * x) / 2.5066282746310002);
  return x;
}
inline float normcdfinvf(float p) { return (float)normcdfinv(p); }
inline float __fdividef(float a, float b) { return a / b; }
using std::isnan;  // CUDA declares isnan, isinf and signbit for device code in the global namespace
using std::isinf;
using std::signbit;
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x ? __builtin_clz(unsigned(x)) : 32; }
template <class T> inline T min(T a, T b) { return b < a ? b : a; }
template <class T> inline T max(T a, T b) { return a < b ? b : a; }
using std::fmaxf;
using std::fminf;

// The scheduler, the fiber switch, the race check and the entry points the launcher calls are
// emmy_sim_runtime.cpp, built once per mode and linked into every kernel's library (emmy/sim/build.py):
// a kernel's build compiles its own kernels only. Hidden: each library keeps its own state.
#pragma GCC visibility push(hidden)
namespace emmy_sim {

// ---- fiber contexts --------------------------------------------------------
#if defined(__x86_64__)
struct Context { void* sp = nullptr; };  // the fiber's saved stack pointer (emmy_sim_runtime.cpp)
#else
using Context = ucontext_t;
#endif

// ---- the fibers of one block ----------------------------------------------
enum class State { runnable, barrier, warp, done, polling, grid };
enum class Collective { none, shfl_idx, shfl_up, shfl_down, shfl_xor, ballot, all, any, syncwarp, exchange };

struct Thread {
  Context context;
  char* stack = nullptr;  // a slice of Launch::stacks
  uint3 index{0, 0, 0};
  unsigned linear = 0;
  State state = State::done;
  int line = 0;             // where it waits
  const char* what = "";    // at what (for reports)
  Collective kind = Collective::none;
  unsigned mask = 0;
  int arg = 0, width = 32;  // shuffle source / delta / lane mask, and segment width
  unsigned char in[8] = {}, out[8] = {};
  int predicate = 0;
  const void* slot = nullptr;  // exchange: what this lane offers the others
  unsigned warp_epoch = 0;     // warp syncs this lane's warp has completed (race check)
  // cp.async copies issued and not yet waited for; group_ends[i]: copies in groups 0..i (committed)
  struct AsyncCopy { void* dst; const void* src; unsigned bytes, source_bytes; };
  std::vector<AsyncCopy> pending;
  std::vector<size_t> group_ends;
};

struct Launch {
  dim3 grid, block;
  uint3 block_index{0, 0, 0};
  std::vector<Thread> threads;
  Thread* current = nullptr;
  Context scheduler;
  void (*invoke)(void*) = nullptr;
  void* closure = nullptr;
  std::string error;
  size_t stack_bytes = 0;
  char* stacks = nullptr;  // every fiber's stack, one after another
  size_t stack_pool_bytes = 0;
  unsigned long events = 0;  // arrivals on mbarriers, async completions: what a polling thread waits for
  unsigned long barrier_epoch = 0;  // barriers released so far (all blocks): race-check epochs
  std::vector<unsigned> warp_epochs;
  bool parked = false;  // the block just run waits at a grid barrier, every live thread of it
  // a block parked at a grid barrier: its fibers, their stacks, and its dynamic shared memory
  struct Parked { uint3 block_index; std::vector<Thread> threads; char* stacks; std::vector<std::vector<char>> shared; };
  std::vector<Parked> waiting;  // blocks at the grid barrier, in launch order
};

extern Launch launch_state;

EMMY_SIM_INLINE Thread& me() { return *launch_state.current; }

// While set, memory accesses are the simulator's bookkeeping, not the kernel's: the race check
// ignores them. Set and cleared only from uninstrumented functions (EMMY_SIM_INTERNAL).
EMMY_SIM_INTERNAL void mute(bool on);

// Dynamic shared memory (`extern __shared__ T name[]`): the launcher defines each such array with
// EMMY_SIM_DYNAMIC_SHARED, which registers it, so that every block starts with it filled with 0xff
// bytes (NaN floats), as a reminder that shared memory starts undefined.
constexpr size_t dynamic_shared_capacity = 232448;  // the largest opt-in per block (sm_90, sm_120)
void register_dynamic_shared(void* base);
struct RegisterDynamic {
  explicit RegisterDynamic(void* base) { register_dynamic_shared(base); }
};

// The running thread waits (at a barrier, a collective, a poll) until the scheduler resumes it.
EMMY_SIM_INTERNAL void wait_here(State state, int line, const char* what);

// Runs `invoke(closure)` as every thread of every block of the grid; nonzero (and the error set)
// on a bad launch, a fault the simulator saw, a deadlock.
EMMY_SIM_INTERNAL int launch(const unsigned* grid, const unsigned* block, unsigned long shared_bytes,
                             void (*invoke)(void*), void* closure);

// ---- warp collectives -----------------------------------------------------
// Reports a shuffle whose width is not a power of two up to 32 or whose mask leaves the caller out.
EMMY_SIM_INTERNAL void check_shuffle(const char* what, int line, unsigned mask, int width);

template <class T>
EMMY_SIM_INLINE T shuffle(Collective kind, const char* what, int line, unsigned mask, T value, int arg, int width) {
  static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
  Thread& t = me();
  if (width < 1 || width > 32 || (width & (width - 1)) || !(mask >> (t.linear % 32) & 1u))
    check_shuffle(what, line, mask, width);
  std::memset(t.in, 0, sizeof t.in);
  std::memcpy(t.in, &value, sizeof(T));
  t.kind = kind;
  t.mask = mask;
  t.arg = arg;
  t.width = width;
  wait_here(State::warp, line, what);
  T result;
  std::memcpy(&result, t.out, sizeof(T));
  return result;
}

EMMY_SIM_INTERNAL unsigned vote(Collective kind, const char* what, int line, unsigned mask, int predicate);

// Every lane of `mask` offers `mine`; `read(lane)` returns lane's offer until
// every lane has finished reading (two warp syncs): the runtime header's twins
// of mma and ldmatrix are built on this.
template <class Offer, class Body>
EMMY_SIM_INLINE void exchange(unsigned mask, int line, const char* what, const Offer& mine, Body&& body) {
  Thread& t = me();
  t.slot = &mine;
  t.kind = Collective::exchange;
  t.mask = mask;
  wait_here(State::warp, line, what);
  const unsigned warp_base = t.linear & ~31u;
  body([&](unsigned lane) -> const Offer& {
    return *static_cast<const Offer*>(launch_state.threads[warp_base + lane].slot);
  });
  t.kind = Collective::exchange;
  t.mask = mask;
  wait_here(State::warp, line, what);
}

EMMY_SIM_INLINE void syncthreads(int line) { wait_here(State::barrier, line, "__syncthreads"); }

// A cooperative launch's grid-wide barrier (cooperative_groups::this_grid().sync() under nvcc).
EMMY_SIM_INLINE void grid_sync(int line) { wait_here(State::grid, line, "grid sync"); }

// cp.async: a copy issued, the group of copies issued so far committed, and every copy but those of
// the `keep` most recent committed groups completed.
EMMY_SIM_INTERNAL void issue_copy(void* dst, const void* src, unsigned bytes, unsigned source_bytes);
EMMY_SIM_INTERNAL void commit_copies();
EMMY_SIM_INTERNAL void complete_copies(Thread& t, size_t keep);

// A polling thread (an mbarrier wait that is not complete yet) lets the others run.
EMMY_SIM_INLINE void poll(int line, const char* what) { wait_here(State::polling, line, what); }
EMMY_SIM_INLINE void event() { ++launch_state.events; }

// The lanes of the caller's warp that have not exited.
EMMY_SIM_INTERNAL unsigned active_lanes();

#if defined(EMMY_SIM_RACECHECK)
void count_atomic(const void* address, size_t size);  // race-check builds count an atomic's read and write
#else
inline void count_atomic(const void*, size_t) {}
#endif

}  // namespace emmy_sim
#pragma GCC visibility pop

// ---- the built-ins kernels see ---------------------------------------------
#define threadIdx (::emmy_sim::me().index)
#define blockIdx (::emmy_sim::launch_state.block_index)
#define blockDim (::emmy_sim::launch_state.block)
#define gridDim (::emmy_sim::launch_state.grid)
static constexpr int warpSize = 32;

#define __syncthreads() ::emmy_sim::syncthreads(__LINE__)
#define __syncwarp(...) ((void)::emmy_sim::vote(::emmy_sim::Collective::syncwarp, "__syncwarp", __LINE__, \
                                                 EMMY_SIM_MASK_OR_ALL(__VA_ARGS__), 0))
#define EMMY_SIM_MASK_OR_ALL(...) (0xffffffffu __VA_OPT__(& (__VA_ARGS__)))
#define __shfl_sync(mask, v, lane, ...) ::emmy_sim::shuffle(::emmy_sim::Collective::shfl_idx, "__shfl_sync", \
    __LINE__, mask, v, lane, EMMY_SIM_WIDTH(__VA_ARGS__))
#define __shfl_up_sync(mask, v, d, ...) ::emmy_sim::shuffle(::emmy_sim::Collective::shfl_up, "__shfl_up_sync", \
    __LINE__, mask, v, d, EMMY_SIM_WIDTH(__VA_ARGS__))
#define __shfl_down_sync(mask, v, d, ...) ::emmy_sim::shuffle(::emmy_sim::Collective::shfl_down, \
    "__shfl_down_sync", __LINE__, mask, v, d, EMMY_SIM_WIDTH(__VA_ARGS__))
#define __shfl_xor_sync(mask, v, m, ...) ::emmy_sim::shuffle(::emmy_sim::Collective::shfl_xor, \
    "__shfl_xor_sync", __LINE__, mask, v, m, EMMY_SIM_WIDTH(__VA_ARGS__))
#define EMMY_SIM_WIDTH(...) (32 __VA_OPT__(* 0 + (__VA_ARGS__)))
#define __ballot_sync(mask, p) ::emmy_sim::vote(::emmy_sim::Collective::ballot, "__ballot_sync", __LINE__, mask, p)
#define __all_sync(mask, p) int(::emmy_sim::vote(::emmy_sim::Collective::all, "__all_sync", __LINE__, mask, p))
#define __any_sync(mask, p) int(::emmy_sim::vote(::emmy_sim::Collective::any, "__any_sync", __LINE__, mask, p))
#define __activemask() ::emmy_sim::active_lanes()
#define __threadfence() ((void)0)
#define __threadfence_block() ((void)0)

// Atomics: one fiber runs at a time, so a plain read-modify-write is atomic. They are not
// race-checked (atomics do not race) but are counted: a read and a write of the element.
#define EMMY_SIM_RMW(p) ::emmy_sim::count_atomic(p, sizeof(T))
template <class T> EMMY_SIM_INLINE T atomicAdd(T* p, T v) { EMMY_SIM_RMW(p); T old = *p; *p = old + v; return old; }
template <class T> EMMY_SIM_INLINE T atomicSub(T* p, T v) { EMMY_SIM_RMW(p); T old = *p; *p = old - v; return old; }
template <class T> EMMY_SIM_INLINE T atomicMax(T* p, T v) { EMMY_SIM_RMW(p); T old = *p; *p = old < v ? v : old; return old; }
template <class T> EMMY_SIM_INLINE T atomicMin(T* p, T v) { EMMY_SIM_RMW(p); T old = *p; *p = v < old ? v : old; return old; }
template <class T> EMMY_SIM_INLINE T atomicExch(T* p, T v) { EMMY_SIM_RMW(p); T old = *p; *p = v; return old; }
template <class T> EMMY_SIM_INLINE T atomicCAS(T* p, T compare, T v) { EMMY_SIM_RMW(p); T old = *p; if (old == compare) *p = v; return old; }
template <class T> EMMY_SIM_INLINE T atomicOr(T* p, T v) { EMMY_SIM_RMW(p); T old = *p; *p = old | v; return old; }
template <class T> EMMY_SIM_INLINE T atomicAnd(T* p, T v) { EMMY_SIM_RMW(p); T old = *p; *p = old & v; return old; }
#undef EMMY_SIM_RMW

#pragma GCC visibility push(hidden)
namespace emmy_sim {

template <class... A, size_t... I>
EMMY_SIM_INLINE void call_kernel(void (*kernel)(A...), void** argv, std::index_sequence<I...>) {
  kernel(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(argv[I])...);
}

// argv[i] points at the i-th argument's value (a pointer for an array). The kernel's call is the
// closure the (untyped) launch runs as every thread.
template <class... A>
EMMY_SIM_INLINE int launch_kernel(void (*kernel)(A...), const unsigned* grid, const unsigned* block,
                                  unsigned long shared_bytes, void** argv) {
  struct Call { void (*kernel)(A...); void** argv; } call{kernel, argv};
  auto invoke = [](void* closure) {
    const Call& c = *static_cast<const Call*>(closure);
    call_kernel(c.kernel, c.argv, std::index_sequence_for<A...>{});
  };
  return launch(grid, block, shared_bytes, invoke, &call);
}

}  // namespace emmy_sim
#pragma GCC visibility pop

#define EMMY_SIM_DYNAMIC_SHARED(type, name) \
  alignas(128) thread_local type name[::emmy_sim::dynamic_shared_capacity / sizeof(type)]; \
  static ::emmy_sim::RegisterDynamic emmy_sim_register_##name(name);

#define EMMY_SIM_EXPORT(kernel) \
  extern "C" int emmy_sim_launch_##kernel(const unsigned* grid, const unsigned* block, unsigned long shared_bytes, \
                                          void** argv) { \
    return ::emmy_sim::launch_kernel(kernel, grid, block, shared_bytes, argv); \
  }

#endif  // EMMY_SIM_H_INCLUDED

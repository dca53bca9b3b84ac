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
// runtime: this header defines the __tsan_* hooks, so every load and store the
// kernel makes comes here, and two threads touching one address between
// barriers, one of them writing, is a reported race).
// A macro guard, not #pragma once: builds take this header precompiled, with a copy of it beside
// the .gch (emmy/sim/build.py), which #pragma once would take for another file.
#ifndef EMMY_SIM_H_INCLUDED
#define EMMY_SIM_H_INCLUDED

#include <ucontext.h>

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

#if defined(__SANITIZE_ADDRESS__)
#include <dlfcn.h>
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

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

namespace emmy_sim {

// ---- fiber contexts --------------------------------------------------------
// A fiber switch happens at every barrier, shuffle and thread start. glibc's swapcontext makes two
// system calls a switch (the signal mask, which fibers never change) and saves the whole FPU
// state: three quarters of a simulator run went there. On x86-64 a switch saves what the calling
// convention says a callee keeps (rbx, rbp, r12-r15, the MXCSR and x87 control words) on the
// fiber's own stack and swaps stack pointers; other machines keep ucontext.
#if defined(__x86_64__)
struct Context { void* sp = nullptr; };

// switch_stacks(&from->sp, to->sp): the layout it pushes, from the saved stack pointer upward, is
// [MXCSR, x87 control word] [r15] [r14] [r13] [r12] [rbx] [rbp] [return address].
__attribute__((naked, noinline)) static void switch_stacks(void** /*save*/, void* /*resume*/) {
  __asm__ volatile(
      "pushq %rbp\n\tpushq %rbx\n\tpushq %r12\n\tpushq %r13\n\tpushq %r14\n\tpushq %r15\n\t"
      "subq $8, %rsp\n\tstmxcsr (%rsp)\n\tfnstcw 4(%rsp)\n\t"
      "movq %rsp, (%rdi)\n\tmovq %rsi, %rsp\n\t"
      "ldmxcsr (%rsp)\n\tfldcw 4(%rsp)\n\taddq $8, %rsp\n\t"
      "popq %r15\n\tpopq %r14\n\tpopq %r13\n\tpopq %r12\n\tpopq %rbx\n\tpopq %rbp\n\tret\n\t");
}

EMMY_SIM_INTERNAL inline void switch_context(Context* from, const Context* to) { switch_stacks(&from->sp, to->sp); }

// A context that, switched to, calls `entry` on `stack` (which `entry` must never return from):
// the frame switch_stacks pops, with the current control words and `entry` as its return address,
// placed so that `entry` starts with the stack aligned as after a call.
EMMY_SIM_INTERNAL inline void start_context(Context* c, char* stack, size_t bytes, void (*entry)()) {
  const uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + bytes) & ~uintptr_t(15);
  uint64_t* frame = reinterpret_cast<uint64_t*>(top - 72);
  uint32_t mxcsr = 0;
  uint16_t control = 0;
  __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
  __asm__ volatile("fnstcw %0" : "=m"(control));
  frame[0] = mxcsr | uint64_t(control) << 32;
  for (int i = 1; i <= 6; ++i) frame[i] = 0;  // r15 .. rbp: a zero frame pointer ends backtraces
  frame[7] = reinterpret_cast<uint64_t>(entry);
  frame[8] = 0;  // entry's return address: none
  c->sp = frame;
}
#else
using Context = ucontext_t;

EMMY_SIM_INTERNAL inline void start_context(Context* c, char* stack, size_t bytes, void (*entry)()) {
  getcontext(c);
  c->uc_stack.ss_sp = stack;
  c->uc_stack.ss_size = bytes;
  c->uc_link = nullptr;
  makecontext(c, entry, 0);
}
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
#if defined(__SANITIZE_ADDRESS__)
  void* fake_stack = nullptr;
  const void* scheduler_stack = nullptr;
  size_t scheduler_stack_size = 0;
#endif
};

inline Launch launch_state;

// While set, memory accesses are the simulator's bookkeeping, not the kernel's: the race check
// ignores them. Set and cleared only from uninstrumented functions (EMMY_SIM_INTERNAL).
inline bool muted = false;
EMMY_SIM_INTERNAL inline void mute(bool on) { muted = on; }

EMMY_SIM_INLINE Thread& me() { return *launch_state.current; }

// Dynamic shared memory (`extern __shared__ T name[]`): the launcher defines
// each such array with EMMY_SIM_DYNAMIC_SHARED, which registers it here so
// that every block starts with it filled with 0xff bytes (NaN floats), as a
// reminder that shared memory starts undefined.
constexpr size_t dynamic_shared_capacity = 232448;  // the largest opt-in per block (sm_90, sm_120)
struct DynamicShared { void* base; };
inline std::vector<DynamicShared>& dynamic_arrays() { static std::vector<DynamicShared> arrays; return arrays; }
inline size_t dynamic_bytes = 0;

// A parked block's dynamic shared memory, to give back when it resumes.
inline std::vector<std::vector<char>> saved_dynamic_shared() {
  std::vector<std::vector<char>> saved;
  for (DynamicShared& d : dynamic_arrays())
    saved.emplace_back(static_cast<char*>(d.base), static_cast<char*>(d.base) + dynamic_bytes);
  return saved;
}

EMMY_SIM_INTERNAL inline void fail(const std::string& message) {
  if (launch_state.error.empty()) launch_state.error = message;
}

// A fiber switch. Off x86-64, under ASan, libc's own swapcontext: ASan's interceptor clears the
// shadow of the whole target stack on every switch (64 KB of shadow for a 512 KB fiber stack, at
// every barrier and shuffle), which made ASan runs fifty times slower than plain ones. Either way
// the switches are announced with __sanitizer_*_switch_fiber, and a fiber's frames unpoison
// themselves as they return; the launch clears the stacks' shadow once, for fibers a fault left
// unfinished.
#if !defined(__x86_64__)
#if defined(__SANITIZE_ADDRESS__)
EMMY_SIM_INTERNAL inline void switch_context(Context* from, const Context* to) {
  using Swap = int (*)(ucontext_t*, const ucontext_t*);
  static const Swap libc_swap = [] {
    void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    void* found = libc ? dlsym(libc, "swapcontext") : nullptr;
    return found ? reinterpret_cast<Swap>(found) : &swapcontext;
  }();
  libc_swap(from, to);
}
#else
EMMY_SIM_INTERNAL inline void switch_context(Context* from, const Context* to) { swapcontext(from, to); }
#endif
#endif

EMMY_SIM_INTERNAL inline void switch_to_scheduler() {
  Launch& L = launch_state;
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_start_switch_fiber(&L.fake_stack, L.scheduler_stack, L.scheduler_stack_size);
#endif
  switch_context(&L.current->context, &L.scheduler);
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_finish_switch_fiber(L.fake_stack, nullptr, nullptr);
#endif
}

EMMY_SIM_INTERNAL inline void wait_here(State state, int line, const char* what) {
  Thread& t = me();
  t.state = state;
  t.line = line;
  t.what = what;
  switch_to_scheduler();
}

EMMY_SIM_INTERNAL inline void fiber_entry() {
  Launch& L = launch_state;
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_finish_switch_fiber(nullptr, &L.scheduler_stack, &L.scheduler_stack_size);
#endif
  L.invoke(L.closure);
  L.current->state = State::done;
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_start_switch_fiber(nullptr, L.scheduler_stack, L.scheduler_stack_size);
#endif
  switch_context(&L.current->context, &L.scheduler);
}

inline std::string thread_list(const std::vector<unsigned>& ids) {
  // "0-15, 17": ranges of linear thread indices
  std::string text;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    if (!text.empty()) text += ", ";
    text += std::to_string(ids[i]);
    if (j > i) text += "-" + std::to_string(ids[j]);
    i = j + 1;
  }
  return text;
}

inline std::string where(const Launch& L) {
  return "block (" + std::to_string(L.block_index.x) + "," + std::to_string(L.block_index.y) + "," +
         std::to_string(L.block_index.z) + ")";
}

// Complete warp collectives: every lane its mask names waits at the same kind
// of collective with the same mask. Returns whether any was resolved.
EMMY_SIM_INTERNAL inline bool resolve_warps() {
  Launch& L = launch_state;
  bool any = false;
  const size_t n = L.threads.size();
  for (size_t w = 0; w * 32 < n; ++w) {
    for (size_t i = w * 32; i < std::min(n, w * 32 + 32); ++i) {
      Thread& first = L.threads[i];
      if (first.state != State::warp) continue;
      bool complete = true;
      for (unsigned lane = 0; lane < 32; ++lane) {
        if (!(first.mask >> lane & 1u)) continue;
        size_t k = w * 32 + lane;
        if (k >= n || L.threads[k].state != State::warp || L.threads[k].mask != first.mask ||
            L.threads[k].kind != first.kind) {
          complete = false;
          break;
        }
      }
      if (!complete) continue;
      Thread* lanes[32] = {};
      for (unsigned lane = 0; lane < 32; ++lane)
        if (first.mask >> lane & 1u) lanes[lane] = &L.threads[w * 32 + lane];
      unsigned ballot = 0;
      for (unsigned lane = 0; lane < 32; ++lane)
        if (lanes[lane] && lanes[lane]->predicate) ballot |= 1u << lane;
      for (unsigned lane = 0; lane < 32; ++lane) {
        Thread* t = lanes[lane];
        if (!t) continue;
        int width = t->width, base = int(lane) & ~(width - 1), source = int(lane);
        switch (t->kind) {
          case Collective::shfl_idx: source = base + (t->arg & (width - 1)); break;
          case Collective::shfl_up: source = (int(lane) - base >= t->arg) ? int(lane) - t->arg : int(lane); break;
          case Collective::shfl_down: source = (int(lane) - base + t->arg < width) ? int(lane) + t->arg : int(lane); break;
          case Collective::shfl_xor: source = int(lane) ^ t->arg; if (source >= base + width || source < base) source = int(lane); break;
          default: break;
        }
        if (t->kind == Collective::shfl_idx || t->kind == Collective::shfl_up || t->kind == Collective::shfl_down ||
            t->kind == Collective::shfl_xor) {
          if (source < 0 || source > 31 || !lanes[source]) {
            fail(std::string(t->what) + " at line " + std::to_string(t->line) + " in " + where(L) + ": lane " +
                 std::to_string(lane) + " of warp " + std::to_string(w) + " reads lane " + std::to_string(source) +
                 ", which is not in the mask");
            return false;
          }
          std::memcpy(t->out, lanes[source]->in, sizeof t->out);
        }
        if (t->kind == Collective::ballot) std::memcpy(t->out, &ballot, 4);
        if (t->kind == Collective::all) { int v = (ballot & t->mask) == t->mask; std::memcpy(t->out, &v, 4); }
        if (t->kind == Collective::any) { int v = ballot != 0; std::memcpy(t->out, &v, 4); }
        t->state = State::runnable;
      }
      if (w < L.warp_epochs.size()) ++L.warp_epochs[w];
      any = true;
    }
  }
  return any;
}

EMMY_SIM_INTERNAL inline std::string waiting_report(const Launch& L) {
  // who waits where, grouped by (what, line); and who has exited
  std::vector<std::pair<std::string, std::vector<unsigned>>> groups;
  std::vector<unsigned> exited;
  for (const Thread& t : L.threads) {
    if (t.state == State::done) { exited.push_back(t.linear); continue; }
    std::string key = std::string(t.what) + " at line " + std::to_string(t.line);
    auto it = std::find_if(groups.begin(), groups.end(), [&](auto& g) { return g.first == key; });
    if (it == groups.end()) groups.push_back({key, {t.linear}});
    else it->second.push_back(t.linear);
  }
  std::string text;
  for (auto& g : groups) text += "; threads " + thread_list(g.second) + " wait at " + g.first;
  if (!exited.empty()) text += "; threads " + thread_list(exited) + " have exited";
  return text;
}

// All threads wait. Release the block barrier if every live thread is at the
// same __syncthreads; otherwise report why the block cannot go on.
EMMY_SIM_INTERNAL inline bool resolve_barrier() {
  Launch& L = launch_state;
  int line = -1;
  bool all_at_barrier = true, same_line = true, some_exited = false;
  for (const Thread& t : L.threads) {
    if (t.state == State::done) { some_exited = true; continue; }
    if (t.state != State::barrier) { all_at_barrier = false; continue; }
    if (line < 0) line = t.line;
    else if (t.line != line) same_line = false;
  }
  if (all_at_barrier && same_line && !some_exited) {
    for (Thread& t : L.threads) t.state = State::runnable;
    ++L.barrier_epoch;
    return true;
  }
  std::string why;
  if (all_at_barrier && !same_line)
    why = "__syncthreads in divergent code: the threads wait at different barriers";
  else if (all_at_barrier && some_exited)
    why = "__syncthreads reached by only part of the block (a barrier in a divergent branch, or after an early return)";
  else
    why = "deadlock: a warp collective waits for lanes that never arrive";
  fail(why + " in " + where(L) + waiting_report(L));
  return false;
}

EMMY_SIM_INTERNAL inline void resume_block();

EMMY_SIM_INTERNAL inline void run_block() {
  Launch& L = launch_state;
  const unsigned n = L.block.x * L.block.y * L.block.z;
  for (unsigned i = 0; i < n; ++i) {
    Thread& t = L.threads[i];
    t.linear = i;
    t.index = uint3{i % L.block.x, (i / L.block.x) % L.block.y, i / (L.block.x * L.block.y)};
    t.state = State::runnable;
    t.kind = Collective::none;
    t.pending.clear();
    t.group_ends.clear();
    // no shadow to clear: the last block's fibers returned through every instrumented frame, and
    // the launch cleared the pool's shadow before its first block (64 KB of shadow a fiber, at
    // every block, was a seventh of an ASan run)
    start_context(&t.context, t.stack, L.stack_bytes, fiber_entry);
  }
  resume_block();
}

// Run the current block's threads until they end, fail, or all wait at a grid barrier (parked).
EMMY_SIM_INTERNAL inline void resume_block() {
  Launch& L = launch_state;
  L.parked = false;
  for (;;) {
    bool live = false, worked = false;
    const unsigned long events = L.events;
    for (Thread& t : L.threads) {
      if (t.state == State::runnable || t.state == State::polling) {
        worked = worked || t.state == State::runnable;
        t.state = State::runnable;
        L.current = &t;
#if defined(__SANITIZE_ADDRESS__)
        __sanitizer_start_switch_fiber(&L.fake_stack, t.stack, L.stack_bytes);
#endif
        switch_context(&L.scheduler, &t.context);
#if defined(__SANITIZE_ADDRESS__)
        __sanitizer_finish_switch_fiber(L.fake_stack, nullptr, nullptr);
#endif
        L.current = nullptr;
        if (!L.error.empty()) return;
      }
      if (t.state != State::done) live = true;
    }
    if (!live) return;
    if (resolve_warps()) continue;
    bool at_grid = false, all_at_grid = true;
    for (const Thread& t : L.threads) {
      at_grid = at_grid || t.state == State::grid;
      all_at_grid = all_at_grid && (t.state == State::grid || t.state == State::done);
    }
    if (at_grid) {
      bool exited = false;
      for (const Thread& t : L.threads) exited = exited || t.state == State::done;
      if (all_at_grid && !exited) { L.parked = true; return; }
      fail(std::string(exited ? "a grid barrier reached by only part of the block (after an early return)"
                              : "deadlock: threads wait at a grid barrier while others wait elsewhere") +
           " in " + where(L) + waiting_report(L));
      return;
    }
    bool polling = false;
    for (const Thread& t : L.threads) polling = polling || t.state == State::polling;
    if (polling && (worked || L.events != events)) continue;  // someone moved: poll again
    if (polling) {
      fail("deadlock: a wait on an mbarrier never completes in " + where(L) + waiting_report(L));
      return;
    }
    if (!L.error.empty() || !resolve_barrier()) return;
  }
}

// The current block's threads on a new stack pool (the old one is freed, unless a parked block
// took it: then L.stacks is null).
EMMY_SIM_INTERNAL inline void fresh_pool(unsigned n) {
  Launch& L = launch_state;
  std::free(L.stacks);
  L.stacks = static_cast<char*>(std::malloc(L.stack_pool_bytes));
  L.threads.assign(n, Thread{});
  for (unsigned i = 0; i < n; ++i) L.threads[i].stack = L.stacks + i * L.stack_bytes;
}

EMMY_SIM_INTERNAL inline int grid_unmet(uint3 waiting, uint3 ended) {
  auto text = [](uint3 b) {
    return "(" + std::to_string(b.x) + "," + std::to_string(b.y) + "," + std::to_string(b.z) + ")";
  };
  fail("a grid barrier reached by only part of the grid: block " + text(waiting) + " waits at it while block " +
       text(ended) + " ended without reaching it");
  return 1;
}

// Frees the stacks of blocks left waiting (a fault, or a barrier some blocks never reach).
EMMY_SIM_INTERNAL inline int release_parked(int rc) {
  Launch& L = launch_state;
  for (Launch::Parked& p : L.waiting) {
#if defined(__SANITIZE_ADDRESS__)
    __asan_unpoison_memory_region(p.stacks, L.stack_pool_bytes);
#endif
    std::free(p.stacks);
  }
  L.waiting.clear();
  return rc;
}

template <class F>
EMMY_SIM_INTERNAL int launch(dim3 grid, dim3 block, F&& body) {
  Launch& L = launch_state;
  L.error.clear();
  const unsigned n = block.x * block.y * block.z;
  if (n == 0 || n > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0) {
    L.error = "bad launch: block of " + std::to_string(n) + " threads (1 to 1024) and grid " +
              std::to_string(grid.x) + "x" + std::to_string(grid.y) + "x" + std::to_string(grid.z);
    return 1;
  }
  L.grid = grid;
  L.block = block;
#if defined(__SANITIZE_ADDRESS__)
  L.stack_bytes = 512 * 1024;
#else
  L.stack_bytes = 128 * 1024;
#endif
  L.stack_pool_bytes = n * L.stack_bytes;
  if (L.threads.size() != n) fresh_pool(n);
#if defined(__SANITIZE_ADDRESS__)
  __asan_unpoison_memory_region(L.stacks, L.stack_pool_bytes);
#endif
  L.warp_epochs.assign((n + 31) / 32, 0);
  auto invoke = [](void* closure) { (*static_cast<std::remove_reference_t<F>*>(closure))(); };
  L.invoke = invoke;
  L.closure = &body;
  const unsigned long blocks = (unsigned long)grid.x * grid.y * grid.z;
  bool ended_early = false;  // a block ended before any waited at a grid barrier
  uint3 first_ended{};
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        L.block_index = uint3{x, y, z};
        for (DynamicShared& d : dynamic_arrays()) std::memset(d.base, 0xff, dynamic_bytes);
        ++L.barrier_epoch;  // nothing of the last block races with this one
        run_block();
        if (!L.error.empty()) return release_parked(1);
        if (L.parked) {  // it keeps its fibers; the next block gets stacks of its own
          L.waiting.push_back({L.block_index, std::move(L.threads), L.stacks, saved_dynamic_shared()});
          L.stacks = nullptr;
          fresh_pool(n);
        } else if (!L.waiting.empty()) {
          return release_parked(grid_unmet(L.waiting.front().block_index, L.block_index));
        } else if (!ended_early) {
          ended_early = true;
          first_ended = L.block_index;
        }
      }
  while (!L.waiting.empty()) {  // every block waits at the grid barrier: release them all
    if (L.waiting.size() != blocks) return release_parked(grid_unmet(L.waiting.front().block_index, first_ended));
    std::vector<Launch::Parked> round = std::move(L.waiting);
    L.waiting.clear();
    ++L.barrier_epoch;
    bool some_ended = false;
    uint3 ended{};
    for (size_t b = 0; b < round.size(); ++b) {
      std::swap(L.threads, round[b].threads);
      std::swap(L.stacks, round[b].stacks);
      L.block_index = round[b].block_index;
      for (size_t i = 0; i < dynamic_arrays().size(); ++i)
        std::memcpy(dynamic_arrays()[i].base, round[b].shared[i].data(), dynamic_bytes);
      for (Thread& t : L.threads) if (t.state == State::grid) t.state = State::runnable;
      resume_block();
      std::swap(L.threads, round[b].threads);
      std::swap(L.stacks, round[b].stacks);
      if (!L.error.empty()) {
        for (size_t r = b; r < round.size(); ++r) L.waiting.push_back(std::move(round[r]));
        return release_parked(1);
      }
      if (L.parked) {
        round[b].shared = saved_dynamic_shared();
        L.waiting.push_back(std::move(round[b]));
      }
      else { if (!some_ended) ended = round[b].block_index; some_ended = true; std::free(round[b].stacks); }
    }
    if (some_ended && !L.waiting.empty()) return release_parked(grid_unmet(L.waiting.front().block_index, ended));
  }
  return 0;
}

// ---- warp collectives -----------------------------------------------------
template <class T>
EMMY_SIM_INLINE T shuffle(Collective kind, const char* what, int line, unsigned mask, T value, int arg, int width) {
  static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
  Thread& t = me();
  if (width < 1 || width > 32 || (width & (width - 1))) {
    fail(std::string(what) + " at line " + std::to_string(line) + ": width " + std::to_string(width) +
         " is not a power of two from 1 to 32");
  }
  if (!(mask >> (t.linear % 32) & 1u)) {
    fail(std::string(what) + " at line " + std::to_string(line) + ": thread " + std::to_string(t.linear) +
         " calls it with a mask that leaves its own lane out");
  }
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

EMMY_SIM_INLINE unsigned vote(Collective kind, const char* what, int line, unsigned mask, int predicate) {
  Thread& t = me();
  t.kind = kind;
  t.mask = mask;
  t.predicate = predicate != 0;
  t.width = 32;
  wait_here(State::warp, line, what);
  unsigned result;
  std::memcpy(&result, t.out, 4);
  return result;
}

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

inline void count_copy(const void* source, size_t bytes);  // race-check builds count what a copy reads
// race-check builds: a cp.async copy's shared-memory write, seen as made both when it is issued and
// when its wait returns (on a GPU it lands any time between), so a copy into a buffer that other
// threads still read, or read before the wait and a barrier, is a reported race
inline void note_copy_write(void* dst, size_t bytes, const void* pc);

EMMY_SIM_INTERNAL inline void issue_copy(void* dst, const void* src, unsigned bytes, unsigned source_bytes) {
  note_copy_write(dst, bytes, __builtin_return_address(0));
  mute(true);
  me().pending.push_back({dst, src, bytes, source_bytes});
  mute(false);
}

EMMY_SIM_INTERNAL inline void commit_copies() {
  mute(true);
  me().group_ends.push_back(me().pending.size());
  mute(false);
}

// cp.async groups: complete every copy but those of the `keep` most recent committed groups.
EMMY_SIM_INTERNAL inline void complete_copies(Thread& t, size_t keep) {
  const size_t groups = t.group_ends.size();
  if (groups <= keep) return;
  const size_t done = t.group_ends[groups - 1 - keep];  // copies in the groups that must be complete
  for (size_t i = 0; i < done; ++i) note_copy_write(t.pending[i].dst, t.pending[i].bytes, __builtin_return_address(0));
  mute(true);
  for (size_t i = 0; i < done; ++i) {
    const Thread::AsyncCopy& c = t.pending[i];
    const unsigned read = c.source_bytes < c.bytes ? c.source_bytes : c.bytes;
    std::memcpy(c.dst, c.src, read);
    count_copy(c.src, read);
    std::memset(static_cast<char*>(c.dst) + read, 0, c.bytes - read);  // the zero-filled rest
  }
  t.pending.erase(t.pending.begin(), t.pending.begin() + long(done));
  t.group_ends.erase(t.group_ends.begin(), t.group_ends.begin() + long(groups - keep));
  for (size_t& end : t.group_ends) end -= done;
  mute(false);
}

// A polling thread (an mbarrier wait that is not complete yet) lets the others run.
EMMY_SIM_INLINE void poll(int line, const char* what) { wait_here(State::polling, line, what); }
EMMY_SIM_INLINE void event() { ++launch_state.events; }

EMMY_SIM_INLINE unsigned active_lanes() {
  // the lanes of this thread's warp that have not exited (fibers run one at a time, so this is the best
  // approximation of "converged" there is)
  Thread& t = me();
  unsigned mask = 0, base = t.linear & ~31u;
  for (unsigned lane = 0; lane < 32 && base + lane < launch_state.threads.size(); ++lane)
    if (launch_state.threads[base + lane].state != State::done) mask |= 1u << lane;
  return mask;
}

// ---- race check (EMMY_SIM_RACECHECK) ----------------------------------------
struct Access { unsigned long epoch = ~0ul; unsigned thread = 0; unsigned warp_epoch = 0; const void* pc = nullptr; };
struct Cell { Access write; Access read[2]; };

struct Race {
  bool found = false;
  const void* pc[2] = {};
  unsigned thread[2] = {};
  bool write[2] = {};
  uintptr_t address = 0;
  uint3 block{0, 0, 0};
};
inline Race first_race;

}  // namespace emmy_sim

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
namespace emmy_sim { inline void count_atomic(const void* address, size_t size); }
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

namespace emmy_sim {

template <class... A, size_t... I>
EMMY_SIM_INLINE void call_kernel(void (*kernel)(A...), void** argv, std::index_sequence<I...>) {
  kernel(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(argv[I])...);
}

// argv[i] points at the i-th argument's value (a pointer for an array).
template <class... A>
EMMY_SIM_INTERNAL int launch_kernel(void (*kernel)(A...), const unsigned* grid, const unsigned* block,
                                    unsigned long shared_bytes, void** argv) {
  if (shared_bytes > dynamic_shared_capacity) {
    launch_state.error = "bad launch: " + std::to_string(shared_bytes) + " bytes of dynamic shared memory (at most " +
                         std::to_string(dynamic_shared_capacity) + ")";
    return 1;
  }
  dynamic_bytes = shared_bytes;
  auto body = [&] { call_kernel(kernel, argv, std::index_sequence_for<A...>{}); };
  return launch(dim3(grid[0], grid[1], grid[2]), dim3(block[0], block[1], block[2]), body);
}

struct RegisterDynamic {
  explicit RegisterDynamic(void* base) { dynamic_arrays().push_back(DynamicShared{base}); }
};

}  // namespace emmy_sim

#define EMMY_SIM_DYNAMIC_SHARED(type, name) \
  alignas(128) thread_local type name[::emmy_sim::dynamic_shared_capacity / sizeof(type)]; \
  static ::emmy_sim::RegisterDynamic emmy_sim_register_##name(name);

#define EMMY_SIM_EXPORT(kernel) \
  extern "C" int emmy_sim_launch_##kernel(const unsigned* grid, const unsigned* block, unsigned long shared_bytes, \
                                          void** argv) { \
    return ::emmy_sim::launch_kernel(kernel, grid, block, shared_bytes, argv); \
  }

extern "C" EMMY_SIM_INTERNAL const char* emmy_sim_error() { return ::emmy_sim::launch_state.error.c_str(); }

#if defined(EMMY_SIM_RACECHECK)
#include <dlfcn.h>

#include <unordered_map>
namespace emmy_sim {

inline std::unordered_map<uintptr_t, Cell>& cells() { static std::unordered_map<uintptr_t, Cell> map; return map; }

EMMY_SIM_INTERNAL inline void note_race(const Access& other, bool other_wrote, const Thread& t, bool wrote,
                                        uintptr_t address, const void* pc) {
  Race& r = first_race;
  if (r.found) return;
  r.found = true;
  r.pc[0] = other.pc; r.thread[0] = other.thread; r.write[0] = other_wrote;
  r.pc[1] = pc; r.thread[1] = t.linear; r.write[1] = wrote;
  r.address = address;
  r.block = launch_state.block_index;
}

// One access of `size` bytes by the running thread. Accesses to fiber stacks
// (locals) are private; anything else two threads touch between two barriers,
// with a write among them, is a race unless both are lanes of one warp with a
// warp sync between them.
EMMY_SIM_INTERNAL inline void check_access(Launch& L, const void* address, size_t size, bool write, const void* pc);

// Global buffers whose accesses are counted (emmy_sim_count_reset): bytes read and written by the
// kernel's threads, before any cache, as the cost model predicts them.
struct Counted {
  uintptr_t lo, hi;
  unsigned long long read, written;
};
inline std::vector<Counted>& counted() { static std::vector<Counted> ranges; return ranges; }

EMMY_SIM_INTERNAL inline void count_access(uintptr_t a, size_t size, bool write) {
  for (Counted& c : counted())
    if (a >= c.lo && a < c.hi) { (write ? c.written : c.read) += size; return; }
}

// An atomic read-modify-write, counted as a read and a write.
inline void count_atomic(const void* address, size_t size) {
  count_access(reinterpret_cast<uintptr_t>(address), size, false);
  count_access(reinterpret_cast<uintptr_t>(address), size, true);
}

// A cp.async copy's global read (counted when it completes: the same bytes).
inline void count_copy(const void* source, size_t bytes) {
  count_access(reinterpret_cast<uintptr_t>(source), bytes, false);
}

EMMY_SIM_INTERNAL inline void access(const void* address, size_t size, bool write, const void* pc);
EMMY_SIM_INTERNAL inline void note_copy_write(void* dst, size_t bytes, const void* pc) { access(dst, bytes, true, pc); }

EMMY_SIM_INTERNAL inline void access(const void* address, size_t size, bool write, const void* pc) {
  Launch& L = launch_state;
  if (!L.current || muted) return;
  muted = true;  // the library code the check itself calls is instrumented too
  count_access(reinterpret_cast<uintptr_t>(address), size, write);
  check_access(L, address, size, write, pc);
  muted = false;
}

EMMY_SIM_INTERNAL inline void check_access(Launch& L, const void* address, size_t size, bool write, const void* pc) {
  uintptr_t a = reinterpret_cast<uintptr_t>(address);
  if (a >= reinterpret_cast<uintptr_t>(L.stacks) && a < reinterpret_cast<uintptr_t>(L.stacks) + L.stack_pool_bytes) return;
  const Thread& t = *L.current;
  const unsigned warp = t.linear / 32, warp_epoch = L.warp_epochs[warp];
  const Access mine{L.barrier_epoch, t.linear, warp_epoch, pc};
  auto conflicts = [&](const Access& other) {
    return other.epoch == L.barrier_epoch && other.thread != t.linear &&
           !(other.thread / 32 == warp && other.warp_epoch != warp_epoch);
  };
  for (size_t i = 0; i < size; ++i) {
    Cell& c = cells()[a + i];
    if (conflicts(c.write)) note_race(c.write, true, t, write, a + i, pc);
    if (write) {
      for (const Access& r : c.read)
        if (conflicts(r)) note_race(r, false, t, true, a + i, pc);
      c.write = mine;
    } else if (c.read[0].epoch != L.barrier_epoch || c.read[0].thread == t.linear) {
      c.read[0] = mine;
    } else {
      c.read[1] = mine;
    }
  }
}

}  // namespace emmy_sim

extern "C" {
// pc's offset in this shared object, for addr2line
EMMY_SIM_INTERNAL unsigned long emmy_sim_module_offset(const void* pc) {
  Dl_info info;
  return dladdr(pc, &info) ? static_cast<unsigned long>(static_cast<const char*>(pc) -
                                                        static_cast<const char*>(info.dli_fbase)) : 0ul;
}
EMMY_SIM_INTERNAL void emmy_sim_race_reset() { ::emmy_sim::first_race = {}; ::emmy_sim::cells().clear(); }
// count the next launches' accesses to these n buffers (base address, bytes), from zero
EMMY_SIM_INTERNAL void emmy_sim_count_reset(const void* const* bases, const unsigned long* bytes, int n) {
  auto& ranges = ::emmy_sim::counted();
  ranges.clear();
  for (int i = 0; i < n; ++i) {
    const uintptr_t lo = reinterpret_cast<uintptr_t>(bases[i]);
    ranges.push_back({lo, lo + bytes[i], 0, 0});
  }
}
// bytes read and written in each buffer since emmy_sim_count_reset
EMMY_SIM_INTERNAL void emmy_sim_counts(unsigned long long* read, unsigned long long* written) {
  const auto& ranges = ::emmy_sim::counted();
  for (size_t i = 0; i < ranges.size(); ++i) { read[i] = ranges[i].read; written[i] = ranges[i].written; }
}
// found, then (pc, thread, wrote) of the earlier and the later access, the address and the block
EMMY_SIM_INTERNAL int emmy_sim_race(const void** pcs, unsigned* threads, int* wrote, unsigned* block,
                                     uintptr_t* address) {
  const ::emmy_sim::Race& r = ::emmy_sim::first_race;
  *address = r.address;
  for (int i = 0; i < 2; ++i) { pcs[i] = r.pc[i]; threads[i] = r.thread[i]; wrote[i] = r.write[i]; }
  block[0] = r.block.x; block[1] = r.block.y; block[2] = r.block.z;
  return r.found;
}
#define EMMY_SIM_HOOK(n) \
  EMMY_SIM_INTERNAL void __tsan_read##n(void* p) { ::emmy_sim::access(p, n, false, __builtin_return_address(0)); } \
  EMMY_SIM_INTERNAL void __tsan_write##n(void* p) { ::emmy_sim::access(p, n, true, __builtin_return_address(0)); } \
  EMMY_SIM_INTERNAL void __tsan_unaligned_read##n(void* p) { ::emmy_sim::access(p, n, false, __builtin_return_address(0)); } \
  EMMY_SIM_INTERNAL void __tsan_unaligned_write##n(void* p) { ::emmy_sim::access(p, n, true, __builtin_return_address(0)); } \
  EMMY_SIM_INTERNAL void __tsan_volatile_read##n(void* p) { ::emmy_sim::access(p, n, false, __builtin_return_address(0)); } \
  EMMY_SIM_INTERNAL void __tsan_volatile_write##n(void* p) { ::emmy_sim::access(p, n, true, __builtin_return_address(0)); }
EMMY_SIM_HOOK(1)
EMMY_SIM_HOOK(2)
EMMY_SIM_HOOK(4)
EMMY_SIM_HOOK(8)
EMMY_SIM_HOOK(16)
EMMY_SIM_INTERNAL void __tsan_read_range(void* p, unsigned long n) { ::emmy_sim::access(p, n, false, __builtin_return_address(0)); }
EMMY_SIM_INTERNAL void __tsan_write_range(void* p, unsigned long n) { ::emmy_sim::access(p, n, true, __builtin_return_address(0)); }
// Atomic operations (static-local guards, atomics in the kernel) are never races: done plainly, as
// one fiber runs at a time.
#define EMMY_SIM_ATOMIC(n, T) \
  EMMY_SIM_INTERNAL T __tsan_atomic##n##_load(const volatile T* a, int) { return *a; } \
  EMMY_SIM_INTERNAL void __tsan_atomic##n##_store(volatile T* a, T v, int) { *a = v; } \
  EMMY_SIM_INTERNAL T __tsan_atomic##n##_exchange(volatile T* a, T v, int) { T o = *a; *a = v; return o; } \
  EMMY_SIM_INTERNAL T __tsan_atomic##n##_fetch_add(volatile T* a, T v, int) { T o = *a; *a = o + v; return o; } \
  EMMY_SIM_INTERNAL T __tsan_atomic##n##_fetch_sub(volatile T* a, T v, int) { T o = *a; *a = o - v; return o; } \
  EMMY_SIM_INTERNAL T __tsan_atomic##n##_fetch_and(volatile T* a, T v, int) { T o = *a; *a = o & v; return o; } \
  EMMY_SIM_INTERNAL T __tsan_atomic##n##_fetch_or(volatile T* a, T v, int) { T o = *a; *a = o | v; return o; } \
  EMMY_SIM_INTERNAL T __tsan_atomic##n##_fetch_xor(volatile T* a, T v, int) { T o = *a; *a = o ^ v; return o; } \
  EMMY_SIM_INTERNAL int __tsan_atomic##n##_compare_exchange_strong(volatile T* a, T* c, T v, int, int) { \
    if (*a == *c) { *a = v; return 1; } *c = *a; return 0; } \
  EMMY_SIM_INTERNAL int __tsan_atomic##n##_compare_exchange_weak(volatile T* a, T* c, T v, int, int) { \
    if (*a == *c) { *a = v; return 1; } *c = *a; return 0; } \
  EMMY_SIM_INTERNAL T __tsan_atomic##n##_compare_exchange_val(volatile T* a, T c, T v, int, int) { \
    T o = *a; if (o == c) *a = v; return o; }
EMMY_SIM_ATOMIC(8, uint8_t)
EMMY_SIM_ATOMIC(16, uint16_t)
EMMY_SIM_ATOMIC(32, uint32_t)
EMMY_SIM_ATOMIC(64, uint64_t)
EMMY_SIM_INTERNAL void __tsan_atomic_thread_fence(int) {}
EMMY_SIM_INTERNAL void __tsan_atomic_signal_fence(int) {}
EMMY_SIM_INTERNAL void __tsan_init() {}
EMMY_SIM_INTERNAL void __tsan_func_entry(void*) {}
EMMY_SIM_INTERNAL void __tsan_func_exit() {}
EMMY_SIM_INTERNAL void __tsan_vptr_update(void**, void*) {}
EMMY_SIM_INTERNAL void __tsan_vptr_read(void**) {}
}
#else
namespace emmy_sim {
inline void count_atomic(const void*, size_t) {}  // only race-check builds count accesses
inline void count_copy(const void*, size_t) {}
inline void note_copy_write(void*, size_t, const void*) {}
}  // namespace emmy_sim
#endif  // EMMY_SIM_RACECHECK

#endif  // EMMY_SIM_H_INCLUDED

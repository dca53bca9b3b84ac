// emmy_sim_runtime.cpp: the simulator's scheduler (the fibers of a block, barriers, warp
// collectives, grid barriers), its fiber switch, the race check and the entry points the launcher
// calls. emmy/sim/build.py compiles it once per mode, with the flags kernels build with, and links
// it into every kernel's library; emmy_sim.h declares what kernels call.
#include "emmy_sim.h"

#include <dlfcn.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if defined(EMMY_SIM_RACECHECK)
#include <unordered_map>
#endif

#pragma GCC visibility push(hidden)
namespace emmy_sim {

Launch launch_state;

bool muted = false;
void mute(bool on) { muted = on; }

// ---- fiber contexts --------------------------------------------------------
// A fiber switch happens at every barrier, shuffle and thread start. glibc's swapcontext makes two
// system calls a switch (the signal mask, which fibers never change) and saves the whole FPU
// state: three quarters of a simulator run went there. On x86-64 a switch saves what the calling
// convention says a callee keeps (rbx, rbp, r12-r15, the MXCSR and x87 control words) on the
// fiber's own stack and swaps stack pointers; other machines keep ucontext.
#if defined(__x86_64__)
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

EMMY_SIM_INTERNAL static void switch_context(Context* from, const Context* to) { switch_stacks(&from->sp, to->sp); }

// A context that, switched to, calls `entry` on `stack` (which `entry` must never return from):
// the frame switch_stacks pops, with the current control words and `entry` as its return address,
// placed so that `entry` starts with the stack aligned as after a call.
EMMY_SIM_INTERNAL static void start_context(Context* c, char* stack, size_t bytes, void (*entry)()) {
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
EMMY_SIM_INTERNAL static void start_context(Context* c, char* stack, size_t bytes, void (*entry)()) {
  getcontext(c);
  c->uc_stack.ss_sp = stack;
  c->uc_stack.ss_size = bytes;
  c->uc_link = nullptr;
  makecontext(c, entry, 0);
}

// Under ASan, libc's own swapcontext: ASan's interceptor clears the shadow of the whole target
// stack on every switch (64 KB of shadow for a 512 KB fiber stack, at every barrier and shuffle),
// which made ASan runs fifty times slower than plain ones. Either way the switches are announced
// with __sanitizer_*_switch_fiber, and a fiber's frames unpoison themselves as they return; the
// launch clears the stacks' shadow once, for fibers a fault left unfinished.
#if defined(__SANITIZE_ADDRESS__)
EMMY_SIM_INTERNAL static void switch_context(Context* from, const Context* to) {
  using Swap = int (*)(ucontext_t*, const ucontext_t*);
  static const Swap libc_swap = [] {
    void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    void* found = libc ? dlsym(libc, "swapcontext") : nullptr;
    return found ? reinterpret_cast<Swap>(found) : &swapcontext;
  }();
  libc_swap(from, to);
}
#else
EMMY_SIM_INTERNAL static void switch_context(Context* from, const Context* to) { swapcontext(from, to); }
#endif
#endif

// ---- dynamic shared memory ---------------------------------------------------
struct DynamicShared { void* base; };
static std::vector<DynamicShared>& dynamic_arrays() { static std::vector<DynamicShared> arrays; return arrays; }
static size_t dynamic_bytes = 0;

void register_dynamic_shared(void* base) { dynamic_arrays().push_back(DynamicShared{base}); }

// A parked block's dynamic shared memory, to give back when it resumes.
static std::vector<std::vector<char>> saved_dynamic_shared() {
  std::vector<std::vector<char>> saved;
  for (DynamicShared& d : dynamic_arrays())
    saved.emplace_back(static_cast<char*>(d.base), static_cast<char*>(d.base) + dynamic_bytes);
  return saved;
}

EMMY_SIM_INTERNAL static void fail(const std::string& message) {
  if (launch_state.error.empty()) launch_state.error = message;
}

// A round of the scheduler runs every thread that may run (runnable, or polling an mbarrier) once,
// in linear order. A thread that stops (waits, or ends) hands over to the round's next thread
// itself, one fiber switch, not two through the scheduler; the round's last returns to the
// scheduler, as does any thread once the launch has failed.
EMMY_SIM_INTERNAL static Thread* next_in_round(size_t from) {
  Launch& L = launch_state;
  if (!L.error.empty()) return nullptr;
  for (size_t i = from; i < L.threads.size(); ++i)
    if (L.threads[i].state == State::runnable || L.threads[i].state == State::polling) return &L.threads[i];
  return nullptr;
}

// The scheduler's round: whether a runnable (not only polling) thread ran in it, and whether the
// running thread was entered from the scheduler (a fiber's first entry then records its stack).
static bool round_worked = false, entered_from_scheduler = false;
// What ASan is told at a switch: the scheduler's stack, and the fake stack of the side switched from.
static const void* scheduler_stack = nullptr;
static size_t scheduler_stack_size = 0;
[[maybe_unused]] static void* fake_stack = nullptr;

// A fiber switch, announced to ASan: `to` runs on `stack`.
EMMY_SIM_INTERNAL static void switch_fiber(Context* from, const Context* to, const void* stack, size_t bytes) {
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_start_switch_fiber(&fake_stack, stack, bytes);
#else
  (void)stack, (void)bytes;
#endif
  switch_context(from, to);
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
}

// Makes `next` the running thread (a polling one is runnable again) and switches `from` to it.
EMMY_SIM_INTERNAL static void run_next(Context* from, Thread* next) {
  Launch& L = launch_state;
  round_worked = round_worked || next->state == State::runnable;
  entered_from_scheduler = from == &L.scheduler;
  next->state = State::runnable;
  L.current = next;
  switch_fiber(from, &next->context, next->stack, L.stack_bytes);
}

// The running thread has stopped (its state says why): the round's next thread runs, else the scheduler.
// Muted meanwhile: the container code it calls is instrumented in race-check builds, and would be
// taken for the running thread's accesses.
EMMY_SIM_INTERNAL static void hand_over() {
  Launch& L = launch_state;
  muted = true;
  Thread* const me = L.current;
  if (Thread* next = next_in_round(size_t(me - L.threads.data()) + 1))
    run_next(&me->context, next);
  else
    switch_fiber(&me->context, &L.scheduler, scheduler_stack, scheduler_stack_size);
  muted = false;  // this thread runs again
}

void wait_here(State state, int line, const char* what) {
  Thread& t = me();
  t.state = state;
  t.line = line;
  t.what = what;
  hand_over();
}

// Never returns, so it keeps no locals in memory: ASan redzones around them would stay poisoned on
// the stack, where the thread's next block starts its frame.
EMMY_SIM_INTERNAL static void fiber_entry() {
  Launch& L = launch_state;
#if defined(__SANITIZE_ADDRESS__)
  // ASan says which stack this fiber was entered from: kept where that is the scheduler's
  if (entered_from_scheduler) __sanitizer_finish_switch_fiber(nullptr, &scheduler_stack, &scheduler_stack_size);
  else __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
  muted = false;  // handed over to: a fresh thread starts with its accesses seen
  L.invoke(L.closure);
  L.current->state = State::done;
  hand_over();  // never returns: nothing switches back to a finished fiber
}

static std::string thread_list(const std::vector<unsigned>& ids) {
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

static std::string where(const Launch& L) {
  return "block (" + std::to_string(L.block_index.x) + "," + std::to_string(L.block_index.y) + "," +
         std::to_string(L.block_index.z) + ")";
}
// Complete warp collectives: every lane its mask names waits at the same kind
// of collective with the same mask. Returns whether any was resolved.
EMMY_SIM_INTERNAL static bool resolve_warps() {
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

EMMY_SIM_INTERNAL static std::string waiting_report(const Launch& L) {
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
EMMY_SIM_INTERNAL static bool resolve_barrier() {
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

EMMY_SIM_INTERNAL static void resume_block();

EMMY_SIM_INTERNAL static void run_block() {
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
EMMY_SIM_INTERNAL static void resume_block() {
  Launch& L = launch_state;
  L.parked = false;
  for (;;) {
    const unsigned long events = L.events;
    round_worked = false;
    if (Thread* first = next_in_round(0)) {  // the round: its threads hand over to each other
      run_next(&L.scheduler, first);
      L.current = nullptr;
      muted = false;
      if (!L.error.empty()) return;
    }
    bool live = false;
    for (const Thread& t : L.threads) live = live || t.state != State::done;
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
    if (polling && (round_worked || L.events != events)) continue;  // someone moved: poll again
    if (polling) {
      fail("deadlock: a wait on an mbarrier never completes in " + where(L) + waiting_report(L));
      return;
    }
    if (!L.error.empty() || !resolve_barrier()) return;
  }
}

// The current block's threads on a new stack pool (the old one is freed, unless a parked block
// took it: then L.stacks is null).
EMMY_SIM_INTERNAL static void fresh_pool(unsigned n) {
  Launch& L = launch_state;
  std::free(L.stacks);
  L.stacks = static_cast<char*>(std::malloc(L.stack_pool_bytes));
  L.threads.assign(n, Thread{});
  for (unsigned i = 0; i < n; ++i) L.threads[i].stack = L.stacks + i * L.stack_bytes;
}

EMMY_SIM_INTERNAL static int grid_unmet(uint3 waiting, uint3 ended) {
  auto text = [](uint3 b) {
    return "(" + std::to_string(b.x) + "," + std::to_string(b.y) + "," + std::to_string(b.z) + ")";
  };
  fail("a grid barrier reached by only part of the grid: block " + text(waiting) + " waits at it while block " +
       text(ended) + " ended without reaching it");
  return 1;
}

// Frees the stacks of blocks left waiting (a fault, or a barrier some blocks never reach).
EMMY_SIM_INTERNAL static int release_parked(int rc) {
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

int launch(const unsigned* grid_size, const unsigned* block_size, unsigned long shared_bytes, void (*invoke)(void*),
           void* closure) {
  Launch& L = launch_state;
  L.error.clear();
  if (shared_bytes > dynamic_shared_capacity) {
    L.error = "bad launch: " + std::to_string(shared_bytes) + " bytes of dynamic shared memory (at most " +
              std::to_string(dynamic_shared_capacity) + ")";
    return 1;
  }
  dynamic_bytes = shared_bytes;
  const dim3 grid(grid_size[0], grid_size[1], grid_size[2]), block(block_size[0], block_size[1], block_size[2]);
  const unsigned n = block.x * block.y * block.z;
  if (n == 0 || n > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0) {
    L.error = "bad launch: block of " + std::to_string(n) + " threads (1 to 1024) and grid " +
              std::to_string(grid.x) + "x" + std::to_string(grid.y) + "x" + std::to_string(grid.z);
    return 1;
  }
  L.grid = grid;
  L.block = block;
  // Each fiber's stack, and 17 cache lines more: with a power-of-two stack every fiber's hot frames
  // (the top of its stack) fell in the same cache sets, and a switch missed the caches.
#if defined(__SANITIZE_ADDRESS__)
  L.stack_bytes = 512 * 1024 + 17 * 64;
#else
  L.stack_bytes = 128 * 1024 + 17 * 64;
#endif
  L.stack_pool_bytes = n * L.stack_bytes;
  if (L.threads.size() != n) fresh_pool(n);
#if defined(__SANITIZE_ADDRESS__)
  __asan_unpoison_memory_region(L.stacks, L.stack_pool_bytes);
#endif
  L.warp_epochs.assign((n + 31) / 32, 0);
  L.invoke = invoke;
  L.closure = closure;
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
void check_shuffle(const char* what, int line, unsigned mask, int width) {
  if (width < 1 || width > 32 || (width & (width - 1))) {
    fail(std::string(what) + " at line " + std::to_string(line) + ": width " + std::to_string(width) +
         " is not a power of two from 1 to 32");
  }
  if (!(mask >> (me().linear % 32) & 1u)) {
    fail(std::string(what) + " at line " + std::to_string(line) + ": thread " + std::to_string(me().linear) +
         " calls it with a mask that leaves its own lane out");
  }
}

unsigned vote(Collective kind, const char* what, int line, unsigned mask, int predicate) {
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


static void count_copy(const void* source, size_t bytes);  // race-check builds count what a copy reads
// race-check builds: a cp.async copy's shared-memory write, seen as made both when it is issued and
// when its wait returns (on a GPU it lands any time between), so a copy into a buffer that other
// threads still read, or read before the wait and a barrier, is a reported race
static void note_copy_write(void* dst, size_t bytes, const void* pc);

void issue_copy(void* dst, const void* src, unsigned bytes, unsigned source_bytes) {
  note_copy_write(dst, bytes, __builtin_return_address(0));
  mute(true);
  me().pending.push_back({dst, src, bytes, source_bytes});
  mute(false);
}

void commit_copies() {
  mute(true);
  me().group_ends.push_back(me().pending.size());
  mute(false);
}

// cp.async groups: complete every copy but those of the `keep` most recent committed groups.
void complete_copies(Thread& t, size_t keep) {
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

unsigned active_lanes() {
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
static Race first_race;

}  // namespace emmy_sim
#pragma GCC visibility pop

extern "C" EMMY_SIM_INTERNAL const char* emmy_sim_error() { return ::emmy_sim::launch_state.error.c_str(); }

#if defined(EMMY_SIM_RACECHECK)

#pragma GCC visibility push(hidden)
namespace emmy_sim {

static std::unordered_map<uintptr_t, Cell>& cells() { static std::unordered_map<uintptr_t, Cell> map; return map; }

EMMY_SIM_INTERNAL static void note_race(const Access& other, bool other_wrote, const Thread& t, bool wrote,
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
EMMY_SIM_INTERNAL static void check_access(Launch& L, const void* address, size_t size, bool write, const void* pc);

// Global buffers whose accesses are counted (emmy_sim_count_reset): bytes read and written by the
// kernel's threads, before any cache, as the cost model predicts them.
struct Counted {
  uintptr_t lo, hi;
  unsigned long long read, written;
};
static std::vector<Counted>& counted() { static std::vector<Counted> ranges; return ranges; }

EMMY_SIM_INTERNAL static void count_access(uintptr_t a, size_t size, bool write) {
  for (Counted& c : counted())
    if (a >= c.lo && a < c.hi) { (write ? c.written : c.read) += size; return; }
}

// An atomic read-modify-write, counted as a read and a write.
void count_atomic(const void* address, size_t size) {
  count_access(reinterpret_cast<uintptr_t>(address), size, false);
  count_access(reinterpret_cast<uintptr_t>(address), size, true);
}

// A cp.async copy's global read (counted when it completes: the same bytes).
static void count_copy(const void* source, size_t bytes) {
  count_access(reinterpret_cast<uintptr_t>(source), bytes, false);
}

EMMY_SIM_INTERNAL static void access(const void* address, size_t size, bool write, const void* pc);
EMMY_SIM_INTERNAL static void note_copy_write(void* dst, size_t bytes, const void* pc) { access(dst, bytes, true, pc); }

EMMY_SIM_INTERNAL static void access(const void* address, size_t size, bool write, const void* pc) {
  Launch& L = launch_state;
  if (!L.current || muted) return;
  muted = true;  // the library code the check itself calls is instrumented too
  count_access(reinterpret_cast<uintptr_t>(address), size, write);
  check_access(L, address, size, write, pc);
  muted = false;
}

EMMY_SIM_INTERNAL static void check_access(Launch& L, const void* address, size_t size, bool write, const void* pc) {
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
#pragma GCC visibility pop

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
#pragma GCC visibility push(hidden)
namespace emmy_sim {
// only race-check builds count accesses
static void count_copy(const void*, size_t) {}
static void note_copy_write(void*, size_t, const void*) {}
}  // namespace emmy_sim
#pragma GCC visibility pop
#endif  // EMMY_SIM_RACECHECK

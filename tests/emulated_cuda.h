// Runs CUDA device code on the CPU, so kernels written over kernels/cuda/mma.cuh (the tensor-core flash attention
// in kernels/cuda/flash_mma.cuh) are checked on machines without a GPU: every CUDA thread of a block is a fiber (its
// own stack, switched on the calling thread), blocks one after another, __syncthreads as a block barrier,
// and the warp collectives (shuffles, mma.sync) as an exchange through per-warp slots between two warp barriers.
// mma_bf16 and mma_tf32 rebuild A and B from the 32 lanes'
// registers with the fragment layouts of the PTX ISA, which is exactly what a layout mistake in a kernel would
// get wrong; operands are rounded as the hardware rounds them (bf16 nearest-even, tf32 nearest-away).
//
// A fiber runs until it waits at a barrier; then the lowest-numbered thread that can go on runs next (the
// highest-numbered in odd blocks), so one warp runs as far ahead of the others as the barriers allow, in one
// direction in even blocks and the other in odd ones: a barrier a kernel lacks between writing shared memory and
// another warp reading it shows in one of the two, every run alike (threads of an OS scheduler interleave by
// chance). Asynchronous copies (cp.async) land as late as the GPU may land them, when their thread waits for them,
// in blocks 0 and 1 of every 4 (a read of a stage before the wait sees the old contents), and as early as it may,
// when issued, in blocks 2 and 3 (a copy into a stage another warp is still reading overwrites it). Threads that wait
// at barriers the others can never reach (a __syncthreads in divergent code) end the run with a message instead of
// hanging.
//
// What it cannot show: speed, bank conflicts, register spills, and memory races between warps that the barriers
// happen to order (compute-sanitizer's racecheck covers those on a GPU). Dynamic shared memory starts filled with
// 0xff bytes (bf16 NaN), so a fragment read of a word no thread wrote shows up as NaN; static __shared__ arrays are
// plain statics (zero at first, then whatever the last block left).
//
// Include this before any header of device code: it defines the CUDA keywords and built-ins those use.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>
#if !defined(__x86_64__)
#define TINYGPT_EMU_UCONTEXT 1  // x86-64 switches fibers with the few instructions below; elsewhere, ucontext
#endif
#if defined(TINYGPT_EMU_UCONTEXT)
#include <ucontext.h>
#endif
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define TINYGPT_EMU_ASAN 1
#endif

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/numerics.h"
#include "kernels/scalar_math.h"

#define TINYGPT_EMULATED_CUDA 1
#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
// Blocks run one after another, so one static array per declaration is each block's own shared memory.
#define __shared__ static

struct dim3 {
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
  unsigned x, y, z;
};
// CUDA's vectors (one 64- or 128-bit load or store on the GPU).
struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};

// CUDA's device math that the host's <cmath> lacks.
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t max(int64_t a, int64_t b) { return a > b ? a : b; }

namespace tinygpt::emu {

/// A barrier among the threads first .. first + n - 1 of a block (a warp's or the block's): released when
/// `expected` of them have arrived (those that returned no longer count).
struct Barrier {
  Barrier(unsigned first_, unsigned n) : first(first_), threads(n), expected(n) {}
  unsigned first, threads;
  unsigned expected;
  unsigned arrived = 0;
};

struct Warp {
  Warp(unsigned first, unsigned lanes) : bar(first, lanes) {}
  Barrier bar;
  uint32_t slot[32][8]{};  // each lane's operands of the collective in flight (zero for lanes a partial warp lacks)
};

struct Block {
  explicit Block(unsigned threads) : bar(0, threads) {
    for (unsigned w = 0; w < (threads + 31) / 32; ++w) {
      warps.push_back(std::make_unique<Warp>(32 * w, std::min(32u, threads - 32 * w)));
    }
  }
  Barrier bar;
  std::vector<std::unique_ptr<Warp>> warps;
};

/// A cp.async in flight, in the blocks where copies land late: it lands (the copy, zero-filled past `valid` bytes)
/// only when its thread waits for its group, so a kernel that reads a stage before waiting reads what was there
/// before, as it may on a GPU.
struct PendingCopy {
  void* dst;
  const void* src;
  int bytes, valid;
};

#if !defined(TINYGPT_EMU_UCONTEXT)
/// A fiber's saved state is its stack pointer: tinygpt_emu_switch pushes the registers the calling convention
/// (System V, x86-64) has a callee keep, and the SSE and x87 control words, stores the stack pointer, loads the other
/// fiber's and pops the same from its stack, returning where that fiber last switched away. (glibc's swapcontext also
/// saves the signal mask, a system call each switch: with it the flash emulator suite took 58 s here, with this 11.)
struct Context {
  void* sp = nullptr;
};
extern "C" void tinygpt_emu_switch(void** save_sp, void* load_sp);
asm(R"(
  .pushsection .text
  .weak tinygpt_emu_switch
  .type tinygpt_emu_switch, @function
tinygpt_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size tinygpt_emu_switch, .-tinygpt_emu_switch
  .popsection
)");
inline void switch_context(Context& save, const Context& load) { tinygpt_emu_switch(&save.sp, load.sp); }
/// A context that starts entry() on the stack [stack, stack + bytes): the frame tinygpt_emu_switch pops, laid out so
/// entry begins as if called (its stack pointer 8 past a 16-byte boundary); entry never returns.
inline void make_context(Context& c, unsigned char* stack, size_t bytes, void (*entry)()) {
  uint64_t* sp = reinterpret_cast<uint64_t*>((reinterpret_cast<uintptr_t>(stack) + bytes) & ~uintptr_t(15));
  *--sp = 0;                                  // entry's return address
  *--sp = reinterpret_cast<uint64_t>(entry);  // where the switch returns to
  for (int i = 0; i < 6; ++i) *--sp = 0;      // rbp, rbx, r12-r15
  uint16_t x87_control;                       // the calling thread's rounding and flushing modes, as a new thread's
  asm volatile("fnstcw %0" : "=m"(x87_control));
  *--sp = uint64_t(__builtin_ia32_stmxcsr()) | uint64_t(x87_control) << 32;
  c.sp = sp;
}
#else
struct Context {
  ucontext_t uc;
};
inline void switch_context(Context& save, const Context& load) { swapcontext(&save.uc, &load.uc); }
inline void make_context(Context& c, unsigned char* stack, size_t bytes, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
#endif

/// One CUDA thread: its context and stack, the barrier it waits at, and its cp.async groups.
struct Fiber {
  Context context;
  unsigned char* stack = nullptr;
  size_t stack_bytes = 0;
  unsigned index = 0;
  bool done = false;
  const Barrier* waiting = nullptr;                   // the barrier it waits at, until released
  std::vector<PendingCopy> open_copies;               // issued, not yet committed
  std::vector<std::vector<PendingCopy>> copy_groups;  // committed, oldest first
  void* fake_stack = nullptr;                         // AddressSanitizer's, while switched out
};

/// The calling thread's side of the switches: where fibers return to.
struct Scheduler {
  Context context;
  void* fake_stack = nullptr;
  const void* stack_bottom = nullptr;  // the calling thread's stack, for AddressSanitizer
  size_t stack_bytes = 0;
  Fiber* fibers = nullptr;      // the block's threads
  std::vector<uint64_t> ready;  // a bit a thread: neither waiting nor returned
  void set_ready(unsigned i) { ready[i / 64] |= uint64_t(1) << (i % 64); }
  void clear_ready(unsigned i) { ready[i / 64] &= ~(uint64_t(1) << (i % 64)); }
  /// The lowest-numbered ready thread (or the highest, `down`), or -1 when none is.
  int pick(bool down) const {
    const int words = int(ready.size());
    for (int n = 0; n < words; ++n) {
      const int w = down ? words - 1 - n : n;
      if (ready[size_t(w)] != 0) {
        return 64 * w + (down ? 63 - std::countl_zero(ready[size_t(w)]) : std::countr_zero(ready[size_t(w)]));
      }
    }
    return -1;
  }
};

inline thread_local Warp* tl_warp = nullptr;
inline thread_local Block* tl_block = nullptr;
inline thread_local Fiber* tl_fiber = nullptr;
inline thread_local bool tl_copies_land_early = false;  // cp.async lands when issued, not when waited for
inline thread_local Scheduler* tl_scheduler = nullptr;
inline thread_local unsigned char* tl_smem = nullptr;  // the block's dynamic shared memory

// AddressSanitizer's fiber annotations (nothing without it): a switch starts with the stack it goes to and ends
// by saying where it came from.
inline void start_switch(void** fake_stack, const void* bottom, size_t bytes) {
#if defined(TINYGPT_EMU_ASAN)
  __sanitizer_start_switch_fiber(fake_stack, bottom, bytes);
#else
  (void)fake_stack, (void)bottom, (void)bytes;
#endif
}
inline void finish_switch(void* fake_stack, const void** from_bottom, size_t* from_bytes) {
#if defined(TINYGPT_EMU_ASAN)
  __sanitizer_finish_switch_fiber(fake_stack, from_bottom, from_bytes);
#else
  (void)fake_stack, (void)from_bottom, (void)from_bytes;
#endif
}

/// The running fiber gives the CPU back to the scheduler until it is picked again.
inline void yield_fiber() {
  Fiber& f = *tl_fiber;
  Scheduler& s = *tl_scheduler;
  start_switch(&f.fake_stack, s.stack_bottom, s.stack_bytes);
  switch_context(f.context, s.context);
  finish_switch(f.fake_stack, &s.stack_bottom, &s.stack_bytes);
}

/// Every thread waiting at b goes on.
inline void release(Barrier& b) {
  Scheduler& s = *tl_scheduler;
  b.arrived = 0;
  for (unsigned i = b.first; i < b.first + b.threads; ++i) {
    if (s.fibers[i].waiting == &b) {
      s.fibers[i].waiting = nullptr;
      s.set_ready(i);
    }
  }
}

/// Waits until every thread of the barrier has arrived; the last to arrive releases them and the scheduler picks who
/// goes on first (it too may wait).
inline void arrive_and_wait(Barrier& b) {
  if (++b.arrived == b.expected) {
    release(b);
  } else {
    tl_fiber->waiting = &b;
    tl_scheduler->clear_ready(tl_fiber->index);
  }
  yield_fiber();
}

/// A returned thread no longer holds up its block's or warp's barriers (as on the GPU).
inline void arrive_and_drop(Barrier& b) {
  --b.expected;
  if (b.arrived > 0 && b.arrived == b.expected) release(b);
}

}  // namespace tinygpt::emu

inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

inline void __syncthreads() { tinygpt::emu::arrive_and_wait(tinygpt::emu::tl_block->bar); }
inline void __syncwarp(unsigned = 0xffffffffu) { tinygpt::emu::arrive_and_wait(tinygpt::emu::tl_warp->bar); }

/// Every lane publishes `words` (n of them), the warp waits, `read` builds this lane's result from all slots, and
/// the warp waits again before the slots can be reused.
template <class Read>
auto warp_exchange(const uint32_t* words, int n, Read read) {
  tinygpt::emu::Warp& w = *tinygpt::emu::tl_warp;
  const unsigned lane = threadIdx.x % 32;
  std::memcpy(w.slot[lane], words, sizeof(uint32_t) * size_t(n));
  tinygpt::emu::arrive_and_wait(w.bar);
  auto result = read(w.slot, lane);
  tinygpt::emu::arrive_and_wait(w.bar);
  return result;
}

inline float __shfl_xor_sync(unsigned, float x, int lane_mask) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  return warp_exchange(&bits, 1, [&](const uint32_t(*slot)[8], unsigned lane) {
    return std::bit_cast<float>(slot[lane ^ unsigned(lane_mask)][0]);
  });
}

inline float __shfl_sync(unsigned, float x, int src_lane) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  return warp_exchange(&bits, 1, [&](const uint32_t(*slot)[8], unsigned) {
    return std::bit_cast<float>(slot[unsigned(src_lane) % 32][0]);
  });
}

namespace tinygpt::cuda {

inline uint16_t to_bf16_bits(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  if (std::isnan(x)) return 0x7fc0;
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // round to nearest, ties to even
}

inline float bf16_bits_to_float(uint16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }

inline uint32_t pack_bf16(float lo, float hi) {
  return uint32_t(to_bf16_bits(lo)) | (uint32_t(to_bf16_bits(hi)) << 16);
}

using Slots = const uint32_t (*)[8];

/// d += A x B for the warp: A (16 x K) and B (K x 8) are rebuilt from all lanes' a and b registers by
/// A(slots, r, k) and B(slots, k, n), where slots[lane][0..3] hold a lane's a and slots[lane][4..5] its b.
template <int K, class ReadA, class ReadB>
void emulated_mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], ReadA A, ReadB B) {
  const uint32_t words[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
  struct Out {
    float v[4];
  };
  const Out out = warp_exchange(words, 6, [&](Slots slots, unsigned lane) {
    Out o;
    const int g = int(lane / 4), t = int(lane % 4);
    for (int i = 0; i < 4; ++i) {  // d[i] is row g + 8 (i / 2), column 2t + i % 2
      const int r = g + 8 * (i / 2), n = 2 * t + i % 2;
      float acc = 0.0f;
      for (int k = 0; k < K; ++k) acc += A(slots, r, k) * B(slots, k, n);
      o.v[i] = d[i] + acc;
    }
    return o;
  });
  for (int i = 0; i < 4; ++i) d[i] = out.v[i];
}

inline float bf16_half(uint32_t w, int i) { return bf16_bits_to_float(uint16_t(i ? w >> 16 : w & 0xffffu)); }

/// mma.m16n8k16 bf16: A(r, k) is held by lane (r % 8) * 4 + (k % 8) / 2 in register r / 8 + 2 (k / 8), half k % 2;
/// B(k, n) by lane n * 4 + (k % 8) / 2 in register 4 + k / 8, half k % 2.
inline void mma_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  emulated_mma<16>(
      d, a, b,
      [](Slots s, int r, int k) { return bf16_half(s[(r % 8) * 4 + (k % 8) / 2][r / 8 + 2 * (k / 8)], k % 2); },
      [](Slots s, int k, int n) { return bf16_half(s[n * 4 + (k % 8) / 2][4 + k / 8], k % 2); });
}

/// ldmatrix.x4 (non-transposed and .trans): every lane publishes its row address, and each lane reads its elements
/// of the four matrices from the rows the others named (mma.cuh states the layout).
template <bool kTrans>
void emulated_ldmatrix(uint32_t (&r)[4], const void* row) {
  const uint64_t addr = reinterpret_cast<uintptr_t>(row);
  const uint32_t words[2] = {uint32_t(addr), uint32_t(addr >> 32)};
  struct Out {
    uint32_t v[4];
  };
  const Out out = warp_exchange(words, 2, [](Slots s, unsigned lane) {
    const auto row_of = [&](int m, int i) {
      return reinterpret_cast<const uint16_t*>(uintptr_t(s[8 * m + i][0]) | (uintptr_t(s[8 * m + i][1]) << 32));
    };
    const int g = int(lane / 4), t = int(lane % 4);
    Out o;
    for (int m = 0; m < 4; ++m) {
      const uint16_t lo = kTrans ? row_of(m, 2 * t)[g] : row_of(m, g)[2 * t];
      const uint16_t hi = kTrans ? row_of(m, 2 * t + 1)[g] : row_of(m, g)[2 * t + 1];
      o.v[m] = uint32_t(lo) | (uint32_t(hi) << 16);
    }
    return o;
  });
  for (int m = 0; m < 4; ++m) r[m] = out.v[m];
}
inline void ldmatrix_x4(uint32_t (&r)[4], const void* row) { emulated_ldmatrix<false>(r, row); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) { emulated_ldmatrix<true>(r, row); }

}  // namespace tinygpt::cuda

namespace tinygpt::cuda {

inline void land(const emu::PendingCopy& c) {
  std::memcpy(c.dst, c.src, size_t(c.valid));
  std::memset(static_cast<unsigned char*>(c.dst) + c.valid, 0, size_t(c.bytes - c.valid));
}
/// A copy lands at the latest when its thread waits for it and at the earliest when issued: in half the blocks
/// the one, in the other half the other (see the top of this file).
inline void cp_async(void* smem, const void* gmem, int bytes, int valid) {
  if (emu::tl_copies_land_early) {
    land({smem, gmem, bytes, valid});
  } else {
    emu::tl_fiber->open_copies.push_back({smem, gmem, bytes, valid});
  }
}
// Fibers switch only at barriers and warp collectives, so a read-modify-write is atomic as it stands.
inline void atomic_add2(float* dst, float a, float b) {
  dst[0] += a;
  dst[1] += b;
}
inline void cp_async16(void* smem, const void* gmem, int valid) { cp_async(smem, gmem, 16, valid); }
inline void cp_async4(void* smem, const void* gmem, int valid) { cp_async(smem, gmem, 4, valid); }
inline void cp_async_commit() {
  emu::Fiber& f = *emu::tl_fiber;
  f.copy_groups.push_back(std::move(f.open_copies));
  f.open_copies.clear();
}
template <int N>
void cp_async_wait() {
  std::vector<std::vector<emu::PendingCopy>>& groups = emu::tl_fiber->copy_groups;
  while (groups.size() > size_t(N)) {
    for (const emu::PendingCopy& c : groups.front()) land(c);
    groups.erase(groups.begin());
  }
}

/// cvt.rna.tf32.f32: nearest, ties away from zero, to a 10-bit mantissa; the low 13 bits are zero.
inline uint32_t to_tf32(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  if (!std::isfinite(x)) return u;
  return (u + 0x1000u) & 0xffffe000u;
}

/// mma.m16n8k8 tf32: A(r, k) is held by lane (r % 8) * 4 + k % 4 in register r / 8 + 2 (k / 4); B(k, n) by lane
/// n * 4 + k % 4 in register 4 + k / 4. The unit reads the top 19 bits of each register.
inline void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  const auto value = [](uint32_t w) { return std::bit_cast<float>(w & 0xffffe000u); };
  emulated_mma<8>(
      d, a, b, [&](Slots s, int r, int k) { return value(s[(r % 8) * 4 + k % 4][r / 8 + 2 * (k / 4)]); },
      [&](Slots s, int k, int n) { return value(s[n * 4 + k % 4][4 + k / 4]); });
}

}  // namespace tinygpt::cuda

namespace tinygpt::emu {

/// Fiber stacks, mapped once for the calling thread and reused by every block after: 1 MiB each (pages touched only
/// as used), a page below each without access, so a stack that overflows faults instead of corrupting another.
class Stacks {
 public:
  static constexpr size_t kBytes = size_t(1) << 20, kGuard = 4096;
  unsigned char* get(size_t i) {
    while (stacks_.size() <= i) {
      void* p =
          mmap(nullptr, kBytes + kGuard, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED || mprotect(p, kGuard, PROT_NONE) != 0) {
        std::fprintf(stderr, "emulated CUDA: could not map a fiber's stack\n");
        std::abort();
      }
      stacks_.push_back(static_cast<unsigned char*>(p) + kGuard);
    }
#if defined(TINYGPT_EMU_ASAN)
    __asan_unpoison_memory_region(stacks_[i], kBytes);  // what the block before left poisoned in its frames
#endif
    return stacks_[i];
  }
  ~Stacks() {
    for (unsigned char* s : stacks_) munmap(s - kGuard, kBytes + kGuard);
  }

 private:
  std::vector<unsigned char*> stacks_;
};

inline thread_local const std::function<void(unsigned char*)>* tl_body = nullptr;

/// Where every fiber starts: the kernel's body, then the thread leaves its barriers and never runs again.
inline void fiber_main() {
  Scheduler& s = *tl_scheduler;
  finish_switch(nullptr, &s.stack_bottom, &s.stack_bytes);
  (*tl_body)(tl_smem);
  Fiber& f = *tl_fiber;
  if (!f.open_copies.empty() || !f.copy_groups.empty()) {  // copies a kernel never waited for
    std::fprintf(stderr, "emulated CUDA: a thread ended with cp.async copies it never waited for\n");
    std::abort();
  }
  arrive_and_drop(tl_warp->bar);
  arrive_and_drop(tl_block->bar);
  f.done = true;
  s.clear_ready(f.index);
  start_switch(nullptr, s.stack_bottom, s.stack_bytes);  // this stack's frames are done with
  switch_context(f.context, s.context);
}

// In functions of their own: on the ucontext path getcontext and swapcontext return twice to the compiler, and the
// scheduler's locals would be thought clobbered.
[[gnu::noinline]] inline void make_fiber_context(Fiber& f) {
  make_context(f.context, f.stack, f.stack_bytes, fiber_main);
}

/// Switches to fiber f until it waits at a barrier or ends.
[[gnu::noinline]] inline void run_fiber(Scheduler& s, Fiber& f) {
  start_switch(&s.fake_stack, f.stack, f.stack_bytes);
  switch_context(s.context, f.context);
  finish_switch(s.fake_stack, nullptr, nullptr);
}

/// Runs body(shared memory) as every thread of every block of the grid.
inline void launch(dim3 grid, unsigned threads, size_t smem_bytes, const std::function<void(unsigned char*)>& body) {
  static thread_local Stacks stacks;
  std::vector<unsigned char> smem(smem_bytes);
  std::vector<Fiber> fibers(threads);
  Scheduler scheduler;
  scheduler.fibers = fibers.data();
  scheduler.ready.resize((threads + 63) / 64);
  tl_scheduler = &scheduler;
  tl_body = &body;
  tl_smem = smem.data();
  blockDim = {threads, 1, 1};
  gridDim = grid;
  uint64_t block_number = 0;
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x, ++block_number) {
        if (!smem.empty()) std::memset(smem.data(), 0xff, smem.size());
        Block block(threads);
        blockIdx = {x, y, z};
        tl_block = &block;
        for (unsigned i = 0; i < threads; ++i) {
          Fiber& f = fibers[i];
          f.index = i;
          f.done = false;
          f.waiting = nullptr;
          f.stack = stacks.get(i);
          f.stack_bytes = Stacks::kBytes;
          make_fiber_context(f);
          scheduler.set_ready(i);
        }
        // The lowest-numbered thread that can go on runs next (the highest in odd blocks): see the top of this file.
        const bool down = block_number % 2 == 1;
        tl_copies_land_early = block_number / 2 % 2 == 1;
        unsigned done = 0;
        while (done < threads) {
          const int i = scheduler.pick(down);
          if (i < 0) {
            std::fprintf(stderr,
                         "emulated CUDA: block (%u, %u, %u): %u of %u threads wait at barriers the others "
                         "never reach (a __syncthreads in divergent code?)\n",
                         x, y, z, threads - done, threads);
            std::abort();
          }
          Fiber* next = &fibers[unsigned(i)];
          threadIdx = {next->index, 0, 0};
          tl_fiber = next;
          tl_warp = block.warps[next->index / 32].get();
          run_fiber(scheduler, *next);
          if (next->done) ++done;
        }
      }
    }
  }
  tl_fiber = nullptr;
  tl_scheduler = nullptr;
}

}  // namespace tinygpt::emu

// The runtime the kernel headers (kernels/cuda/*.cuh) launch through, on the host: launches run under the
// emulator, device memory is host memory, and cuBLAS's products are a plain loop (the CPU stands in for cuBLAS:
// what this checks is the arguments our code hands it, not cuBLAS). The kernel headers define their functions in
// tinygpt::cuda::emulated when included after this header, so they never clash with the real CUDA backend.
namespace tinygpt::cuda::emulated {

struct DeviceProperties;
const DeviceProperties& properties();

template <class... Params, class... Args>
void launch_kernel(const char* what, void (*kernel)(Params...), dim3 grid, unsigned threads, size_t smem_bytes,
                   Args&&... args);

/// Scratch device memory: host memory, filled with NaN bytes so a read of what no kernel wrote shows.
class Scratch {
 public:
  explicit Scratch(size_t bytes) : bytes_(bytes, 0xff) {}
  template <class T>
  T* as() {
    return reinterpret_cast<T*>(bytes_.data());
  }

 private:
  std::vector<unsigned char> bytes_;
};

/// Copies back to the host: each would be a host synchronisation on the GPU.
inline int64_t host_copies = 0;
inline void copy_to_host(void* dst, const void* src, size_t bytes) {
  ++host_copies;
  if (bytes) std::memcpy(dst, src, bytes);
}
inline void copy_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

/// What the launchers read of the GPU: an H100's shared memory per block.
struct DeviceProperties {
  size_t sharedMemPerBlockOptin = 227 * 1024;
  int major = 9, minor = 0;
};
inline const DeviceProperties& properties() {
  static const DeviceProperties p;
  return p;
}

/// Runs the kernel under the emulator; refuses what a GPU would refuse to launch (as an Error naming `what`).
template <class... Params, class... Args>
void launch_kernel(const char* what, void (*kernel)(Params...), dim3 grid, unsigned threads, size_t smem_bytes,
                   Args&&... args) {
  if (threads == 0 || threads > 1024 || smem_bytes > properties().sharedMemPerBlockOptin || grid.y > 65535 ||
      grid.z > 65535) {
    throw std::runtime_error(std::string(what) + ": launch configuration a GPU refuses");
  }
  emu::launch(grid, threads, smem_bytes, [&](unsigned char*) { kernel(args...); });
}

/// Row-major C (M, N) = alpha * op(A) @ op(B) + beta * C, `batch` times with the given element strides, each
/// operand element read as `value(element)`, in f64 sums: the loop that stands in for cuBLAS below. C is f32, or bf16
/// (each result computed in f32 and rounded once).
template <class E, class CT, class Value>
void gemm_loop(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const E* A, int64_t lda,
               int64_t stride_a, const E* B, int64_t ldb, int64_t stride_b, float beta, CT* C, int64_t ldc,
               int64_t stride_c, int64_t batch, Value value) {
  for (int64_t i = 0; i < batch; ++i) {
    const E* a = A + i * stride_a;
    const E* b = B + i * stride_b;
    CT* c = C + i * stride_c;
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0.0;
        for (int64_t k = 0; k < K; ++k) {
          acc += value(trans_a ? a[k * lda + m] : a[m * lda + k]) * value(trans_b ? b[n * ldb + k] : b[k * ldb + n]);
        }
        CT& out = c[m * ldc + n];
        out = float(alpha * acc + (beta == 0.0f ? 0.0 : double(beta) * double(float(out))));
      }
    }
  }
}

/// What the cuBLAS call in kernels/cuda/cublas.cu computes. With tf32 the operands are rounded to TF32 first, as the
/// tensor cores read them, so a launcher that drops the flag shows.
inline void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                 int64_t stride_a, const float* B, int64_t ldb, int64_t stride_b, float beta, float* C, int64_t ldc,
                 int64_t stride_c, int64_t batch, bool tf32, const char*) {
  gemm_loop(trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc, stride_c, batch,
            [tf32](float x) { return double(tf32 ? std::bit_cast<float>(to_tf32(x)) : x); });
}

/// What gemm_bf16 in kernels/cuda/cublas.cu computes: operands read as bf16 bit patterns.
inline void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
                      int64_t lda, int64_t stride_a, const uint16_t* B, int64_t ldb, int64_t stride_b, float beta,
                      float* C, int64_t ldc, int64_t stride_c, int64_t batch, const char*) {
  gemm_loop(trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc, stride_c, batch,
            [](uint16_t x) { return double(bf16_bits_to_float(x)); });
}

/// The same with C in bf16.
inline void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
                      int64_t lda, int64_t stride_a, const uint16_t* B, int64_t ldb, int64_t stride_b, float beta,
                      bf16* C, int64_t ldc, int64_t stride_c, int64_t batch, const char*) {
  gemm_loop(trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc, stride_c, batch,
            [](uint16_t x) { return double(bf16_bits_to_float(x)); });
}

/// Whether the stand-in for cublasLt (fused_gemm) finds an algorithm: tests turn it off to run the launchers' own
/// epilogue kernels, which the real backend runs when cublasLt has none for a call.
inline bool fused_gemm_available = true;
/// How many times the launchers have called fused_gemm (tests check when they ask cublasLt at all).
inline int fused_gemm_calls = 0;

/// What fused_gemm in kernels/cuda/cublas.cu computes: the product as gemm or gemm_bf16 would, then the epilogue
/// (cublasLt's GELU is the tanh form that kernels/scalar_math.h computes).
inline bool fused_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda,
                       const void* B, int64_t ldb, float* D, int64_t ldd, MatmulMath math, Epilogue epilogue,
                       const float* bias, float* aux, int64_t ldaux, const char* what) {
  ++fused_gemm_calls;
  if (!fused_gemm_available) return false;
  if (math == MatmulMath::BF16) {
    gemm_bf16(trans_a, trans_b, M, N, K, 1.0f, static_cast<const uint16_t*>(A), lda, 0, static_cast<const uint16_t*>(B),
              ldb, 0, 0.0f, D, ldd, 0, 1, what);
  } else {
    gemm(trans_a, trans_b, M, N, K, 1.0f, static_cast<const float*>(A), lda, 0, static_cast<const float*>(B), ldb, 0,
         0.0f, D, ldd, 0, 1, math == MatmulMath::TF32, what);
  }
  const auto tanh = [](float u) { return std::tanh(u); };
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      float& d = D[m * ldd + n];
      if (epilogue == Epilogue::Bias || epilogue == Epilogue::GeluBias) d += bias[n];
      if (epilogue == Epilogue::Gelu || epilogue == Epilogue::GeluBias) {
        aux[m * ldaux + n] = d;
        d = gelu(d, tanh);
      }
      if (epilogue == Epilogue::DGelu) d *= gelu_grad(aux[m * ldaux + n], tanh);
    }
  }
  return true;
}

}  // namespace tinygpt::cuda::emulated

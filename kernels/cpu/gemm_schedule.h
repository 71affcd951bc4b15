// The blocked GEMM's scheduling (internal to kernels/cpu/gemm.cpp, the one file that includes it): per-thread
// scratch, the prefetch walker, the tickets threads claim (Segment, Progress) and the oversubscription guard that
// runs calls single-threaded while another process holds a core.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <new>

#include "gemm_configs.h"

namespace tinygpt::cpu::gemm_detail {

// Target size of the shared op(B) slab when all of K does not fit in twice this (it beat 8 MB on dw at M = 16384, and
// 1 MB was no better: docs/RESULTS.md, "Measurements behind design decisions").
inline constexpr int64_t kSlabBytes = 2 << 20;
// A product stored in bf16 whose K does not fit the slab for NC columns runs in column blocks narrow enough for it
// to fit, if they are at least this wide.
inline constexpr int64_t kMinSlabColumns = 512;
// A product stored in bf16 whose K runs in several groups goes through f32 blocks of C of at most this size.
inline constexpr int64_t kF32BlockBytes = 16 << 20;
// Below this many multiply-adds a call runs on one thread (fork/join would cost more than it saves).
inline constexpr double kMinFmasPerThread = 1 << 18;

// Calling thread's scratch, grown on demand and kept: steady-state calls neither allocate nor page-fault. Slot tells
// apart buffers of one type that are live together.
template <class T, int Slot = 0>
T* scratch(int64_t n) {
  struct Buf {
    void* p = nullptr;
    int64_t cap = 0;
    ~Buf() { std::free(p); }
  };
  thread_local Buf buf;
  if (buf.cap < n) {
    std::free(buf.p);
    buf.p = std::aligned_alloc(4096, static_cast<size_t>(round_up(n * int64_t(sizeof(T)), 4096)));
    buf.cap = buf.p ? n : 0;
    if (!buf.p) throw std::bad_alloc();
  }
  return static_cast<T*>(buf.p);
}

// Walks a 2-D region (rows of `bytes` bytes, `stride` apart) one cache line per step, prefetching it (one line per
// row more than `bytes` needs, since rows need not start on a line boundary).
class Prefetch {
 public:
  Prefetch() = default;
  Prefetch(const void* base, int64_t stride, int64_t bytes, int64_t rows)
      : base_(static_cast<const char*>(base)), stride_(stride), rows_(rows), per_row_(ceil_div(bytes, 64) + 1) {}
  int64_t lines() const { return rows_ * per_row_; }
  void step(int64_t n) {
    for (; n > 0 && row_ < rows_; --n) {
      __builtin_prefetch(base_ + row_ * stride_ + line_ * 64, 0, 3);
      if (++line_ == per_row_) line_ = 0, ++row_;
    }
  }

 private:
  const char* base_ = nullptr;
  int64_t stride_ = 0, rows_ = 0, per_row_ = 0, row_ = 0, line_ = 0;
};

// Work of one call, as a sequence of tickets that threads claim in order (dynamic scheduling). Tickets fall into
// segments: for each (N block, K group) a segment packing the shared op(B) slab, then one computing C from it.
// A ticket runs once every earlier segment is complete; since no ticket can finish before its predecessors, that is
// simply `done >= segment start`. Threads wait on that count (spin briefly, then sleep) rather than at OpenMP
// barriers: when another process holds a core, a libgomp barrier spins for milliseconds while the thread it waits
// for sits preempted behind that process, and the dynamic claiming lets the running thread take over the work.
struct Segment {
  int64_t start, end;  // tickets [start, end)
  bool pack;
  int64_t j0, nc, g0, gk;
  int64_t chunks;  // pack: runs of panels per k block; compute: column chunks per row block
};

class Progress {
 public:
  void finish() {
    done_.fetch_add(1);
    if (waiters_.load() > 0) done_.notify_all();
  }
  void wait_for(int64_t count) {
    for (int spin = 0; spin < 8000; ++spin) {  // ~200 us
      if (done_.load(std::memory_order_acquire) >= count) return;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    waiters_.fetch_add(1);
    for (int v = done_.load(); v < count; v = done_.load()) done_.wait(v);
    waiters_.fetch_sub(1);
  }

 private:
  std::atomic<int> done_{0};
  std::atomic<int> waiters_{0};
};

// Oversubscription guard. The closing barrier of an OpenMP region needs every team thread to run; when another
// process holds a core, a team thread queued behind it stalls the caller until the next scheduler tick, and
// libgomp's idle workers spinning after a region take turns with the caller too: with another process busy on one
// of 2 cores, 2-thread calls ran slower than single-threaded ones. Two calls in a row in which the caller spent most
// of the time off its CPU or waiting make the following calls run single-threaded for a while (50 ms, doubling while
// it keeps happening, up to 1 s); then threads are tried again. On a busy machine that brings such calls close to
// single-threaded speed (docs/RESULTS.md, "Measurements behind design decisions"). With the machine to ourselves the
// caller waits a fraction of one work unit; a lone stall (an interrupt, a short-lived process) does not count.
// Results do not depend on the thread count (each element's k order is fixed by the K blocking).
using Clock = std::chrono::steady_clock;
inline std::atomic<int64_t> solo_until_ns{0}, solo_window_ns{0};
inline std::atomic<int> stalled_calls{0};

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

inline bool solo_now() { return now_ns() < solo_until_ns.load(std::memory_order_relaxed); }

inline Clock::duration thread_cpu_time() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

inline void note_idle(Clock::duration idle, Clock::duration span) {
  if (idle < std::chrono::milliseconds(2) || idle * 2 < span) {
    stalled_calls.store(0, std::memory_order_relaxed);
    solo_window_ns.store(0, std::memory_order_relaxed);
    return;
  }
  if (stalled_calls.fetch_add(1, std::memory_order_relaxed) + 1 < 2) return;
  stalled_calls.store(0, std::memory_order_relaxed);
  const int64_t window =
      std::clamp<int64_t>(2 * solo_window_ns.load(std::memory_order_relaxed), 50'000'000, 1'000'000'000);
  solo_window_ns.store(window, std::memory_order_relaxed);
  solo_until_ns.store(now_ns() + window, std::memory_order_relaxed);
}

}  // namespace tinygpt::cpu::gemm_detail

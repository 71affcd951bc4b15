#include "kernels/cpu/gemm.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/base.h"
#include "kernels/cpu/bf16_rows.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define TINYGPT_GEMM_AVX2 1
#if defined(__AVX512F__)
#define TINYGPT_GEMM_AVX512 1
#endif
#endif

// GotoBLAS/BLIS-style GEMM (shapes and sizes below are for float on the 2-core Zen 3 it was tuned on; what was
// tried, and what it measured: docs/RESULTS.md, "Measurements behind design decisions").
// - op(B) is packed into a slab shared by the threads: NR-wide micro-panels, KC deep, so the KC x NR panel the
//   micro-kernel sweeps stays in L1. The slab holds all of K when that is at most 4 MB (fwd/dinp: W is at most
//   2.4 MB), so a C tile is finished in one pass; otherwise (dw, where op(B) = x is M x K: 4.7-100 MB) K goes in
//   groups of KC blocks filling about 2 MB.
// - op(A) is packed per thread in blocks of up to MC rows x KC (lives in L2), MR-high micro-panels.
// - The MR x NR tile of C lives in registers for a KC-long run of the micro-kernel.
// - Work is split into tickets claimed dynamically by the threads: per (NC block, K group), pack tickets filling the
//   slab, then compute tickets (a row block, all of the group's KC blocks, so its C tile stays in L2 across them).
// Transposes are absorbed by the packing routines.

namespace tinygpt::cpu {
namespace {

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
constexpr int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

/// Rounds n packed operands in place (bf16 products: each operand read as bfloat16, the sums stay in T).
template <class T>
void round_packed_bf16(T* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = T(round_bf16(float(x[i])));
}

// ---------------------------------------------------------------------------------------------------------------
// Portable pieces (double everywhere; float when AVX2/FMA is not available).

// Packs rows [r0, r0 + rows) x k [k0, k0 + kc) of a matrix X into micro-panels W rows high:
// dst[p * W * kc + k * W + r] = X(r0 + p * W + r, k0 + k), zero-padded to a whole panel. X(r, k) is X[r * ld + k]
// when k_contig, else X[k * ld + r]. Packed op(A) is X = op(A) with W = MR; packed op(B) is X = op(B)^T, W = NR.
template <class T, int W>
void pack_generic(bool k_contig, const T* X, int64_t ld, int64_t r0, int64_t rows, int64_t k0, int64_t kc, T* dst) {
  for (int64_t p = 0; p * W < rows; ++p, dst += W * kc) {
    for (int64_t k = 0; k < kc; ++k) {
      for (int64_t r = 0; r < W; ++r) {
        const int64_t rr = r0 + p * W + r, kk = k0 + k;
        dst[k * W + r] = p * W + r < rows ? (k_contig ? X[rr * ld + kk] : X[kk * ld + rr]) : T(0);
      }
    }
  }
}

// c[MR x NR, row stride ldc] = alpha * a_panel @ b_panel + beta * c; c is not read when beta == 0.
template <class T, int MR, int NR>
void kernel_generic(int64_t kc, const T* __restrict a, const T* __restrict b, T* c, int64_t ldc, T alpha, T beta) {
  T acc[MR][NR] = {};
  for (int64_t k = 0; k < kc; ++k) {
    for (int i = 0; i < MR; ++i) {
      const T ai = a[k * MR + i];
      for (int j = 0; j < NR; ++j) acc[i][j] += ai * b[k * NR + j];
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) {
      c[i * ldc + j] = beta == T(0) ? alpha * acc[i][j] : alpha * acc[i][j] + beta * c[i * ldc + j];
    }
  }
}

// Per-type configuration: micro-tile MR x NR, cache blocks MC/KC/NC, the three routines.
template <class T>
struct Config;

/// The portable configuration: generic packing and micro-kernel with the given tile and block sizes.
template <class T, int MR_, int NR_, int64_t MC_, int64_t KC_, int64_t NC_>
struct GenericConfig {
  static constexpr int MR = MR_, NR = NR_;
  static constexpr int64_t MC = MC_, KC = KC_, NC = NC_;
  static constexpr int64_t KU = 8;
  using Packed = T;
  struct ThreadScope {};
  static constexpr int64_t kpad(int64_t kc) { return kc; }
  static void pack_a(bool k_contig, const T* X, int64_t ld, int64_t r0, int64_t rows, int64_t k0, int64_t kc, T* dst) {
    pack_generic<T, MR>(k_contig, X, ld, r0, rows, k0, kc, dst);
  }
  static void pack_b(bool k_contig, const T* X, int64_t ld, int64_t r0, int64_t rows, int64_t k0, int64_t kc, T* dst) {
    pack_generic<T, NR>(k_contig, X, ld, r0, rows, k0, kc, dst);
  }
  static void kernel(int64_t kc, const T* a, const T* b, T* c, int64_t ldc, T alpha, T beta) {
    kernel_generic<T, MR, NR>(kc, a, b, c, ldc, alpha, beta);
  }
};

template <>
struct Config<double> : GenericConfig<double, 4, 8, 96, 256, 2048> {};

#ifdef TINYGPT_GEMM_AVX2

// Rows of X prefetched ahead when copying panels out of it: 16 did best of those tried on dw, whose x and dy stream
// from DRAM (docs/RESULTS.md, "Measurements behind design decisions").
constexpr int64_t kPackAhead = 16;

// In-register 8x8 transpose: r[i][j] -> r[j][i].
inline void transpose8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// The micro-kernel's vector operations, as wide as the target's registers.
#ifdef TINYGPT_GEMM_AVX512
struct FloatVec {
  using T = __m512;
  static constexpr int kLanes = 16;
  static T zero() { return _mm512_setzero_ps(); }
  static T load(const float* p) { return _mm512_load_ps(p); }
  static T loadu(const float* p) { return _mm512_loadu_ps(p); }
  static T set1(float x) { return _mm512_set1_ps(x); }
  static T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static void storeu(float* p, T v) { _mm512_storeu_ps(p, v); }
};
#else
struct FloatVec {
  using T = __m256;
  static constexpr int kLanes = 8;
  static T zero() { return _mm256_setzero_ps(); }
  static T load(const float* p) { return _mm256_load_ps(p); }
  static T loadu(const float* p) { return _mm256_loadu_ps(p); }
  static T set1(float x) { return _mm256_set1_ps(x); }
  static T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static void storeu(float* p, T v) { _mm256_storeu_ps(p, v); }
};
#endif

template <>
struct Config<float> {
#ifdef TINYGPT_GEMM_AVX512
  // AVX-512: the same 6 rows, 32 columns (two zmm per row), with the blocking unchanged: faster than the AVX2 6x16
  // tile where both run (docs/RESULTS.md, "CPU matmul kernels").
  static constexpr int MR = 6, NR = 32;
#else
  static constexpr int MR = 6, NR = 16;
#endif
  // MC and KC: a sweep found a plateau around these, a smaller KC worse on dw (docs/RESULTS.md, "Measurements
  // behind design decisions"). 144 x 256 floats = 144 KB of op(A) in the 512 KB L2; a 256 x 16 B panel is 16 KB of
  // the 32 KB L1 (AVX-512: 256 x 32, 32 KB of the Xeon's 48 KB L1).
  static constexpr int64_t MC = 144, KC = 256, NC = 4096;
  static constexpr int64_t KU = 8;
  using Packed = float;
  struct ThreadScope {};
  static constexpr int64_t kpad(int64_t kc) { return kc; }
  static void pack_a(bool k_contig, const float* X, int64_t ld, int64_t r0, int64_t rows, int64_t k0, int64_t kc,
                     float* dst) {
    pack<MR>(k_contig, X, ld, r0, rows, k0, kc, dst);
  }
  static void pack_b(bool k_contig, const float* X, int64_t ld, int64_t r0, int64_t rows, int64_t k0, int64_t kc,
                     float* dst) {
    pack<NR>(k_contig, X, ld, r0, rows, k0, kc, dst);
  }

  // Same contract as pack_generic; W is MR = 6 (op(A)) or NR = 16 or 32 (op(B)).
  template <int W>
  static void pack(bool k_contig, const float* X, int64_t ld, int64_t r0, int64_t rows, int64_t k0, int64_t kc,
                   float* dst) {
    const int64_t full = rows / W;
    if (!k_contig) {
      // Panel rows are contiguous in X (op(A) = A^T, op(B) = B): copy W floats per (k, panel), 8 k at a time per
      // panel, so loads stay within 8 rows and stores within one panel (faster than row by row across panels).
      const float* src = X + k0 * ld + r0;
      for (int64_t k8 = 0; k8 < kc; k8 += 8, src += 8 * ld) {
        const int64_t kn = std::min<int64_t>(8, kc - k8);
        if (k8 + kPackAhead < kc)
          for (int64_t k = 0; k < kn; ++k)
            for (int64_t r = 0; r < rows; r += 16)
              _mm_prefetch(reinterpret_cast<const char*>(src + (kPackAhead + k) * ld + r), _MM_HINT_T0);
        for (int64_t p = 0; p < full; ++p) {
          float* d = dst + p * W * kc + k8 * W;
          for (int64_t k = 0; k < kn; ++k) {
            if constexpr (W % 8 == 0) {
              for (int h = 0; h < W; h += 8) _mm256_store_ps(d + k * W + h, _mm256_loadu_ps(src + k * ld + p * W + h));
            } else {
              std::memcpy(d + k * W, src + k * ld + p * W, W * sizeof(float));
            }
          }
        }
      }
    } else {
      // X stored with k contiguous (op(A) = A, op(B) = B^T): 8x8 transposes, 8 k at a time. For W = 6 each
      // transposed row has 2 junk lanes; the 8-wide stores overlap and the next one overwrites them (the buffer
      // has slack at its end). W is 6 or a multiple of 8, so only the W = 6 stores overlap.
      static_assert(W < 8 || W % 8 == 0);
      for (int64_t p = 0; p < full; ++p) {
        float* d = dst + p * W * kc;
        const float* src = X + (r0 + p * W) * ld + k0;
        int64_t k = 0;
        for (; k + 8 <= kc; k += 8) {
          for (int h = 0; h < W; h += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + std::min(h + i, W - 1) * ld + k);
            transpose8(r);
            for (int t = 0; t < 8; ++t) _mm256_storeu_ps(d + (k + t) * W + h, r[t]);
          }
        }
        for (; k < kc; ++k)
          for (int r = 0; r < W; ++r) d[k * W + r] = src[r * ld + k];
      }
    }
    if (full * W < rows)
      pack_generic<float, W>(k_contig, X, ld, r0 + full * W, rows - full * W, k0, kc, dst + full * W * kc);
  }

  // 6 x NR tile, two vectors per row: 12 accumulators + 2 B vectors + 1 broadcast A (15 of the 16 ymm registers
  // with AVX2); per k, 12 FMAs against 2 loads + 6 broadcasts, which keeps both FMA pipes fed.
  static void kernel(int64_t kc, const float* __restrict a, const float* __restrict b, float* c, int64_t ldc,
                     float alpha, float beta) {
    using V = FloatVec;
    static_assert(NR == 2 * V::kLanes);
    // C is read (beta != 0) or written only after the k loop: start its lines on their way now.
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      for (int j = 0; j < NR; j += 16) __builtin_prefetch(c + i * ldc + j, 1, 3);
      __builtin_prefetch(c + i * ldc + NR - 1, 1, 3);
    }
    V::T acc[MR][2];
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = V::zero();
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; ++k) {
      const V::T b0 = V::load(b + k * NR), b1 = V::load(b + k * NR + V::kLanes);
#pragma GCC unroll 6
      for (int i = 0; i < MR; ++i) {
        const V::T ai = V::set1(a[k * MR + i]);
        acc[i][0] = V::fma(ai, b0, acc[i][0]);
        acc[i][1] = V::fma(ai, b1, acc[i][1]);
      }
    }
    const V::T va = V::set1(alpha);
    if (beta == 0.0f) {
#pragma GCC unroll 6
      for (int i = 0; i < MR; ++i) {
        V::storeu(c + i * ldc, V::mul(va, acc[i][0]));
        V::storeu(c + i * ldc + V::kLanes, V::mul(va, acc[i][1]));
      }
    } else {
      const V::T vb = V::set1(beta);
#pragma GCC unroll 6
      for (int i = 0; i < MR; ++i) {
        float* ci = c + i * ldc;
        V::storeu(ci, V::fma(vb, V::loadu(ci), V::mul(va, acc[i][0])));
        V::storeu(ci + V::kLanes, V::fma(vb, V::loadu(ci + V::kLanes), V::mul(va, acc[i][1])));
      }
    }
  }
};

#else

template <>
struct Config<float> : GenericConfig<float, 4, 16, 128, 256, 4096> {};

#endif

// Target size of the shared op(B) slab when all of K does not fit in twice this (it beat 8 MB on dw at M = 16384, and
// 1 MB was no better: docs/RESULTS.md, "Measurements behind design decisions").
constexpr int64_t kSlabBytes = 2 << 20;
// Below this many multiply-adds a call runs on one thread (fork/join would cost more than it saves).
constexpr double kMinFmasPerThread = 1 << 18;

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
std::atomic<int64_t> solo_until_ns{0}, solo_window_ns{0};
std::atomic<int> stalled_calls{0};

int64_t now_ns() { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count(); }

bool solo_now() { return now_ns() < solo_until_ns.load(std::memory_order_relaxed); }

Clock::duration thread_cpu_time() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

void note_idle(Clock::duration idle, Clock::duration span) {
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

template <class T>
bool has_epilogue(const Epilogue<T>& ep) {
  return ep.bias != nullptr || ep.act != Activation::None;
}

/// The activation part of the epilogue on mr x nr elements of C at c, act's out or act_of at offset `at` from C.
template <Activation A, class T>
void activation_epilogue(const Epilogue<T>& ep, T* c, int64_t ldc, int64_t at, int64_t mr, int64_t nr) {
  for (int64_t i = 0; i < mr; ++i) {
    T* row = c + i * ldc;
    if (ep.act_out) {
      T* out = ep.act_out + at + i * ldc;
#pragma omp simd
      for (int64_t j = 0; j < nr; ++j) out[j] = activation_of(A, row[j]);
    } else {
      const T* of = ep.act_of + at + i * ldc;
#pragma omp simd
      for (int64_t j = 0; j < nr; ++j) row[j] *= activation_grad_of(A, of[j]);
    }
  }
}

/// The epilogue of a product stored in bf16 (Bf16Out) on the mr x nr f32 results at c (row stride ldc), rows
/// [row, row + mr) and columns [col, col + nr) of the output: bias, act' scaling, the sum with what the output held,
/// one rounding each; act of the f32 value, rounded. Each step a vectorized pass over the row.
template <Activation A>
void bf16_out_epilogue_with(const Epilogue<float>& ep, float* c, int64_t ldc, int64_t row, int64_t col, int64_t mr,
                            int64_t nr) {
  const Bf16Out& o = *ep.out16;
  for (int64_t i = 0; i < mr; ++i) {
    float* r = c + i * ldc;
    const int64_t at = (row + i) * o.ld + col;
    if (ep.bias) {
      const float* b = ep.bias + col;
#pragma omp simd
      for (int64_t j = 0; j < nr; ++j) r[j] += b[j];
    }
    if constexpr (A != Activation::None) {
      if (o.act_of) {
        const bf16* of = o.act_of + at;
#pragma omp simd
        for (int64_t j = 0; j < nr; ++j) r[j] *= activation_grad_of(A, float(of[j]));
      }
    }
    if (o.accumulate) {
      const bf16* held = o.out + at;
#pragma omp simd
      for (int64_t j = 0; j < nr; ++j) r[j] += float(held[j]);
    }
    round_range(o.out + at, r, nr);
    if constexpr (A != Activation::None) {
      if (o.act_out) {
#pragma omp simd
        for (int64_t j = 0; j < nr; ++j) r[j] = activation_of(A, r[j]);
        round_range(o.act_out + at, r, nr);
      }
    }
  }
}

void bf16_out_epilogue(const Epilogue<float>& ep, float* c, int64_t ldc, int64_t row, int64_t col, int64_t mr,
                       int64_t nr) {
  switch (ep.act) {
    case Activation::Gelu: return bf16_out_epilogue_with<Activation::Gelu>(ep, c, ldc, row, col, mr, nr);
    case Activation::ReluSquared: return bf16_out_epilogue_with<Activation::ReluSquared>(ep, c, ldc, row, col, mr, nr);
    default: return bf16_out_epilogue_with<Activation::None>(ep, c, ldc, row, col, mr, nr);
  }
}

/// bf16_out_epilogue over a whole M x N product in f32 (row stride ldc), rows on the OpenMP threads.
void bf16_out_rows(const Epilogue<float>& ep, float* c, int64_t ldc, int64_t M, int64_t N) {
#pragma omp parallel for if (M * N >= kParallelGrain && !omp_in_parallel())
  for (int64_t i = 0; i < M; ++i) bf16_out_epilogue(ep, c + i * ldc, ldc, i, 0, 1, N);
}

/// The epilogue on the mr x nr elements of C at c, which is C + at, in columns [j, j + nr): bias, then activation.
template <class T>
void run_epilogue(const Epilogue<T>& ep, T* c, int64_t ldc, int64_t at, int64_t j, int64_t mr, int64_t nr) {
  if (ep.bias) {
    const T* b = ep.bias + j;
    for (int64_t i = 0; i < mr; ++i) {
      T* row = c + i * ldc;
#pragma omp simd
      for (int64_t jj = 0; jj < nr; ++jj) row[jj] += b[jj];
    }
  }
  if (ep.act == Activation::Gelu) activation_epilogue<Activation::Gelu>(ep, c, ldc, at, mr, nr);
  if (ep.act == Activation::ReluSquared) activation_epilogue<Activation::ReluSquared>(ep, c, ldc, at, mr, nr);
}

/// The row block of a product K deep: Cfg::MC, or Cfg::kLongKMC where a config has one and K spans 8 k blocks or
/// more (the weight gradients, K = tokens), where each packed op(B) panel pays to serve more row tiles.
template <class Cfg>
int64_t row_block(int64_t K) {
  if constexpr (requires { Cfg::kLongKMC; }) {
    if (K >= 8 * Cfg::KC) return Cfg::kLongKMC;
  }
  return Cfg::MC;
}

// Cfg: tile and block sizes, packing and micro-kernel. Packed (Cfg::Packed) is the element type of the packed
// operands: T itself (rounded to bf16 in place when `bf16`), or bf16 bits for the bf16 micro-kernels, whose packing
// pads each k block to Cfg::kpad(kc) with zeros. S is the operands' storage: T, or bf16 for the bf16 micro-kernels
// (packed as they lie, no rounding).
template <class Cfg, class T, class S = T>
void gemm_blocked(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const S* A, int64_t lda, const S* B,
                  int64_t ldb, T beta, T* C, int64_t ldc, int nt, bool bf16, const Epilogue<T>& ep) {
  static_assert(std::is_same_v<S, T> || !std::is_same_v<typename Cfg::Packed, T>,
                "bf16 storage is packed by the bf16 micro-kernels' packing only");
  using P = typename Cfg::Packed;
  constexpr int MR = Cfg::MR, NR = Cfg::NR;

  // Balanced blocks (e.g. K = 384 -> 2 x 192, not 256 + 128) in multiples of KU: 8 keeps the f32 packing transposes
  // full, 32 is an AMX tile's depth.
  const int64_t kc_blk = std::min(K, round_up(ceil_div(K, ceil_div(K, Cfg::KC)), Cfg::KU));
  const int64_t nc_blk = round_up(ceil_div(N, ceil_div(N, Cfg::NC)), NR);
  // K groups of equal size (all of K when it fits, see kSlabBytes).
  const int64_t kb_total = ceil_div(K, kc_blk);
  const int64_t kb_cap = K * nc_blk * int64_t(sizeof(P)) <= 2 * kSlabBytes
                             ? kb_total
                             : std::max<int64_t>(1, kSlabBytes / int64_t(sizeof(P)) / (kc_blk * nc_blk));
  const int64_t group_k = std::min(K, ceil_div(kb_total, ceil_div(kb_total, kb_cap)) * kc_blk);
  const bool to16 = ep.out16 != nullptr;
  if constexpr (std::is_same_v<T, float>) {
    if (to16 && group_k < K) {
      // K in several groups (K x N past the op(B) slab: weight gradients over many tokens, wide layers): C in f32,
      // then rounded. A buffer of this call's own, not kept, so a wide layer leaves no f32 product behind.
      std::vector<float> full(size_t(M * N));
      gemm_blocked<Cfg, T, S>(ta, tb, M, N, K, alpha, A, lda, B, ldb, T(0), full.data(), N, nt, bf16, Epilogue<T>{});
      return bf16_out_rows(ep, full.data(), N, M, N);
    }
  }
  // Row blocks: as many as MC requires, rounded up to a multiple of the thread count so the dynamic claiming ends
  // even (M = 1536: 12 blocks, not 11; M = 384: 4 x 96, not 3 x 128). Block rb covers MR-row tiles
  // [rb * tiles / rblocks, (rb + 1) * tiles / rblocks), so blocks differ by at most one tile.
  const int64_t tiles = ceil_div(M, MR);
  const int64_t rblocks = std::min(round_up(ceil_div(M, row_block<Cfg>(K)), nt), tiles);
  const int64_t mc_max = ceil_div(tiles, rblocks) * MR;
  std::vector<Segment> segs;
  int64_t total = 0;
  for (int64_t j0 = 0; j0 < N; j0 += nc_blk) {
    const int64_t nc = std::min(nc_blk, N - j0), panels = ceil_div(nc, NR);
    for (int64_t g0 = 0; g0 < K; g0 += group_k) {
      const int64_t gk = std::min(group_k, K - g0), kblocks = ceil_div(gk, kc_blk);
      // Whole k blocks per pack ticket when there are enough of them (rows of op(B) are then read once).
      const int64_t pchunks = std::min(panels, std::max<int64_t>(1, ceil_div(4 * nt, kblocks)));
      segs.push_back({total, total + kblocks * pchunks, true, j0, nc, g0, gk, pchunks});
      total = segs.back().end;
      // Split columns only when there are fewer row blocks than threads (each chunk re-packs its op(A) block).
      const int64_t cchunks = std::min(panels, ceil_div(nt, rblocks));
      segs.push_back({total, total + rblocks * cchunks, false, j0, nc, g0, gk, cchunks});
      total = segs.back().end;
    }
  }

  // One allocation: the shared op(B) slab, then one op(A) block per thread (page-aligned, plus slack for the
  // overlapping stores of the A packing). A k block takes kc_pad rows of the slab and of op(A) blocks.
  const int64_t kc_pad = Cfg::kpad(kc_blk);
  const int64_t b_elems = round_up(ceil_div(group_k, kc_blk) * kc_pad * nc_blk, 1024);
  const int64_t a_elems = round_up(mc_max * kc_pad + 64, 1024);
  P* const work = scratch<P>(b_elems + a_elems * nt);
  P* const bpack = work;
  // A product stored in bf16 (ep.out16) sums each compute ticket's block of C in the thread's own f32 block, rounded
  // into the output by the epilogue: no f32 C of the whole product.
  const int64_t c_elems = to16 ? round_up(mc_max * round_up(nc_blk, NR), 1024) : 0;
  T* const cwork = to16 ? scratch<T, 1>(c_elems * nt) : nullptr;
  std::atomic<int64_t> next{0};
  Progress progress;

  // op(A) block (row block rb, k block kb of the segment's group) and the source region its packing reads.
  auto a_block = [&](const Segment& sg, int64_t rb, int64_t kb, int64_t& i0, int64_t& mc, int64_t& k0,
                     int64_t& kc) {
    i0 = rb * tiles / rblocks * MR, mc = std::min(M, (rb + 1) * tiles / rblocks * MR) - i0;
    k0 = sg.g0 + kb * kc_blk, kc = std::min(kc_blk, sg.g0 + sg.gk - k0);
  };
  auto a_source = [&](const Segment& sg, int64_t rb, int64_t kb) {
    int64_t i0, mc, k0, kc;
    a_block(sg, rb, kb, i0, mc, k0, kc);
    const int64_t es = sizeof(S);
    return ta ? Prefetch(A + k0 * lda + i0, lda * es, mc * es, kc) : Prefetch(A + i0 * lda + k0, lda * es, kc * es, mc);
  };

  auto run_pack = [&](const Segment& sg, int64_t u) {
    const int64_t panels = ceil_div(sg.nc, NR), ncp = panels * NR;
    const int64_t kb = u / sg.chunks, c = u % sg.chunks;
    const int64_t q0 = panels * c / sg.chunks, q1 = panels * (c + 1) / sg.chunks;
    const int64_t k0 = sg.g0 + kb * kc_blk, kc = std::min(kc_blk, sg.g0 + sg.gk - k0);
    // Slab layout: k block kb at kb * kc_pad * ncp, panel p at p * kpad(kc) * NR in it.
    P* const dst = bpack + kb * kc_pad * ncp + q0 * Cfg::kpad(kc) * NR;
    Cfg::pack_b(tb, B, ldb, sg.j0 + q0 * NR, std::min(sg.nc, q1 * NR) - q0 * NR, k0, kc, dst);
    if constexpr (std::is_same_v<P, T>)
      if (bf16) round_packed_bf16(dst, (q1 - q0) * kc * NR);
  };

  // Compute ticket: C[row block, column chunk] += op(A) block @ slab over the group's k blocks. `after` is the
  // thread's next ticket in the same segment (or -1), whose first op(A) block is prefetched during the last k block.
  auto run_compute = [&](const Segment& sg, int64_t u, int64_t after, P* apack, T* cblock) {
    const int64_t panels = ceil_div(sg.nc, NR), ncp = panels * NR;
    const int64_t rb = u / sg.chunks, c = u % sg.chunks;
    const int64_t p0 = panels * c / sg.chunks, p1 = panels * (c + 1) / sg.chunks;
    const int64_t cld = to16 ? (p1 - p0) * NR : ldc;  // the row stride of the C the kernels write
    const int64_t kblocks = ceil_div(sg.gk, kc_blk);
    for (int64_t kb = 0; kb < kblocks; ++kb) {
      int64_t i0, mc, k0, kc;
      a_block(sg, rb, kb, i0, mc, k0, kc);
      Cfg::pack_a(!ta, A, lda, i0, mc, k0, kc, apack);
      if constexpr (std::is_same_v<P, T>)
        if (bf16) round_packed_bf16(apack, round_up(mc, MR) * kc);
      const int64_t kp = Cfg::kpad(kc);
      // Pull the next op(A) block's source into cache during this block's compute, so its packing does not stall
      // on DRAM with the FMA units idle (x and dy of the big shapes are 8-100 MB).
      Prefetch pf;
      if (kb + 1 < kblocks) pf = a_source(sg, rb, kb + 1);
      else if (after >= 0) pf = a_source(sg, after / sg.chunks, 0);
      const int64_t pf_step = ceil_div(pf.lines(), std::max<int64_t>(1, (p1 - p0) * ceil_div(mc, MR)));
      const T b_eff = k0 == 0 ? beta : T(1);
      // The epilogue runs on a tile when its last k block is added, while the tile is still in cache.
      const bool epilogue_now = k0 + kc == K && has_epilogue(ep) && !to16;
      const P* bblk = bpack + kb * kc_pad * ncp;
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t jj = p * NR, nr = std::min<int64_t>(NR, sg.nc - jj);
        const P* bp = bblk + p * kp * NR;
        for (int64_t ii = 0; ii < mc; ii += MR) {
          pf.step(pf_step);
          const int64_t mr = std::min<int64_t>(MR, mc - ii);
          T* cp = to16 ? cblock + ii * cld + (p - p0) * NR : C + (i0 + ii) * ldc + sg.j0 + jj;
          if (mr == MR && nr == NR) {
            Cfg::kernel(kp, apack + ii * kp, bp, cp, cld, alpha, b_eff);
          } else {
            // Edge tile: full-size product into a local tile, then merge only the valid part.
            alignas(64) T tile[MR * NR];
            Cfg::kernel(kp, apack + ii * kp, bp, tile, NR, T(1), T(0));
            for (int64_t i = 0; i < mr; ++i)
              for (int64_t j = 0; j < nr; ++j)
                cp[i * cld + j] = b_eff == T(0) ? alpha * tile[i * NR + j]
                                                : alpha * tile[i * NR + j] + b_eff * cp[i * cld + j];
          }
          if (epilogue_now) run_epilogue(ep, cp, ldc, (i0 + ii) * ldc + sg.j0 + jj, sg.j0 + jj, mr, nr);
        }
      }
    }
    // Stored in bf16: the ticket's whole block, once its last k block is in (a pass of its own: interleaved with the
    // tile products, tile by tile, it stalled them; docs/RESULTS.md).
    if constexpr (std::is_same_v<T, float>) {
      if (to16) {
        const int64_t i0 = rb * tiles / rblocks * MR, mc = std::min(M, (rb + 1) * tiles / rblocks * MR) - i0;
        bf16_out_epilogue(ep, cblock, cld, i0, sg.j0 + p0 * NR, mc, std::min(p1 * NR, sg.nc) - p0 * NR);
      }
    }
  };

  auto worker = [&](int tid) {
    [[maybe_unused]] const typename Cfg::ThreadScope scope;
    P* const apack = work + b_elems + a_elems * tid;
    T* const cblock = to16 ? cwork + c_elems * tid : nullptr;
    size_t s = 0;
    // Claim one ticket ahead, so a compute ticket knows which op(A) block to prefetch for.
    for (int64_t t = next.fetch_add(1); t < total;) {
      while (segs[s].end <= t) ++s;
      const Segment& sg = segs[s];
      progress.wait_for(sg.start);
      const int64_t t_next = next.fetch_add(1);
      if (sg.pack) {
        run_pack(sg, t - sg.start);
      } else {
        run_compute(sg, t - sg.start, t_next < sg.end ? t_next - sg.start : -1, apack, cblock);
      }
      progress.finish();
      t = t_next;
    }
  };

  if (nt == 1) {
    worker(0);
    return;
  }
  const Clock::time_point start = Clock::now();
  const Clock::duration cpu_start = thread_cpu_time();
  Clock::time_point caller_done;
#pragma omp parallel num_threads(nt)
  {
    worker(omp_get_thread_num());
    if (omp_get_thread_num() == 0) caller_done = Clock::now();
    // Leave only when all work is done, so libgomp's closing barrier never waits on a preempted thread's ticket.
    progress.wait_for(total);
  }
  const Clock::time_point end = Clock::now();
  // Off-CPU time of the caller (asleep waiting, or preempted), or its wait after running out of tickets.
  note_idle(std::max(end - caller_done, (end - start) - (thread_cpu_time() - cpu_start)), end - start);
}

/// A few rows of C (token-by-token decoding): packing B would cost more than the product, so each row is
/// computed straight from the operands, as dot products over contiguous rows of B (trans_b) or as sums of
/// scaled rows of B (!trans_b). Single-threaded: the work is a matrix-vector product per row.
template <class T>
void gemm_few_rows(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
                   const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  std::vector<T> a(static_cast<size_t>(K)), acc;
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t k = 0; k < K; ++k) a[size_t(k)] = trans_a ? A[k * lda + i] : A[i * lda + k];
    T* c = C + i * ldc;
    if (trans_b) {
      auto store = [&](int64_t j, T dot) { c[j] = alpha * dot + (beta == T(0) ? T(0) : beta * c[j]); };
      const T* ap = a.data();
      int64_t j = 0;
      for (; j + 4 <= N; j += 4) {  // four rows of B per pass over a: four independent sums
        const T *b0 = B + j * ldb, *b1 = b0 + ldb, *b2 = b1 + ldb, *b3 = b2 + ldb;
        T d0 = T(0), d1 = T(0), d2 = T(0), d3 = T(0);
#pragma omp simd reduction(+ : d0, d1, d2, d3)
        for (int64_t k = 0; k < K; ++k) {
          d0 += ap[k] * b0[k];
          d1 += ap[k] * b1[k];
          d2 += ap[k] * b2[k];
          d3 += ap[k] * b3[k];
        }
        store(j, d0), store(j + 1, d1), store(j + 2, d2), store(j + 3, d3);
      }
      for (; j < N; ++j) {
        const T* b = B + j * ldb;
        T dot = T(0);
#pragma omp simd reduction(+ : dot)
        for (int64_t k = 0; k < K; ++k) dot += ap[k] * b[k];
        store(j, dot);
      }
    } else {
      acc.assign(size_t(N), T(0));
      for (int64_t k = 0; k < K; ++k) {
        const T ak = a[size_t(k)];
        const T* b = B + k * ldb;
#pragma omp simd
        for (int64_t j = 0; j < N; ++j) acc[size_t(j)] += ak * b[j];
      }
      for (int64_t j = 0; j < N; ++j) c[j] = alpha * acc[size_t(j)] + (beta == T(0) ? T(0) : beta * c[j]);
    }
  }
}

constexpr int64_t kFewRows = 4;

template <class Cfg, class T, class S = T>
void gemm_with(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const S* A, int64_t lda,
               const S* B, int64_t ldb, T beta, T* C, int64_t ldc, bool bf16, const Epilogue<T>& ep = {}) {
  int nt = omp_in_parallel() || solo_now() ? 1 : omp_get_max_threads();
  const double fmas = double(M) * double(N) * double(K);
  nt = int(std::clamp<double>(fmas / kMinFmasPerThread, 1.0, double(std::max(nt, 1))));
  gemm_blocked<Cfg, T, S>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, nt, bf16, ep);
}

/// bf16 products on `kernel`, known to be available.
void run_bf16(Bf16Kernel kernel, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
              const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
              const Epilogue<float>& ep = {}) {
#if defined(TINYGPT_GEMM_BF16)
  if (kernel == Bf16Kernel::Amx)
    return gemm_with<bf16_isa::AmxConfig>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, true, ep);
  if (kernel == Bf16Kernel::Avx512Bf16)
    return gemm_with<bf16_isa::Avx512Bf16Config>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, true, ep);
#endif
  gemm_with<Config<float>>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, true, ep);
}


/// C = beta * C for an empty product (K == 0 or alpha == 0), beta == 0 overwriting (BLAS semantics); false when the
/// product is not empty.
template <class T>
bool scale_only(int64_t M, int64_t N, int64_t K, T alpha, T beta, T* C, int64_t ldc) {
  if (K > 0 && alpha != T(0)) return false;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == T(0) ? T(0) : beta * C[i * ldc + j];
  return true;
}

}  // namespace

void gemm_bf16(Bf16Kernel kernel, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const auto& have = bf16_kernels_available();
  if (std::find(have.begin(), have.end(), kernel) == have.end())
    throw Error(std::string("gemm_bf16: this CPU cannot run the ") + bf16_kernel_name(kernel) + " kernel");
  if (M <= 0 || N <= 0 || scale_only(M, N, K, alpha, beta, C, ldc)) return;
  run_bf16(kernel, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
          const T* B, int64_t ldb, T beta, T* C, int64_t ldc, bool bf16, const Epilogue<T>& ep) {
  if (ep.act != Activation::None && ((ep.act_out == nullptr) == (ep.act_of == nullptr) || beta != T(0)))
    throw Error("gemm: an activation epilogue needs one of act_out and act_of, and beta 0");
  if (M <= 0 || N <= 0) return;
  if (scale_only(M, N, K, alpha, beta, C, ldc)) {
    if (has_epilogue(ep)) run_epilogue(ep, C, ldc, 0, 0, M, N);
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    if (bf16) return run_bf16(bf16_kernel(), trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ep);
  }
  if (M <= kFewRows && !bf16) {
    gemm_few_rows<T>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (has_epilogue(ep)) run_epilogue(ep, C, ldc, 0, 0, M, N);
    return;
  }
  gemm_with<Config<T>>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bf16, ep);
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
                          float, float*, int64_t, bool, const Epilogue<float>&);

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
          const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc, const Epilogue<float>& ep) {
  if (ep.out16 != nullptr) {
    const Bf16Out& o = *ep.out16;
    if (alpha != 1.0f || beta != 0.0f || ep.act_out || ep.act_of ||
        (ep.act != Activation::None && (o.act_out == nullptr) == (o.act_of == nullptr)))
      throw Error("gemm: a product stored in bf16 takes alpha 1, beta 0, and an activation's array in out16");
    if (M <= 0 || N <= 0) return;
    if (K <= 0 || M <= kFewRows) {  // the paths without blocks: C in f32 (scratch), then rounded
      float* const full = scratch<float, 2>(M * N);
      Epilogue<float> none;
      gemm(trans_a, trans_b, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, full, N, none);
      return bf16_out_rows(ep, full, N, M, N);
    }
  } else if (ep.act != Activation::None && ((ep.act_out == nullptr) == (ep.act_of == nullptr) || beta != 0.0f)) {
    throw Error("gemm: an activation epilogue needs one of act_out and act_of, and beta 0");
  }
  if (M <= 0 || N <= 0) return;
  if (scale_only(M, N, K, alpha, beta, C, ldc)) {
    if (has_epilogue(ep)) run_epilogue(ep, C, ldc, 0, 0, M, N);
    return;
  }
#if defined(TINYGPT_GEMM_BF16)
  const Bf16Kernel kernel = bf16_kernel();
  if (kernel == Bf16Kernel::Amx)
    return gemm_with<bf16_isa::AmxConfig, float, bf16>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
                                                        true, ep);
  if (kernel == Bf16Kernel::Avx512Bf16)
    return gemm_with<bf16_isa::Avx512Bf16Config, float, bf16>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta,
                                                               C, ldc, true, ep);
#endif
  // The f32 units: the operands widened (exactly) into f32 copies of the spans the product reads.
  auto widened = [](const bf16* X, int64_t rows, int64_t cols, int64_t ld) {
    const int64_t span = (rows - 1) * ld + cols;
    std::vector<float> w(static_cast<size_t>(span));
#pragma omp parallel for simd if (span >= (int64_t(1) << 16))
    for (int64_t i = 0; i < span; ++i) w[size_t(i)] = float(X[i]);
    return w;
  };
  const std::vector<float> a = trans_a ? widened(A, K, M, lda) : widened(A, M, K, lda);
  const std::vector<float> b = trans_b ? widened(B, N, K, ldb) : widened(B, K, N, ldb);
  if (ep.out16 != nullptr) {
    return gemm_with<Config<float>>(trans_a, trans_b, M, N, K, alpha, a.data(), lda, b.data(), ldb, beta, C, ldc, false,
                                    ep);
  }
  gemm<float>(trans_a, trans_b, M, N, K, alpha, a.data(), lda, b.data(), ldb, beta, C, ldc, false, ep);
}
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t, const double*,
                           int64_t, double, double*, int64_t, bool, const Epilogue<double>&);

}  // namespace tinygpt::cpu

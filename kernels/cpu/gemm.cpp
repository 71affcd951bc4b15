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
#include "kernels/cpu/gemm_configs.h"
#include "kernels/cpu/gemm_epilogue.h"
#include "kernels/cpu/gemm_schedule.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

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

using namespace gemm_detail;  // NOLINT: this file's own pieces

/// The row block of a product K deep: Cfg::MC, or Cfg::kLongKMC where a config has one and K spans 8 k blocks or
/// more (the weight gradients, K = tokens), where each packed op(B) panel pays to serve more row tiles.
template <class Cfg>
int64_t row_block(int64_t K) {
  if constexpr (requires { Cfg::kLongKMC; }) {
    if (K >= 8 * Cfg::KC) return Cfg::kLongKMC;
  }
  return Cfg::MC;
}

/// The operands of one product: C = alpha op(A) op(B) + beta C, op(A) M x K, op(B) K x N, and the epilogue.
template <class T, class S>
struct Operands {
  bool ta, tb;
  int64_t M, N, K;
  T alpha;
  const S* A;
  int64_t lda;
  const S* B;
  int64_t ldb;
  T beta;
  T* C;
  int64_t ldc;
  bool bf16;  // round T operands to bf16 as packed
  const Epilogue<T>& ep;
};

// Cfg: tile and block sizes, packing and micro-kernel. Packed (Cfg::Packed) is the element type of the packed
// operands: T itself (rounded to bf16 in place when `bf16`), or bf16 bits for the bf16 micro-kernels, whose packing
// pads each k block to Cfg::kpad(kc) with zeros. S is the operands' storage: T, or bf16 for the bf16 micro-kernels
// (packed as they lie, no rounding).
/// One call of the blocked GEMM on nt threads: the constructor plans it (block sizes, the tickets, the buffers),
/// run() has the threads claim the tickets: pack tickets fill the shared op(B) slab, compute tickets multiply an
/// op(A) block into a block of C.
template <class Cfg, class T, class S>
class Blocked {
  static_assert(std::is_same_v<S, T> || !std::is_same_v<typename Cfg::Packed, T>,
                "bf16 storage is packed by the bf16 micro-kernels' packing only");
  using P = typename Cfg::Packed;
  static constexpr int MR = Cfg::MR, NR = Cfg::NR;

 public:
  /// The K blocks, in multiples of KU: 8 keeps the f32 packing transposes full, 32 is an AMX tile's depth; balanced
  /// (e.g. K = 384 -> 2 x 192, not 256 + 128).
  static int64_t k_block(int64_t K) { return std::min(K, round_up(ceil_div(K, ceil_div(K, Cfg::KC)), Cfg::KU)); }
  static int64_t n_block(int64_t N) { return round_up(ceil_div(N, ceil_div(N, Cfg::NC)), NR); }
  /// K in groups of equal size: all of K when it fits the op(B) slab, see kSlabBytes.
  static int64_t k_group(int64_t K, int64_t N) {
    const int64_t kc_blk = k_block(K), nc_blk = n_block(N), kb_total = ceil_div(K, kc_blk);
    const int64_t kb_cap = K * nc_blk * int64_t(sizeof(P)) <= 2 * kSlabBytes
                               ? kb_total
                               : std::max<int64_t>(1, kSlabBytes / int64_t(sizeof(P)) / (kc_blk * nc_blk));
    return std::min(K, ceil_div(kb_total, ceil_div(kb_total, kb_cap)) * kc_blk);
  }

  Blocked(const Operands<T, S>& op, int nt)
      : o_(op),
        nt_(nt),
        kc_blk_(k_block(op.K)),
        nc_blk_(n_block(op.N)),
        group_k_(k_group(op.K, op.N)),
        to16_(op.ep.out16 != nullptr) {
    // Row blocks: as many as MC requires, rounded up to a multiple of the thread count so the dynamic claiming ends
    // even (M = 1536: 12 blocks, not 11; M = 384: 4 x 96, not 3 x 128). Block rb covers MR-row tiles
    // [rb * tiles / rblocks, (rb + 1) * tiles / rblocks), so blocks differ by at most one tile.
    tiles_ = ceil_div(o_.M, MR);
    rblocks_ = std::min(round_up(ceil_div(o_.M, row_block<Cfg>(o_.K)), nt), tiles_);
    const int64_t mc_max = ceil_div(tiles_, rblocks_) * MR;
    plan_segments();
    // One allocation: the shared op(B) slab, then one op(A) block per thread (page-aligned, plus slack for the
    // overlapping stores of the A packing). A k block takes kc_pad rows of the slab and of op(A) blocks.
    kc_pad_ = Cfg::kpad(kc_blk_);
    b_elems_ = round_up(ceil_div(group_k_, kc_blk_) * kc_pad_ * nc_blk_, 1024);
    a_elems_ = round_up(mc_max * kc_pad_ + 64, 1024);
    work_ = scratch<P>(b_elems_ + a_elems_ * nt);
    // A product stored in bf16 (ep.out16) sums each compute ticket's block of C in the thread's own f32 block,
    // rounded into the output by the epilogue: no f32 C of the whole product.
    c_elems_ = to16_ ? round_up(mc_max * round_up(nc_blk_, NR), 1024) : 0;
    cwork_ = to16_ ? scratch<T, 1>(c_elems_ * nt) : nullptr;
  }

  void run() {
    if (nt_ == 1) return worker(0);
    const Clock::time_point start = Clock::now();
    const Clock::duration cpu_start = thread_cpu_time();
    Clock::time_point caller_done;
#pragma omp parallel num_threads(nt_)
    {
      worker(omp_get_thread_num());
      if (omp_get_thread_num() == 0) caller_done = Clock::now();
      // Leave only when all work is done, so libgomp's closing barrier never waits on a preempted thread's ticket.
      progress_.wait_for(total_);
    }
    const Clock::time_point end = Clock::now();
    // Off-CPU time of the caller (asleep waiting, or preempted), or its wait after running out of tickets.
    note_idle(std::max(end - caller_done, (end - start) - (thread_cpu_time() - cpu_start)), end - start);
  }

 private:
  /// For each (N block, K group): a segment of pack tickets, then one of compute tickets.
  void plan_segments() {
    for (int64_t j0 = 0; j0 < o_.N; j0 += nc_blk_) {
      const int64_t nc = std::min(nc_blk_, o_.N - j0), panels = ceil_div(nc, NR);
      for (int64_t g0 = 0; g0 < o_.K; g0 += group_k_) {
        const int64_t gk = std::min(group_k_, o_.K - g0), kblocks = ceil_div(gk, kc_blk_);
        // Whole k blocks per pack ticket when there are enough of them (rows of op(B) are then read once).
        const int64_t pchunks = std::min(panels, std::max<int64_t>(1, ceil_div(4 * nt_, kblocks)));
        segs_.push_back({total_, total_ + kblocks * pchunks, true, j0, nc, g0, gk, pchunks});
        total_ = segs_.back().end;
        // Split columns only when there are fewer row blocks than threads (each chunk re-packs its op(A) block).
        const int64_t cchunks = std::min(panels, ceil_div(nt_, rblocks_));
        segs_.push_back({total_, total_ + rblocks_ * cchunks, false, j0, nc, g0, gk, cchunks});
        total_ = segs_.back().end;
      }
    }
  }

  /// op(A) block (row block rb, k block kb of the segment's group): rows [i0, i0 + mc), k [k0, k0 + kc).
  void a_block(const Segment& sg, int64_t rb, int64_t kb, int64_t& i0, int64_t& mc, int64_t& k0, int64_t& kc) const {
    i0 = rb * tiles_ / rblocks_ * MR, mc = std::min(o_.M, (rb + 1) * tiles_ / rblocks_ * MR) - i0;
    k0 = sg.g0 + kb * kc_blk_, kc = std::min(kc_blk_, sg.g0 + sg.gk - k0);
  }
  /// The source region an op(A) block's packing reads.
  Prefetch a_source(const Segment& sg, int64_t rb, int64_t kb) const {
    int64_t i0, mc, k0, kc;
    a_block(sg, rb, kb, i0, mc, k0, kc);
    const int64_t es = sizeof(S);
    return o_.ta ? Prefetch(o_.A + k0 * o_.lda + i0, o_.lda * es, mc * es, kc)
                 : Prefetch(o_.A + i0 * o_.lda + k0, o_.lda * es, kc * es, mc);
  }

  void pack(const Segment& sg, int64_t u) {
    const int64_t panels = ceil_div(sg.nc, NR), ncp = panels * NR;
    const int64_t kb = u / sg.chunks, c = u % sg.chunks;
    const int64_t q0 = panels * c / sg.chunks, q1 = panels * (c + 1) / sg.chunks;
    const int64_t k0 = sg.g0 + kb * kc_blk_, kc = std::min(kc_blk_, sg.g0 + sg.gk - k0);
    // Slab layout: k block kb at kb * kc_pad * ncp, panel p at p * kpad(kc) * NR in it.
    P* const dst = work_ + kb * kc_pad_ * ncp + q0 * Cfg::kpad(kc) * NR;
    Cfg::pack_b(o_.tb, o_.B, o_.ldb, sg.j0 + q0 * NR, std::min(sg.nc, q1 * NR) - q0 * NR, k0, kc, dst);
    if constexpr (std::is_same_v<P, T>)
      if (o_.bf16) round_packed_bf16(dst, (q1 - q0) * kc * NR);
  }

  /// Compute ticket: C[row block, column chunk] += op(A) block @ slab over the group's k blocks. `after` is the
  /// thread's next ticket in the same segment (or -1), whose first op(A) block is prefetched during the last k block.
  void compute(const Segment& sg, int64_t u, int64_t after, P* apack, T* cblock) {
    const int64_t panels = ceil_div(sg.nc, NR);
    const int64_t rb = u / sg.chunks, c = u % sg.chunks;
    const int64_t p0 = panels * c / sg.chunks, p1 = panels * (c + 1) / sg.chunks;
    const int64_t kblocks = ceil_div(sg.gk, kc_blk_);
    for (int64_t kb = 0; kb < kblocks; ++kb) {
      int64_t i0, mc, k0, kc;
      a_block(sg, rb, kb, i0, mc, k0, kc);
      if (!direct_a_) Cfg::pack_a(!o_.ta, o_.A, o_.lda, i0, mc, k0, kc, apack);
      if constexpr (std::is_same_v<P, T>)
        if (o_.bf16) round_packed_bf16(apack, round_up(mc, MR) * kc);
      // Pull the next op(A) block's source into cache during this block's compute, so its packing does not stall
      // on DRAM with the FMA units idle (x and dy of the big shapes are 8-100 MB).
      Prefetch pf;
      if (kb + 1 < kblocks)
        pf = a_source(sg, rb, kb + 1);
      else if (after >= 0)
        pf = a_source(sg, after / sg.chunks, 0);
      multiply(sg, kb, i0, mc, k0, kc, p0, p1, apack, cblock, pf);
    }
    // Stored in bf16: the ticket's whole block, once its last k block is in (a pass of its own: interleaved with the
    // tile products, tile by tile, it stalled them; docs/RESULTS.md).
    if constexpr (std::is_same_v<T, float>) {
      if (to16_) {
        const int64_t i0 = rb * tiles_ / rblocks_ * MR, mc = std::min(o_.M, (rb + 1) * tiles_ / rblocks_ * MR) - i0;
        bf16_out_epilogue(o_.ep, cblock, (p1 - p0) * NR, i0, sg.j0 + p0 * NR, mc, std::min(p1 * NR, sg.nc) - p0 * NR);
      }
    }
  }

  /// The micro-kernel over panels [p0, p1) of k block kb and the packed op(A) block (rows i0 .. i0 + mc), stepping
  /// the prefetch of the next op(A) block as it goes.
  void multiply(const Segment& sg, int64_t kb, int64_t i0, int64_t mc, int64_t k0, int64_t kc, int64_t p0, int64_t p1,
                const P* apack, T* cblock, Prefetch& pf) const {
    const int64_t ncp = ceil_div(sg.nc, NR) * NR, kp = Cfg::kpad(kc);
    const int64_t cld = to16_ ? (p1 - p0) * NR : o_.ldc;  // the row stride of the C the kernels write
    const int64_t pf_step = ceil_div(pf.lines(), std::max<int64_t>(1, (p1 - p0) * ceil_div(mc, MR)));
    const T b_eff = k0 == 0 ? o_.beta : T(1);
    // The epilogue runs on a tile when its last k block is added, while the tile is still in cache.
    const bool epilogue_now = k0 + kc == o_.K && has_epilogue(o_.ep) && !to16_;
    const P* bblk = work_ + kb * kc_pad_ * ncp;
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t jj = p * NR, nr = std::min<int64_t>(NR, sg.nc - jj);
      const P* bp = bblk + p * kp * NR;
      for (int64_t ii = 0; ii < mc; ii += MR) {
        pf.step(pf_step);
        const int64_t mr = std::min<int64_t>(MR, mc - ii);
        T* cp = to16_ ? cblock + ii * cld + (p - p0) * NR : o_.C + (i0 + ii) * o_.ldc + sg.j0 + jj;
        if (mr == MR && nr == NR) {
          tile_product(kp, apack + ii * kp, i0 + ii, k0, bp, cp, cld, o_.alpha, b_eff);
        } else {
          // Edge tile: full-size product into a local tile, then merge only the valid part.
          alignas(64) T tile[MR * NR];
          tile_product(kp, apack + ii * kp, i0 + ii, k0, bp, tile, NR, T(1), T(0));
          for (int64_t i = 0; i < mr; ++i)
            for (int64_t j = 0; j < nr; ++j)
              cp[i * cld + j] =
                  b_eff == T(0) ? o_.alpha * tile[i * NR + j] : o_.alpha * tile[i * NR + j] + b_eff * cp[i * cld + j];
        }
        if (epilogue_now) run_epilogue(o_.ep, cp, o_.ldc, (i0 + ii) * o_.ldc + sg.j0 + jj, sg.j0 + jj, mr, nr);
      }
    }
  }

  /// One micro-kernel call: on the packed op(A) panel, or, reading op(A) where it lies (direct_a_), on rows
  /// [row, row + MR) from column k0.
  void tile_product(int64_t kp, const P* apanel, int64_t row, int64_t k0, const P* bp, T* c, int64_t ldc, T alpha,
                    T beta) const {
    if constexpr (requires { Cfg::kernel_rows; } && std::is_same_v<S, bf16>) {
      if (direct_a_) {
        const auto* a = reinterpret_cast<const uint16_t*>(o_.A + row * o_.lda + k0);
        return Cfg::kernel_rows(kp, a, o_.lda, bp, c, ldc, alpha, beta);
      }
    }
    Cfg::kernel(kp, apanel, bp, c, ldc, alpha, beta);
  }

  /// Whether op(A) is read where it lies instead of packed: a kernel that can (AVX512-BF16 broadcasts A's pairs one by
  /// one, so a row of bf16 storage with k contiguous is its packed panel already), every tile full height (M a
  /// multiple of MR) and every k block a whole number of pairs (K even: no padding to read past a row).
  bool read_a_in_place() const {
    if constexpr (requires { Cfg::kernel_rows; } && std::is_same_v<S, bf16>) {
      return !o_.ta && o_.M % MR == 0 && o_.K % 2 == 0 && Cfg::kpad(kc_blk_) == kc_blk_;
    }
    return false;
  }

  void worker(int tid) {
    [[maybe_unused]] const typename Cfg::ThreadScope scope;
    P* const apack = work_ + b_elems_ + a_elems_ * tid;
    T* const cblock = to16_ ? cwork_ + c_elems_ * tid : nullptr;
    size_t s = 0;
    // Claim one ticket ahead, so a compute ticket knows which op(A) block to prefetch for.
    for (int64_t t = next_.fetch_add(1); t < total_;) {
      while (segs_[s].end <= t) ++s;
      const Segment& sg = segs_[s];
      progress_.wait_for(sg.start);
      const int64_t t_next = next_.fetch_add(1);
      if (sg.pack) {
        pack(sg, t - sg.start);
      } else {
        compute(sg, t - sg.start, t_next < sg.end ? t_next - sg.start : -1, apack, cblock);
      }
      progress_.finish();
      t = t_next;
    }
  }

  const Operands<T, S>& o_;
  const int nt_;
  const int64_t kc_blk_, nc_blk_, group_k_;
  const bool to16_;
  const bool direct_a_ = read_a_in_place();
  int64_t tiles_ = 0, rblocks_ = 0, kc_pad_ = 0, b_elems_ = 0, a_elems_ = 0, c_elems_ = 0, total_ = 0;
  std::vector<Segment> segs_;
  P* work_ = nullptr;   // the op(B) slab, then the threads' op(A) blocks
  T* cwork_ = nullptr;  // the threads' f32 blocks of C (bf16 output)
  std::atomic<int64_t> next_{0};
  Progress progress_;
};

template <class Cfg, class T, class S = T>
void gemm_blocked(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const S* A, int64_t lda, const S* B,
                  int64_t ldb, T beta, T* C, int64_t ldc, int nt, bool bf16, const Epilogue<T>& ep) {
  if constexpr (std::is_same_v<T, float>) {
    if (ep.out16 != nullptr && Blocked<Cfg, T, S>::k_group(K, N) < K) {
      // All of K fits the op(B) slab for columns this narrow: the product in column blocks of that width, each
      // stored in bf16 tile by tile as usual (the 49,152 logits of K = 576 in blocks of 3,616 columns, not K in two
      // groups through f32: 580 -> 820 GFLOP/s on AVX512-BF16).
      const int64_t fit = 2 * kSlabBytes / (K * int64_t(sizeof(typename Cfg::Packed))) / Cfg::NR * Cfg::NR;
      if (fit >= kMinSlabColumns) {
        for (int64_t j0 = 0; j0 < N; j0 += fit) {
          const int64_t nb = std::min(fit, N - j0);
          const Bf16Out& o = *ep.out16;
          const Bf16Out part{o.out + j0, o.ld, o.accumulate, o.act_out ? o.act_out + j0 : nullptr,
                             o.act_of ? o.act_of + j0 : nullptr};
          Epilogue<T> e = ep;
          e.bias = ep.bias ? ep.bias + j0 : nullptr;
          e.out16 = &part;
          gemm_blocked<Cfg, T, S>(ta, tb, M, nb, K, alpha, A, lda, tb ? B + j0 * ldb : B + j0, ldb, beta, C, ldc, nt,
                                  bf16, e);
        }
        return;
      }
      // K in several groups (K x N past the op(B) slab: weight gradients over many tokens, wide layers, the
      // classifier's logits): C in f32, then rounded, a block of C at a time through the calling thread's kept
      // scratch of at most kF32BlockBytes. A fresh buffer of all of C cost its zero-fill and its page faults every
      // call (the 49,152 logits of 2,048 tokens: 400 MB a call), and a kept one would hold a wide layer's product.
      // Each element sums its k blocks in the same order however C is cut (one C += tile per k block), so the bits
      // are those of the whole product.
      using B16 = Blocked<Cfg, T, S>;
      const int64_t cols = std::min(N, B16::n_block(N));
      const int64_t rows =
          std::min<int64_t>(M, std::max<int64_t>(Cfg::MR, kF32BlockBytes / 4 / cols / Cfg::MR * Cfg::MR));
      float* const block = scratch<float, 3>(rows * cols);
      for (int64_t j0 = 0; j0 < N; j0 += cols) {
        for (int64_t i0 = 0; i0 < M; i0 += rows) {
          const int64_t mb = std::min(rows, M - i0), nb = std::min(cols, N - j0);
          const S* a = ta ? A + i0 : A + i0 * lda;
          const S* b = tb ? B + j0 * ldb : B + j0;
          gemm_blocked<Cfg, T, S>(ta, tb, mb, nb, K, alpha, a, lda, b, ldb, T(0), block, nb, nt, bf16, Epilogue<T>{});
          bf16_out_rows(ep, block, nb, mb, nb, i0, j0);
        }
      }
      return;
    }
  }
  const Operands<T, S> op{ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bf16, ep};
  Blocked<Cfg, T, S>(op, nt).run();
}

/// An operand of a few-rows product as the product takes it: bf16 widened (exact); f32 rounded to bf16 first where
/// the product is bf16's (`round`), so f32 operands rounded and the same values stored in bf16 give the same bits.
template <class T, class S>
inline T operand(S x, bool round) {
  if constexpr (std::is_same_v<S, bf16>) {
    return float(x);
  } else {
    return round ? T(round_bf16(float(x))) : x;
  }
}

/// One row of C from the row `a` (operands already) and rows j0 .. j0 + R of B (trans_b): dot products in kLanes
/// independent lanes over k, the lanes summed in a fixed order, so each element's arithmetic is the same whatever
/// rows are computed beside it or on which thread.
template <int R, class T, class S>
void dot_rows(const T* a, const S* B, int64_t ldb, int64_t j0, int64_t K, bool round, T alpha, T beta, T* c) {
  constexpr int kLanes = std::is_same_v<T, float> ? 16 : 8;
  T lanes[R][kLanes] = {};
  const S* b[R];
  for (int r = 0; r < R; ++r) b[r] = B + (j0 + r) * ldb;
  int64_t k = 0;
  for (; k + kLanes <= K; k += kLanes) {
    for (int r = 0; r < R; ++r) {
#pragma omp simd
      for (int l = 0; l < kLanes; ++l) lanes[r][l] += a[k + l] * operand<T>(b[r][k + l], round);
    }
  }
  for (int r = 0; r < R; ++r) {
    T tail = T(0);
    for (int64_t kk = k; kk < K; ++kk) tail += a[kk] * operand<T>(b[r][kk], round);
    for (int w = kLanes / 2; w > 0; w /= 2) {
      for (int l = 0; l < w; ++l) lanes[r][l] += lanes[r][l + w];
    }
    const T dot = lanes[r][0] + tail;
    T& out = c[j0 + r];
    out = alpha * dot + (beta == T(0) ? T(0) : beta * out);
  }
}

/// One row of C of a few-rows product with op(B) = B^T on AVX512-BF16 (dot_rows_dpbf16) where the products are bf16's
/// and bf16_kernel() is a bf16 unit: `a` holds the row's operands (bf16 values); B in bf16 as stored, or in f32
/// rounded row by row as the other kernels round it, so both storages give the same bits. False where not taken.
template <class T, class S>
bool dpbf16_rows(const T* a, int64_t N, int64_t K, T alpha, const S* B, int64_t ldb, T beta, T* c, bool round, int nt) {
#if defined(TINYGPT_GEMM_BF16)
  if constexpr (std::is_same_v<T, float>) {
    if (!round || !bf16_decode_unit()) return false;  // vdpbf16ps where the CPU has it (kernels/device.h)
    const int64_t kpad = bf16_isa::round_up(K, 32);
    std::vector<uint16_t> a16(size_t(kpad), 0);
    for (int64_t k = 0; k < K; ++k) a16[size_t(k)] = bf16_bits_of(a[k]);  // exact: a holds bf16 values
    const int64_t groups = N / 4;
    if constexpr (std::is_same_v<S, bf16>) {
      const auto* b = reinterpret_cast<const uint16_t*>(B);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
      for (int64_t g = 0; g < groups; ++g) bf16_isa::dot_rows_dpbf16<4>(a16.data(), b, ldb, 4 * g, K, alpha, beta, c);
      for (int64_t j = 4 * groups; j < N; ++j) bf16_isa::dot_rows_dpbf16<1>(a16.data(), b, ldb, j, K, alpha, beta, c);
    } else {
#pragma omp parallel num_threads(nt) if (nt > 1)
      {
        std::vector<uint16_t> rows(size_t(4 * kpad));
#pragma omp for schedule(static)
        for (int64_t g = 0; g <= groups; ++g) {
          const int64_t j0 = 4 * g, n = std::min<int64_t>(4, N - j0);
          for (int64_t r = 0; r < n; ++r) bf16_isa::round_row_bf16(B + (j0 + r) * ldb, K, rows.data() + r * kpad);
          if (n == 4) {
            bf16_isa::dot_rows_dpbf16<4>(a16.data(), rows.data(), kpad, 0, K, alpha, beta, c + j0);
          } else {
            for (int64_t r = 0; r < n; ++r)
              bf16_isa::dot_rows_dpbf16<1>(a16.data(), rows.data(), kpad, r, K, alpha, beta, c + j0);
          }
        }
      }
    }
    return true;
  }
#endif
  (void)a, (void)N, (void)K, (void)alpha, (void)B, (void)ldb, (void)beta, (void)c, (void)round, (void)nt;
  return false;
}

/// A few rows of C (token-by-token decoding): packing B would cost more than the product, so each row is
/// computed straight from the operands (B in f32, or in bf16 as stored: half the bytes a decoding step reads), as
/// dot products over contiguous rows of B (trans_b) or as sums of scaled rows of B (!trans_b). The columns of C are
/// split between the threads (a matrix-vector product is bound by reading B, which one core cannot do at the
/// memory's speed); each element is computed the same way on any split.
template <class T, class S>
void gemm_few_rows(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const S* A, int64_t lda,
                   const S* B, int64_t ldb, T beta, T* C, int64_t ldc, bool round) {
  const int max_threads = omp_in_parallel() || solo_now() ? 1 : omp_get_max_threads();
  const int nt =
      int(std::clamp<double>(double(N) * double(K) / kMinFmasPerThread, 1.0, double(std::max(max_threads, 1))));
  std::vector<T> a(static_cast<size_t>(K));
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t k = 0; k < K; ++k) a[size_t(k)] = operand<T>(trans_a ? A[k * lda + i] : A[i * lda + k], round);
    T* c = C + i * ldc;
    if (trans_b && dpbf16_rows<T, S>(a.data(), N, K, alpha, B, ldb, beta, c, round, nt)) continue;
    if (trans_b) {
      const int64_t groups = N / 4;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
      for (int64_t g = 0; g < groups; ++g) dot_rows<4>(a.data(), B, ldb, 4 * g, K, round, alpha, beta, c);
      for (int64_t j = 4 * groups; j < N; ++j) dot_rows<1>(a.data(), B, ldb, j, K, round, alpha, beta, c);
    } else {
      constexpr int64_t kChunk = 64;  // columns a thread owns
      const int64_t chunks = (N + kChunk - 1) / kChunk;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
      for (int64_t q = 0; q < chunks; ++q) {
        const int64_t j0 = q * kChunk, j1 = std::min(N, j0 + kChunk);
        T acc[kChunk] = {};
        for (int64_t k = 0; k < K; ++k) {
          const T ak = a[size_t(k)];
          const S* b = B + k * ldb;
#pragma omp simd
          for (int64_t j = j0; j < j1; ++j) acc[j - j0] += ak * operand<T>(b[j], round);
        }
        for (int64_t j = j0; j < j1; ++j) c[j] = alpha * acc[j - j0] + (beta == T(0) ? T(0) : beta * c[j]);
      }
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
    return gemm_with<bf16_isa::Avx512Bf16Config>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, true,
                                                 ep);
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
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
          int64_t ldb, T beta, T* C, int64_t ldc, bool bf16, const Epilogue<T>& ep) {
  if (ep.act != Activation::None && ((ep.act_out == nullptr) == (ep.act_of == nullptr) || beta != T(0)))
    throw Error("gemm: an activation epilogue needs one of act_out and act_of, and beta 0");
  if (M <= 0 || N <= 0) return;
  if (scale_only(M, N, K, alpha, beta, C, ldc)) {
    if (has_epilogue(ep)) run_epilogue(ep, C, ldc, 0, 0, M, N);
    return;
  }
  if (M <= kFewRows) {  // bf16 products too: the operands rounded as they are read
    gemm_few_rows<T, T>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bf16);
    if (has_epilogue(ep)) run_epilogue(ep, C, ldc, 0, 0, M, N);
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    if (bf16) return run_bf16(bf16_kernel(), trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ep);
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
  if (M <= kFewRows) {  // decoding: B read as stored, in bf16, by every kernel choice alike
    gemm_few_rows<float, bf16>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, true);
    if (has_epilogue(ep)) run_epilogue(ep, C, ldc, 0, 0, M, N);
    return;
  }
#if defined(TINYGPT_GEMM_BF16)
  const Bf16Kernel kernel = bf16_kernel();
  if (kernel == Bf16Kernel::Amx)
    return gemm_with<bf16_isa::AmxConfig, float, bf16>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
                                                       true, ep);
  if (kernel == Bf16Kernel::Avx512Bf16)
    return gemm_with<bf16_isa::Avx512Bf16Config, float, bf16>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C,
                                                              ldc, true, ep);
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

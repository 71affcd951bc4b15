// Flash attention forward on bf16 storage, in FlashAttention-2's structure: q, k and v are bf16 in memory and
// reach the tensor cores as they are (no f32 read, no rounding on the way), the output is bf16 and the logsumexp
// f32. The lean case only: head dims 64 and 128 exactly, causal or not, grouped-query heads, dropout, any strides that
// keep rows on 16-byte boundaries; no mask, padding or score modifier (flash_bf16_takes in kernels/attention.h says
// which calls; the others run the f32-tensor kernels of flash_mma.cuh on widened copies). Dropout multiplies P by the
// mask of kernels/dropout_hash.h after the row sums (as the f32 kernels do): P V in the forward, dP's factor in dS
// and dV's P in the backward.
//
// A block of 4 warps owns 64 query rows, a warp 16 of them. Q's tile is copied into shared memory once and its
// A fragments kept in registers for the whole row of key tiles (EP/16 x 4 registers). K and V tiles of 64 keys are
// double-buffered: while the block computes on one pair, cp.async streams the next into the other. Fragments come
// out of shared memory by ldmatrix (.trans for V, whose reduction index, the key, runs down its rows), four 8x8
// matrices an instruction. Tiles are stored row-major with each 16-byte chunk c of row r at c ^ (r % 8), so the 8
// rows an ldmatrix phase reads hit 8 different bank groups, and the cp.async writes stay whole 16-byte chunks.
// P stays in registers as the A operand of P V (the accumulator layout of two 16x8 blocks is the A layout of one
// 16x16 block). The online softmax runs in base 2 with the scale folded into one FMA a score; each lane keeps
// partial row sums, summed over the quad once at the end. Causal: key tiles past the block's last row are never
// loaded, and only tiles crossing the diagonal (or the sequence's end) are masked element by element.
//
// Written as a __device__ body over the primitives of mma.cuh, so tests/emulated_cuda.h runs the same source on
// the CPU (tests/test_flash_mma_emulated.cpp checks it against a double reference).
#pragma once

#include <cstdint>

#include "kernels/bf16.h"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/flash_mma.cuh"

namespace tinygpt::cuda::flash_bf16 {

constexpr int kRows = 64;  // query rows of a block: 4 warps x 16
constexpr int kCols = 64;  // keys a tile
constexpr int kThreads = 128;

/// Bytes of a tile of `rows` rows of EP bf16.
template <int EP>
constexpr int tile_bytes(int rows) {
  return rows * EP * 2;
}

/// Q (MT x 64 rows), then two stages of K and V.
template <int EP, int MT = 1>
constexpr int forward_smem_bytes() {
  return tile_bytes<EP>(MT * kRows) + 4 * tile_bytes<EP>(kCols);
}

/// Byte offset of 16-byte chunk c (features 8c .. 8c+7) of row r in a swizzled tile.
template <int EP>
__device__ __forceinline__ int chunk_at(int r, int c) {
  return r * (EP * 2) + ((c ^ (r & 7)) << 4);
}

/// Issues the cp.async copies of rows r0 .. r0+R-1 of (b, head) of a strided bf16 operand into a swizzled tile;
/// rows at or past n are zero-filled (their source is not read).
template <int R, int EP>
__device__ __forceinline__ void copy_tile(unsigned char* tile, const bf16* base, const int64_t* stride, int64_t b,
                                          int64_t head, int64_t r0, int64_t n) {
  constexpr int kChunks = EP / 8;
  static_assert(R * kChunks % kThreads == 0, "whole rounds of 16-byte copies");
#pragma unroll
  for (int i = 0; i < R * kChunks / kThreads; ++i) {
    const int idx = i * kThreads + int(threadIdx.x), r = idx / kChunks, c = idx % kChunks;
    const bool in = r0 + r < n;
    const bf16* src = in ? at(base, stride, b, head, r0 + r) + 8 * c : base;
    cp_async16(tile + chunk_at<EP>(r, c), src, in ? 16 : 0);
  }
}

using flash_mma::quad_max;  // max and sum over the 4 lanes that hold one fragment row
using flash_mma::quad_sum;

/// The lanes' rows and ldmatrix addressing of the forward, shared by its steps: warp w owns rows 16w + 64mt.
struct ForwardLanes {
  int lane, warp_row, gr, tc;
  int lrow_a, lchunk_a;  // ldmatrix row and chunk of this lane for A (Q) and the .trans B (V): down the rows first
  int lrow_k, lchunk_k;  // and for the non-transposed B (K): across first
  __device__ __forceinline__ ForwardLanes()
      : lane(int(threadIdx.x % 32)),
        warp_row(16 * int(threadIdx.x / 32)),
        gr(lane / 4),
        tc(lane % 4),
        lrow_a((lane & 7) + 8 * ((lane >> 3) & 1)),
        lchunk_a(lane >> 4),
        lrow_k((lane & 7) + 8 * (lane >> 4)),
        lchunk_k((lane >> 3) & 1) {}
  __device__ __forceinline__ int row0(int mt) const { return warp_row + kRows * mt; }
};

/// sc = Q K^T for one key tile (raw products): Q's fragments from qf (kQRegs) or from shared memory at each k step.
template <int EP, int MT, bool kQRegs, int QK>
__device__ __forceinline__ void forward_scores(float (&sc)[MT][kCols / 8][4], uint32_t (&qf)[MT][QK][4],
                                               const unsigned char* Qs, const unsigned char* Ks,
                                               const ForwardLanes& ln) {
#pragma unroll
  for (int kk = 0; kk < EP / 16; ++kk) {
    const int qk = kQRegs ? kk : 0;
    if constexpr (!kQRegs) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        ldmatrix_x4(qf[mt][0], Qs + chunk_at<EP>(ln.row0(mt) + ln.lrow_a, 2 * kk + ln.lchunk_a));
    }
#pragma unroll
    for (int jp = 0; jp < kCols / 16; ++jp) {
      uint32_t kb[4];
      ldmatrix_x4(kb, Ks + chunk_at<EP>(16 * jp + ln.lrow_k, 2 * kk + ln.lchunk_k));
      const uint32_t b0[2] = {kb[0], kb[1]}, b1[2] = {kb[2], kb[3]};
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_bf16(sc[mt][2 * jp], qf[mt][qk], b0);
        mma_bf16(sc[mt][2 * jp + 1], qf[mt][qk], b1);
      }
    }
  }
}

/// The online softmax over one key tile of scores (base 2 after sl2; -inf where hidden, only in tiles that cross the
/// diagonal or the sequence's end): new running max m, row sums l (before dropout), O rescaled, and sc turned into
/// the dropped probabilities.
template <int EP, int MT>
__device__ __forceinline__ void forward_softmax(float (&sc)[MT][kCols / 8][4], float (&m)[MT][2], float (&l)[MT][2],
                                                float (&o)[MT][EP / 8][4], const DropoutRow (&drop)[MT][2],
                                                const AttentionGeom& g, int64_t t0, int64_t s0, float sl2,
                                                float keep_scale, const ForwardLanes& ln) {
  if (s0 + kCols > causal_end(g, t0)) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < kCols / 8; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int64_t t = t0 + ln.row0(mt) + ln.gr + 8 * (i / 2), s = s0 + 8 * j + 2 * ln.tc + i % 2;
          sc[mt][j][i] = s < causal_end(g, t) ? sc[mt][j][i] * sl2 : -INFINITY;
        }
  } else {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < kCols / 8; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) sc[mt][j][i] *= sl2;
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float mx = m[mt][half];
#pragma unroll
      for (int j = 0; j < kCols / 8; ++j) mx = fmaxf(mx, fmaxf(sc[mt][j][2 * half], sc[mt][j][2 * half + 1]));
      const float m_new = quad_max(mx);
      const float m_sub = m_new == -INFINITY ? 0.0f : m_new;  // a row that sees nothing yet: exp2(-inf - 0) = 0
      const float alpha = exp2f(m[mt][half] - m_sub);
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kCols / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = sc[mt][j][2 * half + e];
          x = exp2f(x - m_sub);
          sum += x;  // the softmax's sum: before dropout
          x *= dropout_factor(g, drop[mt][half], keep_scale, s0 + 8 * j + 2 * ln.tc + e);
        }
      }
      l[mt][half] = l[mt][half] * alpha + sum;
      m[mt][half] = m_new;
#pragma unroll
      for (int d = 0; d < EP / 8; ++d) {
        o[mt][d][2 * half] *= alpha;
        o[mt][d][2 * half + 1] *= alpha;
      }
    }
  }
}

/// O += P V: P's A fragments from the score registers, V's B fragments by ldmatrix.trans.
template <int EP, int MT>
__device__ __forceinline__ void forward_pv(float (&o)[MT][EP / 8][4], const float (&sc)[MT][kCols / 8][4],
                                           const unsigned char* Vs, const ForwardLanes& ln) {
#pragma unroll
  for (int kk = 0; kk < kCols / 16; ++kk) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      a[mt][0] = pack_bf16(sc[mt][2 * kk][0], sc[mt][2 * kk][1]);
      a[mt][1] = pack_bf16(sc[mt][2 * kk][2], sc[mt][2 * kk][3]);
      a[mt][2] = pack_bf16(sc[mt][2 * kk + 1][0], sc[mt][2 * kk + 1][1]);
      a[mt][3] = pack_bf16(sc[mt][2 * kk + 1][2], sc[mt][2 * kk + 1][3]);
    }
#pragma unroll
    for (int dp = 0; dp < EP / 16; ++dp) {
      uint32_t vb[4];
      ldmatrix_x4_trans(vb, Vs + chunk_at<EP>(16 * kk + ln.lrow_a, 2 * dp + ln.lchunk_a));
      const uint32_t b0[2] = {vb[0], vb[1]}, b1[2] = {vb[2], vb[3]};
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_bf16(o[mt][2 * dp], a[mt], b0);
        mma_bf16(o[mt][2 * dp + 1], a[mt], b1);
      }
    }
  }
}

/// The block's output rows O / l (bf16) and their logsumexp.
template <int EP, int MT>
__device__ __forceinline__ void forward_store(bf16* out, float* lse, const float (&o)[MT][EP / 8][4],
                                              const float (&m)[MT][2], const float (&l)[MT][2], const AttentionGeom& g,
                                              int64_t b, int64_t h, int64_t t0, const ForwardLanes& ln) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float sum = quad_sum(l[mt][half]);
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      const int64_t t = t0 + ln.row0(mt) + ln.gr + 8 * half;
      if (t >= g.T) continue;
      bf16* row = at(out, g.o_stride, b, h, t);
#pragma unroll
      for (int d = 0; d < EP / 8; ++d) {
        *reinterpret_cast<uint32_t*>(row + 8 * d + 2 * ln.tc) =
            pack_bf16(o[mt][d][2 * half] * inv, o[mt][d][2 * half + 1] * inv);
      }
      if (ln.tc == 0) {
        lse[(b * g.NH + h) * g.T + t] = sum > 0.0f ? m[mt][half] * 0.6931471805599453f + logf(sum) : -INFINITY;
      }
    }
  }
}

/// Output rows and logsumexp of one block of MT x 64 queries: blockIdx.x = b * NH + h, query tiles in reverse order
/// (blockIdx.y = 0 is the last, longest causal tile, so it starts first). Warp w owns rows 16w + 64mt, mt < MT: with
/// MT = 2 (FlashAttention-2's 128-row blocks) each K and V fragment read from shared memory serves two row tiles
/// (a 64-key step reads 20 KB of shared memory for 32 rows instead of 32 KB), for twice the registers of O and the
/// scores. kQRegs: Q's fragments held in registers for the whole row of key tiles, or read from shared memory at
/// each k step (always with two row tiles; at head dim 128 it spares the registers ptxas otherwise spills).
template <int EP, int MT = 1, bool kQRegs = MT == 1>
__device__ void forward_body(unsigned char* smem, bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                             const AttentionGeom& g) {
  constexpr int R = MT * kRows;
  unsigned char* Qs = smem;
  unsigned char* stage[2][2] = {{Qs + tile_bytes<EP>(R), Qs + tile_bytes<EP>(R) + tile_bytes<EP>(kCols)},
                                {Qs + tile_bytes<EP>(R) + 2 * tile_bytes<EP>(kCols),
                                 Qs + tile_bytes<EP>(R) + 3 * tile_bytes<EP>(kCols)}};  // [stage][K, V]
  const int64_t h = blockIdx.x % g.NH, b = blockIdx.x / g.NH, kvh = h / (g.NH / g.NKV);
  const int64_t t0 = int64_t(gridDim.y - 1 - blockIdx.y) * R;
  const ForwardLanes ln;

  const int64_t s_end = key_end(g, min64(t0 + R, g.T) - 1);
  const int tiles = int((s_end + kCols - 1) / kCols);
  copy_tile<R, EP>(Qs, q, g.q_stride, b, h, t0, g.T);
  if (tiles > 0) {
    copy_tile<kCols, EP>(stage[0][0], k, g.k_stride, b, kvh, 0, g.S);
    copy_tile<kCols, EP>(stage[0][1], v, g.v_stride, b, kvh, 0, g.S);
  }
  cp_async_commit();

  const float sl2 = float(g.scale) * 1.4426950408889634f;  // scores in base 2: exp(x * scale) = exp2(x * sl2)
  const float keep_scale = dropout_scale<float>(g.dropout_p);
  DropoutRow drop[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    drop[mt][0] = dropout_row(g, b, h, t0 + ln.row0(mt) + ln.gr);
    drop[mt][1] = dropout_row(g, b, h, t0 + ln.row0(mt) + ln.gr + 8);
  }
  // Q's A fragments: all of them in registers for the whole row of key tiles, or one k step's at a time, read again
  // from shared memory (with two row tiles the registers they would take spilled).
  static_assert(!kQRegs || MT == 1, "two row tiles read Q from shared memory");
  constexpr int QK = kQRegs ? EP / 16 : 1;
  uint32_t qf[MT][QK][4];
  float o[MT][EP / 8][4] = {};
  float m[MT][2], l[MT][2];  // l: this lane's part of the row sums
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;
  for (int it = 0; it < tiles; ++it) {
    const int64_t s0 = int64_t(it) * kCols;
    if (it + 1 < tiles) {  // the next pair streams into the other stage (freed by the barrier ending the last step)
      copy_tile<kCols, EP>(stage[(it + 1) & 1][0], k, g.k_stride, b, kvh, s0 + kCols, g.S);
      copy_tile<kCols, EP>(stage[(it + 1) & 1][1], v, g.v_stride, b, kvh, s0 + kCols, g.S);
    }
    cp_async_commit();
    cp_async_wait<1>();  // all but the group just issued: this step's K and V (and, at first, Q)
    __syncthreads();
    if (kQRegs && it == 0) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int kk = 0; kk < QK; ++kk)
          ldmatrix_x4(qf[mt][kk], Qs + chunk_at<EP>(ln.row0(mt) + ln.lrow_a, 2 * kk + ln.lchunk_a));
    }
    float sc[MT][kCols / 8][4] = {};
    forward_scores<EP, MT, kQRegs, QK>(sc, qf, Qs, stage[it & 1][0], ln);
    forward_softmax<EP, MT>(sc, m, l, o, drop, g, t0, s0, sl2, keep_scale, ln);
    forward_pv<EP, MT>(o, sc, stage[it & 1][1], ln);
    __syncthreads();  // every warp is done with this stage before the next step's copies overwrite it
  }
  cp_async_wait<0>();  // the last (empty) group, or Q's when no key is visible
  forward_store<EP, MT>(out, lse, o, m, l, g, b, h, t0, ln);
}

// ---------------------------------------------------------------------------------------------------------------
// Backward, FlashAttention-2's: D = rowsum(dO * O) and dQ in one pass over each query tile's key tiles, then dK and
// dV in one pass over each key tile's query tiles (of every head of its group), P and dS recomputed from the
// logsumexp in both. No atomics: each gradient row is summed by one warp in a fixed order (deterministic). Every
// operand is a swizzled bf16 tile read by ldmatrix; a tile that is the B operand both as stored and transposed (Q
// and dO in the dK/dV pass, K in the dQ pass) is read both ways from the one copy.

/// Reads a 16 x 16 block as the A operand: rows r0 .. r0+15, features 16kk .. 16kk+15 of a swizzled tile.
template <int EP>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const unsigned char* tile, int r0, int kk, int lane) {
  ldmatrix_x4(a, tile + chunk_at<EP>(r0 + (lane & 7) + 8 * ((lane >> 3) & 1), 2 * kk + (lane >> 4)));
}

/// acc[N/8] += A x B^T for one warp, A a 16 x EP block (rows r0.. of tile `a`, or fragments given), B^T rows
/// 0 .. N-1 of tile `b` (N x EP, row-major): scores or dP.
template <int EP, int N>
__device__ __forceinline__ void dot_rows(float (&acc)[N / 8][4], const unsigned char* a, int r0, const unsigned char* b,
                                         int lane) {
#pragma unroll
  for (int kk = 0; kk < EP / 16; ++kk) {
    uint32_t af[4];
    load_a<EP>(af, a, r0, kk, lane);
#pragma unroll
    for (int jp = 0; jp < N / 16; ++jp) {
      uint32_t kb[4];
      ldmatrix_x4(kb, b + chunk_at<EP>(16 * jp + (lane & 7) + 8 * (lane >> 4), 2 * kk + ((lane >> 3) & 1)));
      const uint32_t b0[2] = {kb[0], kb[1]}, b1[2] = {kb[2], kb[3]};
      mma_bf16(acc[2 * jp], af, b0);
      mma_bf16(acc[2 * jp + 1], af, b1);
    }
  }
}

/// acc[EP/8] += P x B for one warp: P (16 x K) in accumulator registers, rounded to bf16 here; B rows 0 .. K-1 of
/// tile `b` (K x EP), read transposed.
template <int EP, int K>
__device__ __forceinline__ void accumulate_rows(float (&acc)[EP / 8][4], const float (&P)[K / 8][4],
                                                const unsigned char* b, int lane) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    const uint32_t a[4] = {pack_bf16(P[2 * kk][0], P[2 * kk][1]), pack_bf16(P[2 * kk][2], P[2 * kk][3]),
                           pack_bf16(P[2 * kk + 1][0], P[2 * kk + 1][1]),
                           pack_bf16(P[2 * kk + 1][2], P[2 * kk + 1][3])};
#pragma unroll
    for (int dp = 0; dp < EP / 16; ++dp) {
      uint32_t vb[4];
      ldmatrix_x4_trans(vb, b + chunk_at<EP>(16 * kk + (lane & 7) + 8 * ((lane >> 3) & 1), 2 * dp + (lane >> 4)));
      const uint32_t b0[2] = {vb[0], vb[1]}, b1[2] = {vb[2], vb[3]};
      mma_bf16(acc[2 * dp], a, b0);
      mma_bf16(acc[2 * dp + 1], a, b1);
    }
  }
}

/// Stores two adjacent gradient elements (x0, x1) into the bf16 pair at w, or adds them to it: each sum rounded once.
__device__ __forceinline__ void store_pair(uint32_t* w, float x0, float x1, bool add) {
  if (add) {
    const uint32_t old = *w;
    x0 += float_of_bf16_bits(uint16_t(old & 0xffffu));
    x1 += float_of_bf16_bits(uint16_t(old >> 16));
  }
  *w = pack_bf16(x0, x1);
}

/// Stores (or, unless g.grads_unwritten, adds into) rows r0 + row0 .. of a strided bf16 gradient: acc times `scale`,
/// rows at or past n skipped; each sum rounded once.
template <int EP>
__device__ __forceinline__ void store_grad(bf16* base, const int64_t* stride, int64_t b, int64_t head, int64_t r0,
                                           int64_t n, const float (&acc)[EP / 8][4], float scale, bool add, int row0,
                                           int lane) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t r = r0 + row0 + lane / 4 + 8 * half;
    if (r >= n) continue;
    bf16* row = at(base, stride, b, head, r);
#pragma unroll
    for (int d = 0; d < EP / 8; ++d) {
      store_pair(reinterpret_cast<uint32_t*>(row + 8 * d + 2 * (lane % 4)), acc[d][2 * half] * scale,
                 acc[d][2 * half + 1] * scale, add);
    }
  }
}

/// The logsumexp of row t in base 2, +inf for a row that sees no key (so every P of it is exp2(-inf) = 0).
__device__ __forceinline__ float lse_base2(float lse) {
  return lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
}

/// dQ pass: Q and dO, then two stages of K and V.
template <int EP>
constexpr int dq_smem_bytes() {
  return 2 * tile_bytes<EP>(kRows) + 4 * tile_bytes<EP>(kCols);
}

/// D = rowsum(dO * O) of the query tile at t0 (head h, batch b), in f32: two threads a row, each half of its
/// features in 16-byte loads, all in flight together (read one element at a time, these loads were where dQ's warps
/// stalled most: docs/RESULTS.md).
template <int EP>
__device__ __forceinline__ void tile_rowsum(float* D, const bf16* dout, const bf16* out, const AttentionGeom& g,
                                            int64_t b, int64_t h, int64_t t0) {
  constexpr int kLoads = EP / 16;  // 16-byte loads (8 bf16) per thread and operand
  const int r = int(threadIdx.x) / 2, e0 = (int(threadIdx.x) % 2) * (EP / 2);
  const int64_t t = t0 + r;
  float acc = 0.0f;
  if (t < g.T) {
    const uint4* o = reinterpret_cast<const uint4*>(at(out, g.o_stride, b, h, t) + e0);
    const uint4* d = reinterpret_cast<const uint4*>(at(dout, g.o_stride, b, h, t) + e0);
    uint4 ov[kLoads], dv[kLoads];
#pragma unroll
    for (int i = 0; i < kLoads; ++i) ov[i] = o[i], dv[i] = d[i];
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const uint32_t ow[4] = {ov[i].x, ov[i].y, ov[i].z, ov[i].w}, dw[4] = {dv[i].x, dv[i].y, dv[i].z, dv[i].w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        acc += float_of_bf16_bits(uint16_t(ow[w] & 0xffffu)) * float_of_bf16_bits(uint16_t(dw[w] & 0xffffu));
        acc += float_of_bf16_bits(uint16_t(ow[w] >> 16)) * float_of_bf16_bits(uint16_t(dw[w] >> 16));
      }
    }
  }
  acc += __shfl_xor_sync(0xffffffffu, acc, 1);
  if (t < g.T && e0 == 0) D[(b * g.NH + h) * g.T + t] = acc;
}

/// D and dQ of one query tile (blocks as the forward's): D = rowsum(dO * O) of its rows into D (f32, (B, NH, T)),
/// then, when dq is given, dQ = scale * sum over key tiles of dS K, dS = P * (dO V^T - D). Without dq, the tile's
/// rows of dq_acc (f32, (B, NH, T, EP)), when given, are zeroed for the dK/dV pass to add dQ into.
template <int EP>
__device__ void backward_dq_body(unsigned char* smem, bf16* dq, float* D, float* dq_acc, const bf16* dout,
                                 const bf16* out, const bf16* q, const bf16* k, const bf16* v, const float* lse,
                                 const AttentionGeom& g) {
  unsigned char* Qs = smem;
  unsigned char* dOs = Qs + tile_bytes<EP>(kRows);
  unsigned char* stage[2][2] = {{dOs + tile_bytes<EP>(kRows), dOs + tile_bytes<EP>(kRows) + tile_bytes<EP>(kCols)},
                                {dOs + tile_bytes<EP>(kRows) + 2 * tile_bytes<EP>(kCols),
                                 dOs + tile_bytes<EP>(kRows) + 3 * tile_bytes<EP>(kCols)}};  // [stage][K, V]
  const int64_t h = blockIdx.x % g.NH, b = blockIdx.x / g.NH, kvh = h / (g.NH / g.NKV);
  const int64_t t0 = int64_t(gridDim.y - 1 - blockIdx.y) * kRows;
  const int lane = int(threadIdx.x % 32), row0 = 16 * int(threadIdx.x / 32), gr = lane / 4, tc = lane % 4;

  tile_rowsum<EP>(D, dout, out, g, b, h, t0);
  if (dq == nullptr) {
    if (dq_acc != nullptr) {
      const int64_t rows = min64(kRows, g.T - t0);
      float4* acc = reinterpret_cast<float4*>(dq_acc + ((b * g.NH + h) * g.T + t0) * EP);
      for (int64_t i = threadIdx.x; i < rows * EP / 4; i += kThreads) acc[i] = float4{0.0f, 0.0f, 0.0f, 0.0f};
    }
    return;
  }
  __syncthreads();  // the tile's D rows are written before any warp reads them back below

  const int64_t s_end = key_end(g, min64(t0 + kRows, g.T) - 1);
  const int tiles = int((s_end + kCols - 1) / kCols);
  copy_tile<kRows, EP>(Qs, q, g.q_stride, b, h, t0, g.T);
  copy_tile<kRows, EP>(dOs, dout, g.o_stride, b, h, t0, g.T);
  if (tiles > 0) {
    copy_tile<kCols, EP>(stage[0][0], k, g.k_stride, b, kvh, 0, g.S);
    copy_tile<kCols, EP>(stage[0][1], v, g.v_stride, b, kvh, 0, g.S);
  }
  cp_async_commit();
  const float sl2 = float(g.scale) * 1.4426950408889634f, keep_scale = dropout_scale<float>(g.dropout_p);
  const DropoutRow drop[2] = {dropout_row(g, b, h, t0 + row0 + gr), dropout_row(g, b, h, t0 + row0 + gr + 8)};
  float lse2[2], Drow[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t t = t0 + row0 + gr + 8 * half;
    const int64_t idx = (b * g.NH + h) * g.T + t;
    lse2[half] = t < g.T ? lse_base2(lse[idx]) : INFINITY;
    Drow[half] = t < g.T ? D[idx] : 0.0f;
  }
  float acc[EP / 8][4] = {};
  for (int it = 0; it < tiles; ++it) {
    const int64_t s0 = int64_t(it) * kCols;
    if (it + 1 < tiles) {
      copy_tile<kCols, EP>(stage[(it + 1) & 1][0], k, g.k_stride, b, kvh, s0 + kCols, g.S);
      copy_tile<kCols, EP>(stage[(it + 1) & 1][1], v, g.v_stride, b, kvh, s0 + kCols, g.S);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const unsigned char* Ks = stage[it & 1][0];
    const unsigned char* Vs = stage[it & 1][1];
    float P[kCols / 8][4] = {}, dP[kCols / 8][4] = {};
    dot_rows<EP, kCols>(P, Qs, row0, Ks, lane);
    dot_rows<EP, kCols>(dP, dOs, row0, Vs, lane);
    const bool masked = s0 + kCols > causal_end(g, t0);
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t t = t0 + row0 + gr + 8 * (i / 2), s = s0 + 8 * j + 2 * tc + i % 2;
        const float p = !masked || s < causal_end(g, t) ? exp2f(P[j][i] * sl2 - lse2[i / 2]) : 0.0f;
        P[j][i] = p * (dP[j][i] * dropout_factor(g, drop[i / 2], keep_scale, s) - Drow[i / 2]);  // dS
      }
    }
    accumulate_rows<EP, kCols>(acc, P, Ks, lane);
    __syncthreads();
  }
  cp_async_wait<0>();
  store_grad<EP>(dq, g.q_stride, b, h, t0, g.T, acc, float(g.scale), !g.grads_unwritten, row0, lane);
}

/// Queries a step of the dK/dV pass: 32 at head dim 128, to stay within the registers.
template <int EP>
constexpr int dkdv_queries() {
  return EP > 64 ? 32 : 64;
}

/// dK/dV pass: K and V, then two stages of Q, dO, and the queries' logsumexp (base 2) and D.
template <int EP>
constexpr int dkdv_stage_bytes() {
  return 2 * tile_bytes<EP>(dkdv_queries<EP>()) + 8 * dkdv_queries<EP>();
}
/// The dS^T tile of the one-pass backward's steps (64 keys x the step's queries, bf16), when it has one.
template <int EP, bool kDq>
constexpr int dkdv_ds_bytes() {
  return kDq ? kRows * dkdv_queries<EP>() * 2 : 0;
}
/// K and V, the two stages, the dS^T tile (one pass) and the dropout rows of a step's queries.
template <int EP, bool kDq = false>
constexpr int dkdv_smem_bytes() {
  return 2 * tile_bytes<EP>(kRows) + 2 * dkdv_stage_bytes<EP>() + dkdv_ds_bytes<EP, kDq>() +
         dkdv_queries<EP>() * int(sizeof(DropoutRow));
}

/// Byte offset of 16-byte chunk c (queries 8c .. 8c+7) of key row r in the dS^T tile (rows of Q bf16): swizzled so
/// the 8 rows an ldmatrix phase reads hit 8 different 16-byte bank groups (at Q = 32 two rows share a 128-byte line).
template <int Q>
__device__ __forceinline__ int ds_at(int r, int c) {
  constexpr int kRowsPerLine = 64 / Q;
  return r * (Q * 2) + ((c ^ ((r / kRowsPerLine) & (Q / 8 - 1))) << 4);
}

/// One step's part of dQ in the one-pass backward: dq_acc[t0 + r] += (dS K)[r] for the step's Q queries (rows of
/// this head's dq_acc, at or past T skipped), dS read transposed from the step's dS^T tile and K from the key tile.
/// Warp w sums query rows 16 (w % (Q/16)) .. +15 and a 4/(Q/16)-th of the features, over all 64 keys.
template <int EP, int Q>
__device__ __forceinline__ void add_dq_part(float* dq_acc, int64_t t0, int64_t T, const unsigned char* dSs,
                                            const unsigned char* Ks, int lane) {
  constexpr int kGroups = Q / 16, W = EP * kGroups / 4;  // row groups; features a warp
  static_assert(kThreads / 32 % kGroups == 0 && W % 16 == 0, "whole 16-row groups and 16-feature blocks a warp");
  const int warp = int(threadIdx.x / 32), rg = warp % kGroups, f0 = warp / kGroups * W;
  float acc[W / 8][4] = {};
#pragma unroll
  for (int kk = 0; kk < kRows / 16; ++kk) {
    uint32_t a[4];  // dS (queries x keys) = the stored dS^T read transposed
    ldmatrix_x4_trans(a, dSs + ds_at<Q>(16 * kk + (lane & 7) + 8 * (lane >> 4), 2 * rg + ((lane >> 3) & 1)));
#pragma unroll
    for (int dp = 0; dp < W / 16; ++dp) {
      uint32_t kb[4];
      ldmatrix_x4_trans(kb,
                        Ks + chunk_at<EP>(16 * kk + (lane & 7) + 8 * ((lane >> 3) & 1), f0 / 8 + 2 * dp + (lane >> 4)));
      const uint32_t b0[2] = {kb[0], kb[1]}, b1[2] = {kb[2], kb[3]};
      mma_bf16(acc[2 * dp], a, b0);
      mma_bf16(acc[2 * dp + 1], a, b1);
    }
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t t = t0 + 16 * rg + lane / 4 + 8 * half;
    if (t >= T) continue;
    float* row = dq_acc + t * EP + f0 + 2 * (lane % 4);
#pragma unroll
    for (int d = 0; d < W / 8; ++d) atomic_add2(row + 8 * d, acc[d][2 * half], acc[d][2 * half + 1]);
  }
}

/// dK and dV of one key tile (blockIdx.x = b * NKV + kv head, blockIdx.y the tile), summed over the group's query
/// heads and every query that sees a key of it: dV = P^T dO, dK = scale * dS^T Q. Rows of the warp fragments are
/// keys, columns queries. With kDq (the one-pass backward), each step also adds its key tile's part of dQ, dS K,
/// into dq_acc (f32, (B, NH, T, EP), unscaled) with atomics: the warps' dS^T rows go through shared memory, so that
/// each warp sums a quarter of the step's dQ block over all 64 keys before adding it (FlashAttention-2's scheme).
/// The dK/dV pass's step, elementwise: from S^T (P) and dP^T of the block's key rows against the step's Q queries,
/// the dropped probabilities P^T (for dV) in P and dS^T in dP.
template <int Q>
__device__ __forceinline__ void probs_and_ds_transposed(float (&P)[Q / 8][4], float (&dP)[Q / 8][4],
                                                        const AttentionGeom& g, int64_t s0, int64_t t0,
                                                        const float* lse_s, const float* D_s, const DropoutRow* drop_s,
                                                        float sl2, float keep_scale) {
  const int lane = int(threadIdx.x % 32), row0 = 16 * int(threadIdx.x / 32), gr = lane / 4, tc = lane % 4;
  const bool masked = s0 + kRows > causal_end(g, t0);
#pragma unroll
  for (int j = 0; j < Q / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = 8 * j + 2 * tc + e % 2;  // the query within the step
      const int64_t s = s0 + row0 + gr + 8 * (e / 2), t = t0 + c;
      const float l2 = t < g.T ? lse_base2(lse_s[c]) : INFINITY;
      const float p = !masked || s < causal_end(g, t) ? exp2f(P[j][e] * sl2 - l2) : 0.0f;
      const float f = dropout_factor(g, drop_s[c], keep_scale, s);
      P[j][e] = p * f;                         // dropped P^T, for dV
      dP[j][e] = p * (dP[j][e] * f - D_s[c]);  // dS^T
    }
  }
}

/// One pass: this warp's 16 rows of dS^T into shared memory, rounded to bf16 as the dQ products read them.
template <int Q>
__device__ __forceinline__ void store_ds_rows(unsigned char* dSs, const float (&dP)[Q / 8][4]) {
  const int lane = int(threadIdx.x % 32), row0 = 16 * int(threadIdx.x / 32), gr = lane / 4, tc = lane % 4;
#pragma unroll
  for (int j = 0; j < Q / 8; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half)
      *reinterpret_cast<uint32_t*>(dSs + ds_at<Q>(row0 + gr + 8 * half, j) + 4 * tc) =
          pack_bf16(dP[j][2 * half], dP[j][2 * half + 1]);
}

template <int EP, bool kDq = false>
__device__ void backward_dkdv_body(unsigned char* smem, bf16* dk, bf16* dv, float* dq_acc, const bf16* dout,
                                   const bf16* q, const bf16* k, const bf16* v, const float* lse, const float* D,
                                   const AttentionGeom& g) {
  constexpr int Q = dkdv_queries<EP>();
  unsigned char* Ks = smem;
  unsigned char* Vs = Ks + tile_bytes<EP>(kRows);
  unsigned char* stages = Vs + tile_bytes<EP>(kRows);
  unsigned char* dSs = stages + 2 * dkdv_stage_bytes<EP>();                            // dS^T, one pass only
  DropoutRow* drop_s = reinterpret_cast<DropoutRow*>(dSs + dkdv_ds_bytes<EP, kDq>());  // the step's queries
  const int64_t b = blockIdx.x / g.NKV, kvh = blockIdx.x % g.NKV, group = g.NH / g.NKV;
  const int64_t s0 = int64_t(blockIdx.y) * kRows;
  const int lane = int(threadIdx.x % 32), row0 = 16 * int(threadIdx.x / 32);
  const float sl2 = float(g.scale) * 1.4426950408889634f, keep_scale = dropout_scale<float>(g.dropout_p);

  const int64_t t_first = query_begin(g, s0) / Q * Q, t_end = query_end(g, min64(s0 + kRows, g.S) - 1);
  const int64_t per_head = t_end > t_first ? (t_end - t_first + Q - 1) / Q : 0, steps = group * per_head;
  // Step i: query tile t_first + (i % per_head) * Q of head kvh * group + i / per_head, into stage i % 2.
  auto issue = [&](int64_t i) {
    unsigned char* st = stages + (i & 1) * dkdv_stage_bytes<EP>();
    const int64_t h = kvh * group + i / per_head, t0 = t_first + i % per_head * Q;
    copy_tile<Q, EP>(st, q, g.q_stride, b, h, t0, g.T);
    copy_tile<Q, EP>(st + tile_bytes<EP>(Q), dout, g.o_stride, b, h, t0, g.T);
    float* rows = reinterpret_cast<float*>(st + 2 * tile_bytes<EP>(Q));  // lse, then D
    for (int r = int(threadIdx.x); r < Q; r += kThreads) {
      const bool in = t0 + r < g.T;
      const int64_t idx = (b * g.NH + h) * g.T + t0 + r;
      cp_async4(rows + r, in ? lse + idx : lse, in ? 4 : 0);
      cp_async4(rows + Q + r, in ? D + idx : D, in ? 4 : 0);
    }
  };
  copy_tile<kRows, EP>(Ks, k, g.k_stride, b, kvh, s0, g.S);
  copy_tile<kRows, EP>(Vs, v, g.v_stride, b, kvh, s0, g.S);
  if (steps > 0) issue(0);
  cp_async_commit();

  float dk_acc[EP / 8][4] = {}, dv_acc[EP / 8][4] = {};
  for (int64_t i = 0; i < steps; ++i) {
    if (i + 1 < steps) issue(i + 1);
    cp_async_commit();
    if (g.dropout_p > 0.0f) {  // the step's query rows' dropout (the last step's readers passed its closing barrier)
      const int64_t h = kvh * group + i / per_head, t0 = t_first + i % per_head * Q;
      for (int r = int(threadIdx.x); r < Q; r += kThreads) drop_s[r] = dropout_row(g, b, h, t0 + r);
    }
    cp_async_wait<1>();
    __syncthreads();
    const unsigned char* st = stages + (i & 1) * dkdv_stage_bytes<EP>();
    const unsigned char* Qs = st;
    const unsigned char* dOs = st + tile_bytes<EP>(Q);
    const float* lse_s = reinterpret_cast<const float*>(st + 2 * tile_bytes<EP>(Q));
    const float* D_s = lse_s + Q;
    const int64_t t0 = t_first + i % per_head * Q;
    float P[Q / 8][4] = {}, dP[Q / 8][4] = {};
    dot_rows<EP, Q>(P, Ks, row0, Qs, lane);    // S^T
    dot_rows<EP, Q>(dP, Vs, row0, dOs, lane);  // dP^T = V dO^T
    probs_and_ds_transposed<Q>(P, dP, g, s0, t0, lse_s, D_s, drop_s, sl2, keep_scale);
    if constexpr (kDq) store_ds_rows<Q>(dSs, dP);  // this warp's 16 rows of dS^T, rounded as the products read them
    accumulate_rows<EP, Q>(dv_acc, P, dOs, lane);
    accumulate_rows<EP, Q>(dk_acc, dP, Qs, lane);
    if constexpr (kDq) {
      __syncthreads();  // every warp's dS^T rows are in shared memory
      add_dq_part<EP, Q>(dq_acc + (b * g.NH + kvh * group + i / per_head) * g.T * EP, t0, g.T, dSs, Ks, lane);
    }
    __syncthreads();
  }
  cp_async_wait<0>();
  const bool add = !g.grads_unwritten;
  if (dv) store_grad<EP>(dv, g.v_stride, b, kvh, s0, g.S, dv_acc, 1.0f, add, row0, lane);
  if (dk) store_grad<EP>(dk, g.k_stride, b, kvh, s0, g.S, dk_acc, float(g.scale), add, row0, lane);
}

/// The one-pass backward's last step: dq = scale * dq_acc, stored (g.grads_unwritten) or added to dq and rounded
/// once; thread i takes 8 features of one row (a 16-byte store).
template <int EP>
__device__ void dq_from_acc_body(bf16* dq, const float* dq_acc, const AttentionGeom& g) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, row = i / (EP / 8);
  if (row >= g.B * g.NH * g.T) return;
  const int64_t t = row % g.T, h = row / g.T % g.NH, b = row / g.T / g.NH;
  const int f = int(i % (EP / 8)) * 8;
  const float4* acc = reinterpret_cast<const float4*>(dq_acc + row * EP + f);
  const float4 a0 = acc[0], a1 = acc[1];
  const float x[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
  uint32_t* out = reinterpret_cast<uint32_t*>(at(dq, g.q_stride, b, h, t) + f);  // 4-byte aligned, as dq's rows are
  const float scale = float(g.scale);
#pragma unroll
  for (int j = 0; j < 4; ++j) store_pair(out + j, x[2 * j] * scale, x[2 * j + 1] * scale, !g.grads_unwritten);
}

}  // namespace tinygpt::cuda::flash_bf16

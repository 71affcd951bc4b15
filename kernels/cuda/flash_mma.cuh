// Flash attention on tensor cores, for two operand formats: bf16 (mma.m16n8k16) or tf32 (mma.m16n8k8) for every
// product (Q, K, V, dO, P, dS); f32 accumulation, online softmax, logsumexp and outputs. Same op, layout, masks
// and dropout as the f32 kernels in attention.cu (kernels/attention.h); inputs and gradients stay f32 in memory
// and are rounded to the operand format as tiles are loaded into shared memory.
//
// Written as __device__ bodies over the primitives of mma.cuh, so the same source runs on the GPU
// (attention.cu wraps them in kernels) and on the CPU under tests/emulated_cuda.h, which checks the fragment
// bookkeeping on machines without a GPU.
//
// Layout. A block has 4 warps; warp w owns rows 16w .. 16w+15 of a 64-row tile (queries in the forward and
// dQ kernels, keys in the dK/dV kernel). Scores for 64 columns live in registers as 8 accumulator fragments
// (16 x 8 each). A probability or dS tile goes back into the next product as the A operand straight from
// those registers (FlashAttention-2's trick: for bf16 the accumulator layout of two adjacent 16x8 blocks is the A
// layout of one 16x16 block; for tf32 a lane needs columns t and t+4 where it holds 2t and 2t+1, which eight
// shuffles per 16x8 block fetch), so P and dS never touch shared memory.
//
// Shared memory holds tiles as 32-bit words (two bf16 features, or one tf32), rows padded by 4 words so the
// fragment loads of a warp hit 32 different banks; counted in words, both formats load fragments the same way.
// Operands read down a column (V in O = P V; Q and dO in dK = dS^T Q and dV = P^T dO; K in dQ = dS K) are also
// stored transposed, written while loading; in those tiles word w of row e sits at w ^ ((e / 8) % 8) (swizzled),
// because the loading lanes write one column of eight rows 8 apart, which would otherwise share 4 banks.
//
// Each body is built twice (kMods): with the score modifiers' per-element code (kernels/score_mods.h), and without it
// for calls that have none, where it would be dead weight: inlined into every element of the unrolled tiles it made
// the kernels 28-33 thousand instructions long, far past the instruction cache (H200: half the stalls of the
// forward were instruction fetches), and without it (and with the 32-bit dropout hash) they are 7-12 thousand (sm_90,
// bf16, head dim 64).
//
// Each tile is loaded with synchronous loads between two barriers. Builds that streamed the next tile into a
// shared-memory stage with cp.async (FlashAttention-2's pipelining, over these f32 rows) were slower on every shape
// measured (H100, docs/RESULTS.md, "One GPU") and were removed; the kernels on bf16 storage (flash_bf16.cuh) stream
// their bf16 tiles with cp.async instead.
//
// Backward, deterministic as the f32 one: D = rowsum(dO * O) first (attention.cu); one block per key tile
// keeps dK and dV in registers over the group's heads and all queries; one block per query tile keeps dQ.
// No atomics. For head dim 128 the dK/dV kernel takes 32 queries per step to stay within 255 registers.
#pragma once

#include <cstdint>

#include "kernels/cuda/attention_common.cuh"

namespace tinygpt::cuda::flash_mma {

constexpr int kRows = 64;  // rows of a block's own tile: 4 warps x 16
constexpr int kCols = 64;  // keys per step in the forward and dQ kernels
constexpr int kThreads = 128;

/// bf16 operands: two features per 32-bit word, 16 features per mma.
struct Bf16 {
  static constexpr int kPerWord = 2;
  static constexpr const char* kName = "bf16";
  /// Two consecutive features of a row, into the word at w.
  __device__ static __forceinline__ void store(uint32_t* w, float f0, float f1) { w[0] = pack_bf16(f0, f1); }
  __device__ static __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    mma_bf16(d, a, b);
  }
  /// The A operand of k-step kk (columns 16kk ..) from accumulator fragments (P[j] = columns 8j .. 8j+7).
  template <int N>
  __device__ static __forceinline__ void a_from_acc(uint32_t (&a)[4], const float (&P)[N][4], int kk) {
    a[0] = pack_bf16(P[2 * kk][0], P[2 * kk][1]);
    a[1] = pack_bf16(P[2 * kk][2], P[2 * kk][3]);
    a[2] = pack_bf16(P[2 * kk + 1][0], P[2 * kk + 1][1]);
    a[3] = pack_bf16(P[2 * kk + 1][2], P[2 * kk + 1][3]);
  }
};

/// tf32 operands: one feature per word, 8 features per mma.
struct Tf32 {
  static constexpr int kPerWord = 1;
  static constexpr const char* kName = "tf32";
  /// Two consecutive features of a row, into the words at w and w + 1.
  __device__ static __forceinline__ void store(uint32_t* w, float f0, float f1) {
    w[0] = to_tf32(f0);
    w[1] = to_tf32(f1);
  }
  __device__ static __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    mma_tf32(d, a, b);
  }
  /// Lane (g, t) needs P(g, 8kk + t) and P(g, 8kk + t + 4) (and rows g + 8): elements t % 2 of lanes 4g + t/2
  /// and 4g + 2 + t/2.
  template <int N>
  __device__ static __forceinline__ void a_from_acc(uint32_t (&a)[4], const float (&P)[N][4], int kk) {
    const int lane = int(threadIdx.x % 32), src = (lane & ~3) | ((lane & 3) >> 1);
    const bool odd = lane & 1;
#pragma unroll
    for (int i = 0; i < 2; ++i) {  // i = 0: row g (elements 0, 1); i = 1: row g + 8 (elements 2, 3)
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {  // columns t, then t + 4
        const float x0 = __shfl_sync(0xffffffffu, P[kk][2 * i], src + 2 * hi);
        const float x1 = __shfl_sync(0xffffffffu, P[kk][2 * i + 1], src + 2 * hi);
        a[i + 2 * hi] = to_tf32(odd ? x1 : x0);
      }
    }
  }
};

/// Words per row of a row-major tile of `features` operands (padded by 4 words).
template <class Op>
constexpr int row_words(int features) {
  return features / Op::kPerWord + 4;
}

/// Position of word w of row `row` in a transposed (swizzled) tile: w moves within its aligned group of 8.
__device__ __forceinline__ int swizzled(int row, int w) { return w ^ ((row >> 3) & 7); }

/// Query columns per step of the dK/dV kernel.
constexpr int dkdv_queries(int EP) { return EP > 64 ? 32 : 64; }

struct Lane {
  int row0;  // first row of this warp in the block's tile
  int g;     // lane / 4: fragment row (and row + 8)
  int t;     // lane % 4: fragment columns 2t, 2t + 1
};

__device__ __forceinline__ Lane lane_pos() {
  const int lane = int(threadIdx.x % 32);
  return {16 * int(threadIdx.x / 32), lane / 4, lane % 4};
}

/// Stores step (r, e) of an operand tile: rows r, r+1 x features e .. e+3 of x, rounded to the operand format,
/// row-major into `rows` (R x row_words<Op>(EP) words) and/or transposed into `cols` (EP x row_words<Op>(R) words).
template <class Op, int R, int EP>
__device__ __forceinline__ void store_step(uint32_t* rows, uint32_t* cols, int r, int e, const float (&x)[2][4]) {
  constexpr int kWords = 2 / Op::kPerWord;  // words that two features (or rows) take
  if (rows) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      uint32_t* row = rows + (r + i) * row_words<Op>(EP) + e / Op::kPerWord;
      Op::store(row, x[i][0], x[i][1]);
      Op::store(row + kWords, x[i][2], x[i][3]);
    }
  }
  if (cols) {
#pragma unroll
    for (int f = 0; f < 4; ++f) {
      uint32_t words[2];
      Op::store(words, x[0][f], x[1][f]);
#pragma unroll
      for (int w = 0; w < kWords; ++w)
        cols[(e + f) * row_words<Op>(R) + swizzled(e + f, r / Op::kPerWord + w)] = words[w];
    }
  }
}

/// Fills an operand tile (store_step) from f32 values, a step at a time: fetch(r, e, x) gives rows r, r+1 x features
/// e .. e+3 (zero past the operand's rows or features, so padding contributes nothing to any product).
template <class Op, int R, int EP, class Fetch>
__device__ __forceinline__ void fill_tile(uint32_t* rows, uint32_t* cols, Fetch fetch) {
  constexpr int kQuads = EP / 4;            // four features a step
  constexpr int kSteps = (R / 2) * kQuads;  // each step: rows r, r+1 x features e .. e+3
  for (int idx = int(threadIdx.x); idx < kSteps; idx += kThreads) {
    const int r = 2 * (idx / kQuads), e = 4 * (idx % kQuads);
    float x[2][4];
    fetch(r, e, x);
    store_step<Op, R, EP>(rows, cols, r, e, x);
  }
}

/// Rows r0 .. r0+R-1 of (b, head) of a strided f32 operand into an operand tile, read from global memory.
///
/// Each step takes rows r, r+1 x features e .. e+3, so the 16 lanes on a pair of rows read 256 contiguous bytes of
/// each: one 16-byte load a row (two scalar loads of adjacent floats a lane left half of every sector unused: Nsight
/// Compute on an H200). A whole tile (every row in range, all EP features, rows on 16-byte boundaries: every tile of
/// a head dim of 32, 64 or 128 but a sequence's last partial one) is fetched four steps at a time (or all of a
/// thread's, if fewer) before any is stored, so a thread's loads are in flight together. One step at a time, each
/// load waited for the previous step's stores to shared memory, which the compiler may not move a load of a plain
/// pointer above (SASS of the bf16 forward, sm_90: load, round, store, branch, four times a tile). Other tiles check
/// each quad, a step at a time.
template <class Op, int R, int EP>
__device__ void load_tile(uint32_t* rows, uint32_t* cols, const float* base, const int64_t* stride, int64_t b,
                          int64_t head, int64_t r0, int64_t n, int64_t width) {
  constexpr int kQuads = EP / 4, kSteps = (R / 2) * kQuads, kPerThread = kSteps / kThreads;
  constexpr int kBatch = kPerThread < 4 ? kPerThread : 4;  // steps a thread fetches before it stores any
  static_assert(kSteps % kThreads == 0 && kPerThread % kBatch == 0, "whole batches");
  const float* first = at(base, stride, b, head, r0);
  const int64_t rs = stride[2];
  if (r0 + R <= n && width == EP && rs % 4 == 0 && (reinterpret_cast<uintptr_t>(first) & 15) == 0) {
#pragma unroll
    for (int batch = 0; batch < kSteps; batch += kBatch * kThreads) {
      float x[kBatch][2][4];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int idx = batch + j * kThreads + int(threadIdx.x), r = 2 * (idx / kQuads), e = 4 * (idx % kQuads);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float4 v = *reinterpret_cast<const float4*>(first + (r + i) * rs + e);
          x[j][i][0] = v.x, x[j][i][1] = v.y, x[j][i][2] = v.z, x[j][i][3] = v.w;
        }
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int idx = batch + j * kThreads + int(threadIdx.x);
        store_step<Op, R, EP>(rows, cols, 2 * (idx / kQuads), 4 * (idx % kQuads), x[j]);
      }
    }
    return;
  }
  fill_tile<Op, R, EP>(rows, cols, [&](int r, int e, float(&x)[2][4]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const bool in = r0 + r + i < n;
      const float* src = in ? at(base, stride, b, head, r0 + r + i) + e : nullptr;
      if (in && e + 4 <= width && (reinterpret_cast<uintptr_t>(src) & 15) == 0) {
        const float4 v = *reinterpret_cast<const float4*>(src);
        x[i][0] = v.x, x[i][1] = v.y, x[i][2] = v.z, x[i][3] = v.w;
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) x[i][j] = in && e + j < width ? src[j] : 0.0f;
      }
    }
  });
}

/// A operand of a k-step: rows row0 .. row0+15, the 8 words from word k0 of each row of a row-major tile.
__device__ __forceinline__ void frag_a(uint32_t (&a)[4], const uint32_t* tile, int words, int row0, int k0, Lane p) {
  const uint32_t* lo = tile + (row0 + p.g) * words + k0 + p.t;
  const uint32_t* hi = lo + 8 * words;
  a[0] = lo[0];
  a[1] = hi[0];
  a[2] = lo[4];
  a[3] = hi[4];
}

/// B operand of a k-step whose column n is row n0 + n of the tile (8 words from word k0), from a row-major tile or
/// a transposed (swizzled) one.
template <bool kSwizzled>
__device__ __forceinline__ void frag_b(uint32_t (&b)[2], const uint32_t* tile, int words, int n0, int k0, Lane p) {
  const uint32_t* row = tile + (n0 + p.g) * words;
  // n0 is a multiple of 8, so swizzled(n0 + g, w) == swizzled(n0, w): known at compile time in unrolled loops.
  b[0] = row[kSwizzled ? swizzled(n0, k0 + p.t) : k0 + p.t];
  b[1] = row[kSwizzled ? swizzled(n0, k0 + 4 + p.t) : k0 + 4 + p.t];
}

/// acc = A x B^T for this warp's 16 rows: A = rows row0.. of `a_tile`, B^T = rows 0 .. N-1 of `b_tile`, both
/// row-major with K features (a 16 x N block of scores, as N/8 accumulator fragments).
template <class Op, int K, int N>
__device__ __forceinline__ void warp_dot(float (&acc)[N / 8][4], const uint32_t* a_tile, const uint32_t* b_tile,
                                         Lane p) {
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < K / (8 * Op::kPerWord); ++kk) {
    uint32_t a[4];
    frag_a(a, a_tile, row_words<Op>(K), p.row0, 8 * kk, p);
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
      uint32_t b[2];
      frag_b<false>(b, b_tile, row_words<Op>(K), 8 * j, 8 * kk, p);
      Op::mma(acc[j], a, b);
    }
  }
}

/// acc += P x B for this warp's 16 rows: P (16 x K) in accumulator fragments (rounded to the operand format
/// here), B (K x N) read from a transposed tile: B[k][n] = cols[n][k] (swizzled), K columns per row.
template <class Op, int K, int N>
__device__ __forceinline__ void warp_accumulate(float (&acc)[N / 8][4], const float (&P)[K / 8][4],
                                                const uint32_t* cols, Lane p) {
#pragma unroll
  for (int kk = 0; kk < K / (8 * Op::kPerWord); ++kk) {
    uint32_t a[4];
    Op::a_from_acc(a, P, kk);
#pragma unroll
    for (int n = 0; n < N / 8; ++n) {
      uint32_t b[2];
      frag_b<true>(b, cols, row_words<Op>(K), 8 * n, 8 * kk, p);
      Op::mma(acc[n], a, b);
    }
  }
}

/// Row (within the warp's 16) and column (within an 8-wide block) of accumulator element i.
__device__ __forceinline__ int frag_row(Lane p, int i) { return p.row0 + p.g + 8 * (i / 2); }
__device__ __forceinline__ int frag_col(Lane p, int i) { return 2 * p.t + i % 2; }

/// Max and sum over the 4 lanes that hold one fragment row.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/// Writes a warp's 16 x EP accumulator, row i times row_scale[i / 2], into rows r0 + row0 .. of a strided f32
/// operand (rows past n and features past width skipped); `add` accumulates instead of storing. A lane's two
/// adjacent features go as one 8-byte access (Nsight Compute on an H100: the scalar ones used half of each sector).
template <int EP>
__device__ __forceinline__ void store_rows(float* base, const int64_t* stride, int64_t b, int64_t head, int64_t r0,
                                           int64_t n, int64_t width, const float (&acc)[EP / 8][4],
                                           const float (&row_scale)[2], bool add, Lane p) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t r = r0 + frag_row(p, 2 * half);
    if (r >= n) continue;
    float* row = at(base, stride, b, head, r);
#pragma unroll
    for (int d = 0; d < EP / 8; ++d) {
      const int col = 8 * d + frag_col(p, 0);  // and col + 1: one 8-byte access where both are in range and aligned
      const float x0 = acc[d][2 * half] * row_scale[half], x1 = acc[d][2 * half + 1] * row_scale[half];
      if (col + 2 <= width && (reinterpret_cast<uintptr_t>(row + col) & 7) == 0) {
        float2* dst = reinterpret_cast<float2*>(row + col);
        const float2 old = add ? *dst : float2{0.0f, 0.0f};
        *dst = float2{old.x + x0, old.y + x1};
      } else {
        if (col < width) row[col] = add ? row[col] + x0 : x0;
        if (col + 1 < width) row[col + 1] = add ? row[col + 1] + x1 : x1;
      }
    }
  }
}

/// A query-tile block's batch, head, kv head and first query: blockIdx.x = b * NH + h, and the query tiles in
/// reverse order, so the longest causal rows start first.
struct QueryTile {
  int64_t b, h, kvh, t0;
};

__device__ __forceinline__ QueryTile query_tile(const AttentionGeom& g) {
  const int64_t h = blockIdx.x % g.NH;
  return {blockIdx.x / g.NH, h, h / (g.NH / g.NKV), int64_t(gridDim.y - 1 - blockIdx.y) * kRows};
}

template <class Op, int EP>
constexpr int forward_smem_bytes() {
  return 4 *
         (kRows * row_words<Op>(EP) /* Q */ + kCols * row_words<Op>(EP) /* K */ + EP * row_words<Op>(kCols) /* V^T */);
}

/// Output and logsumexp of one query tile (query_tile).
template <class Op, int EP, bool kMods>
__device__ void forward_body(unsigned char* smem, float* out, float* lse, const float* q, const float* k,
                             const float* v, const float* mask, const uint8_t* kp, const AttentionGeom& g) {
  uint32_t* Qs = reinterpret_cast<uint32_t*>(smem);
  uint32_t* Ks = Qs + kRows * row_words<Op>(EP);
  uint32_t* Vt = Ks + kCols * row_words<Op>(EP);
  const auto [b, h, kvh, t0] = query_tile(g);
  const Lane p = lane_pos();
  const float scale = float(g.scale);

  const int64_t s_begin = key_begin(g, t0), s_end = key_end(g, min64(t0 + kRows, g.T) - 1);
  load_tile<Op, kRows, EP>(Qs, nullptr, q, g.q_stride, b, h, t0, g.T, g.E);
  const float keep_scale = dropout_scale<float>(g.dropout_p);
  const DropoutRow drop[2] = {dropout_row(g, b, h, t0 + frag_row(p, 0)), dropout_row(g, b, h, t0 + frag_row(p, 2))};
  float o[EP / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int64_t s0 = s_begin; s0 < s_end; s0 += kCols) {
    __syncthreads();  // the previous tiles of K and V are no longer read
    load_tile<Op, kCols, EP>(Ks, nullptr, k, g.k_stride, b, kvh, s0, g.S, g.E);
    load_tile<Op, kCols, EP>(nullptr, Vt, v, g.v_stride, b, kvh, s0, g.S, g.Ev);
    __syncthreads();
    float sc[kCols / 8][4];
    warp_dot<Op, EP, kCols>(sc, Qs, Ks, p);
    // The logits. A tile every query sees whole, without modifiers, has a loop of its own: the checks of the other
    // case, unrolled over the tile, would sit between its instructions (on an H200 half the stalls of this kernel
    // were waits for instructions to be fetched).
    if (tile_unmasked(g, kp, mask, t0, kRows, s0, kCols)) {
#pragma unroll
      for (int j = 0; j < kCols / 8; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) sc[j][i] *= scale;
    } else {
#pragma unroll
      for (int j = 0; j < kCols / 8; ++j) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float capped;
          sc[j][i] =
              score_logit<kMods>(g, kp, mask, b, h, t0 + frag_row(p, i), s0 + 8 * j + frag_col(p, i), sc[j][i], capped);
        }
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < kCols / 8; ++j) mx = fmaxf(mx, fmaxf(sc[j][2 * half], sc[j][2 * half + 1]));
      const float m_new = fmaxf(m[half], quad_max(mx));
      const float m_sub = m_new == -INFINITY ? 0.0f : m_new;  // a row that sees nothing yet: exp(-inf - 0) = 0
      const float alpha = expf(m[half] - m_sub);
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kCols / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = sc[j][2 * half + e];
          const float pr = expf(x - m_sub);
          sum += pr;
          x = pr * dropout_factor(g, drop[half], keep_scale, s0 + 8 * j + frag_col(p, e));
        }
      }
      l[half] = l[half] * alpha + quad_sum(sum);
      m[half] = m_new;
#pragma unroll
      for (int d = 0; d < EP / 8; ++d) {
        o[d][2 * half] *= alpha;
        o[d][2 * half + 1] *= alpha;
      }
    }
    warp_accumulate<Op, kCols, EP>(o, sc, Vt, p);
  }
  const float inv[2] = {l[0] > 0.0f ? 1.0f / l[0] : 0.0f, l[1] > 0.0f ? 1.0f / l[1] : 0.0f};
  store_rows<EP>(out, g.o_stride, b, h, t0, g.T, g.Ev, o, inv, false, p);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t t = t0 + frag_row(p, 2 * half);
    if (p.t == 0 && t < g.T) lse[(b * g.NH + h) * g.T + t] = l[half] > 0.0f ? m[half] + logf(l[half]) : -INFINITY;
  }
}

template <class Op, int EP>
constexpr int dkdv_smem_bytes() {
  constexpr int Q = dkdv_queries(EP);
  return 4 * (2 * kRows * row_words<Op>(EP) /* K, V */ + 2 * Q * row_words<Op>(EP) /* Q, dO */ +
              2 * EP * row_words<Op>(Q) /* Q^T, dO^T */ + 2 * Q /* lse, D */ +
              Q * int(sizeof(DropoutRow) / 4) /* the queries' dropout rows */);
}

/// The dK/dV pass's step where some query may not see some key (masks, causal edges, modifiers): from the logits'
/// raw products P^T (pt) and dP^T (dst), the dropped probabilities P^T in pt and dS^T in dst.
template <bool kMods, int Q>
__device__ __forceinline__ void masked_probs_and_ds(float (&pt)[Q / 8][4], float (&dst)[Q / 8][4],
                                                    const AttentionGeom& g, const uint8_t* kp, const float* mask,
                                                    int64_t b, int64_t h, int64_t t0, int64_t s0, const float* lse_s,
                                                    const float* D_s, const DropoutRow* drop_s, float keep_scale,
                                                    const Lane& p) {
#pragma unroll
  for (int j = 0; j < Q / 8; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t s = s0 + frag_row(p, i);
      const int tj = 8 * j + frag_col(p, i);
      const int64_t t = t0 + tj;
      float pd = 0.0f, ds = 0.0f, capped = 0.0f;
      float x = -INFINITY;
      if (lse_s[tj] != -INFINITY) x = score_logit<kMods>(g, kp, mask, b, h, t, s, pt[j][i], capped);
      if (x != -INFINITY) {
        const float pr = expf(x - lse_s[tj]);
        const float f = dropout_factor(g, drop_s[tj], keep_scale, s);
        pd = pr * f;
        ds = score_ds<kMods>(g, pr * (score_dp<kMods>(g, b, h, t, s, dst[j][i]) * f - D_s[tj]), capped);
      }
      pt[j][i] = pd;
      dst[j][i] = ds;
    }
  }
}

/// Block (blockIdx.x = b * NKV + kv head, key tile blockIdx.y): dK and dV of 64 keys (accumulated into), summed
/// over the group's query heads and every query. Rows of the warp fragments are keys, columns queries.
template <class Op, int EP, bool kMods>
__device__ void backward_dkdv_body(unsigned char* smem, float* dk, float* dv, const float* dout, const float* q,
                                   const float* k, const float* v, const float* lse, const float* D, const float* mask,
                                   const uint8_t* kp, const AttentionGeom& g) {
  constexpr int Q = dkdv_queries(EP);
  uint32_t* Ks = reinterpret_cast<uint32_t*>(smem);
  uint32_t* Vs = Ks + kRows * row_words<Op>(EP);
  uint32_t* Qs = Vs + kRows * row_words<Op>(EP);
  uint32_t* dOs = Qs + Q * row_words<Op>(EP);
  uint32_t* Qt = dOs + Q * row_words<Op>(EP);
  uint32_t* dOt = Qt + EP * row_words<Op>(Q);
  float* lse_s = reinterpret_cast<float*>(dOt + EP * row_words<Op>(Q));
  float* D_s = lse_s + Q;
  DropoutRow* drop_s = reinterpret_cast<DropoutRow*>(D_s + Q);
  const int64_t b = blockIdx.x / g.NKV, kvh = blockIdx.x % g.NKV, group = g.NH / g.NKV;
  const int64_t s0 = int64_t(blockIdx.y) * kRows;
  const Lane p = lane_pos();
  const float scale = float(g.scale), keep_scale = dropout_scale<float>(g.dropout_p);

  float dk_acc[EP / 8][4] = {}, dv_acc[EP / 8][4] = {};
  // The queries that see any key of the tile (causal: s0 <= t + S - T; window); other query tiles are skipped.
  const int64_t t_first = query_begin(g, s0) / Q * Q, t_end = query_end(g, min64(s0 + kRows, g.S) - 1);
  // The steps: query tiles t_first, t_first + Q, .. below t_end of each head of the group.
  const int64_t tiles_per_head = t_end > t_first ? (t_end - t_first + Q - 1) / Q : 0, steps = group * tiles_per_head;
  load_tile<Op, kRows, EP>(Ks, nullptr, k, g.k_stride, b, kvh, s0, g.S, g.E);
  load_tile<Op, kRows, EP>(Vs, nullptr, v, g.v_stride, b, kvh, s0, g.S, g.Ev);
  static_assert(Q <= kThreads, "a thread for each query of a step");
  for (int64_t step = 0; step < steps; ++step) {
    const int64_t h = kvh * group + step / tiles_per_head, t0 = t_first + step % tiles_per_head * Q;
    // Thread i < Q takes query t0 + i's logsumexp and D, loaded before the tiles so that the loads overlap theirs.
    const int i = int(threadIdx.x);
    const bool in = i < Q && t0 + i < g.T;
    const int64_t row = (b * g.NH + h) * g.T + t0 + i;
    float lse_i = -INFINITY, D_i = 0.0f;
    if (in) lse_i = lse[row], D_i = D[row];
    __syncthreads();  // the previous query tile is no longer read
    load_tile<Op, Q, EP>(Qs, Qt, q, g.q_stride, b, h, t0, g.T, g.E);
    load_tile<Op, Q, EP>(dOs, dOt, dout, g.o_stride, b, h, t0, g.T, g.Ev);
    if (i < Q) {
      lse_s[i] = lse_i;
      D_s[i] = D_i;
      drop_s[i] = dropout_row(g, b, h, t0 + i);
    }
    __syncthreads();
    float pt[Q / 8][4], dst[Q / 8][4];  // P^T, then dS^T (rows keys, columns queries)
    warp_dot<Op, EP, Q>(pt, Ks, Qs, p);
    warp_dot<Op, EP, Q>(dst, Vs, dOs, p);                // dP^T
    if (tile_unmasked(g, kp, mask, t0, Q, s0, kRows)) {  // every query sees every key: a loop of its own (forward)
#pragma unroll
      for (int j = 0; j < Q / 8; ++j) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int tj = 8 * j + frag_col(p, i);
          const float pr = expf(scale * pt[j][i] - lse_s[tj]);
          const float f = dropout_factor(g, drop_s[tj], keep_scale, s0 + frag_row(p, i));
          pt[j][i] = pr * f;
          dst[j][i] = pr * (dst[j][i] * f - D_s[tj]) * scale;
        }
      }
    } else {
      masked_probs_and_ds<kMods, Q>(pt, dst, g, kp, mask, b, h, t0, s0, lse_s, D_s, drop_s, keep_scale, p);
    }
    warp_accumulate<Op, Q, EP>(dv_acc, pt, dOt, p);
    warp_accumulate<Op, Q, EP>(dk_acc, dst, Qt, p);
  }
  const float one[2] = {1.0f, 1.0f};
  if (dk) store_rows<EP>(dk, g.k_stride, b, kvh, s0, g.S, g.E, dk_acc, one, !g.grads_unwritten, p);
  if (dv) store_rows<EP>(dv, g.v_stride, b, kvh, s0, g.S, g.Ev, dv_acc, one, !g.grads_unwritten, p);
}

template <class Op, int EP>
constexpr int dq_smem_bytes() {
  return 4 * (2 * kRows * row_words<Op>(EP) /* Q, dO */ + 2 * kCols * row_words<Op>(EP) /* K, V */ +
              EP * row_words<Op>(kCols) /* K^T */);
}

/// dQ of one query tile (query_tile), accumulated into.
template <class Op, int EP, bool kMods>
__device__ void backward_dq_body(unsigned char* smem, float* dq, const float* dout, const float* q, const float* k,
                                 const float* v, const float* lse, const float* D, const float* mask, const uint8_t* kp,
                                 const AttentionGeom& g) {
  uint32_t* Qs = reinterpret_cast<uint32_t*>(smem);
  uint32_t* dOs = Qs + kRows * row_words<Op>(EP);
  uint32_t* Ks = dOs + kRows * row_words<Op>(EP);
  uint32_t* Vs = Ks + kCols * row_words<Op>(EP);
  uint32_t* Kt = Vs + kCols * row_words<Op>(EP);
  const auto [b, h, kvh, t0] = query_tile(g);
  const Lane p = lane_pos();
  const float scale = float(g.scale);

  const int64_t s_begin = key_begin(g, t0), s_end = key_end(g, min64(t0 + kRows, g.T) - 1);
  load_tile<Op, kRows, EP>(Qs, nullptr, q, g.q_stride, b, h, t0, g.T, g.E);
  load_tile<Op, kRows, EP>(dOs, nullptr, dout, g.o_stride, b, h, t0, g.T, g.Ev);
  float row_lse[2], row_D[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t t = t0 + frag_row(p, 2 * half);
    row_lse[half] = t < g.T ? lse[(b * g.NH + h) * g.T + t] : -INFINITY;
    row_D[half] = t < g.T ? D[(b * g.NH + h) * g.T + t] : 0.0f;
  }
  const float keep_scale = dropout_scale<float>(g.dropout_p);
  const DropoutRow drop[2] = {dropout_row(g, b, h, t0 + frag_row(p, 0)), dropout_row(g, b, h, t0 + frag_row(p, 2))};
  float dq_acc[EP / 8][4] = {};
  for (int64_t s0 = s_begin; s0 < s_end; s0 += kCols) {
    __syncthreads();
    load_tile<Op, kCols, EP>(Ks, Kt, k, g.k_stride, b, kvh, s0, g.S, g.E);
    load_tile<Op, kCols, EP>(Vs, nullptr, v, g.v_stride, b, kvh, s0, g.S, g.Ev);
    __syncthreads();
    float ds[kCols / 8][4], dp[kCols / 8][4];
    warp_dot<Op, EP, kCols>(ds, Qs, Ks, p);  // scores, turned into dS below
    warp_dot<Op, EP, kCols>(dp, dOs, Vs, p);
    if (tile_unmasked(g, kp, mask, t0, kRows, s0, kCols)) {  // every query sees every key: a loop of its own (forward)
#pragma unroll
      for (int j = 0; j < kCols / 8; ++j) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int half = i / 2;
          const float pr = expf(scale * ds[j][i] - row_lse[half]);
          const float f = dropout_factor(g, drop[half], keep_scale, s0 + 8 * j + frag_col(p, i));
          ds[j][i] = pr * (dp[j][i] * f - row_D[half]) * scale;
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < kCols / 8; ++j) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int half = i / 2;
          const int64_t t = t0 + frag_row(p, i), s = s0 + 8 * j + frag_col(p, i);
          float x = 0.0f, capped = 0.0f, logit = -INFINITY;
          if (row_lse[half] != -INFINITY) logit = score_logit<kMods>(g, kp, mask, b, h, t, s, ds[j][i], capped);
          if (logit != -INFINITY) {
            const float pr = expf(logit - row_lse[half]);
            const float f = dropout_factor(g, drop[half], keep_scale, s);
            x = score_ds<kMods>(g, pr * (score_dp<kMods>(g, b, h, t, s, dp[j][i]) * f - row_D[half]), capped);
          }
          ds[j][i] = x;
        }
      }
    }
    warp_accumulate<Op, kCols, EP>(dq_acc, ds, Kt, p);
  }
  const float one[2] = {1.0f, 1.0f};
  store_rows<EP>(dq, g.q_stride, b, h, t0, g.T, g.E, dq_acc, one, !g.grads_unwritten, p);
}

}  // namespace tinygpt::cuda::flash_mma

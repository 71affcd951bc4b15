// Scaled dot-product attention on the GPU, f32: flash attention (tiles in shared memory, online softmax, no T x S
// buffer), forward and backward. Twins of kernels/cpu/attention.cpp; layout, masking and dropout as kernels/attention.h
// describes.
//
// Flash layout: a block of 128 threads (4 warps) owns a 64 x 64 tile of scores. Thread (warp w, lane l) holds
// rows 16w + 4(l/8) + i (i < 4) and columns l%8 + 8j (j < 8), so a row is spread over the 8 lanes of one
// group and its max and sum are 3 shuffles away; output columns are l%8 + 8d (d < EP/8). EP is the head dim
// rounded up to 32, 64 or 128 (zero padded). Operands that are read down a column are stored transposed in
// shared memory with a padded stride of 65 floats, which keeps every access free of bank conflicts.
//
// The flash entry points run the tensor-core kernels of flash_mma.cuh instead when the call's AttentionGeom::math
// asks for tf32 or bf16 operands (f32 accumulation either way; with_flash_path below).
//
// Every flash kernel (f32 here, tf32 and bf16 in flash_mma.cuh) is built with and without the score modifiers'
// per-element code (kMods: score_logit in attention_common.cuh), and a call without modifiers runs the lean build.
//
// Backward, FlashAttention-2 style, deterministic: D = rowsum(dO * O) first; then one block per key tile
// walks the query tiles of every head of its group and keeps dK and dV in registers; then one block per
// query tile walks the key tiles and keeps dQ in registers. No gradient is written by two blocks, so there
// are no atomics, at the price of computing P and dS twice.
//
// Compiled by nvcc in attention.cu and under tests/emulated_cuda.h (see launch.cuh), which also emulates the
// tensor cores.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_rowdot.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/device.h"  // flash_tensor_cores
#if !defined(TINYGPT_EMULATED_CUDA)
#include "kernels/cuda/mma.cuh"
#endif
#include "kernels/cuda/flash_mma.cuh"  // after the mma primitives: its kernels are written over them
#include "kernels/cuda/score_mods.cuh"

TINYGPT_CUDA_BEGIN
namespace {

// ---------------------------------------------------------------------------------------------------------------
// Flash attention.

constexpr int kTile = 64;  // Br = Bc = 64
constexpr int kFlashThreads = 128;
constexpr int kT = kTile + 1;  // stride of a transposed tile [EP][kT]

struct ThreadPos {
  int row0;  // first of this thread's 4 rows in the tile
  int col0;  // first of its columns: col0 + 8j
};

__device__ __forceinline__ ThreadPos thread_pos() {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  return {16 * warp + 4 * (lane / 8), lane % 8};
}

/// Max and sum over the 8 lanes that share a row.
__device__ __forceinline__ float group_max(float x) {
  for (int o = 1; o < 8; o <<= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float group_sum(float x) {
  for (int o = 1; o < 8; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

/// Rows r0 .. r0+63 of (b, head) of a strided operand, zero past n rows or width, element (r, e) stored at
/// dst[kTransposed ? e * kT + r : r * (EP + 1) + e].
///
/// A whole tile (every row in range, all EP features) is read eight elements a thread at a time, each thread's eight
/// loads issued before any of its stores; one element at a time, each load waited for the previous one's store to
/// shared memory, which the compiler may not move a load of a plain pointer above: 32 round trips to global memory a
/// thread for a 64 x 64 tile, where there are now 4. Other tiles check each element, one at a time.
template <int EP, bool kTransposed>
__device__ void load_tile_f32(float* dst, const float* base, const int64_t* stride, int64_t b, int64_t head, int64_t r0,
                              int64_t n, int64_t width) {
  auto store = [&](int idx, float x) {
    const int r = idx / EP, e = idx % EP;
    dst[kTransposed ? e * kT + r : r * (EP + 1) + e] = x;
  };
  constexpr int kPerThread = kTile * EP / kFlashThreads, kBatch = kPerThread < 8 ? kPerThread : 8;
  static_assert(kTile * EP % kFlashThreads == 0 && kPerThread % kBatch == 0, "whole batches");
  if (r0 + kTile <= n && width == EP) {
    const float* first = at(base, stride, b, head, r0);
    const int64_t rs = stride[2];
    for (int batch = 0; batch < kPerThread; batch += kBatch) {
      float x[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int idx = (batch + j) * kFlashThreads + int(threadIdx.x);
        x[j] = first[(idx / EP) * rs + idx % EP];
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) store((batch + j) * kFlashThreads + int(threadIdx.x), x[j]);
    }
    return;
  }
  for (int idx = threadIdx.x; idx < kTile * EP; idx += kFlashThreads) {
    const int r = idx / EP, e = idx % EP;
    store(idx, (r0 + r < n && e < width) ? at(base, stride, b, head, r0 + r)[e] : 0.0f);
  }
}

/// dst[r][e] (row stride EP + 1) = rows r0 .. r0+63 of (b, head) of a strided operand, zero past n rows or width.
template <int EP>
__device__ void load_rows(float* dst, const float* base, const int64_t* stride, int64_t b, int64_t head, int64_t r0,
                          int64_t n, int64_t width) {
  load_tile_f32<EP, false>(dst, base, stride, b, head, r0, n, width);
}

/// dst[e][r] (row stride kT), the same rows stored transposed.
template <int EP>
__device__ void load_cols(float* dst, const float* base, const int64_t* stride, int64_t b, int64_t head, int64_t r0,
                          int64_t n, int64_t width) {
  load_tile_f32<EP, true>(dst, base, stride, b, head, r0, n, width);
}

/// acc[i][j] = sum_e rows[row0 + i][e] * cols[e][col0 + 8j]
template <int EP>
__device__ __forceinline__ void tile_dot(float (&acc)[4][8], const float* rows, const float* cols, ThreadPos p) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
#pragma unroll 4
  for (int e = 0; e < EP; ++e) {
    float a[4], c[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = rows[(p.row0 + i) * (EP + 1) + e];
#pragma unroll
    for (int j = 0; j < 8; ++j) c[j] = cols[e * kT + p.col0 + 8 * j];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i][j] += a[i] * c[j];
  }
}

/// acc[i][d] += sum_c probs[row0 + i][c] * vals(c, col0 + 8d), vals read from a transposed [EP][kT] tile
/// (transposed = true) or a row-major [64][EP + 1] one.
template <int EP, bool kTransposed>
__device__ __forceinline__ void tile_accumulate(float (&acc)[4][EP / 8], const float* probs, const float* vals,
                                                ThreadPos p) {
#pragma unroll 2
  for (int c = 0; c < kTile; ++c) {
    float w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = probs[(p.row0 + i) * kT + c];
#pragma unroll
    for (int d = 0; d < EP / 8; ++d) {
      const int e = p.col0 + 8 * d;
      const float x = kTransposed ? vals[e * kT + c] : vals[c * (EP + 1) + e];
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[i][d] += w[i] * x;
    }
  }
}

template <int EP>
constexpr int forward_smem_floats() {
  return kTile * (EP + 1) /* Q */ + EP * kT /* K^T */ + kTile * (EP + 1) /* V */ + kTile * kT /* P */;
}

template <int EP, bool kMods>
__global__ void __launch_bounds__(kFlashThreads)
    flash_forward_kernel(float* out, float* lse, const float* q, const float* k, const float* v, const float* mask,
                         const uint8_t* kp, AttentionGeom g) {
  TINYGPT_DYNAMIC_SMEM(float, smem);
  float* Qs = smem;
  float* Kt = Qs + kTile * (EP + 1);
  float* Vs = Kt + EP * kT;
  float* Ps = Vs + kTile * (EP + 1);
  const int64_t bh = blockIdx.x, b = bh / g.NH, h = bh % g.NH, kvh = h / (g.NH / g.NKV);
  const int64_t t0 = int64_t(gridDim.y - 1 - blockIdx.y) * kTile;  // the longest causal tiles start first
  const ThreadPos p = thread_pos();
  const float keep_scale = dropout_scale<float>(g.dropout_p);

  load_rows<EP>(Qs, q, g.q_stride, b, h, t0, g.T, g.E);
  float o[4][EP / 8] = {};
  float m[4], l[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
  }
  // Keys no query of the tile sees (past the last row's diagonal, before the first row's window) are skipped.
  const int64_t s_end = key_end(g, min64(t0 + kTile, g.T) - 1);
  for (int64_t s0 = key_begin(g, t0); s0 < s_end; s0 += kTile) {
    __syncthreads();  // the previous tile's K, V and P are no longer read
    load_cols<EP>(Kt, k, g.k_stride, b, kvh, s0, g.S, g.E);
    load_rows<EP>(Vs, v, g.v_stride, b, kvh, s0, g.S, g.Ev);
    __syncthreads();
    float sc[4][8];
    tile_dot<EP>(sc, Qs, Kt, p);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t t = t0 + p.row0 + i;
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int64_t s = s0 + p.col0 + 8 * j;
        float capped;
        sc[i][j] = score_logit<kMods>(g, kp, mask, b, h, t, s, sc[i][j], capped);
        mx = fmaxf(mx, sc[i][j]);
      }
      const float m_new = fmaxf(m[i], group_max(mx));
      const float m_sub = m_new == -INFINITY ? 0.0f : m_new;  // a row that sees nothing yet: exp(-inf - 0) = 0
      const float alpha = expf(m[i] - m_sub);
      const DropoutRow drop = dropout_row(g, b, h, t);
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float e = expf(sc[i][j] - m_sub);
        sum += e;
        Ps[(p.row0 + i) * kT + p.col0 + 8 * j] = e * dropout_factor(g, drop, keep_scale, s0 + p.col0 + 8 * j);
      }
      l[i] = l[i] * alpha + group_sum(sum);
      m[i] = m_new;
#pragma unroll
      for (int d = 0; d < EP / 8; ++d) o[i][d] *= alpha;
    }
    __syncwarp();  // a warp reads only its own rows of P
    tile_accumulate<EP, false>(o, Ps, Vs, p);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t t = t0 + p.row0 + i;
    if (t >= g.T) continue;
    const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
    float* orow = at(out, g.o_stride, b, h, t);
#pragma unroll
    for (int d = 0; d < EP / 8; ++d) {
      const int e = p.col0 + 8 * d;
      if (e < g.Ev) orow[e] = o[i][d] * inv;
    }
    if (p.col0 == 0) lse[(b * g.NH + h) * g.T + t] = l[i] > 0.0f ? m[i] + logf(l[i]) : -INFINITY;
  }
}

template <int EP>
constexpr int dkdv_smem_floats() {
  return 2 * kTile * (EP + 1) /* K, V */ + 2 * EP * kT /* Q^T, dO^T */ + 2 * kTile * kT /* P^T, dS^T */ + 2 * kTile;
}

/// One block per (key tile, batch, kv head): dK and dV of 64 keys, summed over the group's heads and every query.
template <int EP, bool kMods>
__global__ void __launch_bounds__(kFlashThreads)
    flash_backward_dkdv_kernel(float* dk, float* dv, const float* dout, const float* q, const float* k, const float* v,
                               const float* lse, const float* D, const float* mask, const uint8_t* kp,
                               AttentionGeom g) {
  TINYGPT_DYNAMIC_SMEM(float, smem);
  float* Ks = smem;
  float* Vs = Ks + kTile * (EP + 1);
  float* Qt = Vs + kTile * (EP + 1);
  float* dOt = Qt + EP * kT;
  float* PT = dOt + EP * kT;
  float* dST = PT + kTile * kT;
  float* lse_s = dST + kTile * kT;
  float* D_s = lse_s + kTile;
  const int64_t bkv = blockIdx.x, b = bkv / g.NKV, kvh = bkv % g.NKV, group = g.NH / g.NKV;
  const int64_t s0 = int64_t(blockIdx.y) * kTile;
  const ThreadPos p = thread_pos();  // rows: keys; columns: queries
  const float keep_scale = dropout_scale<float>(g.dropout_p);

  load_rows<EP>(Ks, k, g.k_stride, b, kvh, s0, g.S, g.E);
  load_rows<EP>(Vs, v, g.v_stride, b, kvh, s0, g.S, g.Ev);
  float dk_acc[4][EP / 8] = {}, dv_acc[4][EP / 8] = {};
  // The queries that see any key of the tile (causal: s0 <= t + S - T; window); other query tiles are skipped.
  const int64_t t_first = query_begin(g, s0) / kTile * kTile, t_end = query_end(g, min64(s0 + kTile, g.S) - 1);
  for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    for (int64_t t0 = t_first; t0 < t_end; t0 += kTile) {
      __syncthreads();
      load_cols<EP>(Qt, q, g.q_stride, b, h, t0, g.T, g.E);
      load_cols<EP>(dOt, dout, g.o_stride, b, h, t0, g.T, g.Ev);
      for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
        const int64_t row = (b * g.NH + h) * g.T + t0 + i;
        lse_s[i] = t0 + i < g.T ? lse[row] : -INFINITY;
        D_s[i] = t0 + i < g.T ? D[row] : 0.0f;
      }
      __syncthreads();
      float sc[4][8], dp[4][8];
      tile_dot<EP>(sc, Ks, Qt, p);
      tile_dot<EP>(dp, Vs, dOt, p);
      // Query columns outside, keys inside: each query's dropout row serves the thread's 4 keys. (Kept in shared
      // memory, as the tensor-core kernel keeps them, the rows would take head dim 128 past an A100's 163 KB a block.)
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int tj = p.col0 + 8 * j;
        const int64_t t = t0 + tj;
        const DropoutRow drop = dropout_row(g, b, h, t);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int64_t s = s0 + p.row0 + i;
          float pd = 0.0f, ds = 0.0f, capped;
          const float x =
              lse_s[tj] != -INFINITY ? score_logit<kMods>(g, kp, mask, b, h, t, s, sc[i][j], capped) : -INFINITY;
          if (x != -INFINITY) {
            const float pr = expf(x - lse_s[tj]);
            const float f = dropout_factor(g, drop, keep_scale, s);
            pd = pr * f;
            ds = score_ds<kMods>(g, pr * (score_dp<kMods>(g, b, h, t, s, dp[i][j]) * f - D_s[tj]), capped);
          }
          PT[(p.row0 + i) * kT + tj] = pd;
          dST[(p.row0 + i) * kT + tj] = ds;
        }
      }
      __syncwarp();
      tile_accumulate<EP, true>(dv_acc, PT, dOt, p);
      tile_accumulate<EP, true>(dk_acc, dST, Qt, p);
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t s = s0 + p.row0 + i;
    if (s >= g.S) continue;
    float* dkr = dk ? at(dk, g.k_stride, b, kvh, s) : nullptr;
    float* dvr = dv ? at(dv, g.v_stride, b, kvh, s) : nullptr;
#pragma unroll
    for (int d = 0; d < EP / 8; ++d) {
      const int e = p.col0 + 8 * d;
      if (dkr && e < g.E) dkr[e] = g.grads_unwritten ? dk_acc[i][d] : dkr[e] + dk_acc[i][d];
      if (dvr && e < g.Ev) dvr[e] = g.grads_unwritten ? dv_acc[i][d] : dvr[e] + dv_acc[i][d];
    }
  }
}

template <int EP>
constexpr int dq_smem_floats() {
  return 2 * kTile * (EP + 1) /* Q, dO */ + 2 * EP * kT /* K^T, V^T */ + kTile * kT /* dS */;
}

/// One block per (query tile, batch, head): dQ of 64 queries.
template <int EP, bool kMods>
__global__ void __launch_bounds__(kFlashThreads)
    flash_backward_dq_kernel(float* dq, const float* dout, const float* q, const float* k, const float* v,
                             const float* lse, const float* D, const float* mask, const uint8_t* kp, AttentionGeom g) {
  TINYGPT_DYNAMIC_SMEM(float, smem);
  float* Qs = smem;
  float* dOs = Qs + kTile * (EP + 1);
  float* Kt = dOs + kTile * (EP + 1);
  float* Vt = Kt + EP * kT;
  float* dSs = Vt + EP * kT;
  const int64_t bh = blockIdx.x, b = bh / g.NH, h = bh % g.NH, kvh = h / (g.NH / g.NKV);
  const int64_t t0 = int64_t(gridDim.y - 1 - blockIdx.y) * kTile;
  const ThreadPos p = thread_pos();

  load_rows<EP>(Qs, q, g.q_stride, b, h, t0, g.T, g.E);
  load_rows<EP>(dOs, dout, g.o_stride, b, h, t0, g.T, g.Ev);
  float row_lse[4], row_D[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t t = t0 + p.row0 + i;
    row_lse[i] = t < g.T ? lse[(b * g.NH + h) * g.T + t] : -INFINITY;
    row_D[i] = t < g.T ? D[(b * g.NH + h) * g.T + t] : 0.0f;
  }
  float dq_acc[4][EP / 8] = {};
  const float keep_scale = dropout_scale<float>(g.dropout_p);
  const int64_t s_end = key_end(g, min64(t0 + kTile, g.T) - 1);
  for (int64_t s0 = key_begin(g, t0); s0 < s_end; s0 += kTile) {
    __syncthreads();
    load_cols<EP>(Kt, k, g.k_stride, b, kvh, s0, g.S, g.E);
    load_cols<EP>(Vt, v, g.v_stride, b, kvh, s0, g.S, g.Ev);
    __syncthreads();
    float sc[4][8], dp[4][8];
    tile_dot<EP>(sc, Qs, Kt, p);
    tile_dot<EP>(dp, dOs, Vt, p);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t t = t0 + p.row0 + i;
      const DropoutRow drop = dropout_row(g, b, h, t);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int64_t s = s0 + p.col0 + 8 * j;
        float ds = 0.0f, capped;
        const float x =
            row_lse[i] != -INFINITY ? score_logit<kMods>(g, kp, mask, b, h, t, s, sc[i][j], capped) : -INFINITY;
        if (x != -INFINITY) {
          const float pr = expf(x - row_lse[i]);
          const float f = dropout_factor(g, drop, keep_scale, s);
          ds = score_ds<kMods>(g, pr * (score_dp<kMods>(g, b, h, t, s, dp[i][j]) * f - row_D[i]), capped);
        }
        dSs[(p.row0 + i) * kT + p.col0 + 8 * j] = ds;
      }
    }
    __syncwarp();
    tile_accumulate<EP, true>(dq_acc, dSs, Kt, p);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t t = t0 + p.row0 + i;
    if (t >= g.T) continue;
    float* dqr = at(dq, g.q_stride, b, h, t);
#pragma unroll
    for (int d = 0; d < EP / 8; ++d) {
      const int e = p.col0 + 8 * d;
      if (e < g.E) dqr[e] = g.grads_unwritten ? dq_acc[i][d] : dqr[e] + dq_acc[i][d];
    }
  }
}

// Tensor-core kernels (flash_mma.cuh); their shared memory is named apart from the f32 kernels' float array.
template <class Op, int EP, bool kMods>
__global__ void __launch_bounds__(flash_mma::kThreads)
    flash_mma_forward_kernel(float* out, float* lse, const float* q, const float* k, const float* v, const float* mask,
                             const uint8_t* kp, AttentionGeom g) {
  TINYGPT_DYNAMIC_SMEM(unsigned char, mma_smem);
  flash_mma::forward_body<Op, EP, kMods>(mma_smem, out, lse, q, k, v, mask, kp, g);
}

template <class Op, int EP, bool kMods>
__global__ void __launch_bounds__(flash_mma::kThreads)
    flash_mma_dkdv_kernel(float* dk, float* dv, const float* dout, const float* q, const float* k, const float* v,
                          const float* lse, const float* D, const float* mask, const uint8_t* kp, AttentionGeom g) {
  TINYGPT_DYNAMIC_SMEM(unsigned char, mma_smem);
  flash_mma::backward_dkdv_body<Op, EP, kMods>(mma_smem, dk, dv, dout, q, k, v, lse, D, mask, kp, g);
}

template <class Op, int EP, bool kMods>
__global__ void __launch_bounds__(flash_mma::kThreads)
    flash_mma_dq_kernel(float* dq, const float* dout, const float* q, const float* k, const float* v, const float* lse,
                        const float* D, const float* mask, const uint8_t* kp, AttentionGeom g) {
  TINYGPT_DYNAMIC_SMEM(unsigned char, mma_smem);
  flash_mma::backward_dq_body<Op, EP, kMods>(mma_smem, dq, dout, q, k, v, lse, D, mask, kp, g);
}

/// The f32 kernels on CUDA cores, as a with_flash_path choice.
struct CudaCores {};

/// Whether the tensor-core tiles of operand format `math` fit in this GPU's shared memory at padded head dim EP.
template <int EP>
bool tensor_tiles_fit(AttentionMath math) {
  using flash_mma::Tf32;
  if (math != AttentionMath::TF32) return true;  // the bf16 tiles fit every GPU of compute capability 8.0 or newer
  return std::max({flash_mma::forward_smem_bytes<Tf32, EP>(), flash_mma::dkdv_smem_bytes<Tf32, EP>(),
                   flash_mma::dq_smem_bytes<Tf32, EP>()}) <= int(properties().sharedMemPerBlockOptin);
}

/// Calls f(flash_mma::Bf16{}), f(flash_mma::Tf32{}) or f(CudaCores{}): the kernels a flash call with padded head
/// dim EP runs for the operand format `math`, as flash_tensor_cores answers (the tf32 tiles of head dim 128 need 170 KB
/// of shared memory, more than an A100 has; that case runs on CUDA cores).
template <int EP, class F>
void with_flash_path(AttentionMath math, F f) {
  if (math != AttentionMath::F32 && properties().major < 8) {
    throw Error(std::string(attention_math_name(math)) +
                " flash attention needs tensor cores of compute capability 8.0 or newer; this GPU has none");
  }
  if (math != AttentionMath::F32 && tensor_tiles_fit<EP>(math)) {
    if (math == AttentionMath::BF16) return f(flash_mma::Bf16{});
    return f(flash_mma::Tf32{});
  }
  return f(CudaCores{});
}

/// Calls f(std::true_type{}) when the call has score modifiers, f(std::false_type{}) when not: which build of a
/// flash kernel runs (kMods).
template <class F>
void with_mods(const AttentionGeom& g, F f) {
  if (g.mods.any()) return f(std::true_type{});
  return f(std::false_type{});
}

static_assert(flash_mma::kThreads == kFlashThreads && flash_mma::kRows == kTile && flash_mma::kCols == kTile,
              "both flash paths share the launch geometry");

template <int EP>
using PaddedDim = std::integral_constant<int, EP>;

/// Calls f(PaddedDim<EP>) with EP the head dim padded to 32, 64 or 128.
template <class F>
void with_padded_dim(const AttentionGeom& g, F f) {
  const int64_t e = std::max(g.E, g.Ev);
  if (e <= 32) return f(PaddedDim<32>{});
  if (e <= 64) return f(PaddedDim<64>{});
  if (e <= 128) return f(PaddedDim<128>{});
  throw Error("attention_flash: head dims above 128 are not supported on the GPU; use the naive implementation");
}

unsigned tiles(int64_t n) { return unsigned((n + kTile - 1) / kTile); }

}  // namespace

bool flash_tensor_cores(AttentionMath math, int64_t head_dim) {
  if (math == AttentionMath::F32 || properties().major < 8) return false;
  if (head_dim <= 32) return tensor_tiles_fit<32>(math);
  if (head_dim <= 64) return tensor_tiles_fit<64>(math);
  return head_dim <= 128 && tensor_tiles_fit<128>(math);
}

void attention_flash_forward(float* out, float* lse, const float* q, const float* k, const float* v, const float* mask,
                             const uint8_t* key_padding, const AttentionGeom& call) {
  if (call.B * call.NH * call.T == 0) return;
  check_grid(call);
  ModLaunch mods(call, q, nullptr);
  const AttentionGeom& g = mods.geom();  // the call's, with the modifiers' rows
  with_padded_dim(g, [&](auto dim) {
    constexpr int EP = decltype(dim)::value;
    const dim3 grid(unsigned(g.B * g.NH), tiles(g.T));
    with_flash_path<EP>(g.math, [&](auto path) {
      using Op = decltype(path);
      if constexpr (std::is_same_v<Op, CudaCores>) {
        with_mods(g, [&](auto mods_code) {
          launch_kernel("attention_flash_forward", flash_forward_kernel<EP, decltype(mods_code)::value>, grid,
                        kFlashThreads, size_t(4 * forward_smem_floats<EP>()), out, lse, q, k, v, mask, key_padding, g);
        });
      } else {
        with_mods(g, [&](auto mods_code) {
          launch_kernel("attention_flash_forward (tensor cores)",
                        flash_mma_forward_kernel<Op, EP, decltype(mods_code)::value>, grid, kFlashThreads,
                        size_t(flash_mma::forward_smem_bytes<Op, EP>()), out, lse, q, k, v, mask, key_padding, g);
        });
      }
    });
  });
  mods.finish_forward(out, q, k, lse, mask, key_padding);
}

void attention_flash_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                              const float* v, const float* out, const float* lse, const float* mask,
                              const uint8_t* key_padding, const AttentionGeom& call) {
  const int64_t rows = call.B * call.NH * call.T;
  if (rows == 0) return;
  check_grid(call);
  Scratch D(size_t(rows) * sizeof(float));
  launch_kernel("attention_flash_backward (D)", rowdot_kernel, blocks_for(rows * 32), kThreads, 0, D.as<float>(), dout,
                out, call);
  ModLaunch mods(call, q, dout);
  const AttentionGeom& g = mods.geom();  // the call's, with the modifiers' rows
  with_padded_dim(g, [&](auto dim) {
    constexpr int EP = decltype(dim)::value;
    with_flash_path<EP>(g.math, [&](auto path) {
      using Op = decltype(path);
      constexpr bool kCudaCores = std::is_same_v<Op, CudaCores>;
      if ((dk || dv) && g.S > 0) {
        const dim3 grid(unsigned(g.B * g.NKV), tiles(g.S));
        if constexpr (kCudaCores) {
          with_mods(g, [&](auto mods_code) {
            launch_kernel("attention_flash_backward (dk, dv)",
                          flash_backward_dkdv_kernel<EP, decltype(mods_code)::value>, grid, kFlashThreads,
                          size_t(4 * dkdv_smem_floats<EP>()), dk, dv, dout, q, k, v, lse, D.as<float>(), mask,
                          key_padding, g);
          });
        } else {
          with_mods(g, [&](auto mods_code) {
            launch_kernel("attention_flash_backward (dk, dv; tensor cores)",
                          flash_mma_dkdv_kernel<Op, EP, decltype(mods_code)::value>, grid, kFlashThreads,
                          size_t(flash_mma::dkdv_smem_bytes<Op, EP>()), dk, dv, dout, q, k, v, lse, D.as<float>(), mask,
                          key_padding, g);
          });
        }
      }
      if (dq) {
        const dim3 grid(unsigned(g.B * g.NH), tiles(g.T));
        if constexpr (kCudaCores) {
          with_mods(g, [&](auto mods_code) {
            launch_kernel("attention_flash_backward (dq)", flash_backward_dq_kernel<EP, decltype(mods_code)::value>,
                          grid, kFlashThreads, size_t(4 * dq_smem_floats<EP>()), dq, dout, q, k, v, lse, D.as<float>(),
                          mask, key_padding, g);
          });
        } else {
          with_mods(g, [&](auto mods_code) {
            launch_kernel("attention_flash_backward (dq; tensor cores)",
                          flash_mma_dq_kernel<Op, EP, decltype(mods_code)::value>, grid, kFlashThreads,
                          size_t(flash_mma::dq_smem_bytes<Op, EP>()), dq, dout, q, k, v, lse, D.as<float>(), mask,
                          key_padding, g);
          });
        }
      }
    });
  });
  mods.finish_backward(dq, dout, q, k, v, lse, D.as<float>(), mask, key_padding);
}

TINYGPT_CUDA_END

// The kernels on bf16 tensors and their entry points, in the same translation unit (they share its helpers).
#include "kernels/cuda/attention_bf16.cuh"

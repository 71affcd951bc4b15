// Device helpers shared by the attention kernels (attention.cu, flash_mma.cuh): strided rows, causal ends,
// masks and dropout, with the semantics kernels/attention.h describes. Plain code with no CUDA intrinsics, so
// the CPU emulator in tests/emulated_cuda.h can compile it too.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/attention.h"
#include "kernels/base.h"
#include "kernels/scalar_math.h"

namespace tinygpt::cuda {

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/// Row (b, h, t) of a strided operand; const in, const out.
template <class T>
__device__ __forceinline__ T* at(T* base, const int64_t* stride, int64_t b, int64_t h, int64_t t) {
  return base + b * stride[0] + h * stride[1] + t * stride[2];
}

/// Whether query t sees key s (both in range, causal, padding).
__device__ __forceinline__ bool visible(const AttentionGeom& g, const uint8_t* kp, int64_t b, int64_t t, int64_t s) {
  return t < g.T && s < g.S && s < causal_end(g, t) && !(kp && kp[b * g.S + s]);
}

__device__ __forceinline__ float mask_at(const float* mask, const AttentionGeom& g, int64_t b, int64_t h, int64_t t,
                                         int64_t s) {
  return mask ? mask[b * g.mask_stride[0] + h * g.mask_stride[1] + t * g.mask_stride[2] + s * g.mask_stride[3]] : 0.0f;
}

__device__ __forceinline__ float dropout_factor(const AttentionGeom& g, int64_t b, int64_t h, int64_t t, int64_t s) {
  if (g.dropout_p <= 0.0f) return 1.0f;
  const bool keep = dropout_keep(g.dropout_seed.value(), ((b * g.NH + h) * g.T + t) * g.S + s, g.dropout_p);
  return keep ? dropout_scale<float>(g.dropout_p) : 0.0f;
}

/// The dropout of score row (b, h, t): dropout_keep's key for it (kernels/dropout_hash.h), or nothing without dropout.
__device__ __forceinline__ DropoutRow dropout_row(const AttentionGeom& g, int64_t b, int64_t h, int64_t t) {
  return g.dropout_p > 0.0f ? DropoutRow(g.dropout_seed.value(), ((b * g.NH + h) * g.T + t) * g.S) : DropoutRow();
}

/// dropout_factor of key s of the row `row` (dropout_row), with keep_scale = dropout_scale<float>(g.dropout_p): the
/// flash kernels' form, a few 32-bit operations a score.
__device__ __forceinline__ float dropout_factor(const AttentionGeom& g, const DropoutRow& row, float keep_scale,
                                                int64_t s) {
  if (g.dropout_p <= 0.0f) return 1.0f;
  return row.keep(s, g.dropout_p) ? keep_scale : 0.0f;
}

/// True when every query of [t0, t0 + rows) sees every key of [s0, s0 + cols): no padding, no additive mask, no
/// score modifier, all in range and below the causal diagonal. Such tiles skip the per-element checks.
__device__ __forceinline__ bool tile_unmasked(const AttentionGeom& g, const uint8_t* kp, const float* mask, int64_t t0,
                                              int64_t rows, int64_t s0, int64_t cols) {
  return !kp && !mask && !g.mods.any() && t0 + rows <= g.T && s0 + cols <= g.S && causal_end(g, t0) >= s0 + cols;
}

/// The logit of (t, s) from its raw product qk, -inf where the key is hidden (out of range, causal, padding, and the
/// score modifiers of kernels/score_mods.h); `capped` gets the soft-capped scaled score, which the backward needs.
/// With modifiers it is modified_logit (kernels/scalar_math.h, the CPU's too), Shaw's R rows from g.mods.gpu_R.
/// kMods = false promises a call without score modifiers (!g.mods.any()): the flash kernels are built twice, and the
/// build without the modifiers' per-element code is a quarter the size (instruction cache) and needs fewer registers.
template <bool kMods = true>
__device__ __forceinline__ float score_logit(const AttentionGeom& g, const uint8_t* kp, const float* mask, int64_t b,
                                             int64_t h, int64_t t, int64_t s, float qk, float& capped) {
  if (!kMods || !g.mods.any()) {
    capped = float(g.scale) * qk;
    return visible(g, kp, b, t, s) ? capped + mask_at(mask, g, b, h, t, s) : -INFINITY;
  }
  return modified_logit(g, kp, mask, g.mods.gpu_R, b, h, t, s, qk, position_bias<float>(g, h, s - (t + g.S - g.T)),
                        capped);
}

/// dP of (t, s) from dO_t . v_s: plus Shaw's G rows (g.mods.gpu_G) on the value side.
template <bool kMods = true>
__device__ __forceinline__ float score_dp(const AttentionGeom& g, int64_t b, int64_t h, int64_t t, int64_t s,
                                          float dov) {
  return kMods ? modified_dp(g, g.mods.gpu_G, b, h, t, s, dov) : dov;
}

/// The raw product's gradient from the logit's: times the soft-cap's derivative and the scale.
template <bool kMods = true>
__device__ __forceinline__ float score_ds(const AttentionGeom& g, float dlogit, float capped) {
  if (!kMods) return dlogit * float(g.scale);
  return modified_score_grad(dlogit, capped, float(g.scale), float(g.mods.softcap));
}

/// Throws when a call's grid does not fit one launch: B * NH heads in one grid dimension, 64-row tiles of T and S in
/// the other.
inline void check_grid(const AttentionGeom& g) {
  constexpr int64_t kRows = 64;
  if (g.B * g.NH > (int64_t(1) << 31) - 1 || (std::max(g.T, g.S) + kRows - 1) / kRows > 65535) {
    throw Error("attention: the batch, head or sequence count is too large for one GPU launch");
  }
}

}  // namespace tinygpt::cuda

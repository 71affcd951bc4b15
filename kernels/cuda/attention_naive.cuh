// Scaled dot-product attention on the GPU, f32, naive: the reference the flash kernels (attention.cuh) are checked
// against. One warp per query row, the scores in memory (`weights`, or scratch), turned into probabilities in place;
// backward from D = rowsum(dO * O), dq by query rows and dk, dv by key rows. Twins of kernels/cpu/attention.cpp's
// naive kernels; layout, masking and dropout as kernels/attention.h describes. Compiled by nvcc in
// attention_naive.cu and under tests/emulated_cuda.h (see launch.cuh).
#pragma once

#include <algorithm>
#include <cmath>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_rowdot.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/score_mods.cuh"

TINYGPT_CUDA_BEGIN
namespace {

// ---------------------------------------------------------------------------------------------------------------
// Naive reference.

/// One warp per query row; the scores go to `weights` (or scratch) and are turned into probabilities in place.
__global__ void naive_forward_kernel(float* out, float* weights, float* lse, const float* q, const float* k,
                                     const float* v, const float* mask, const uint8_t* kp, AttentionGeom g) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= g.B * g.NH * g.T) return;
  const int64_t b = row / (g.NH * g.T), h = row / g.T % g.NH, t = row % g.T, kvh = h / (g.NH / g.NKV);
  float* p = weights + row * g.S;
  const float* qr = at(q, g.q_stride, b, h, t);
  float mx = -INFINITY;
  for (int64_t s = lane; s < g.S; s += 32) {
    float x = -INFINITY;
    if (g.mods.any() || visible(g, kp, b, t, s)) {
      const float* kr = at(k, g.k_stride, b, kvh, s);
      float dot = 0.0f;
      for (int64_t e = 0; e < g.E; ++e) dot += qr[e] * kr[e];
      float capped;
      x = score_logit(g, kp, mask, b, h, t, s, dot, capped);
    }
    p[s] = x;
    mx = fmaxf(mx, x);
  }
  mx = warp_max(mx);
  float* o = at(out, g.o_stride, b, h, t);
  if (mx == -INFINITY) {  // no visible key
    for (int64_t s = lane; s < g.S; s += 32) p[s] = 0.0f;
    for (int64_t e = lane; e < g.Ev; e += 32) o[e] = 0.0f;
    if (lane == 0) lse[row] = -INFINITY;
    return;
  }
  float sum = 0.0f;
  for (int64_t s = lane; s < g.S; s += 32) sum += (p[s] = expf(p[s] - mx));
  sum = warp_sum(sum);
  const float inv = 1.0f / sum;
  for (int64_t s = lane; s < g.S; s += 32) p[s] *= inv;
  if (lane == 0) lse[row] = mx + logf(sum);
  __syncwarp();
  for (int64_t e = lane; e < g.Ev; e += 32) {
    float acc = 0.0f;
    for (int64_t s = 0; s < g.S; ++s) {
      const float w = p[s] * dropout_factor(g, b, h, t, s);
      if (w != 0.0f) acc += w * at(v, g.v_stride, b, kvh, s)[e];
    }
    o[e] = acc;
  }
}

/// P * dropout and dS of element (b, h, t, s), computed by a whole warp; false when the key is invisible.
__device__ bool naive_element(const AttentionGeom& g, const float* q, const float* k, const float* v, const float* dout,
                              const float* lse, const float* D, const float* mask, const uint8_t* kp, int64_t b,
                              int64_t h, int64_t t, int64_t s, float& pd, float& ds) {
  const int lane = threadIdx.x % 32;
  const int64_t row = (b * g.NH + h) * g.T + t, kvh = h / (g.NH / g.NKV);
  if (lse[row] == -INFINITY || (!g.mods.any() && !visible(g, kp, b, t, s))) return false;
  const float* qr = at(q, g.q_stride, b, h, t);
  const float* kr = at(k, g.k_stride, b, kvh, s);
  const float* gr = at(dout, g.o_stride, b, h, t);
  const float* vr = at(v, g.v_stride, b, kvh, s);
  float qk = 0.0f, dp = 0.0f;
  for (int64_t e = lane; e < g.E; e += 32) qk += qr[e] * kr[e];
  for (int64_t e = lane; e < g.Ev; e += 32) dp += gr[e] * vr[e];
  qk = warp_sum(qk);
  dp = warp_sum(dp);
  float capped;
  const float x = score_logit(g, kp, mask, b, h, t, s, qk, capped);
  if (x == -INFINITY) return false;
  const float p = expf(x - lse[row]);
  const float f = dropout_factor(g, b, h, t, s);
  pd = p * f;
  ds = score_ds(g, p * (score_dp(g, b, h, t, s, dp) * f - D[row]), capped);
  return true;
}

__global__ void naive_backward_dq_kernel(float* dq, const float* dout, const float* q, const float* k, const float* v,
                                         const float* lse, const float* D, const float* mask, const uint8_t* kp,
                                         AttentionGeom g) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= g.B * g.NH * g.T) return;
  const int64_t b = row / (g.NH * g.T), h = row / g.T % g.NH, t = row % g.T, kvh = h / (g.NH / g.NKV);
  float* dqr = at(dq, g.q_stride, b, h, t);
  for (int64_t s = 0; s < g.S; ++s) {
    float pd, ds;
    if (!naive_element(g, q, k, v, dout, lse, D, mask, kp, b, h, t, s, pd, ds)) continue;
    const float* kr = at(k, g.k_stride, b, kvh, s);
    for (int64_t e = lane; e < g.E; e += 32) dqr[e] += ds * kr[e];
  }
}

/// One warp per (batch, kv head, key): it owns that key's dk and dv rows and sums over the group's heads.
__global__ void naive_backward_dkdv_kernel(float* dk, float* dv, const float* dout, const float* q, const float* k,
                                           const float* v, const float* lse, const float* D, const float* mask,
                                           const uint8_t* kp, AttentionGeom g) {
  const int64_t key = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (key >= g.B * g.NKV * g.S) return;
  const int64_t b = key / (g.NKV * g.S), kvh = key / g.S % g.NKV, s = key % g.S, group = g.NH / g.NKV;
  float* dkr = dk ? at(dk, g.k_stride, b, kvh, s) : nullptr;
  float* dvr = dv ? at(dv, g.v_stride, b, kvh, s) : nullptr;
  for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    for (int64_t t = 0; t < g.T; ++t) {
      float pd, ds;
      if (!naive_element(g, q, k, v, dout, lse, D, mask, kp, b, h, t, s, pd, ds)) continue;
      if (dvr) {
        const float* gr = at(dout, g.o_stride, b, h, t);
        for (int64_t e = lane; e < g.Ev; e += 32) dvr[e] += pd * gr[e];
      }
      if (dkr) {
        const float* qr = at(q, g.q_stride, b, h, t);
        for (int64_t e = lane; e < g.E; e += 32) dkr[e] += ds * qr[e];
      }
    }
  }
}

}  // namespace

void attention_naive_forward(float* out, float* weights, float* lse, const float* q, const float* k, const float* v,
                             const float* mask, const uint8_t* key_padding, const AttentionGeom& g) {
  const int64_t rows = g.B * g.NH * g.T;
  if (rows == 0) return;
  check_grid(g);
  Scratch scratch(weights ? 0 : size_t(rows * g.S) * sizeof(float));
  ModLaunch mods(g, q, nullptr);
  launch_kernel("attention_naive_forward", naive_forward_kernel, blocks_for(rows * 32), kThreads, 0, out,
                weights ? weights : scratch.as<float>(), lse, q, k, v, mask, key_padding, mods.geom());
  mods.finish_forward(out, q, k, lse, mask, key_padding);
}

void attention_naive_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                              const float* v, const float* out, const float* lse, const float* mask,
                              const uint8_t* key_padding, const AttentionGeom& g) {
  const int64_t rows = g.B * g.NH * g.T;
  if (rows == 0) return;
  check_grid(g);
  Scratch D(size_t(rows) * sizeof(float));
  launch_kernel("attention_naive_backward (D)", rowdot_kernel, blocks_for(rows * 32), kThreads, 0, D.as<float>(), dout,
                out, g);
  ModLaunch mods(g, q, dout);
  const AttentionGeom& gm = mods.geom();
  if (dq) {
    launch_kernel("attention_naive_backward (dq)", naive_backward_dq_kernel, blocks_for(rows * 32), kThreads, 0, dq,
                  dout, q, k, v, lse, D.as<float>(), mask, key_padding, gm);
  }
  if (dk || dv) {
    launch_kernel("attention_naive_backward (dk, dv)", naive_backward_dkdv_kernel, blocks_for(g.B * g.NKV * g.S * 32),
                  kThreads, 0, dk, dv, dout, q, k, v, lse, D.as<float>(), mask, key_padding, gm);
  }
  mods.finish_backward(dq, dout, q, k, v, lse, D.as<float>(), mask, key_padding);
}

TINYGPT_CUDA_END

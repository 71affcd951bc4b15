// Cross-entropy from logits on the GPU: the loss, its gradient, and the fused classifier (llm.c's: loss and gradient
// in one pass over each row), a warp per row or a block per wide row. Twins of kernels/cpu/nn.cpp's; every sum in a
// fixed order. Compiled by nvcc in crossentropy.cu and under tests/emulated_cuda.h (see launch.cuh).
#pragma once

#include <algorithm>
#include <cmath>

#include "kernels/cuda/launch.cuh"

TINYGPT_CUDA_BEGIN
namespace {

/// Row n's lse from one warp (lane 0 writes it and the loss). The row is read from memory once: the passes after the
/// first find it in L1.
template <class T>
__device__ float crossentropy_row(float* losses, float* lse, const T* x, int32_t target, int64_t n, int64_t V,
                                  int32_t ignore_index, int lane) {
  float mx = -INFINITY;
  for (int64_t v = lane; v < V; v += 32) mx = fmaxf(mx, float(x[v]));
  mx = warp_max(mx);
  float sum = 0.0f;
  for (int64_t v = lane; v < V; v += 32) sum += expf(float(x[v]) - mx);
  sum = warp_sum(sum);
  const float l = mx + logf(sum);
  if (lane == 0) {
    lse[n] = l;
    losses[n] = target == ignore_index ? 0.0f : l - float(x[target]);
  }
  return l;
}

/// One warp per row: lse and the loss.
template <class T>
__global__ void crossentropy_forward_kernel(float* losses, float* lse, const T* logits, const int32_t* targets,
                                            int64_t N, int64_t V, int32_t ignore_index) {
  const int64_t n = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (n >= N) return;
  crossentropy_row(losses, lse, logits + n * V, targets[n], n, V, ignore_index, lane);
}

/// Each element's gradient, the target's term included, added in f32 (or written, `overwrite`) and stored once.
template <class T>
__device__ void crossentropy_grad_row(T* dx, const T* x, float l, int32_t t, float dloss, int64_t V, bool overwrite,
                                      int lane) {
  for (int64_t v = lane; v < V; v += 32)
    dx[v] = (overwrite ? 0.0f : float(dx[v])) + dloss * (expf(float(x[v]) - l) - (v == t ? 1.0f : 0.0f));
}

/// fused: dlogits holds crossentropy_fused's gradient, kept when the upstream gradient is 1 (read here, on the
/// device, so a captured graph decides at each replay).
template <class T>
__global__ void crossentropy_backward_kernel(T* dlogits, const float* dloss_in, float scale, const T* logits,
                                             const float* lse, const int32_t* targets, int64_t N, int64_t V,
                                             int32_t ignore_index, bool fused) {
  const int64_t n = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (n >= N || (fused && *dloss_in == 1.0f) || targets[n] == ignore_index) return;
  crossentropy_grad_row(dlogits + n * V, logits + n * V, lse[n], targets[n], *dloss_in * scale, V, fused, lane);
}

// Wide rows (a vocabulary of kWideRow classes or more, GPT-2's 50257): a block per row instead of a warp, so that
// the rows in flight fit in L2 and the pass after the first finds its row there (a warp a row would put thousands
// of 100 KB rows in flight); each thread takes groups of eight columns (16-byte loads where the rows allow) and runs
// an online softmax over them (max and sum of exponentials in one pass), combined over the block in a fixed order.
inline constexpr int64_t kWideRow = 1024;
inline constexpr int kWideThreads = 256;

/// exp(m - to), 0 when m is -inf (a part that has seen nothing, or only -inf).
__device__ __forceinline__ float rescale(float m, float to) { return m == -INFINITY ? 0.0f : expf(m - to); }

/// The lse of row x (V columns) by the whole block, returned to every thread: red holds 2 floats a warp.
template <class T>
__device__ float wide_row_lse(const T* x, int64_t V, bool vec, float* red) {
  float m = -INFINITY, s = 0.0f;
  for (int64_t c = 8 * int64_t(threadIdx.x); c < V; c += 8 * int64_t(blockDim.x)) {
    float v[8];
    const int k = load_group(v, x, c, V, vec);
    float gm = v[0];
    for (int j = 1; j < 8; ++j) gm = j < k ? fmaxf(gm, v[j]) : gm;
    const float nm = fmaxf(m, gm);
    float add = 0.0f;
    for (int j = 0; j < 8; ++j) add += j < k ? rescale(v[j], nm) : 0.0f;
    s = s * rescale(m, nm) + add;
    m = nm;
  }
  for (int o = 16; o > 0; o >>= 1) {  // the butterfly: every lane ends with the same bits
    const float om = __shfl_xor_sync(0xffffffffu, m, o), os = __shfl_xor_sync(0xffffffffu, s, o);
    const float nm = fmaxf(m, om);
    s = s * rescale(m, nm) + os * rescale(om, nm);
    m = nm;
  }
  const int warp = int(threadIdx.x) / 32, warps = int(blockDim.x) / 32;
  if (threadIdx.x % 32 == 0) {
    red[2 * warp] = m;
    red[2 * warp + 1] = s;
  }
  __syncthreads();
  float M = -INFINITY, S = 0.0f;
  for (int w = 0; w < warps; ++w) M = fmaxf(M, red[2 * w]);
  for (int w = 0; w < warps; ++w) S += red[2 * w + 1] * rescale(red[2 * w], M);
  return M + logf(S);
}

/// A block per row: lse and the loss.
template <class T>
__global__ void crossentropy_forward_wide_kernel(float* losses, float* lse, const T* logits, const int32_t* targets,
                                                 int64_t V, int32_t ignore_index, bool vec) {
  TINYGPT_DYNAMIC_SMEM(float, red);
  const int64_t n = blockIdx.x;
  const T* x = logits + n * V;
  const float l = wide_row_lse(x, V, vec, red);
  if (threadIdx.x == 0) {
    lse[n] = l;
    losses[n] = targets[n] == ignore_index ? 0.0f : l - float(x[targets[n]]);
  }
}

/// A row's gradient by its block, in groups of eight: each element as crossentropy_grad_row computes it.
template <class T>
__device__ void wide_grad_row(T* dx, const T* x, float l, int32_t t, float dloss, int64_t V, bool overwrite, bool vec) {
  for (int64_t c = 8 * int64_t(threadIdx.x); c < V; c += 8 * int64_t(blockDim.x)) {
    float v[8], d[8] = {};
    load_group(v, x, c, V, vec);
    if (!overwrite) load_group(d, dx, c, V, vec);
    for (int j = 0; j < 8; ++j)
      d[j] = (overwrite ? 0.0f : d[j]) + dloss * (expf(v[j] - l) - (c + j == t ? 1.0f : 0.0f));
    store_group(dx, d, c, V, vec);
  }
}

template <class T>
__global__ void crossentropy_backward_wide_kernel(T* dlogits, const float* dloss_in, float scale, const T* logits,
                                                  const float* lse, const int32_t* targets, int64_t V,
                                                  int32_t ignore_index, bool fused, bool vec) {
  const int64_t n = blockIdx.x;
  if ((fused && *dloss_in == 1.0f) || targets[n] == ignore_index) return;
  wide_grad_row(dlogits + n * V, logits + n * V, lse[n], targets[n], *dloss_in * scale, V, fused, vec);
}

template <class T>
__global__ void crossentropy_fused_wide_kernel(float* losses, float* lse, T* dlogits, const T* logits,
                                               const int32_t* targets, float scale, int64_t V, int32_t ignore_index,
                                               bool vec) {
  TINYGPT_DYNAMIC_SMEM(float, red);
  const int64_t n = blockIdx.x;
  const T* x = logits + n * V;
  const int32_t t = targets[n];
  const float l = wide_row_lse(x, V, vec, red);
  if (threadIdx.x == 0) {
    lse[n] = l;
    losses[n] = t == ignore_index ? 0.0f : l - float(x[t]);
  }
  T* dx = dlogits + n * V;
  if (t == ignore_index) {
    const float zero[8] = {};
    for (int64_t c = 8 * int64_t(threadIdx.x); c < V; c += 8 * int64_t(blockDim.x)) store_group(dx, zero, c, V, vec);
  } else {
    wide_grad_row(dx, x, l, t, 1.0f * scale, V, true, vec);
  }
}

/// The fused classifier: one warp per row, its loss, lse and gradient (for an upstream gradient of 1) from one read.
template <class T>
__global__ void crossentropy_fused_kernel(float* losses, float* lse, T* dlogits, const T* logits,
                                          const int32_t* targets, float scale, int64_t N, int64_t V,
                                          int32_t ignore_index) {
  const int64_t n = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (n >= N) return;
  const T* x = logits + n * V;
  const int32_t t = targets[n];
  const float l = crossentropy_row(losses, lse, x, t, n, V, ignore_index, lane);
  T* dx = dlogits + n * V;
  if (t == ignore_index) {
    for (int64_t v = lane; v < V; v += 32) dx[v] = T(0.0f);
  } else {
    crossentropy_grad_row(dx, x, l, t, 1.0f * scale, V, true, lane);  // dloss as the backward computes it for 1
  }
}

}  // namespace

/// Rows of kWideRow classes or more take a block each (the *_wide kernels), narrower ones a warp each. vec: every row
/// starts on a 16-byte boundary (V a multiple of 8 and the buffers aligned), so groups of eight are vector loads.
template <class... P>
bool rows_vec(int64_t V, const P*... p) {
  return V % 8 == 0 && vectors_fit(p...);
}

constexpr size_t kWideSmem = 2 * (kWideThreads / 32) * sizeof(float);

template <class T>
void crossentropy_forward(compute_t<T>* losses, compute_t<T>* lse, const T* logits, const int32_t* targets, int64_t N,
                          int64_t V, int32_t ignore_index) {
  if (N == 0) return;
  if (V >= kWideRow) {
    return launch_kernel("crossentropy_forward", crossentropy_forward_wide_kernel<T>, dim3(unsigned(N)), kWideThreads,
                         kWideSmem, losses, lse, logits, targets, V, ignore_index, rows_vec(V, logits));
  }
  launch_kernel("crossentropy_forward", crossentropy_forward_kernel<T>, blocks_for(N * 32), kThreads, 0, losses, lse,
                logits, targets, N, V, ignore_index);
}

template <class T>
void crossentropy_backward(T* dlogits, const compute_t<T>* dloss, compute_t<T> scale, const T* logits,
                           const compute_t<T>* lse, const int32_t* targets, int64_t N, int64_t V, int32_t ignore_index,
                           bool fused) {
  if (N == 0) return;
  if (V >= kWideRow) {
    return launch_kernel("crossentropy_backward", crossentropy_backward_wide_kernel<T>, dim3(unsigned(N)), kWideThreads,
                         0, dlogits, dloss, scale, logits, lse, targets, V, ignore_index, fused,
                         rows_vec(V, logits, dlogits));
  }
  launch_kernel("crossentropy_backward", crossentropy_backward_kernel<T>, blocks_for(N * 32), kThreads, 0, dlogits,
                dloss, scale, logits, lse, targets, N, V, ignore_index, fused);
}

template <class T>
void crossentropy_fused(compute_t<T>* losses, compute_t<T>* lse, T* dlogits, const T* logits, const int32_t* targets,
                        compute_t<T> scale, int64_t N, int64_t V, int32_t ignore_index) {
  if (N == 0) return;
  if (V >= kWideRow) {
    return launch_kernel("crossentropy_fused", crossentropy_fused_wide_kernel<T>, dim3(unsigned(N)), kWideThreads,
                         kWideSmem, losses, lse, dlogits, logits, targets, scale, V, ignore_index,
                         rows_vec(V, logits, dlogits));
  }
  launch_kernel("crossentropy_fused", crossentropy_fused_kernel<T>, blocks_for(N * 32), kThreads, 0, losses, lse,
                dlogits, logits, targets, scale, N, V, ignore_index);
}

TINYGPT_CUDA_END

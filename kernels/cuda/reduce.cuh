// Sums over a dimension and softmax on the GPU: the twins of kernels/cpu/reduce.cpp, in a fixed order (deterministic).
// Compiled by nvcc in reduce.cu and by the host compiler under tests/emulated_cuda.h (see launch.cuh).
#pragma once

#include <algorithm>
#include <cmath>

#include "kernels/cuda/launch.cuh"

TINYGPT_CUDA_BEGIN
namespace {

/// out[o, i] = alpha * sum_d inp[o, d, i]; one thread per output (coalesced along i).
__global__ void sum_strided_kernel(float* out, const float* inp, int64_t outer, int64_t D, int64_t inner, float alpha) {
  TINYGPT_CUDA_LOOP(j, outer * inner) {
    const int64_t o = j / inner, i = j % inner;
    const float* x = inp + o * D * inner + i;
    float acc = 0.0f;
    for (int64_t d = 0; d < D; ++d) acc += x[d * inner];
    out[j] = alpha * acc;
  }
}

/// inner == 1, first pass: block (row, chunk) sums its chunk of the row into partial[row * chunks + chunk].
template <bool kSquares>
__global__ void sum_rows_kernel(float* partial, const float* inp, int64_t D, int64_t chunk) {
  const float* x = inp + int64_t(blockIdx.x) * D;
  const int64_t d0 = int64_t(blockIdx.y) * chunk, d1 = min(D, d0 + chunk);
  float acc = 0.0f;
  for (int64_t d = d0 + threadIdx.x; d < d1; d += blockDim.x) acc += kSquares ? x[d] * x[d] : x[d];
  acc = block_sum(acc);
  if (threadIdx.x == 0) partial[int64_t(blockIdx.x) * gridDim.y + blockIdx.y] = acc;
}

/// Second pass: each row's chunk sums added in chunk order.
__global__ void sum_partials_kernel(float* out, const float* partial, int64_t rows, int64_t chunks, float alpha) {
  TINYGPT_CUDA_LOOP(r, rows) {
    float acc = 0.0f;
    for (int64_t c = 0; c < chunks; ++c) acc += partial[r * chunks + c];
    out[r] = alpha * acc;
  }
}

__global__ void sum_backward_kernel(float* dinp, const float* dout, int64_t outer, int64_t D, int64_t inner,
                                    float alpha) {
  TINYGPT_CUDA_LOOP(j, outer * D * inner) {
    const int64_t o = j / (D * inner), i = j % inner;
    dinp[j] += alpha * dout[o * inner + i];
  }
}

/// One warp per row: softmax (log=false) or log-softmax (log=true).
__global__ void softmax_forward_kernel(float* out, const float* inp, int64_t N, int64_t C, bool log) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* x = inp + row * C;
  float* y = out + row * C;
  float mx = -INFINITY;
  for (int64_t c = lane; c < C; c += 32) mx = fmaxf(mx, x[c]);
  mx = warp_max(mx);
  if (!log && mx == -INFINITY) {  // every entry masked out: zeros, as attention does
    for (int64_t c = lane; c < C; c += 32) y[c] = 0.0f;
    return;
  }
  float sum = 0.0f;
  for (int64_t c = lane; c < C; c += 32) sum += expf(x[c] - mx);
  sum = warp_sum(sum);
  if (log) {
    const float lse = mx + logf(sum);
    for (int64_t c = lane; c < C; c += 32) y[c] = x[c] - lse;
  } else {
    const float inv = 1.0f / sum;
    for (int64_t c = lane; c < C; c += 32) y[c] = expf(x[c] - mx) * inv;
  }
}

__global__ void softmax_backward_kernel(float* dinp, const float* dout, const float* out, int64_t N, int64_t C,
                                        bool log) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* g = dout + row * C;
  const float* y = out + row * C;
  float* dx = dinp + row * C;
  float acc = 0.0f;
  for (int64_t c = lane; c < C; c += 32) acc += log ? g[c] : g[c] * y[c];
  acc = warp_sum(acc);
  for (int64_t c = lane; c < C; c += 32) dx[c] += log ? g[c] - expf(y[c]) * acc : y[c] * (g[c] - acc);
}

}  // namespace

void sum_forward(float* out, const float* inp, int64_t outer, int64_t D, int64_t inner, float alpha) {
  if (outer * inner == 0) return;
  if (inner == 1 && D >= 256 && outer <= 65535) {
    // Rows are split in chunks of at least 16K elements over up to 256 blocks per row; fixed order throughout.
    const int64_t chunks = std::clamp<int64_t>(D / 16384, 1, 256), chunk = (D + chunks - 1) / chunks;
    Scratch partial(size_t(outer * chunks) * sizeof(float));
    launch_kernel("sum_forward (chunks)", sum_rows_kernel<false>, dim3(unsigned(outer), unsigned(chunks)), 512, 0,
                  partial.as<float>(), inp, D, chunk);
    launch_kernel("sum_forward (partials)", sum_partials_kernel, blocks_for(outer), kThreads, 0, out,
                  partial.as<float>(), outer, chunks, alpha);
  } else {
    launch_kernel("sum_forward", sum_strided_kernel, blocks_for(outer * inner), kThreads, 0, out, inp, outer, D, inner,
                  alpha);
  }
}

void sum_squares(float* out, const float* inp, int64_t n) {
  // As sum_forward over one row: chunks of at least 16K elements over up to 256 blocks, added in a fixed order.
  const int64_t chunks = std::clamp<int64_t>(n / 16384, 1, 256), chunk = (n + chunks - 1) / chunks;
  Scratch partial(size_t(chunks) * sizeof(float));
  launch_kernel("sum_squares (chunks)", sum_rows_kernel<true>, dim3(1, unsigned(chunks)), 512, 0, partial.as<float>(),
                inp, n, chunk);
  launch_kernel("sum_squares (partials)", sum_partials_kernel, 1, kThreads, 0, out, partial.as<float>(), int64_t(1),
                chunks, 1.0f);
}

void sum_backward(float* dinp, const float* dout, int64_t outer, int64_t D, int64_t inner, float alpha) {
  const int64_t n = outer * D * inner;
  if (n == 0) return;
  launch_kernel("sum_backward", sum_backward_kernel, blocks_for(n), kThreads, 0, dinp, dout, outer, D, inner, alpha);
}

void softmax_forward(float* out, const float* inp, int64_t N, int64_t C) {
  if (N * C == 0) return;
  launch_kernel("softmax_forward", softmax_forward_kernel, blocks_for(N * 32), kThreads, 0, out, inp, N, C, false);
}

void softmax_backward(float* dinp, const float* dout, const float* out, int64_t N, int64_t C) {
  if (N * C == 0) return;
  launch_kernel("softmax_backward", softmax_backward_kernel, blocks_for(N * 32), kThreads, 0, dinp, dout, out, N, C,
                false);
}

void log_softmax_forward(float* out, const float* inp, int64_t N, int64_t C) {
  if (N * C == 0) return;
  launch_kernel("log_softmax_forward", softmax_forward_kernel, blocks_for(N * 32), kThreads, 0, out, inp, N, C, true);
}

void log_softmax_backward(float* dinp, const float* dout, const float* out, int64_t N, int64_t C) {
  if (N * C == 0) return;
  launch_kernel("log_softmax_backward", softmax_backward_kernel, blocks_for(N * 32), kThreads, 0, dinp, dout, out, N, C,
                true);
}

TINYGPT_CUDA_END

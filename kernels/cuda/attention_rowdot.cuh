// D = rowsum(dO * O) per query row on the GPU, f32: the first step of the naive and the flash backward passes
// (attention_naive.cuh, attention.cuh). Compiled by nvcc and under tests/emulated_cuda.h (see launch.cuh).
#pragma once

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/launch.cuh"

TINYGPT_CUDA_BEGIN
namespace {

/// D[row] = dot(dout, out) of every query row; one warp per row.
__global__ void rowdot_kernel(float* D, const float* dout, const float* out, AttentionGeom g) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= g.B * g.NH * g.T) return;
  const int64_t b = row / (g.NH * g.T), h = row / g.T % g.NH, t = row % g.T;
  const float* go = at(dout, g.o_stride, b, h, t);
  const float* o = at(out, g.o_stride, b, h, t);
  float acc = 0.0f;
  for (int64_t e = lane; e < g.Ev; e += 32) acc += go[e] * o[e];
  acc = warp_sum(acc);
  if (lane == 0) D[row] = acc;
}

}  // namespace
TINYGPT_CUDA_END

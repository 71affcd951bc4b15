// Matmuls: batched matmul and the linear layer, forward and backward, as cuBLAS products (gemm in
// kernels/cuda/cublas.cu) plus the small kernels around them (bias, fixed-order bias gradient). Twins of
// kernels/cpu/matmul.cpp; f32 throughout, TF32 tensor cores when the call asks for them. Compiled by nvcc in
// matmul.cu and under tests/emulated_cuda.h, where a loop stands in for cuBLAS.
#pragma once

#include <algorithm>

#include "kernels/cuda/launch.cuh"

TINYGPT_CUDA_BEGIN

/// The unbatched product (beside the batched one of runtime.cuh, so both overloads are found).
inline void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc, bool tf32, const char* what) {
  gemm(trans_a, trans_b, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1, tf32, what);
}

namespace {

/// Block b sums rows [b * rows, (b + 1) * rows) of x (N, C) into partial[b] (C floats).
__global__ void column_partials_kernel(float* partial, const float* x, int64_t N, int64_t C, int64_t rows) {
  const int64_t n0 = int64_t(blockIdx.x) * rows, n1 = min(N, n0 + rows);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = 0.0f;
#pragma unroll 4
    for (int64_t n = n0; n < n1; ++n) acc += x[n * C + c];
    partial[C * blockIdx.x + c] = acc;
  }
}

__global__ void add_partials_kernel(float* out, const float* partial, int64_t blocks, int64_t C) {
  TINYGPT_CUDA_LOOP(c, C) {
    float acc = 0.0f;
    for (int64_t b = 0; b < blocks; ++b) acc += partial[C * b + c];
    out[c] += acc;
  }
}

/// out (C) += column sums of x (N, C), in a fixed order.
void add_column_sums(float* out, const float* x, int64_t N, int64_t C) {
  const int64_t rows = std::max<int64_t>(32, (N + 255) / 256);
  const int64_t blocks = (N + rows - 1) / rows;
  Scratch partial(size_t(C * blocks) * sizeof(float));
  launch_kernel("linear_backward (bias partial sums)", column_partials_kernel, unsigned(blocks), 256, 0, partial.as<float>(), x, N, C, rows);
  launch_kernel("linear_backward (bias sum)", add_partials_kernel, blocks_for(C), kThreads, 0, out, partial.as<float>(), blocks, C);
}

__global__ void add_bias_kernel(float* out, const float* bias, int64_t N, int64_t OC) {
  TINYGPT_CUDA_LOOP(i, N * OC) out[i] += bias[i % OC];
}

}  // namespace


void matmul_forward(float* out, const float* a, const float* b, int64_t batch_a, int64_t batch_b, int64_t M, int64_t K,
                    int64_t N, bool trans_a, bool trans_b, bool tf32) {
  const int64_t lda = trans_a ? M : K, ldb = trans_b ? K : N;
  if (batch_b == 1 && !trans_a) {
    gemm(false, trans_b, batch_a * M, N, K, 1.0f, a, lda, b, ldb, 0.0f, out, N, tf32, "matmul_forward");
    return;
  }
  gemm(trans_a, trans_b, M, N, K, 1.0f, a, lda, batch_a == 1 ? 0 : M * K, b, ldb, batch_b == 1 ? 0 : K * N, 0.0f, out,
       N, M * N, std::max(batch_a, batch_b), tf32, "matmul_forward");
}

void matmul_backward(float* da, float* db, const float* dout, const float* a, const float* b, int64_t batch_a,
                     int64_t batch_b, int64_t M, int64_t K, int64_t N, bool trans_a, bool trans_b, bool tf32) {
  const int64_t lda = trans_a ? M : K, ldb = trans_b ? K : N;
  const int64_t batch = std::max(batch_a, batch_b);
  if (batch_b == 1 && !trans_a) {
    if (da) gemm(false, !trans_b, batch_a * M, K, N, 1.0f, dout, N, b, ldb, 1.0f, da, K, tf32, "matmul_backward (da)");
    if (db) {
      if (trans_b) {
        gemm(true, false, N, K, batch_a * M, 1.0f, dout, N, a, lda, 1.0f, db, K, tf32, "matmul_backward (db)");
      } else {
        gemm(true, false, K, N, batch_a * M, 1.0f, a, lda, dout, N, 1.0f, db, N, tf32, "matmul_backward (db)");
      }
    }
    return;
  }
  // A gradient shared by every batch (batch 1 against a batched operand) is summed one batch after another.
  if (da) {
    const int64_t sb = batch_b == 1 ? 0 : K * N;
    auto grad_a = [&](int64_t first, int64_t count, int64_t sda) {
      const float* bi = b + first * sb;
      const float* gi = dout + first * M * N;
      float* dai = da + (sda == 0 ? 0 : first * M * K);
      if (trans_a) {
        gemm(trans_b, true, K, M, N, 1.0f, bi, ldb, sb, gi, N, M * N, 1.0f, dai, M, sda, count, tf32, "matmul_backward (da)");
      } else {
        gemm(false, !trans_b, M, K, N, 1.0f, gi, N, M * N, bi, ldb, sb, 1.0f, dai, K, sda, count, tf32, "matmul_backward (da)");
      }
    };
    if (batch_a == 1) {
      for (int64_t i = 0; i < batch; ++i) grad_a(i, 1, 0);
    } else {
      grad_a(0, batch, M * K);
    }
  }
  if (db) {
    const int64_t sa = batch_a == 1 ? 0 : M * K;
    auto grad_b = [&](int64_t first, int64_t count, int64_t sdb) {
      const float* ai = a + first * sa;
      const float* gi = dout + first * M * N;
      float* dbi = db + (sdb == 0 ? 0 : first * K * N);
      if (trans_b) {
        gemm(true, trans_a, N, K, M, 1.0f, gi, N, M * N, ai, lda, sa, 1.0f, dbi, K, sdb, count, tf32, "matmul_backward (db)");
      } else {
        gemm(!trans_a, false, K, N, M, 1.0f, ai, lda, sa, gi, N, M * N, 1.0f, dbi, N, sdb, count, tf32, "matmul_backward (db)");
      }
    };
    if (batch_b == 1) {
      for (int64_t i = 0; i < batch; ++i) grad_b(i, 1, 0);
    } else {
      grad_b(0, batch, K * N);
    }
  }
}

void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t N, int64_t C, int64_t OC, bool tf32) {
  if (N == 0 || OC == 0) return;
  if (bias && C > 0 && linear_forward_epilogue(out, inp, weight, bias, N, C, OC, tf32)) return;
  gemm(false, true, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC, tf32, "linear_forward");
  if (bias) {
    launch_kernel("linear_forward (bias)", add_bias_kernel, blocks_for(N * OC), kThreads, 0, out, bias, N, OC);
  }
}

void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight,
                     int64_t N, int64_t C, int64_t OC, bool tf32) {
  if (dinp) gemm(false, false, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C, tf32, "linear_backward (dinp)");
  if (dweight) gemm(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C, tf32, "linear_backward (dweight)");
  if (dbias && N > 0) add_column_sums(dbias, dout, N, OC);
}
TINYGPT_CUDA_END

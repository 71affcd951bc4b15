// Matmuls through cuBLAS: batched matmul and the linear layer, forward and backward. Twins of
// kernels/cpu/matmul.cpp. Row-major products are computed as the column-major product of the transposes
// (C^T = B^T A^T), so no data is ever transposed. f32 throughout; TF32 tensor cores when allowed.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/runtime.cuh"

namespace tinygpt::cuda {
namespace {

cublasComputeType_t compute_type() { return allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F; }

/// TF32 only where every leading dimension is a multiple of 4 floats: cuBLAS's tensor-core kernels need 16-byte
/// aligned rows, and with a dimension like a 65-character vocabulary it falls back to much slower ones.
cublasComputeType_t compute_type(int64_t lda, int64_t ldb, int64_t ldc) {
  return lda % 4 == 0 && ldb % 4 == 0 && ldc % 4 == 0 ? compute_type() : CUBLAS_COMPUTE_32F;
}

/// Row-major C (M, N) = alpha * op(A) @ op(B) + beta * C, `batch` times with the given element strides
/// (0: the operand is shared by every batch).
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          int64_t stride_a, const float* B, int64_t ldb, int64_t stride_b, float beta, float* C, int64_t ldc,
          int64_t stride_c, int64_t batch, const char* what) {
  if (M == 0 || N == 0 || batch == 0) return;
  check(cublasGemmStridedBatchedEx(cublas(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   int(N), int(M), int(K), &alpha, B, CUDA_R_32F, int(ldb), stride_b, A, CUDA_R_32F,
                                   int(lda), stride_a, &beta, C, CUDA_R_32F, int(ldc), stride_c, int(batch),
                                   compute_type(lda, ldb, ldc), CUBLAS_GEMM_DEFAULT),
        what);
}

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc, const char* what) {
  gemm(trans_a, trans_b, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1, what);
}

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
  column_partials_kernel<<<unsigned(blocks), 256>>>(partial.as<float>(), x, N, C, rows);
  check_launch("linear_backward (bias partial sums)");
  add_partials_kernel<<<blocks_for(C), kThreads>>>(out, partial.as<float>(), blocks, C);
  check_launch("linear_backward (bias sum)");
}

__global__ void add_bias_kernel(float* out, const float* bias, int64_t N, int64_t OC) {
  TINYGPT_CUDA_LOOP(i, N * OC) out[i] += bias[i % OC];
}

/// out (N, OC) = inp (N, C) @ weight (OC, C)^T + bias with the bias added in cublasLt's epilogue. Returns false
/// when cublasLt offers no algorithm for the shape (the caller then adds the bias itself).
bool linear_forward_lt(float* out, const float* inp, const float* weight, const float* bias, int64_t N, int64_t C,
                       int64_t OC) {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  bool ok = false;
  const cublasOperation_t trans = CUBLAS_OP_T, no_trans = CUBLAS_OP_N;
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  size_t ws_bytes = 0;
  void* ws = cublaslt_workspace(&ws_bytes);
  // Column-major: D (OC, N) = W^T-as-stored (C, OC)^T @ inp-as-stored (C, N).
  check(cublasLtMatmulDescCreate(&op, compute_type(), CUDA_R_32F), "cublasLtMatmulDescCreate");
  check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof(trans)), "cublasLt TRANSA");
  check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &no_trans, sizeof(no_trans)), "cublasLt TRANSB");
  check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)), "cublasLt EPILOGUE");
  check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)), "cublasLt BIAS_POINTER");
  check(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, uint64_t(C), uint64_t(OC), C), "cublasLtMatrixLayoutCreate");
  check(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, uint64_t(C), uint64_t(N), C), "cublasLtMatrixLayoutCreate");
  check(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, uint64_t(OC), uint64_t(N), OC), "cublasLtMatrixLayoutCreate");
  check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes)),
        "cublasLt workspace");
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  if (cublasLtMatmulAlgoGetHeuristic(cublaslt(), op, la, lb, ld, ld, pref, 1, &heuristic, &found) ==
          CUBLAS_STATUS_SUCCESS &&
      found > 0) {
    const float alpha = 1.0f, beta = 0.0f;
    check(cublasLtMatmul(cublaslt(), op, &alpha, weight, la, inp, lb, &beta, out, ld, out, ld, &heuristic.algo, ws,
                         ws_bytes, nullptr),
          "linear_forward (cublasLtMatmul)");
    ok = true;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatmulDescDestroy(op);
  return ok;
}

}  // namespace

void matmul_forward(float* out, const float* a, const float* b, int64_t batch_a, int64_t batch_b, int64_t M, int64_t K,
                    int64_t N, bool trans_a, bool trans_b) {
  const int64_t lda = trans_a ? M : K, ldb = trans_b ? K : N;
  if (batch_b == 1 && !trans_a) {
    gemm(false, trans_b, batch_a * M, N, K, 1.0f, a, lda, b, ldb, 0.0f, out, N, "matmul_forward");
    return;
  }
  gemm(trans_a, trans_b, M, N, K, 1.0f, a, lda, batch_a == 1 ? 0 : M * K, b, ldb, batch_b == 1 ? 0 : K * N, 0.0f, out,
       N, M * N, std::max(batch_a, batch_b), "matmul_forward");
}

void matmul_backward(float* da, float* db, const float* dout, const float* a, const float* b, int64_t batch_a,
                     int64_t batch_b, int64_t M, int64_t K, int64_t N, bool trans_a, bool trans_b) {
  const int64_t lda = trans_a ? M : K, ldb = trans_b ? K : N;
  const int64_t batch = std::max(batch_a, batch_b);
  if (batch_b == 1 && !trans_a) {
    if (da) gemm(false, !trans_b, batch_a * M, K, N, 1.0f, dout, N, b, ldb, 1.0f, da, K, "matmul_backward (da)");
    if (db) {
      if (trans_b) {
        gemm(true, false, N, K, batch_a * M, 1.0f, dout, N, a, lda, 1.0f, db, K, "matmul_backward (db)");
      } else {
        gemm(true, false, K, N, batch_a * M, 1.0f, a, lda, dout, N, 1.0f, db, N, "matmul_backward (db)");
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
        gemm(trans_b, true, K, M, N, 1.0f, bi, ldb, sb, gi, N, M * N, 1.0f, dai, M, sda, count, "matmul_backward (da)");
      } else {
        gemm(false, !trans_b, M, K, N, 1.0f, gi, N, M * N, bi, ldb, sb, 1.0f, dai, K, sda, count, "matmul_backward (da)");
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
        gemm(true, trans_a, N, K, M, 1.0f, gi, N, M * N, ai, lda, sa, 1.0f, dbi, K, sdb, count, "matmul_backward (db)");
      } else {
        gemm(!trans_a, false, K, N, M, 1.0f, ai, lda, sa, gi, N, M * N, 1.0f, dbi, N, sdb, count, "matmul_backward (db)");
      }
    };
    if (batch_b == 1) {
      for (int64_t i = 0; i < batch; ++i) grad_b(i, 1, 0);
    } else {
      grad_b(0, batch, K * N);
    }
  }
}

void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t N, int64_t C, int64_t OC) {
  if (N == 0 || OC == 0) return;
  if (bias && C > 0 && linear_forward_lt(out, inp, weight, bias, N, C, OC)) return;
  gemm(false, true, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC, "linear_forward");
  if (bias) {
    add_bias_kernel<<<blocks_for(N * OC), kThreads>>>(out, bias, N, OC);
    check_launch("linear_forward (bias)");
  }
}

void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight,
                     int64_t N, int64_t C, int64_t OC) {
  if (dinp) gemm(false, false, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C, "linear_backward (dinp)");
  if (dweight) gemm(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C, "linear_backward (dweight)");
  if (dbias && N > 0) add_column_sums(dbias, dout, N, OC);
}

}  // namespace tinygpt::cuda

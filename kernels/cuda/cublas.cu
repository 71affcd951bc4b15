// The cuBLAS products under kernels/cuda/matmul.cuh (declared in runtime.cuh). Row-major products are computed as
// the column-major product of the transposes (C^T = B^T A^T), so no data is ever transposed. The emulated backend
// of the tests replaces this file with a loop (tests/emulated_cuda.h).
#include "kernels/cuda/runtime.cuh"

namespace tinygpt::cuda {
namespace {

/// TF32 only where every leading dimension is a multiple of 4 floats: cuBLAS's tensor-core kernels need 16-byte
/// aligned rows, and with a dimension like a 65-character vocabulary it falls back to much slower ones.
cublasComputeType_t compute_type(bool tf32, int64_t lda, int64_t ldb, int64_t ldc) {
  return tf32 && lda % 4 == 0 && ldb % 4 == 0 && ldc % 4 == 0 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

/// The handle's math mode follows the call: with TF32 allowed there, cuBLAS may use TF32 tensor cores even where
/// the compute type stays f32 (rows not 16-byte aligned). Set only when it changes (one stream, one host thread).
void set_math_mode(bool tf32) {
  static int current = -1;
  if (current == int(tf32)) return;
  check(cublasSetMathMode(cublas(), tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  current = int(tf32);
}

/// The row-major product as cuBLAS's column-major one of the transposes: C^T = op(B)^T op(A)^T.
void strided_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
                     int64_t lda, int64_t stride_a, const void* B, int64_t ldb, int64_t stride_b, cudaDataType_t type,
                     float beta, float* C, int64_t ldc, int64_t stride_c, int64_t batch, cublasComputeType_t compute,
                     const char* what) {
  check(cublasGemmStridedBatchedEx(cublas(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   int(N), int(M), int(K), &alpha, B, type, int(ldb), stride_b, A, type, int(lda),
                                   stride_a, &beta, C, CUDA_R_32F, int(ldc), stride_c, int(batch), compute,
                                   CUBLAS_GEMM_DEFAULT),
        what);
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          int64_t stride_a, const float* B, int64_t ldb, int64_t stride_b, float beta, float* C, int64_t ldc,
          int64_t stride_c, int64_t batch, bool tf32, const char* what) {
  if (M == 0 || N == 0 || batch == 0) return;
  set_math_mode(tf32);
  strided_batched(trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, CUDA_R_32F, beta, C, ldc,
                  stride_c, batch, compute_type(tf32, lda, ldb, ldc), what);
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
               int64_t lda, int64_t stride_a, const uint16_t* B, int64_t ldb, int64_t stride_b, float beta, float* C,
               int64_t ldc, int64_t stride_c, int64_t batch, const char* what) {
  if (M == 0 || N == 0 || batch == 0) return;
  set_math_mode(false);
  strided_batched(trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, CUDA_R_16BF, beta, C, ldc,
                  stride_c, batch, CUBLAS_COMPUTE_32F, what);
}

bool linear_forward_epilogue(float* out, const float* inp, const float* weight, const float* bias, int64_t N, int64_t C,
                             int64_t OC, bool tf32) {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  bool ok = false;
  const cublasOperation_t trans = CUBLAS_OP_T, no_trans = CUBLAS_OP_N;
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  size_t ws_bytes = 0;
  void* ws = cublaslt_workspace(&ws_bytes);
  // Column-major: D (OC, N) = W^T-as-stored (C, OC)^T @ inp-as-stored (C, N).
  check(cublasLtMatmulDescCreate(&op, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
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
                         ws_bytes, stream()),
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

}  // namespace tinygpt::cuda

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
                     float beta, void* C, cudaDataType_t c_type, int64_t ldc, int64_t stride_c, int64_t batch,
                     cublasComputeType_t compute, const char* what) {
  const ProfiledRegion timed(what);
  check(cublasGemmStridedBatchedEx(cublas(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   int(N), int(M), int(K), &alpha, B, type, int(ldb), stride_b, A, type, int(lda),
                                   stride_a, &beta, C, c_type, int(ldc), stride_c, int(batch), compute,
                                   CUBLAS_GEMM_DEFAULT),
        what);
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          int64_t stride_a, const float* B, int64_t ldb, int64_t stride_b, float beta, float* C, int64_t ldc,
          int64_t stride_c, int64_t batch, bool tf32, const char* what) {
  if (M == 0 || N == 0 || batch == 0) return;
  set_math_mode(tf32);
  strided_batched(trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, CUDA_R_32F, beta, C, CUDA_R_32F,
                  ldc, stride_c, batch, compute_type(tf32, lda, ldb, ldc), what);
}

namespace {

/// The product of bf16 operands, f32 sums, C of c_type (f32 or bf16).
void bf16_operands(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
                   int64_t lda, int64_t stride_a, const uint16_t* B, int64_t ldb, int64_t stride_b, float beta, void* C,
                   cudaDataType_t c_type, int64_t ldc, int64_t stride_c, int64_t batch, const char* what) {
  if (M == 0 || N == 0 || batch == 0) return;
  set_math_mode(false);
  strided_batched(trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, CUDA_R_16BF, beta, C, c_type,
                  ldc, stride_c, batch, CUBLAS_COMPUTE_32F, what);
}

}  // namespace

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t lda,
               int64_t stride_a, const uint16_t* B, int64_t ldb, int64_t stride_b, float beta, float* C, int64_t ldc,
               int64_t stride_c, int64_t batch, const char* what) {
  bf16_operands(trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, CUDA_R_32F, ldc,
                stride_c, batch, what);
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t lda,
               int64_t stride_a, const uint16_t* B, int64_t ldb, int64_t stride_b, float beta, bf16* C, int64_t ldc,
               int64_t stride_c, int64_t batch, const char* what) {
  bf16_operands(trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, CUDA_R_16BF, ldc,
                stride_c, batch, what);
}

bool fused_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda, const void* B,
                int64_t ldb, float* D, int64_t ldd, MatmulMath math, Epilogue epilogue, const float* bias, float* aux,
                int64_t ldaux, const char* what) {
  static constexpr cublasLtEpilogue_t kEpilogue[] = {CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_GELU_AUX,
                                                     CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUBLASLT_EPILOGUE_DGELU};
  const cublasLtEpilogue_t ep = kEpilogue[int(epilogue)];
  const bool bf16 = math == MatmulMath::BF16;
  const cudaDataType_t type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasComputeType_t compute = bf16 ? CUBLAS_COMPUTE_32F : compute_type(math == MatmulMath::TF32, lda, ldb, ldd);
  const cublasOperation_t op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  bool ok = false;
  size_t ws_bytes = 0;
  void* ws = cublaslt_workspace(&ws_bytes);
  // Column-major, as strided_batched: D^T (N, M) = op(B)^T (N, K) @ op(A)^T (K, M), B as stored is cublasLt's A.
  check(cublasLtMatmulDescCreate(&op, compute, CUDA_R_32F), what);
  check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)), what);
  check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)), what);
  check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)), what);
  if (epilogue == Epilogue::Bias || epilogue == Epilogue::GeluBias) {
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)), what);
  }
  if (epilogue != Epilogue::Bias) {
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)), what);
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ldaux, sizeof(ldaux)), what);
  }
  check(cublasLtMatrixLayoutCreate(&la, type, uint64_t(trans_b ? K : N), uint64_t(trans_b ? N : K), ldb), what);
  check(cublasLtMatrixLayoutCreate(&lb, type, uint64_t(trans_a ? M : K), uint64_t(trans_a ? K : M), lda), what);
  check(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, uint64_t(N), uint64_t(M), ldd), what);
  check(cublasLtMatmulPreferenceCreate(&pref), what);
  check(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes)),
      what);
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  if (cublasLtMatmulAlgoGetHeuristic(cublaslt(), op, la, lb, ld, ld, pref, 1, &heuristic, &found) ==
          CUBLAS_STATUS_SUCCESS &&
      found > 0) {
    const float alpha = 1.0f, beta = 0.0f;
    const ProfiledRegion timed(what);
    const cublasStatus_t status = cublasLtMatmul(cublaslt(), op, &alpha, B, la, A, lb, &beta, D, ld, D, ld,
                                                 &heuristic.algo, ws, ws_bytes, stream());
    // An algorithm the heuristic offered and the call then refused queues nothing: the caller's kernels take over.
    if (status != CUBLAS_STATUS_NOT_SUPPORTED) check(status, what);
    ok = status == CUBLAS_STATUS_SUCCESS;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatmulDescDestroy(op);
  return ok;
}

}  // namespace tinygpt::cuda

// cuBLAS and cuBLASLt opened on first use, not at start-up: the binary does not link them, so a CPU run of a CUDA build
// maps none of their 200-odd MB (a run with --device cuda opens them at its first matmul). Each function the backend
// calls is defined here with the header's own declaration and forwards to the library's symbol, found once with
// dlopen/dlsym (kernels/cuda/lazy_libs.h). A library that cannot be opened is one error naming it and what to do.
#include <cublasLt.h>
#include <cublas_v2.h>

#include "kernels/cuda/lazy_libs.h"

namespace {
tinygpt::cuda::LazyLib g_cublas{"libcublas.so." TINYGPT_STR(CUBLAS_VER_MAJOR), TINYGPT_CUDA_LIBDIR, "cuBLAS"};
tinygpt::cuda::LazyLib g_cublaslt{"libcublasLt.so." TINYGPT_STR(CUBLAS_VER_MAJOR), TINYGPT_CUDA_LIBDIR, "cuBLASLt"};
}  // namespace

TINYGPT_LAZY(g_cublas, cublasStatus_t, cublasCreate_v2, (cublasHandle_t * handle), (handle))
TINYGPT_LAZY(g_cublas, cublasStatus_t, cublasSetStream_v2, (cublasHandle_t handle, cudaStream_t streamId),
             (handle, streamId))
TINYGPT_LAZY(g_cublas, cublasStatus_t, cublasSetWorkspace_v2,
             (cublasHandle_t handle, void* workspace, size_t workspaceSizeInBytes),
             (handle, workspace, workspaceSizeInBytes))
TINYGPT_LAZY(g_cublas, cublasStatus_t, cublasSetMathMode, (cublasHandle_t handle, cublasMath_t mode), (handle, mode))
TINYGPT_LAZY(g_cublas, const char*, cublasGetStatusString, (cublasStatus_t status), (status))
TINYGPT_LAZY(g_cublas, cublasStatus_t, cublasGemmStridedBatchedEx,
             (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
              const void* alpha, const void* A, cudaDataType Atype, int lda, long long int strideA, const void* B,
              cudaDataType Btype, int ldb, long long int strideB, const void* beta, void* C, cudaDataType Ctype,
              int ldc, long long int strideC, int batchCount, cublasComputeType_t computeType, cublasGemmAlgo_t algo),
             (handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb, strideB, beta, C, Ctype,
              ldc, strideC, batchCount, computeType, algo))

TINYGPT_LAZY(g_cublaslt, cublasStatus_t, cublasLtCreate, (cublasLtHandle_t * lightHandle), (lightHandle))
TINYGPT_LAZY(g_cublaslt, cublasStatus_t, cublasLtMatmulDescCreate,
             (cublasLtMatmulDesc_t * matmulDesc, cublasComputeType_t computeType, cudaDataType_t scaleType),
             (matmulDesc, computeType, scaleType))
TINYGPT_LAZY(g_cublaslt, cublasStatus_t, cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t matmulDesc), (matmulDesc))
TINYGPT_LAZY(g_cublaslt, cublasStatus_t, cublasLtMatmulDescSetAttribute,
             (cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr, const void* buf,
              size_t sizeInBytes),
             (matmulDesc, attr, buf, sizeInBytes))
TINYGPT_LAZY(g_cublaslt, cublasStatus_t, cublasLtMatrixLayoutCreate,
             (cublasLtMatrixLayout_t * matLayout, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld),
             (matLayout, type, rows, cols, ld))
TINYGPT_LAZY(g_cublaslt, cublasStatus_t, cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t matLayout), (matLayout))
TINYGPT_LAZY(g_cublaslt, cublasStatus_t, cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * pref), (pref))
TINYGPT_LAZY(g_cublaslt, cublasStatus_t, cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t pref), (pref))
TINYGPT_LAZY(g_cublaslt, cublasStatus_t, cublasLtMatmulPreferenceSetAttribute,
             (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
              size_t sizeInBytes),
             (pref, attr, buf, sizeInBytes))
TINYGPT_LAZY(g_cublaslt, cublasStatus_t, cublasLtMatmulAlgoGetHeuristic,
             (cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
              cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
              cublasLtMatmulPreference_t preference, int requestedAlgoCount,
              cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount),
             (lightHandle, operationDesc, Adesc, Bdesc, Cdesc, Ddesc, preference, requestedAlgoCount,
              heuristicResultsArray, returnAlgoCount))
TINYGPT_LAZY(g_cublaslt, cublasStatus_t, cublasLtMatmul,
             (cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void* alpha, const void* A,
              cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
              const void* C, cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc,
              const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspaceSizeInBytes, cudaStream_t stream),
             (lightHandle, computeDesc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace,
              workspaceSizeInBytes, stream))

// NCCL opened on first use (kernels/cuda/lazy_cublas.cpp says why and how): only a data-parallel run on GPUs maps it.
#include <nccl.h>

#include "kernels/cuda/lazy_libs.h"

namespace {
tinygpt::cuda::LazyLib g_nccl{"libnccl.so." TINYGPT_STR(NCCL_MAJOR), TINYGPT_NCCL_LIBDIR, "NCCL"};
}  // namespace

TINYGPT_LAZY(g_nccl, ncclResult_t, ncclGetUniqueId, (ncclUniqueId * uniqueId), (uniqueId))
TINYGPT_LAZY(g_nccl, ncclResult_t, ncclCommInitRank, (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank),
             (comm, nranks, commId, rank))
TINYGPT_LAZY(g_nccl, ncclResult_t, ncclCommDestroy, (ncclComm_t comm), (comm))
TINYGPT_LAZY(g_nccl, const char*, ncclGetErrorString, (ncclResult_t result), (result))
TINYGPT_LAZY(g_nccl, const char*, ncclGetLastError, (ncclComm_t comm), (comm))
TINYGPT_LAZY(g_nccl, ncclResult_t, ncclGroupStart, (), ())
TINYGPT_LAZY(g_nccl, ncclResult_t, ncclGroupEnd, (), ())
TINYGPT_LAZY(g_nccl, ncclResult_t, ncclSend,
             (const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
              cudaStream_t stream),
             (sendbuff, count, datatype, peer, comm, stream))
TINYGPT_LAZY(g_nccl, ncclResult_t, ncclRecv,
             (void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream),
             (recvbuff, count, datatype, peer, comm, stream))
TINYGPT_LAZY(g_nccl, ncclResult_t, ncclBroadcast,
             (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
              cudaStream_t stream),
             (sendbuff, recvbuff, count, datatype, root, comm, stream))

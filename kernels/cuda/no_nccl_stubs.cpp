// Linked instead of kernels/cuda/nccl.cu when the build has no NCCL (CPU-only, or nccl.h/libnccl not found):
// training on several GPUs then reduces the gradients through host memory over MPI.
#include "kernels/base.h"
#include "kernels/device.h"

namespace tinygpt::cuda {
namespace {

[[noreturn]] void unavailable() {
  throw Error("this tinygpt was built without NCCL (nccl.h and libnccl were not found at configure time)");
}

}  // namespace

bool built_with_nccl() { return false; }
NcclId nccl_unique_id() { unavailable(); }
void nccl_init(const NcclId&, int, int) { unavailable(); }
void nccl_all_reduce_sum(float*, int64_t) { unavailable(); }

}  // namespace tinygpt::cuda

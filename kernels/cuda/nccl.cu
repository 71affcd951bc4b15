// NCCL for data-parallel training on several GPUs (kernels/device.h): this process's communicator and the
// fixed-order all-reduce. Built when the configure step found nccl.h and libnccl (kernels/cuda/no_nccl_stubs.cpp
// otherwise). Every NCCL call runs on the default stream, after the kernels that wrote the gradients.
#include <fmt/format.h>
#include <nccl.h>

#include <cstring>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/runtime.cuh"

namespace tinygpt::cuda {
namespace {

struct Nccl {
  ncclComm_t comm = nullptr;
  int rank = 0, world = 1;
  ~Nccl() {
    if (comm != nullptr) ncclCommDestroy(comm);
  }
};
Nccl g_nccl;

void check(ncclResult_t status, const char* what) {
  if (status == ncclSuccess) return;
  const char* detail = g_nccl.comm != nullptr ? ncclGetLastError(g_nccl.comm) : "";
  throw Error(fmt::format("{}: NCCL error: {}{}{}", what, ncclGetErrorString(status), *detail ? ": " : "", detail));
}

}  // namespace

bool built_with_nccl() { return true; }

NcclId nccl_unique_id() {
  static_assert(sizeof(NcclId) == sizeof(ncclUniqueId), "NcclId must hold an ncclUniqueId");
  ncclUniqueId id;
  check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  NcclId out;
  std::memcpy(out.bytes, &id, sizeof(id));
  return out;
}

void nccl_init(const NcclId& id, int rank, int world) {
  if (g_nccl.comm != nullptr) throw Error("nccl_init: this process already has a NCCL communicator");
  ncclUniqueId nid;
  std::memcpy(&nid, id.bytes, sizeof(nid));
  check(ncclCommInitRank(&g_nccl.comm, world, nid, rank), "ncclCommInitRank");
  g_nccl.rank = rank, g_nccl.world = world;
}

void nccl_all_reduce_sum(float* data, int64_t n) {
  if (g_nccl.comm == nullptr) throw Error("nccl_all_reduce_sum: no NCCL communicator (call nccl_init first)");
  const int N = g_nccl.world, me = g_nccl.rank;
  auto begin = [&](int i) { return n * i / N; };  // rank i owns [begin(i), begin(i + 1))
  const int64_t own = begin(me + 1) - begin(me);
  Scratch parts(size_t(own) * size_t(N) * sizeof(float));  // (N, own): rank i's part of my slice in row i
  check(ncclGroupStart(), "ncclGroupStart");
  for (int i = 0; i < N; ++i) {
    check(ncclSend(data + begin(i), size_t(begin(i + 1) - begin(i)), ncclFloat, i, g_nccl.comm, stream()), "ncclSend");
    check(ncclRecv(parts.as<float>() + int64_t(i) * own, size_t(own), ncclFloat, i, g_nccl.comm, stream()), "ncclRecv");
  }
  check(ncclGroupEnd(), "ncclGroupEnd");
  sum_rows_in_order(data + begin(me), parts.as<float>(), N, own);
  // Every owner's sums to every rank, in place (slices may differ by one element, which ncclAllGather does not allow).
  check(ncclGroupStart(), "ncclGroupStart");
  for (int i = 0; i < N; ++i) {
    check(ncclBroadcast(data + begin(i), data + begin(i), size_t(begin(i + 1) - begin(i)), ncclFloat, i, g_nccl.comm,
                        stream()),
          "ncclBroadcast");
  }
  check(ncclGroupEnd(), "ncclGroupEnd");
}

}  // namespace tinygpt::cuda

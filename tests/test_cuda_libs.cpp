// A CUDA build opens cuBLAS, cuBLASLt and NCCL on first use (kernels/cuda/lazy_libs.h), not at start-up: none is
// mapped before the first call, each is after it. Needs no GPU: the calls below only ask for status strings and a
// host-side cuBLASLt object.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <doctest/doctest.h>

#include <fstream>
#include <string>
#ifdef TINYGPT_TEST_NCCL
#include <nccl.h>
#endif

namespace {

bool mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(name) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("cuda libraries: cuBLAS, cuBLASLt and NCCL are mapped on first use, not at start-up") {
  REQUIRE(mapped("/"));  // /proc/self/maps is readable
  CHECK_FALSE(mapped("libcublas.so"));
  CHECK_FALSE(mapped("libcublasLt.so"));
  CHECK_FALSE(mapped("libnccl.so"));
  CHECK(std::string(cublasGetStatusString(CUBLAS_STATUS_SUCCESS)).size() > 0);  // "success" in CUDA 13
  CHECK(mapped("libcublas.so"));
  cublasLtMatmulPreference_t pref = nullptr;
  CHECK(cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublasLtMatmulPreferenceDestroy(pref) == CUBLAS_STATUS_SUCCESS);
  CHECK(mapped("libcublasLt.so"));
#ifdef TINYGPT_TEST_NCCL
  CHECK(std::string(ncclGetErrorString(ncclSuccess)) == "no error");
  CHECK(mapped("libnccl.so"));
#endif
}

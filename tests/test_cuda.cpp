// GPU tests. Without a GPU this binary prints why and exits 77, which CTest reports as skipped.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <fmt/core.h>

#include "autograd/ops.h"
#include "kernels/cuda/device.h"

using namespace tinygpt;

TEST_CASE("cuda: tensors round-trip between host and device") {
  Generator gen(1);
  const Tensor x = randn({3, 5}, gen);
  const Tensor d = x.to(Device::CUDA);
  CHECK(d.device() == Device::CUDA);
  CHECK(d.to(Device::CPU).to_vector<float>() == x.to_vector<float>());
  CHECK(zeros({4}, DType::F32, Device::CUDA).to(Device::CPU).to_vector<float>() == std::vector<float>(4, 0.0f));
  CHECK(d.clone().to(Device::CPU).to_vector<float>() == x.to_vector<float>());
}

int main(int argc, char** argv) {
  if (!cuda::built_with_cuda()) {
    fmt::print("test_cuda: SKIPPED: this build has no CUDA backend (nvcc was not found)\n");
    return 77;
  }
  if (cuda::device_count() == 0) {
    fmt::print("test_cuda: SKIPPED: no GPU is present\n");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}

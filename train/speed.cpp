#include "train/speed.h"

#include <algorithm>
#include <chrono>

#include "autograd/autograd.h"
#include "kernels/device.h"
#include "kernels/kernels.h"

namespace tinygpt {

using Clock = std::chrono::steady_clock;

double step_flops(const nn::GPT& model, int64_t tokens_per_step) {
  const nn::GPTConfig& c = model.config();
  const double per_token = 6.0 * double(model.num_parameters_non_embedding()) +
                           12.0 * double(c.n_layer) * double(c.block_size) * double(c.n_embd);
  return per_token * double(tokens_per_step);
}

std::pair<double, int64_t> measure_peak_gflops(Device device, const Numerics& numerics) {
  NoGradGuard no_grad;
  const int64_t largest = device == Device::CPU ? 1536 : 4096;
  Generator gen(0);
  Tensor a, b, c;
  // The kernel itself, not the matmul op through launch(): TINYGPT_PROFILE and TINYGPT_CUDA_PROFILE time the run's
  // kernels, and this product would be the largest entry of their tables.
  const auto product = device == Device::CPU ? kernels::matmul_forward<float>.cpu : kernels::matmul_forward<float>.cuda;
  if (product == nullptr) throw Error("measure_peak_gflops: no matmul kernel on this device");
  auto seconds = [&] {
    const auto t0 = Clock::now();
    product(c.data<float>(), a.data<float>(), b.data<float>(), 1, 1, c.size(0), a.size(1), c.size(1), false, false,
            numerics.matmul());
    if (device == Device::CUDA) cuda::synchronize();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  int64_t n = 64;
  double best = 0;
  do {
    n = std::min(largest, n * 2);
    a = randn({n, n}, gen).to(device), b = randn({n, n}, gen).to(device), c = empty({n, n}, DType::F32, device);
    best = seconds();
    // A slow product is timed again: the first also pays one-time costs (the library's start, loading its kernels),
    // which on a busy GPU once stopped the search at 128^3 with a peak of 0 GFLOP/s.
    if (best >= 0.1) best = std::min(best, seconds());
  } while (n < largest && best < 0.1);
  if (best < 0.1) {
    double spent = 0;
    for (int i = 0; i < 5 || spent < 0.3; ++i) {
      const double t = seconds();
      spent += t;
      best = std::min(best, t);
    }
  }
  return {2.0 * double(n) * double(n) * double(n) / best / 1e9, n};
}

}  // namespace tinygpt

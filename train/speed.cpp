#include "train/speed.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "autograd/autograd.h"
#include "kernels/cpu/gemm.h"
#include "kernels/device.h"
#include "kernels/kernels.h"

namespace tinygpt {

using Clock = std::chrono::steady_clock;

double step_flops(const nn::GPT& model, int64_t tokens_per_step) {
  const nn::GPTConfig& c = model.config();
  const double per_token = 6.0 * double(model.num_parameters_non_embedding()) +
                           6.0 * double(c.n_layer) * double(c.block_size) * double(c.n_embd);
  return per_token * double(tokens_per_step);
}

namespace {

/// The CPU's stated clock in GHz and where it was read, or 0 when nothing states one.
std::pair<double, std::string> stated_cpu_ghz() {
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) >= 0x16 && __get_cpuid(0x16, &a, &b, &c, &d) && (a & 0xffff) != 0) {
    return {double(a & 0xffff) / 1e3, "base frequency (CPUID)"};
  }
#endif
  if (std::ifstream f("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"); f) {
    double khz = 0;
    if (f >> khz && khz > 0) return {khz / 1e6, "maximum frequency (cpufreq)"};
  }
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("cpu MHz", 0) == 0 && line.find(':') != std::string::npos) {
      const double mhz = std::atof(line.c_str() + line.find(':') + 1);
      if (mhz > 0) return {mhz / 1e3, "clock (/proc/cpuinfo)"};
    }
  }
  return {0.0, ""};
}

bool amd_cpu() {
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  __get_cpuid(0, &a, &b, &c, &d);
  return b == 0x68747541u;  // "Auth" of "AuthenticAMD"
#else
  return false;
#endif
}

/// NVIDIA's dense figures in TFLOP/s (bf16 tensor cores, TF32 tensor cores, f32 CUDA cores), by a part of the name.
struct GpuPeak {
  std::string_view name;
  double bf16, tf32, f32;
};
constexpr GpuPeak kGpuPeaks[] = {
    {"H200", 989.4, 494.7, 66.9},
    {"H100 PCIe", 756.5, 378.0, 51.2},
    {"H100", 989.4, 494.7, 66.9},  // SXM
    {"A100", 312.0, 156.0, 19.5},
};

}  // namespace

Peak stated_peak(Device device, const Numerics& numerics) {
  if (device == Device::CUDA) {
    const std::string name = cuda::device_description();
    for (const GpuPeak& p : kGpuPeaks) {
      if (name.find(p.name) == std::string::npos) continue;
      const char* unit = numerics.bf16 ? "bf16" : numerics.tf32 ? "TF32" : "f32";
      const double tflops = numerics.bf16 ? p.bf16 : numerics.tf32 ? p.tf32 : p.f32;
      return {tflops * 1e3, fmt::format("NVIDIA's dense {} figure for the {}", unit, p.name)};
    }
  } else {
    const auto [ghz, source] = stated_cpu_ghz();
    if (ghz > 0) {
      const int threads = omp_get_max_threads();
      const cpu::Bf16Kernel kernel = numerics.bf16 ? cpu::bf16_kernel() : cpu::Bf16Kernel::F32Units;
      double per_cycle = 0;
      std::string unit;
      if (kernel == cpu::Bf16Kernel::Amx) {
        per_cycle = 1024, unit = "AMX-BF16";
      } else if (kernel == cpu::Bf16Kernel::Avx512Bf16) {
        per_cycle = 64, unit = "AVX512-BF16, 16 lanes x 2 products";
      } else {
        const int lanes = cpu::f32_lanes(), pipes = amd_cpu() && lanes == 16 ? 1 : 2;
        per_cycle = 2.0 * lanes * pipes, unit = fmt::format("f32 FMA, {} lanes x {} pipes", lanes, pipes);
      }
      return {threads * ghz * per_cycle,
              fmt::format("{} threads x {:.2f} GHz, the {} x {:.0f} FLOP a cycle ({})", threads, ghz, source,
                          per_cycle, unit)};
    }
  }
  const auto [gflops, n] = measure_peak_gflops(device, numerics);
  return {gflops, fmt::format("no stated figure for this {}: a {}^3 matmul measured now",
                              device == Device::CPU ? "CPU" : "GPU", n)};
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
    // which could otherwise stop the search at a small size with a peak far too low.
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

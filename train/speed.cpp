#include "train/speed.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <string_view>

#include "data/text.h"
#include "kernels/device.h"
#include "kernels/env.h"

namespace tinygpt {

double step_flops(const nn::GPT& model, int64_t tokens_per_step) {
  const nn::GPTConfig& c = model.config();
  const double per_token = 6.0 * double(model.num_parameters_non_embedding()) +
                           6.0 * double(c.n_layer) * double(c.block_size) * double(c.n_head * c.head_size());
  return per_token * double(tokens_per_step);
}

std::filesystem::path cpu_rates_cache_path() {
  if (const char* dir = TINYGPT_ENV("TINYGPT_CACHE_DIR"); dir != nullptr) {
    if (std::string_view(dir) == "off") return {};
    return std::filesystem::path(dir) / "cpu-rates.txt";
  }
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg == '/') {
    return std::filesystem::path(xdg) / "tinygpt" / "cpu-rates.txt";
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home == '/') {
    return std::filesystem::path(home) / ".cache" / "tinygpt" / "cpu-rates.txt";
  }
  return {};
}

namespace {

/// A clock read at start-up replaces the cached one when it is this much faster (readings of one clock differ by
/// well under 1%).
constexpr double kClockRise = 1.02;

/// The lines that say which CPU and build the cached rates belong to.
std::string cpu_rates_key() {
  return fmt::format("tinygpt cpu rates 2\ncpu {}\nthreads {}\nf32 lanes {}\n", cpu::cpu_model_name(),
                     omp_get_max_threads(), cpu::f32_lanes());
}

}  // namespace

void use_cpu_rates_cache() {
  const std::filesystem::path path = cpu_rates_cache_path();
  std::error_code ec;
  if (path.empty() || !std::filesystem::is_regular_file(path, ec)) return;
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string key = cpu_rates_key();
  if (!in || text.size() > 4096 || text.rfind(key, 0) != 0) return;  // another CPU, thread count or build: measure
  cpu::UnitRates rates;
  std::istringstream values(text.substr(key.size()));
  std::string name;
  double value = 0;
  while (values >> name >> value) {
    if (name == "ghz")
      rates.ghz = value;
    else if (name == "f32")
      rates.f32 = value;
    else if (name == "avx512_bf16")
      rates.avx512_bf16 = value;
    else if (name == "amx")
      rates.amx = value;
    else
      return;
  }
  if (!values.eof()) return;
  // The clock is read again (about 20 ms): a cache written while another process or VM held the cores states a clock
  // below what they reach, and so a peak below what the products can do. A clearly higher reading replaces it and is
  // saved, so the stated peak only rises, to the fastest clock read on this machine, and then stays.
  // A clock that is not a positive number is damage: the whole cache is refused below, as before.
  const double now = cpu::measure_clock_ghz();
  const bool faster = rates.ghz > 0 && now > rates.ghz * kClockRise;
  if (faster) rates.ghz = now;
  try {
    cpu::set_unit_rates(rates, !faster);
  } catch (const Error&) {  // damaged, or another machine's: measured again and rewritten
  }
}

std::string save_cpu_rates_cache() {
  const cpu::UnitRates& rates = cpu::unit_rates();
  const std::filesystem::path path = cpu_rates_cache_path();
  if (rates.cached || rates.ghz <= 0 || path.empty()) return {};
  const std::string text = cpu_rates_key() + fmt::format("ghz {:.17g}\nf32 {:g}\navx512_bf16 {:g}\namx {:g}\n",
                                                         rates.ghz, rates.f32, rates.avx512_bf16, rates.amx);
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  try {
    data::write_text_file(path, text);  // by rename, never half a file
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

namespace {

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
    const cpu::UnitRates& rates = cpu::unit_rates();
    if (rates.ghz > 0) {
      const int threads = omp_get_max_threads();
      const cpu::Bf16Kernel kernel = numerics.bf16 ? cpu::bf16_kernel() : cpu::Bf16Kernel::F32Units;
      const double per_cycle = cpu::flops_per_cycle(kernel);
      std::string unit = cpu::bf16_kernel_name(kernel);
      if (kernel == cpu::Bf16Kernel::F32Units) {
        unit = fmt::format("f32 FMA, {} lanes x {:g} pipe(s)", cpu::f32_lanes(), per_cycle / (2.0 * cpu::f32_lanes()));
      } else if (kernel == cpu::Bf16Kernel::Avx512Bf16) {
        unit = fmt::format("AVX512-BF16, 16 lanes x 2 products x {:g} pipe(s)", per_cycle / 64);
      }
      return {threads * rates.ghz * per_cycle,
              fmt::format("{} threads x {:.2f} GHz x {:.0f} FLOP a cycle ({}), clock and rate measured{} on the {}",
                          threads, rates.ghz, per_cycle, unit,
                          rates.cached ? fmt::format(" (cached in {})", cpu_rates_cache_path().string()) : " now",
                          cpu::cpu_model_name())};
    }
  }
  return {0, device == Device::CPU
                 ? "none stated for this CPU (its clock and units are probed on x86-64 only)"
                 : fmt::format("none stated for the {} (NVIDIA's figures are known for the H100, H200 and A100)",
                               cuda::device_description())};
}

Peak peak_passed(Device device, const Numerics& numerics, const Peak& peak, double gflops) {
  if (device == Device::CPU && cpu::unit_rates().ghz > 0) {
    const cpu::Bf16Kernel kernel = numerics.bf16 ? cpu::bf16_kernel() : cpu::Bf16Kernel::F32Units;
    const double per_cycle = gflops / (omp_get_max_threads() * cpu::unit_rates().ghz);
    // The power of two at or above what the step needs, and always above the unit's rate (a step a rounding above the
    // peak would otherwise ask for the rate it has).
    const double needed = std::exp2(std::ceil(std::log2(per_cycle)));
    cpu::raise_unit_rate(kernel, std::max(needed, 2 * cpu::flops_per_cycle(kernel)));
    Peak raised = stated_peak(device, numerics);
    const std::string why = save_cpu_rates_cache();
    raised.how = fmt::format("the probe read the unit low (a busy core): it is now {}{}", raised.how,
                             why.empty() ? "" : fmt::format(" (not cached: {})", why));
    return raised;
  }
  return {gflops,
          fmt::format("the step's rate: {} was passed, so the step's FLOP count is wrong (train/speed.cpp)", peak.how)};
}

}  // namespace tinygpt

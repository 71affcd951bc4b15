// The probes of kernels/cpu/cpu_probe.h: loops on registers only, timed on every OpenMP thread at once.
#include "cpu_probe.h"

#include <omp.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>

#include "../base.h"
#include "gemm_bf16.h"  // TINYGPT_GEMM_BF16, the AMX tile configuration

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace tinygpt::cpu {
namespace {

/// Seconds of CPU time of the calling thread: a probe timed by it reads the same rate whether or not other processes
/// take the core for part of the timing (a wall clock would count their time as the probe's, and read the clock and
/// the units slow: the peak stated from such a reading once put a run's MFU above 100%).
double thread_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

#if defined(__x86_64__)
// Each returns the FLOPs done in `reps` rounds of 12 independent accumulators (more than any unit's latency times its
// pipes, so the loop runs at the unit's throughput). The asm barrier keeps the compiler from folding the loop.
__attribute__((target("avx2,fma"), noinline)) double fma_ymm(long reps) {
  __m256 acc[12];
  for (auto& a : acc) a = _mm256_setzero_ps();
  __m256 x = _mm256_set1_ps(1.0f), y = _mm256_set1_ps(1e-9f);
  for (long i = 0; i < reps; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) acc[j] = _mm256_fmadd_ps(x, y, acc[j]);
    __asm__ volatile("" : "+x"(x));
  }
  for (int j = 1; j < 12; ++j) acc[0] = _mm256_add_ps(acc[0], acc[j]);
  __asm__ volatile("" : : "x"(acc[0]));
  return 12.0 * 16 * double(reps);
}

__attribute__((target("avx512f"), noinline)) double fma_zmm(long reps) {
  __m512 acc[12];
  for (auto& a : acc) a = _mm512_setzero_ps();
  __m512 x = _mm512_set1_ps(1.0f), y = _mm512_set1_ps(1e-9f);
  for (long i = 0; i < reps; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) acc[j] = _mm512_fmadd_ps(x, y, acc[j]);
    __asm__ volatile("" : "+v"(x));
  }
  for (int j = 1; j < 12; ++j) acc[0] = _mm512_add_ps(acc[0], acc[j]);
  __asm__ volatile("" : : "v"(acc[0]));
  return 12.0 * 32 * double(reps);
}
#endif

#if defined(TINYGPT_GEMM_BF16)
__attribute__((target("avx512f,avx512bf16"), noinline)) double dpbf16_zmm(long reps) {
  __m512 acc[12];
  for (auto& a : acc) a = _mm512_setzero_ps();
  __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), y = (__m512bh)_mm512_set1_epi32(0x30003000);
  for (long i = 0; i < reps; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], x, y);
    __asm__ volatile("" : "+v"(x));
  }
  for (int j = 1; j < 12; ++j) acc[0] = _mm512_add_ps(acc[0], acc[j]);
  __asm__ volatile("" : : "v"(acc[0]));
  return 12.0 * 64 * double(reps);
}

// Four accumulator tiles, two A and two B tiles (as the GEMM's 32 x 32 kernel), four products per round.
TINYGPT_TARGET_AMX __attribute__((noinline)) double amx_tiles(long reps) {
  bf16_isa::load_tile_config(bf16_isa::kAllTiles16x64);
  alignas(64) static thread_local uint16_t ab[16 * 32];
  for (auto& v : ab) v = 0x3f80;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, ab, 64);
  _tile_loadd(5, ab, 64);
  _tile_loadd(6, ab, 64);
  _tile_loadd(7, ab, 64);
  for (long i = 0; i < reps; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) static thread_local float out[16 * 16];
  _tile_stored(0, out, 64);
  _tile_release();
  __asm__ volatile("" : : "r"(out) : "memory");
  return 4.0 * 16 * 16 * 32 * 2 * double(reps);
}
#endif

/// Work per second of `work` timed for about `seconds` of the calling thread's CPU time.
template <class F>
double timed_rate(F& work, double seconds) {
  const double t0 = thread_seconds();
  double done = 0, elapsed = 0;
  do {
    done += work();
    elapsed = thread_seconds() - t0;
  } while (elapsed < seconds);
  return done / elapsed;
}

/// Per thread, the best rate (work per second) of `work` over `rounds` timings of about `seconds` each, all threads
/// at once; the mean over the threads.
template <class F>
double rate_per_thread(F work, int rounds, double seconds) {
  const int threads = omp_get_max_threads();
  double sum = 0;
  int ran = 0;  // the team may be smaller than asked (OMP_DYNAMIC, or a call inside a parallel region)
#pragma omp parallel num_threads(threads) reduction(+ : sum, ran)
  {
    ++ran;
    work();  // warm-up: the clock's ramp
    double best = 0;
    for (int r = 0; r < rounds; ++r) {
#pragma omp barrier
      best = std::max(best, timed_rate(work, seconds));
    }
    sum += best;
  }
  return sum / ran;
}

/// Per thread, the unit's work per cycle: in each round the unit and the chain of dependent adds are timed one right
/// after the other; the best ratio over the rounds, the mean over the threads. A round the core was taken from reads
/// the unit low, never high (after another process ran, a vector unit warms up again, seen as a round at half rate on
/// a Xeon of family 6, model 167 beside busy processes, and the median of seven then read it a power of two low once
/// in five), and a clock that drops under the unit's load lowers the ratio too: so the best round.
double per_cycle_per_thread(ProbeUnit unit, int rounds, double seconds) {
  const int threads = omp_get_max_threads();
  double sum = 0;
  int ran = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sum, ran)
  {
    ++ran;
    auto chain = [] { return probe_chain_cycles(2000); };
    auto flops = [unit] { return probe_unit(unit, 1000); };
    chain(), flops();  // warm-up: the clock's ramp, the unit's power-up, AMX's state
    double best = 0;
    for (int r = 0; r < rounds; ++r) {
#pragma omp barrier
      const double cycles = timed_rate(chain, seconds);
      best = std::max(best, timed_rate(flops, seconds) / cycles);
    }
    sum += best;
  }
  return sum / ran;
}

/// x rounded to the nearest power of two (x > 0).
double power_of_two(double x) { return std::exp2(std::round(std::log2(x))); }

/// A unit's FLOPs a cycle from its reading: the power of two at or above the reading less 20% (timing noise, which the
/// best of seven ratios picks when it reads high). A reading falls below the unit's rate, never far above: the core
/// shared with another process or hyperthread, or a vector clock below the chain's (on a Xeon of family 6, model 167,
/// the 512-bit FMAs read 42-56 FLOPs a cycle against the chain's clock, where the nearest power of two flipped between
/// 32 and 64 from run to run). So the figure is a ceiling; one read far low is raised by a step (raise_unit_rate).
double rate_at_or_above(double reading) { return std::exp2(std::ceil(std::log2(reading / 1.2))); }

constexpr int kRounds = 7;
constexpr double kSeconds = 0.002;

UnitRates measure_rates() {
  UnitRates r;
#if defined(__x86_64__)
  r.ghz = measure_clock_ghz();
  auto per_cycle = [&](ProbeUnit u) { return rate_at_or_above(per_cycle_per_thread(u, kRounds, kSeconds)); };
  // Read twice, the higher kept: a whole reading can fall a power of two low (one in twelve fresh probes on a quiet
  // 2-core Xeon VM of family 6, model 167, where the host may run another guest on the core's other hyperthread).
  auto f32_per_cycle = [&](ProbeUnit u) { return std::max(per_cycle(u), per_cycle(u)); };
  if (f32_lanes() == 16) {
    r.f32 = f32_per_cycle(ProbeUnit::FmaZmm);
  } else if (f32_lanes() == 8) {
    r.f32 = f32_per_cycle(ProbeUnit::FmaYmm);
  } else {
    r.f32 = 8;  // the portable build: SSE, 4 lanes, one multiply and one add
  }
  const auto& have = bf16_kernels_available();
  // A core that is busy with other work for part of a reading can read a unit a power of two low (seen once: the
  // AVX512-BF16 unit at 32 FLOPs a cycle instead of 64, a tie with the f32 units that flips the choice and would be
  // cached). A bf16 unit that reads no faster than the f32 units is read again and the higher reading kept.
  auto bf16_per_cycle = [&](ProbeUnit u) {
    const double first = per_cycle(u);
    return first > r.f32 ? first : std::max(first, per_cycle(u));
  };
  if (std::ranges::count(have, Bf16Kernel::Avx512Bf16) > 0) r.avx512_bf16 = bf16_per_cycle(ProbeUnit::Dpbf16Zmm);
  if (std::ranges::count(have, Bf16Kernel::Amx) > 0) r.amx = bf16_per_cycle(ProbeUnit::AmxTiles);
#endif
  return r;
}

std::mutex g_rates_mutex;
bool g_rates_set = false;
UnitRates g_rates;

}  // namespace

double probe_unit(ProbeUnit unit, long reps) {
#if defined(__x86_64__)
  switch (unit) {
    case ProbeUnit::FmaYmm:
      return fma_ymm(reps);
    case ProbeUnit::FmaZmm:
      return fma_zmm(reps);
#if defined(TINYGPT_GEMM_BF16)
    case ProbeUnit::Dpbf16Zmm:
      return dpbf16_zmm(reps);
    case ProbeUnit::AmxTiles:
      return amx_tiles(reps);
#endif
    default:
      break;
  }
#endif
  (void)unit, (void)reps;
  throw Error("probe_unit: this build has no such unit");
}

double probe_chain_cycles(long reps) {
#if defined(__x86_64__)
  // Register to register: a chain of immediate adds (addq $1) is folded by the renamer of recent Intel cores (seen on a
  // Xeon of family 6, model 167: 64 adds in 13-26 cycles), which read the clock at 7-15 GHz.
  uint64_t x = 0, one = 1;
  __asm__ volatile("" : "+r"(one));
  for (long i = 0; i < reps; ++i) __asm__ volatile(".rept 64\n\taddq %1, %0\n\t.endr" : "+r"(x) : "r"(one));
  return 64.0 * double(reps);
#else
  (void)reps;
  throw Error("probe_chain_cycles: x86-64 only");
#endif
}

const UnitRates& unit_rates() {
  const std::lock_guard lock(g_rates_mutex);
  if (!g_rates_set) {
    g_rates = measure_rates();
    g_rates_set = true;
  }
  return g_rates;
}

double measure_clock_ghz() {
#if defined(__x86_64__)
  return rate_per_thread([] { return probe_chain_cycles(2000); }, kRounds, kSeconds) / 1e9;
#else
  return 0;
#endif
}

void set_unit_rates(const UnitRates& rates, bool from_cache) {
  const std::lock_guard lock(g_rates_mutex);
  if (g_rates_set) throw Error("set_unit_rates: the CPU's rates are in use already; set them before the first product");
  auto valid = [](double x, bool present) { return present ? x > 0 && power_of_two(x) == x : x == 0; };
  const auto& have = bf16_kernels_available();
  // A clock a core could run at, and at least one FMA a cycle (a cache written beside busy processes can state a rate
  // far below the unit's: the first step that passes it raises it, raise_unit_rate).
  if (!(rates.ghz >= 0.3 && rates.ghz <= 10) || !valid(rates.f32, true) || rates.f32 < 2 ||
      !valid(rates.avx512_bf16, std::ranges::count(have, Bf16Kernel::Avx512Bf16) > 0) ||
      !valid(rates.amx, std::ranges::count(have, Bf16Kernel::Amx) > 0)) {
    throw Error("set_unit_rates: rates that do not fit this CPU's units");
  }
  g_rates = rates;
  g_rates.cached = from_cache;
  g_rates_set = true;
}

void raise_unit_rate(Bf16Kernel kernel, double per_cycle) {
  unit_rates();  // measured first, if not yet
  const std::lock_guard lock(g_rates_mutex);
  double& rate = kernel == Bf16Kernel::Amx          ? g_rates.amx
                 : kernel == Bf16Kernel::Avx512Bf16 ? g_rates.avx512_bf16
                                                    : g_rates.f32;
  if (!(per_cycle > rate) || power_of_two(per_cycle) != per_cycle) {
    throw Error("raise_unit_rate: a rate that is not a power of two above the unit's");
  }
  rate = per_cycle;
  g_rates.cached = false;  // the cache is written again with it
}

double flops_per_cycle(Bf16Kernel kernel) {
  const UnitRates& r = unit_rates();
  return kernel == Bf16Kernel::Amx ? r.amx : kernel == Bf16Kernel::Avx512Bf16 ? r.avx512_bf16 : r.f32;
}

std::string cpu_model_name() {
#if defined(__x86_64__)
  unsigned regs[12] = {};
  std::string brand;
  if (__get_cpuid_max(0x80000000, nullptr) >= 0x80000004) {
    for (unsigned i = 0; i < 3; ++i)
      __get_cpuid(0x80000002 + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2], &regs[4 * i + 3]);
    char text[49] = {};
    std::memcpy(text, regs, 48);
    brand = text;
    brand.erase(0, brand.find_first_not_of(' '));
    brand.erase(brand.find_last_not_of(' ') + 1);
  }
  unsigned a = 0, b = 0, c = 0, d = 0;
  __get_cpuid(1, &a, &b, &c, &d);
  const unsigned base_family = (a >> 8) & 0xf, base_model = (a >> 4) & 0xf;
  const unsigned family = base_family == 0xf ? base_family + ((a >> 20) & 0xff) : base_family;
  const unsigned model = base_family == 0xf || base_family == 6 ? (((a >> 16) & 0xf) << 4) | base_model : base_model;
  return (brand.empty() ? std::string("x86-64 CPU") : brand) + " (family " + std::to_string(family) + ", model " +
         std::to_string(model) + ")";
#else
  return "CPU";
#endif
}

}  // namespace tinygpt::cpu

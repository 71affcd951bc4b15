// bench_peak: the arithmetic peak of each multiply unit the GEMM kernels use, measured, so that a GEMM's GFLOP/s
// reads as a fraction of what the machine can do. Each unit runs a loop of independent multiply-adds on registers
// only (no memory traffic), on 1 thread and then on every thread at once:
//   f32 FMA    vfmadd231ps on 8 (AVX2) or 16 (AVX-512) floats: 2 flops per lane
//   AVX512-BF16 vdpbf16ps: 16 lanes, each adds 2 bf16 products: 64 flops
//   AMX-BF16   tdpbf16ps: a 16 x 16 f32 tile += 16 x 32 bf16 @ 32 x 16 bf16: 16384 flops
// Only the units this CPU reports are run (kernels/cpu/gemm.h's detection; it also asks Linux for the AMX state).
// Then the memory's read bandwidth: every thread summing its share of a 512 MiB buffer, the best of 5 passes.
//
//   bench_peak [--threads N] [--seconds S]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_probe.h"
#include "kernels/cpu/gemm.h"

namespace {

using Clock = std::chrono::steady_clock;

using tinygpt::cpu::probe_unit;
using tinygpt::cpu::ProbeUnit;

struct Unit {
  const char* name;
  std::function<double(long)> run;
  long reps;  // per timing call, about a millisecond
};

// GFLOP/s of `threads` threads running the unit at once for about `seconds`: the best of 5 timings.
double measure(const Unit& u, int threads, double seconds) {
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    double flops = 0, elapsed = 0;
#pragma omp parallel num_threads(threads) reduction(+ : flops)
    {
      u.run(u.reps);  // warm-up: clock ramp, AMX state
#pragma omp barrier
      const Clock::time_point t0 = Clock::now();
      double done = 0;
      while (std::chrono::duration<double>(Clock::now() - t0).count() < seconds / 5) done += u.run(u.reps);
      flops += done;
#pragma omp barrier
#pragma omp master
      elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    }
    best = std::max(best, flops / elapsed / 1e9);
  }
  return best;
}

// GB/s of `threads` threads reading `buf` (far larger than the caches) once between them: the best of 5 passes. What
// a matrix-vector product (decoding) can reach: it reads each weight once per token.
double read_bandwidth(const std::vector<uint64_t>& buf, int threads) {
  double best = 0;
  uint64_t sink = 0;
  for (int rep = 0; rep < 6; ++rep) {  // the first pass warms up (pages, clock)
    const Clock::time_point t0 = Clock::now();
    uint64_t sum = 0;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : sum)
    for (size_t i = 0; i < buf.size(); ++i) sum += buf[i];
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    sink += sum;
    if (rep > 0) best = std::max(best, double(buf.size() * sizeof(uint64_t)) / s / 1e9);
  }
  if (sink == 42) std::printf(" ");  // keeps the sums
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = omp_get_max_threads();
  double seconds = 1.0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--seconds") && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      std::printf(
          "usage: bench_peak [--threads N] [--seconds S]\n"
          "  Peak GFLOP/s of each multiply unit this CPU has (f32 FMA, AVX512-BF16, AMX-BF16), registers\n"
          "  only, on 1 thread and on N threads (default: omp_get_max_threads()), S seconds each (default 1);\n"
          "  then the memory's read bandwidth (GB/s over a 512 MiB buffer, best of 5 passes)\n");
      return 0;
    } else {
      std::fprintf(stderr, "bench_peak: unknown argument '%s' (--help)\n", argv[i]);
      return 2;
    }
  }
  if (threads < 1 || !(seconds > 0)) {
    std::fprintf(stderr, "bench_peak: --threads must be >= 1 and --seconds > 0\n");
    return 2;
  }
  using tinygpt::cpu::Bf16Kernel;
  const auto& have = tinygpt::cpu::bf16_kernels_available();
  auto has = [&](Bf16Kernel k) { return std::find(have.begin(), have.end(), k) != have.end(); };
  std::vector<Unit> units;
  auto probe = [](ProbeUnit u) { return [u](long reps) { return probe_unit(u, reps); }; };
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    units.push_back({"f32 FMA, AVX2 (ymm)", probe(ProbeUnit::FmaYmm), 20000});
  if (__builtin_cpu_supports("avx512f")) units.push_back({"f32 FMA, AVX-512 (zmm)", probe(ProbeUnit::FmaZmm), 20000});
  if (has(Bf16Kernel::Avx512Bf16)) units.push_back({"AVX512-BF16 vdpbf16ps", probe(ProbeUnit::Dpbf16Zmm), 20000});
  if (has(Bf16Kernel::Amx)) units.push_back({"AMX-BF16 tdpbf16ps", probe(ProbeUnit::AmxTiles), 2000});
  std::printf("%-26s %14s %14s\n", "unit", "1 thread", (std::to_string(threads) + " threads").c_str());
  for (const Unit& u : units) {
    const double one = measure(u, 1, seconds), all = measure(u, threads, seconds);
    std::printf("%-26s %9.0f GF/s %9.0f GF/s\n", u.name, one, all);
  }
  {
    std::vector<uint64_t> buf(size_t(512) << 20 >> 3, 1);  // 512 MiB
    std::printf("%-26s %9.1f GB/s %9.1f GB/s\n", "memory read, 512 MiB", read_bandwidth(buf, 1),
                read_bandwidth(buf, threads));
  }
  // What the kernel choice and the training log's meter use (kernels/cpu/cpu_probe.h): a shorter probe, per thread.
  const tinygpt::cpu::UnitRates& r = tinygpt::cpu::unit_rates();
  std::printf(
      "%s: clock %.2f GHz (dependent adds, %d threads at once); FLOPs a cycle a core: f32 FMA %g, "
      "AVX512-BF16 %g, AMX-BF16 %g; bf16 products on %s\n",
      tinygpt::cpu::cpu_model_name().c_str(), r.ghz, omp_get_max_threads(), r.f32, r.avx512_bf16, r.amx,
      tinygpt::cpu::bf16_kernel_name(tinygpt::cpu::bf16_kernel()));
  return 0;
}

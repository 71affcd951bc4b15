// bench_peak: the arithmetic peak of each multiply unit the GEMM kernels use, measured, so that a GEMM's GFLOP/s
// reads as a fraction of what the machine can do. Each unit runs a loop of independent multiply-adds on registers
// only (no memory traffic), on 1 thread and then on every thread at once:
//   f32 FMA    vfmadd231ps on 8 (AVX2) or 16 (AVX-512) floats: 2 flops per lane
//   AVX512-BF16 vdpbf16ps: 16 lanes, each adds 2 bf16 products: 64 flops
//   AMX-BF16   tdpbf16ps: a 16 x 16 f32 tile += 16 x 32 bf16 @ 32 x 16 bf16: 16384 flops
// Only the units this CPU reports are run (kernels/cpu/gemm.h's detection; it also asks Linux for the AMX state).
//
//   bench_peak [--threads N] [--seconds S]
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_bf16.h"

namespace {

using Clock = std::chrono::steady_clock;

// Each returns the flops done in `reps` rounds. The asm barrier keeps the compiler from folding the loop.
__attribute__((target("avx2,fma"), noinline)) double fma_ymm(long reps) {
  __m256 acc[12];
  for (auto& a : acc) a = _mm256_setzero_ps();
  __m256 x = _mm256_set1_ps(1.0f), y = _mm256_set1_ps(1e-9f);
  for (long i = 0; i < reps; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) acc[j] = _mm256_fmadd_ps(x, y, acc[j]);
    __asm__ volatile("" : "+x"(x));
  }
  float sink[8];
  for (int j = 1; j < 12; ++j) acc[0] = _mm256_add_ps(acc[0], acc[j]);
  _mm256_storeu_ps(sink, acc[0]);
  __asm__ volatile("" : : "r"(sink) : "memory");
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
  float sink[16];
  for (int j = 1; j < 12; ++j) acc[0] = _mm512_add_ps(acc[0], acc[j]);
  _mm512_storeu_ps(sink, acc[0]);
  __asm__ volatile("" : : "r"(sink) : "memory");
  return 12.0 * 32 * double(reps);
}

__attribute__((target("avx512f,avx512bf16"), noinline)) double dpbf16_zmm(long reps) {
  __m512 acc[12];
  for (auto& a : acc) a = _mm512_setzero_ps();
  __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), y = (__m512bh)_mm512_set1_epi32(0x30003000);
  for (long i = 0; i < reps; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], x, y);
    __asm__ volatile("" : "+v"(x));
  }
  float sink[16];
  for (int j = 1; j < 12; ++j) acc[0] = _mm512_add_ps(acc[0], acc[j]);
  _mm512_storeu_ps(sink, acc[0]);
  __asm__ volatile("" : : "r"(sink) : "memory");
  return 12.0 * 64 * double(reps);
}

// Four accumulator tiles, two A and two B tiles (as the GEMM's 32 x 32 kernel), four products per round.
TINYGPT_TARGET_AMX __attribute__((noinline)) double amx_tiles(long reps) {
  tinygpt::cpu::bf16_isa::load_tile_config(tinygpt::cpu::bf16_isa::kAllTiles16x64);
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
      std::printf("usage: bench_peak [--threads N] [--seconds S]\n"
                  "  Peak GFLOP/s of each multiply unit this CPU has (f32 FMA, AVX512-BF16, AMX-BF16), registers\n"
                  "  only, on 1 thread and on N threads (default: omp_get_max_threads()), S seconds each (default 1)\n");
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
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) units.push_back({"f32 FMA, AVX2 (ymm)", fma_ymm, 20000});
  if (__builtin_cpu_supports("avx512f")) units.push_back({"f32 FMA, AVX-512 (zmm)", fma_zmm, 20000});
  if (has(Bf16Kernel::Avx512Bf16)) units.push_back({"AVX512-BF16 vdpbf16ps", dpbf16_zmm, 20000});
  if (has(Bf16Kernel::Amx)) units.push_back({"AMX-BF16 tdpbf16ps", amx_tiles, 2000});
  std::printf("%-26s %14s %14s\n", "unit", "1 thread", (std::to_string(threads) + " threads").c_str());
  for (const Unit& u : units) {
    const double one = measure(u, 1, seconds), all = measure(u, threads, seconds);
    std::printf("%-26s %9.0f GF/s %9.0f GF/s\n", u.name, one, all);
  }
  return 0;
}

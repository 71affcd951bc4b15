// Which multiply units this CPU has and which the GEMM's bf16 products use: detection (CPUID, the OS's XCR0, and
// Linux's permission for the AMX tile state, which a process must ask for), the choice (TINYGPT_CPU_BF16), and the
// f32 micro-kernel's vector width. Declared in kernels/cpu/gemm.h.
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/base.h"
#include "kernels/cpu/cpu_probe.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_bf16.h"  // TINYGPT_GEMM_BF16
#include "kernels/env.h"            // TINYGPT_CPU_BF16

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace tinygpt::cpu {
namespace {

// bf16 kernels the CPU reports and the OS has enabled (XCR0: the AVX-512 state; the AMX tile state after Linux grants
// it to the process, which it does only when asked).
#if defined(TINYGPT_GEMM_BF16)
uint64_t xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

std::vector<Bf16Kernel> detect_bf16_kernels() {
  std::vector<Bf16Kernel> kernels{Bf16Kernel::F32Units};
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return kernels;
  const uint64_t xcr = xcr0();
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return kernels;
  const uint32_t ebx7 = b, edx7 = d;
  __get_cpuid_count(7, 1, &a, &b, &c, &d);
  const uint32_t eax7_1 = a;
  const bool avx512 = (xcr & 0xe6) == 0xe6 && (ebx7 & (1u << 16)) && (ebx7 & (1u << 17)) && (ebx7 & (1u << 30)) &&
                      (ebx7 & (1u << 31));               // F, DQ, BW, VL
  if (!avx512 || !(eax7_1 & (1u << 5))) return kernels;  // AVX512_BF16
  kernels.push_back(Bf16Kernel::Avx512Bf16);
#if defined(__linux__)  // only Linux has the permission call (and only it grants the tile state)
  const bool amx = (edx7 & (1u << 22)) && (edx7 & (1u << 24));  // AMX-BF16, AMX-TILE
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (amx && syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0 && (xcr0() & 0x60000) == 0x60000)
    kernels.push_back(Bf16Kernel::Amx);
#endif
  return kernels;
}
#else
std::vector<Bf16Kernel> detect_bf16_kernels() { return {Bf16Kernel::F32Units}; }
#endif

}  // namespace

int f32_lanes() {
#if defined(__AVX2__) && defined(__FMA__) && defined(__AVX512F__)  // gemm.cpp's TINYGPT_GEMM_AVX512
  return 16;
#elif defined(__AVX2__) && defined(__FMA__)  // TINYGPT_GEMM_AVX2
  return 8;
#else
  return 4;
#endif
}

const char* bf16_kernel_name(Bf16Kernel kernel) {
  return kernel == Bf16Kernel::Amx ? "AMX-BF16" : kernel == Bf16Kernel::Avx512Bf16 ? "AVX512-BF16" : "f32 units";
}

const std::vector<Bf16Kernel>& bf16_kernels_available() {
  static const std::vector<Bf16Kernel> kernels = detect_bf16_kernels();
  return kernels;
}

namespace {

// The unit with the most FLOPs a cycle as measured (cpu_probe.h), the f32 units on a tie: where AVX512-BF16's dot
// products run at half the f32 FMAs' rate (the Xeon of docs/RESULTS.md, "CPU matmul kernels") its kernel loses to the
// f32 units; where they run at twice it (AMD Zen 4 and Zen 5) it wins. AMX where present. TINYGPT_CPU_BF16 names one.
Bf16Kernel choose_bf16_kernel() {
  const std::vector<Bf16Kernel>& have = bf16_kernels_available();
  const char* env = TINYGPT_ENV("TINYGPT_CPU_BF16");
  if (!env) {
    if (have.size() == 1) return have[0];  // nothing to choose: no probe
    Bf16Kernel best = Bf16Kernel::F32Units;
    for (const Bf16Kernel k : have) {
      if (flops_per_cycle(k) > flops_per_cycle(best)) best = k;
    }
    return best;
  }
  const std::string name = env;
  const Bf16Kernel want = name == "amx"      ? Bf16Kernel::Amx
                          : name == "avx512" ? Bf16Kernel::Avx512Bf16
                                             : Bf16Kernel::F32Units;
  if (name != "amx" && name != "avx512" && name != "f32")
    throw Error("TINYGPT_CPU_BF16 must be amx, avx512 or f32, got '" + name + "'");
  if (std::find(have.begin(), have.end(), want) == have.end())
    throw Error(std::string("TINYGPT_CPU_BF16=") + name + ": this CPU has no " + bf16_kernel_name(want) +
                " (unset it to use the fastest kernel it has)");
  return want;
}

}  // namespace

Bf16Kernel bf16_kernel() {
  static const Bf16Kernel kernel = choose_bf16_kernel();
  return kernel;
}

bool bf16_decode_unit() {
  static const bool unit = [] {
    const std::vector<Bf16Kernel>& have = bf16_kernels_available();
    const char* env = TINYGPT_ENV("TINYGPT_CPU_BF16");
    const bool forced_f32 = env != nullptr && std::string(env) == "f32";
    return !forced_f32 && std::find(have.begin(), have.end(), Bf16Kernel::Avx512Bf16) != have.end();
  }();
  return unit;
}

}  // namespace tinygpt::cpu

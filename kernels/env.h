// Every environment variable tinygpt reads, in one list: its values, its default and what it changes. The library
// reads them only through TINYGPT_ENV("NAME"), which fails to compile for a name this list does not hold, so the
// list stays whole. Numerics themselves (--dtype, --storage, --attention-math, --no-tf32) are command-line options
// parsed into one Numerics value (kernels/numerics.h); these switches pick among kernels that compute the same
// thing, or turn on diagnostics. (The MPI launchers' own variables, read by train/comm.cpp to see a launch, are not
// tinygpt's.)
#pragma once

#include <cstdlib>
#include <string>
#include <string_view>

#include "numerics.h"

namespace tinygpt::env {

struct Switch {
  const char* name;
  const char* values;  // what it may be set to; unset (or empty) is the default
  const char* effect;
};

inline constexpr Switch kSwitches[] = {
    {"TINYGPT_CPU_BF16", "amx | avx512 | f32",
     "the CPU unit for bf16 products (matmuls and --dtype bf16's attention): AMX tiles, AVX512-BF16 dot products, or "
     "the f32 units on rounded operands (default: of those the CPU has, the one with the most FLOPs a cycle as "
     "measured at start-up, the f32 units on a tie; a unit the CPU lacks is an error). Same roundings, so results "
     "agree up to the order of f32 sums"},
    {"TINYGPT_CACHE_DIR", "a directory | off",
     "where train keeps the CPU's measured clock and unit rates (cpu-rates.txt), so every run on a machine states "
     "the same peak (a clock read 2% faster at start-up replaces the cached one) (default: $XDG_CACHE_HOME/tinygpt, "
     "else ~/.cache/tinygpt; off: measured by every run, nothing "
     "written)"},
    {"TINYGPT_FLASH_ROWS", "128",
     "the GPU's flash forward on bf16 storage at head dim 64 takes blocks of 128 query rows (each of 4 warps two "
     "16-row "
     "tiles, so every K and V fragment read from shared memory serves both) instead of 64; not the default until "
     "measured faster on a GPU (scripts/gpu_check.sh times both)"},
    {"TINYGPT_FLASH_Q", "smem",
     "the GPU's flash forward on bf16 storage at head dim 128 reads Q's fragments from shared memory at every k step "
     "(FlashAttention-2's default; no spills for sm_90) instead of holding them in registers (68 bytes a thread "
     "spilled); not the default until measured faster on a GPU (scripts/gpu_check.sh times both)"},
    {"TINYGPT_FLASH_DQ", "atomic",
     "the GPU's flash backward on bf16 storage computes dQ in the dK/dV pass (FlashAttention-2's one pass: 5 products "
     "a tile pair instead of 7), each key tile's part added to f32 sums with atomics, then rounded once; the sums' "
     "order, so dQ's last bits, vary from run to run. Not the default until measured faster on a GPU "
     "(scripts/gpu_check.sh times both)"},
    {"TINYGPT_CUBLASLT_EPILOGUES", "1",
     "the GPU's f32 linear layers take bias and GELU in cublasLt's epilogue instead of tinygpt's kernels (never for "
     "bf16 products)"},
    {"TINYGPT_HOST_CACHE", "0", "turns off the CPU's cache of freed tensor buffers (default on)"},
    {"TINYGPT_PROFILE", "1", "prints the CPU time by kernel and phase at exit, and the attention paths taken"},
    {"TINYGPT_CUDA_PROFILE", "1", "prints the GPU time by op and kernel at exit (CUDA events; graphs off)"},
    {"TINYGPT_TRACE_SHAPES", "1", "prints the shapes through each attention layer"},
};

/// Whether kSwitches lists `name`.
constexpr bool listed(std::string_view name) {
  for (const Switch& s : kSwitches) {
    if (name == s.name) return true;
  }
  return false;
}

/// The variable's value, or nullptr when it is unset or empty.
inline const char* value(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

/// The listed switches that are set, as "NAME=value" separated by spaces (empty when none): for the logs.
inline std::string set_switches() {
  std::string out;
  for (const Switch& s : kSwitches) {
    const char* v = value(s.name);
    if (v == nullptr) continue;
    if (!out.empty()) out.push_back(' ');
    out.append(s.name).append("=").append(v);
  }
  return out;
}

}  // namespace tinygpt::env

/// The value of a listed switch (kernels/env.h), or nullptr when unset or empty; an unlisted name does not compile.
#define TINYGPT_ENV(name)                                                                \
  ([] {                                                                                  \
    static_assert(::tinygpt::env::listed(name), name " is not listed in kernels/env.h"); \
    return ::tinygpt::env::value(name);                                                  \
  }())
/// Whether a listed switch is set to exactly `want` (the variable read once).
#define TINYGPT_ENV_IS(name, want)                              \
  ([] {                                                         \
    const char* value = TINYGPT_ENV(name);                      \
    return value != nullptr && std::string_view(want) == value; \
  }())

namespace tinygpt::env {

/// The GPU's bf16 flash variants the switches ask for (TINYGPT_FLASH_ROWS=128, TINYGPT_FLASH_Q=smem,
/// TINYGPT_FLASH_DQ=atomic): read where a command builds its Numerics, never inside a kernel call.
inline FlashVariants flash_variants() {
  FlashVariants f;
  f.rows128 = TINYGPT_ENV_IS("TINYGPT_FLASH_ROWS", "128");
  f.q_smem = TINYGPT_ENV_IS("TINYGPT_FLASH_Q", "smem");
  f.dq_atomic = TINYGPT_ENV_IS("TINYGPT_FLASH_DQ", "atomic");
  return f;
}

/// Whether the GPU's f32 linear layers take cublasLt's epilogues (TINYGPT_CUBLASLT_EPILOGUES=1;
/// Numerics::lt_epilogues).
inline bool lt_epilogues() { return TINYGPT_ENV_IS("TINYGPT_CUBLASLT_EPILOGUES", "1"); }

}  // namespace tinygpt::env

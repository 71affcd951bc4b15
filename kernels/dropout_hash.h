// The dropout mask as a pure function of (seed, element index): no mask is stored, backward recomputes
// it, any thread split gives the same mask, and the CUDA kernels can use the same function.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define TINYGPT_HOST_DEVICE __host__ __device__
#else
#define TINYGPT_HOST_DEVICE
#endif

namespace tinygpt {

TINYGPT_HOST_DEVICE inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

/// Uniform in [0, 1) with 24 random bits, from (seed, i).
TINYGPT_HOST_DEVICE inline float hash_uniform(uint64_t seed, int64_t i) {
  return float(mix64(seed + 0x9e3779b97f4a7c15ULL * uint64_t(i + 1)) >> 40) * 0x1.0p-24f;
}

/// True when element i survives dropout with probability p.
TINYGPT_HOST_DEVICE inline bool dropout_keep(uint64_t seed, int64_t i, float p) { return hash_uniform(seed, i) >= p; }

}  // namespace tinygpt

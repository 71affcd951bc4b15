// The dropout mask as a pure function of (seed, element index): no mask is stored, backward recomputes
// it, any thread split gives the same mask, and the CUDA kernels can use the same function.
//
// Element i of the stream of `seed` is kept iff dropout_uniform(dropout_key(seed, i >> 32), uint32(i)) >= p: one
// 64-bit mix per 2^32 elements (the key) and a 32-bit one per element (murmur3's finalizer over the low word times
// an odd constant, xor the key). Both steps are bijections of the low word, so within a block of 2^32 elements every
// 24-bit value appears equally often. Kernels keep the key of a row (DropoutRow) and pay a few 32-bit integer
// operations a score (two 64-bit products a score before: a fifth of the GPU dQ kernel's instructions).
#pragma once

#include <cmath>
#include <cstdint>

#include "host_device.h"

namespace tinygpt {

TINYGPT_HOST_DEVICE inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

TINYGPT_HOST_DEVICE inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x85ebca6bu;
  x ^= x >> 13;
  x *= 0xc2b2ae35u;
  x ^= x >> 16;
  return x;
}

/// A dropout stream's seed as kernels take it: `seed`, plus the 64-bit word at `offset` when there is one, read where
/// the kernel runs (device memory for a GPU kernel, read on the device). A CUDA graph replays its kernels with the
/// arguments it captured; the word at offset, refilled before each replay, gives each step its own masks (PyTorch's
/// graph-safe Philox offset, for a counter-based hash). The CPU reads the same word from host memory, so both devices
/// draw the same masks.
struct DropoutSeed {
  uint64_t seed = 0;
  const uint64_t* offset = nullptr;

  DropoutSeed() = default;
  TINYGPT_HOST_DEVICE DropoutSeed(uint64_t s, const uint64_t* o = nullptr) : seed(s), offset(o) {}  // NOLINT: implicit
  TINYGPT_HOST_DEVICE uint64_t value() const { return offset ? seed + *offset : seed; }
};

/// The key of elements [hi * 2^32, (hi + 1) * 2^32) of the stream of `seed`.
TINYGPT_HOST_DEVICE inline uint32_t dropout_key(uint64_t seed, uint64_t hi) {
  return uint32_t(mix64(seed + 0x9e3779b97f4a7c15ULL * (hi + 1)) >> 32);
}

/// The 24 random bits of an element, from its block's key and its low word.
TINYGPT_HOST_DEVICE inline uint32_t dropout_bits(uint32_t key, uint32_t lo) {
  return mix32((lo * 0x9e3779b9u) ^ key) >> 8;
}

/// Uniform in [0, 1) with 24 random bits, from a block's key and the element's low word.
TINYGPT_HOST_DEVICE inline float dropout_uniform(uint32_t key, uint32_t lo) {
  return float(dropout_bits(key, lo)) * 0x1.0p-24f;
}

/// dropout_uniform(key, lo) >= p as an integer comparison: the float is the 24 bits times 2^-24 exactly, so it is at
/// least p iff the bits are at least ceil(p 2^24) (p 2^24 is exact in a float). A kernel compares integers instead of
/// converting every score's bits to a float (a quarter-rate instruction on a GPU). As int32: the bits are below 2^24.
/// A NaN p keeps nothing, as the float comparison does.
TINYGPT_HOST_DEVICE inline int32_t dropout_threshold(float p) {
  if (p < 1.0f) return p > 0.0f ? int32_t(ceilf(p * 0x1.0p24f)) : 0;
  return int32_t(1) << 24;  // p >= 1 or NaN
}

/// Uniform in [0, 1) with 24 random bits, from (seed, i).
TINYGPT_HOST_DEVICE inline float hash_uniform(uint64_t seed, int64_t i) {
  return dropout_uniform(dropout_key(seed, uint64_t(i) >> 32), uint32_t(uint64_t(i)));
}

/// True when element i survives dropout with probability p.
TINYGPT_HOST_DEVICE inline bool dropout_keep(uint64_t seed, int64_t i, float p) { return hash_uniform(seed, i) >= p; }

/// dropout_keep for a whole stream, with the key of its first 2^32 elements computed once.
struct DropoutStream {
  uint64_t seed;
  uint32_t key0;

  TINYGPT_HOST_DEVICE explicit DropoutStream(uint64_t s) : seed(s), key0(dropout_key(s, 0)) {}

  TINYGPT_HOST_DEVICE bool keep(int64_t i, float p) const {
    return uint64_t(i) >> 32 == 0 ? int32_t(dropout_bits(key0, uint32_t(i))) >= dropout_threshold(p)
                                  : dropout_keep(seed, i, p);
  }
};

/// dropout_keep over a run of fewer than 2^32 elements from i0 (a row of attention scores): the keys of the block
/// i0 is in and of the next, so each element costs only dropout_uniform.
struct DropoutRow {
  uint32_t lo0 = 0, key0 = 0, key1 = 0;

  DropoutRow() = default;
  TINYGPT_HOST_DEVICE DropoutRow(uint64_t seed, int64_t i0)
      : lo0(uint32_t(uint64_t(i0))),
        key0(dropout_key(seed, uint64_t(i0) >> 32)),
        key1(dropout_key(seed, (uint64_t(i0) >> 32) + 1)) {}

  /// dropout_keep(seed, i0 + j, p).
  TINYGPT_HOST_DEVICE bool keep(int64_t j, float p) const { return keep(lo0, key0, key1, j, p); }

  /// The same from the three fields, for rows kept as separate arrays (a loop across rows then vectorizes).
  TINYGPT_HOST_DEVICE static bool keep(uint32_t lo0, uint32_t key0, uint32_t key1, int64_t j, float p) {
    const uint32_t lo = lo0 + uint32_t(j);
    return int32_t(dropout_bits(lo < lo0 ? key1 : key0, lo)) >= dropout_threshold(p);  // lo < lo0: past i0's block
  }
};

}  // namespace tinygpt

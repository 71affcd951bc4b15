// Rows of bf16 converted to and from f32 in vector registers (AVX-512 BW where the CPU has it, chosen at run time;
// plain loops elsewhere), with the rounding of kernels/bf16.h bit for bit: the CPU kernels' loads and stores of bf16
// storage, when a loop over the struct itself would not vectorize.
#pragma once

#include <cstdint>

#include "../bf16.h"

namespace tinygpt::cpu {

/// out[i] = inp[i] rounded to bf16 (nearest even, NaN quieted), i < n. Single-threaded.
void round_range(bf16* out, const float* inp, int64_t n);
/// out[i] = inp[i] * scale, rounded once (the product in f32).
void round_scaled(bf16* out, const float* inp, float scale, int64_t n);
/// out[i] = inp[i], exactly, i < n. Single-threaded.
void widen_range(float* out, const bf16* inp, int64_t n);

}  // namespace tinygpt::cpu

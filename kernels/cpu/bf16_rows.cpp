#include "kernels/cpu/bf16_rows.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define TINYGPT_BF16_AVX512 1
#endif

namespace tinygpt::cpu {
namespace {

#if defined(TINYGPT_BF16_AVX512)
bool has_avx512bw() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  return yes;
}

// The maskz forms, all lanes on: GCC 12's unmasked ones warn of an uninitialized operand.
/// out = inp * scale, rounded (the product in f32; scale 1 is a plain rounding).
__attribute__((target("avx512f,avx512bw"))) void round_avx512(bf16* out, const float* inp, int64_t n,
                                                              float scale = 1.0f) {
  const __m512 vs = _mm512_set1_ps(scale);
  const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff), quiet = _mm512_set1_epi32(0x40);
  const __mmask16 all = 0xffff;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_mul_ps(vs, _mm512_loadu_ps(inp + i));
    const __m512i u = _mm512_castps_si512(x);
    const __m512i hi = _mm512_maskz_srli_epi32(all, u, 16);
    const __m512i rounded =
        _mm512_maskz_srli_epi32(all, _mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(hi, one))), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    const __m512i bits = _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(hi, quiet));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_maskz_cvtepi32_epi16(all, bits));
  }
  for (; i < n; ++i) out[i] = bf16(inp[i] * scale);
}

__attribute__((target("avx512f,avx512bw"))) void widen_avx512(float* out, const bf16* inp, int64_t n) {
  const __mmask16 all = 0xffff;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(inp + i));
    _mm512_storeu_si512(out + i, _mm512_maskz_slli_epi32(all, _mm512_maskz_cvtepu16_epi32(all, h), 16));
  }
  for (; i < n; ++i) out[i] = float(inp[i]);
}
#endif

}  // namespace

void round_range(bf16* out, const float* inp, int64_t n) {
#if defined(TINYGPT_BF16_AVX512)
  if (has_avx512bw()) return round_avx512(out, inp, n);
#endif
  for (int64_t i = 0; i < n; ++i) out[i] = bf16(inp[i]);
}

void round_scaled(bf16* out, const float* inp, float scale, int64_t n) {
#if defined(TINYGPT_BF16_AVX512)
  if (has_avx512bw()) return round_avx512(out, inp, n, scale);
#endif
  for (int64_t i = 0; i < n; ++i) out[i] = bf16(inp[i] * scale);
}

void widen_range(float* out, const bf16* inp, int64_t n) {
#if defined(TINYGPT_BF16_AVX512)
  if (has_avx512bw()) return widen_avx512(out, inp, n);
#endif
  for (int64_t i = 0; i < n; ++i) out[i] = float(inp[i]);
}

}  // namespace tinygpt::cpu

#include "tile_bf16.h"

#include <algorithm>
#include <stdexcept>

#include "gemm_bf16.h"

namespace tinygpt::cpu {

#if defined(TINYGPT_GEMM_BF16)

AmxTiles::AmxTiles() { bf16_isa::load_tile_config(bf16_isa::kAllTiles16x64); }
AmxTiles::~AmxTiles() { bf16_isa::release_tiles(); }

TINYGPT_TARGET_AMX void AmxTiles::product(float* C, int64_t ldc, const float* A, int64_t ars, int64_t aks,
                                          const float* B, int64_t ldb, int64_t M, int64_t K, int64_t N,
                                          bool accumulate) {
  using bf16_isa::lanes16;
  const int64_t kcp = bf16_isa::round_up(K, 32);
  const size_t a_size = size_t(bf16_isa::round_up(M, 32) * kcp), b_size = size_t(bf16_isa::round_up(N, 32) * kcp);
  if (a_.size() < a_size) a_.resize(a_size);
  if (b_.size() < b_size) b_.resize(b_size);
  const bool k_contig = aks == 1;
  bf16_isa::pack_bf16_pairs<32, bf16_isa::PairsByRow<32>>(k_contig, A, k_contig ? ars : aks, 0, M, 0, K, kcp, a_.data());
  bf16_isa::pack_bf16_pairs<32, bf16_isa::PairsByK<32>>(false, B, ldb, 0, N, 0, K, kcp, b_.data());
  alignas(64) float out[32 * 32];
  for (int64_t m0 = 0; m0 < M; m0 += 32) {
    for (int64_t n0 = 0; n0 < N; n0 += 32) {
      bf16_isa::amx_product_32x32(kcp, a_.data() + m0 * kcp, b_.data() + n0 * kcp, out);
      const __mmask16 lo = lanes16(N - n0), hi = lanes16(N - n0 - 16);
      for (int64_t r = 0; r < std::min<int64_t>(32, M - m0); ++r) {
        float* c = C + (m0 + r) * ldc + n0;
        __m512 v0 = _mm512_load_ps(out + r * 32), v1 = _mm512_load_ps(out + r * 32 + 16);
        if (accumulate) {
          v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(lo, c));
          v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(hi, c + 16));
        }
        _mm512_mask_storeu_ps(c, lo, v0);
        _mm512_mask_storeu_ps(c + 16, hi, v1);
      }
    }
  }
}

#else

AmxTiles::AmxTiles() { throw std::logic_error("AmxTiles: this build has no AMX kernels"); }
AmxTiles::~AmxTiles() = default;
void AmxTiles::product(float*, int64_t, const float*, int64_t, int64_t, const float*, int64_t, int64_t, int64_t, int64_t,
                       bool) {}

#endif

}  // namespace tinygpt::cpu

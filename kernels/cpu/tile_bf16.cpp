#include "tile_bf16.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "gemm_bf16.h"

namespace tinygpt::cpu {

#if defined(TINYGPT_GEMM_BF16)

namespace {

using bf16_isa::round_up;

/// X (rows x K, element (r, k) at X[r * rs + k * ks], rs or ks 1) packed into `p` in layout L, 32 rows a panel.
template <template <int> class L, class S, class Packed>
TINYGPT_TARGET_AVX512 void pack(Packed& p, const S* X, int64_t rs, int64_t ks, int64_t rows, int64_t K) {
  const int64_t kcp = round_up(K, 32);
  const size_t size = size_t(round_up(rows, 32) * kcp) + 32;  // 32 elements of slack to align the start
  if (p.buf.size() < size) p.buf.resize(size);
  const auto addr = reinterpret_cast<uintptr_t>(p.buf.data());
  p.data = p.buf.data() + (uintptr_t(-intptr_t(addr)) & 63) / sizeof(uint16_t);
  const bool k_contig = ks == 1;
  bf16_isa::pack_bf16_pairs<32, L<32>>(k_contig, X, k_contig ? rs : ks, 0, rows, 0, K, kcp, p.data);
  p.rows = rows, p.depth = K;
}

}  // namespace

AmxTiles::AmxTiles() { bf16_isa::load_tile_config(bf16_isa::kAllTiles16x64); }
AmxTiles::~AmxTiles() { bf16_isa::release_tiles(); }

void AmxTiles::pack_a(const float* A, int64_t rs, int64_t ks, int64_t M, int64_t K) {
  pack<bf16_isa::PairsByRow>(a_, A, rs, ks, M, K);
}
void AmxTiles::pack_a(const bf16* A, int64_t rs, int64_t ks, int64_t M, int64_t K) {
  pack<bf16_isa::PairsByRow>(a_, A, rs, ks, M, K);
}
// B's rows in the packing are its columns n: element (n, k) at B[n * ns + k * ks].
void AmxTiles::pack_b(int slot, const float* B, int64_t ks, int64_t ns, int64_t K, int64_t N) {
  Packed& b = b_.at(size_t(slot));
  pack<bf16_isa::PairsByK>(b, B, ns, ks, N, K);
}
void AmxTiles::pack_b(int slot, const bf16* B, int64_t ks, int64_t ns, int64_t K, int64_t N) {
  Packed& b = b_.at(size_t(slot));
  pack<bf16_isa::PairsByK>(b, B, ns, ks, N, K);
}

TINYGPT_TARGET_AMX void AmxTiles::run(float* C, int64_t ldc, int slot, int64_t M, int64_t K, int64_t N,
                                      bool accumulate) {
  using bf16_isa::lanes16;
  const Packed& b = b_.at(size_t(slot));
  if (K != a_.depth || K != b.depth || M > a_.rows || N > round_up(b.rows, 32)) {
    throw std::logic_error("AmxTiles::run: the product's shape is not the packed operands'");
  }
  const int64_t kcp = round_up(K, 32);
  alignas(64) float out[32 * 32];
  for (int64_t m0 = 0; m0 < M; m0 += 32) {
    for (int64_t n0 = 0; n0 < N; n0 += 32) {
      bf16_isa::amx_product_32x32(kcp, a_.data + m0 * kcp, b.data + n0 * kcp, out);
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

void AmxTiles::product(float* C, int64_t ldc, const float* A, int64_t ars, int64_t aks, const float* B, int64_t ldb,
                       int64_t M, int64_t K, int64_t N, bool accumulate) {
  pack_a(A, ars, aks, M, K);
  pack_b(kSlots - 1, B, ldb, 1, K, N);
  run(C, ldc, kSlots - 1, M, K, N, accumulate);
}

#else

AmxTiles::AmxTiles() { throw std::logic_error("AmxTiles: this build has no AMX kernels"); }
AmxTiles::~AmxTiles() = default;
void AmxTiles::pack_a(const float*, int64_t, int64_t, int64_t, int64_t) {}
void AmxTiles::pack_a(const bf16*, int64_t, int64_t, int64_t, int64_t) {}
void AmxTiles::pack_b(int, const float*, int64_t, int64_t, int64_t, int64_t) {}
void AmxTiles::pack_b(int, const bf16*, int64_t, int64_t, int64_t, int64_t) {}
void AmxTiles::run(float*, int64_t, int, int64_t, int64_t, int64_t, bool) {}
void AmxTiles::product(float*, int64_t, const float*, int64_t, int64_t, const float*, int64_t, int64_t, int64_t, int64_t,
                       bool) {}

#endif

}  // namespace tinygpt::cpu

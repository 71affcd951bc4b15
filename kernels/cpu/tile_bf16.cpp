#include "tile_bf16.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

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

/// Where a run reads op(A): packed (32-row panels in AmxConfig's op(A) layout, kcp deep: the pair kp of row r at word
/// (kp / 16) * 512 + r * 16 + kp % 16 of its panel), or in place (bf16 storage, k contiguous: the pair kp of row r
/// is the 32-bit word at rows + r * ld + 2 kp), which the AVX512-BF16 product broadcasts as it would the packed word.
struct ASource {
  const uint16_t* packed = nullptr;
  const uint16_t* rows = nullptr;
  int64_t ld = 0;  // packed: kcp, each row's elements (row m0's panel at m0 * kcp); in place: the row stride
};

/// Row c (lanes past the block's columns masked off by lo, hi) = or += the row's sums v0, v1.
TINYGPT_TARGET_AVX512 inline void store_row(float* c, __m512 v0, __m512 v1, __mmask16 lo, __mmask16 hi,
                                            bool accumulate) {
  if (accumulate) {
    v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(lo, c));
    v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(hi, c + 16));
  }
  _mm512_mask_storeu_ps(c, lo, v0);
  _mm512_mask_storeu_ps(c + 16, hi, v1);
}

/// C rows [m0, m0 + rows) x columns [n0, n0 + 32) (lanes past the columns masked off by lo, hi) = or += rows of op(A)
/// @ b (32 columns in the VNNI layout), over k [k0, k0 + kcp), kcp a multiple of 32: on AMX tiles into a staging
/// block, then added to C; with vdpbf16ps 8 rows at a time, each row's sum added to C as it is stored. Either way each
/// element of C is its old value plus the block's sum (summed from zero): the same bits on both units.
TINYGPT_TARGET_AMX void amx_block(const ASource& a, int64_t m0, int64_t k0, int64_t kcp, const uint16_t* b, float* C,
                                  int64_t ldc, int64_t rows, __mmask16 lo, __mmask16 hi, bool accumulate) {
  alignas(64) float out[32 * 32];
  bf16_isa::amx_product_32x32(kcp, a.packed + m0 * a.ld + k0 * 32, b, out);
  for (int64_t r = 0; r < rows; ++r)
    store_row(C + r * ldc, _mm512_load_ps(out + r * 32), _mm512_load_ps(out + r * 32 + 16), lo, hi, accumulate);
}

TINYGPT_TARGET_AVX512 void avx512_block(const ASource& a, int64_t m0, int64_t k0, int64_t kcp, const uint16_t* b,
                                        float* C, int64_t ldc, int64_t rows, __mmask16 lo, __mmask16 hi,
                                        bool accumulate) {
  const auto* bw = reinterpret_cast<const int32_t*>(b);
  for (int64_t r0 = 0; r0 < rows; r0 += 8) {
    // Row i's pair words: packed, 16 to a 32-k chunk of 512 words; in place, along its row (rows past the block's
    // read the block's last row instead, and are not stored).
    const int64_t chunk = a.packed != nullptr ? 1024 : 32;  // elements from one 32-k chunk of a row to the next
    const uint16_t* at[8];
    for (int i = 0; i < 8; ++i) {
      at[i] = a.packed != nullptr ? a.packed + m0 * a.ld + k0 * 32 + (r0 + i) * 32
                                  : a.rows + (m0 + std::min<int64_t>(r0 + i, rows - 1)) * a.ld + k0;
    }
    __m512 acc[8][2];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int64_t kp0 = 0; kp0 < kcp / 2; kp0 += 16) {
      const int64_t ao = kp0 / 16 * chunk;  // elements
      const int32_t* bp = bw + kp0 * 32;
#pragma GCC unroll 2
      for (int j = 0; j < 16; ++j) {
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + j * 32);
        const __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + j * 32 + 16);
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) {
          int32_t pair;  // a 32-bit word at any 2-byte boundary (bf16 rows in place)
          std::memcpy(&pair, at[i] + ao + 2 * j, sizeof pair);
          const __m512bh ai = (__m512bh)_mm512_set1_epi32(pair);
          acc[i][0] = _mm512_dpbf16_ps(acc[i][0], ai, b0);
          acc[i][1] = _mm512_dpbf16_ps(acc[i][1], ai, b1);
        }
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      if (r0 + i >= rows) break;
      store_row(C + (r0 + i) * ldc, acc[i][0], acc[i][1], lo, hi, accumulate);
    }
  }
}

using BlockFn = void (*)(const ASource&, int64_t, int64_t, int64_t, const uint16_t*, float*, int64_t, int64_t,
                         __mmask16, __mmask16, bool);

/// C (M x N, row stride ldc) (+)= a @ b, b packed, in 32 x 32 blocks of Block, those `band` rules out skipped. Both
/// packings hold k in chunks of 32 (a 32-row or 32-column panel's chunk c at word c * 512), so a block's k range
/// starts at a chunk's first word.
template <BlockFn Block>
TINYGPT_TARGET_AVX512 void run_tiles(float* C, int64_t ldc, const ASource& a, const uint16_t* b, int64_t M, int64_t K,
                                     int64_t N, bool accumulate, const Band& band) {
  using bf16_isa::lanes16;
  const int64_t kcp = round_up(K, 32);
  for (int64_t m0 = 0; m0 < M; m0 += 32) {
    const int64_t rows = std::min<int64_t>(32, M - m0);
    int64_t k0 = 0, k1 = kcp;  // the k that can be nonzero for these rows, in whole chunks
    if (band.on_k) {
      k0 = std::clamp<int64_t>((m0 + band.lo) / 32 * 32, 0, kcp);
      k1 = std::clamp<int64_t>(round_up(std::max<int64_t>(m0 + rows + band.hi, 0), 32), 0, kcp);
    }
    for (int64_t n0 = 0; n0 < N; n0 += 32) {
      const __mmask16 lo = lanes16(N - n0), hi = lanes16(N - n0 - 16);
      const bool needed = band.on_k ? k0 < k1 : n0 + 31 - m0 >= band.lo && n0 - (m0 + rows - 1) <= band.hi;
      float* c = C + m0 * ldc + n0;
      if (!needed) {
        if (accumulate) continue;
        for (int64_t r = 0; r < rows; ++r) {
          _mm512_mask_storeu_ps(c + r * ldc, lo, _mm512_setzero_ps());
          _mm512_mask_storeu_ps(c + r * ldc + 16, hi, _mm512_setzero_ps());
        }
        continue;
      }
      Block(a, m0, k0, k1 - k0, b + n0 * kcp + k0 * 32, c, ldc, rows, lo, hi, accumulate);
    }
  }
}

}  // namespace

Bf16Tiles::Bf16Tiles(Bf16Kernel kernel) : kernel_(kernel) {
  const auto& have = bf16_kernels_available();
  if (kernel == Bf16Kernel::F32Units || std::find(have.begin(), have.end(), kernel) == have.end()) {
    throw std::logic_error(std::string("Bf16Tiles: this CPU has no ") + bf16_kernel_name(kernel) + " unit for tiles");
  }
  if (kernel == Bf16Kernel::Amx) bf16_isa::load_tile_config(bf16_isa::kAllTiles16x64);
}
Bf16Tiles::~Bf16Tiles() {
  if (kernel_ == Bf16Kernel::Amx) bf16_isa::release_tiles();
}

void Bf16Tiles::pack_a(const float* A, int64_t rs, int64_t ks, int64_t M, int64_t K) {
  a_rows_ = nullptr;
  pack<bf16_isa::PairsByRow>(a_, A, rs, ks, M, K);
}
// bf16 rows with k contiguous, K whole 32-k chunks: AVX512-BF16 broadcasts their pair words where they lie (no copy);
// AMX's tiles load the packed layout.
void Bf16Tiles::pack_a(const bf16* A, int64_t rs, int64_t ks, int64_t M, int64_t K) {
  a_rows_ = nullptr;
  if (kernel_ == Bf16Kernel::Avx512Bf16 && ks == 1 && K % 32 == 0) {
    a_rows_ = reinterpret_cast<const uint16_t*>(A);
    a_ld_ = rs, a_.rows = M, a_.depth = K;
    return;
  }
  pack<bf16_isa::PairsByRow>(a_, A, rs, ks, M, K);
}
// B's rows in the packing are its columns n: element (n, k) at B[n * ns + k * ks].
void Bf16Tiles::pack_b(int slot, const float* B, int64_t ks, int64_t ns, int64_t K, int64_t N) {
  Packed& b = b_.at(size_t(slot));
  pack<bf16_isa::PairsByK>(b, B, ns, ks, N, K);
}
void Bf16Tiles::pack_b(int slot, const bf16* B, int64_t ks, int64_t ns, int64_t K, int64_t N) {
  Packed& b = b_.at(size_t(slot));
  pack<bf16_isa::PairsByK>(b, B, ns, ks, N, K);
}

void Bf16Tiles::run(float* C, int64_t ldc, int slot, int64_t M, int64_t K, int64_t N, bool accumulate, Band band) {
  const Packed& b = b_.at(size_t(slot));
  if (K != a_.depth || K != b.depth || M > a_.rows || N > round_up(b.rows, 32)) {
    throw std::logic_error("Bf16Tiles::run: the product's shape is not the packed operands'");
  }
  const ASource a = a_rows_ ? ASource{nullptr, a_rows_, a_ld_} : ASource{a_.data, nullptr, round_up(K, 32)};
  if (kernel_ == Bf16Kernel::Amx) return run_tiles<amx_block>(C, ldc, a, b.data, M, K, N, accumulate, band);
  run_tiles<avx512_block>(C, ldc, a, b.data, M, K, N, accumulate, band);
}

void Bf16Tiles::product(float* C, int64_t ldc, const float* A, int64_t ars, int64_t aks, const float* B, int64_t ldb,
                        int64_t M, int64_t K, int64_t N, bool accumulate) {
  pack_a(A, ars, aks, M, K);
  pack_b(kSlots - 1, B, ldb, 1, K, N);
  run(C, ldc, kSlots - 1, M, K, N, accumulate);
}

#else

Bf16Tiles::Bf16Tiles(Bf16Kernel kernel) : kernel_(kernel) {
  throw std::logic_error("Bf16Tiles: this build has no bf16 units");
}
Bf16Tiles::~Bf16Tiles() = default;
void Bf16Tiles::pack_a(const float*, int64_t, int64_t, int64_t, int64_t) {}
void Bf16Tiles::pack_a(const bf16*, int64_t, int64_t, int64_t, int64_t) {}
void Bf16Tiles::pack_b(int, const float*, int64_t, int64_t, int64_t, int64_t) {}
void Bf16Tiles::pack_b(int, const bf16*, int64_t, int64_t, int64_t, int64_t) {}
void Bf16Tiles::run(float*, int64_t, int, int64_t, int64_t, int64_t, bool, Band) {}
void Bf16Tiles::product(float*, int64_t, const float*, int64_t, int64_t, const float*, int64_t, int64_t, int64_t,
                        int64_t, bool) {}

#endif

}  // namespace tinygpt::cpu

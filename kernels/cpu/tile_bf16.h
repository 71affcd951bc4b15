// bf16 products of the small tiles inside the CPU flash-attention kernels (kernels/cpu/attention.cpp), on AMX-BF16 or
// AVX512-BF16.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <vector>

#include "../bf16.h"
#include "gemm.h"  // Bf16Kernel

namespace tinygpt::cpu {

/// Tile products C (M x N) = or += A (M x K) @ B (K x N) on AMX-BF16 tiles or AVX512-BF16 dot products, the operands
/// packed into AMX's layouts (which the AVX512-BF16 product reads too) straight from where they lie: f32 rounded to
/// bf16 as it is packed (exactly as gemm's bf16 products round it), bf16 storage as it is. Products summed in f32. A
/// B operand is packed into one of kSlots slots and may serve several products (the flash kernels pack Q^T or K^T
/// once per task); A is packed for each product. One per thread, on a kernel other than F32Units that
/// bf16_kernels_available() lists: for AMX, constructing it configures the calling thread's tiles, destroying it
/// releases them.
/// Where a tile product is known to vanish, a causal mask's triangle: with `on_k`, A(r, k) is zero unless
/// lo <= k - r <= hi, so each block of 32 rows sums only the 32-deep blocks of k that can be nonzero; else C(r, c) is
/// needed only where lo <= c - r <= hi, and 32 x 32 blocks of C wholly outside are not computed (zero, or left as
/// they are when accumulating). The products skipped are zeros (or never read), so C is what the whole product gives.
struct Band {
  static constexpr int64_t kFar = std::numeric_limits<int64_t>::max() / 4;
  int64_t lo = -kFar, hi = kFar;
  bool on_k = false;
};

class Bf16Tiles {
 public:
  static constexpr int kSlots = 4;

  explicit Bf16Tiles(Bf16Kernel kernel);
  ~Bf16Tiles();
  Bf16Tiles(const Bf16Tiles&) = delete;
  Bf16Tiles& operator=(const Bf16Tiles&) = delete;

  /// A (M x K) of the next run: element (r, k) at A[r * rs + k * ks]; ks or rs is 1. bf16 rows with k contiguous may
  /// be read where they lie (AVX512-BF16, K a multiple of 32): they must then stay unchanged until the run.
  void pack_a(const float* A, int64_t rs, int64_t ks, int64_t M, int64_t K);
  void pack_a(const bf16* A, int64_t rs, int64_t ks, int64_t M, int64_t K);
  /// B (K x N) into `slot`: element (k, n) at B[k * ks + n * ns]; ks or ns is 1. Columns past N are zero up to the
  /// next multiple of 32, so a run may ask for that many.
  void pack_b(int slot, const float* B, int64_t ks, int64_t ns, int64_t K, int64_t N);
  void pack_b(int slot, const bf16* B, int64_t ks, int64_t ns, int64_t K, int64_t N);
  /// C (M x N, row stride ldc) = or += the packed A @ slot's B: M at most the packed A's rows, K their common depth;
  /// the blocks `band` rules out skipped.
  void run(float* C, int64_t ldc, int slot, int64_t M, int64_t K, int64_t N, bool accumulate, Band band = {});

  /// pack_a, pack_b into the last slot and run: C (+)= A (element (r, k) at A[r * ars + k * aks]) @ B (row stride ldb).
  void product(float* C, int64_t ldc, const float* A, int64_t ars, int64_t aks, const float* B, int64_t ldb, int64_t M,
               int64_t K, int64_t N, bool accumulate);

 private:
  struct Packed {
    std::vector<uint16_t> buf;    // grown on demand
    uint16_t* data = nullptr;     // buf's first 64-byte boundary: a tile row split across two cache lines loads at
                                  // half the speed (bench_attention --bf16)
    int64_t rows = 0, depth = 0;  // rows (A's M, B's N) and K as packed
  };
  Bf16Kernel kernel_;
  Packed a_;                          // op(A) packed, or (a_rows_ set) only its rows and depth
  const uint16_t* a_rows_ = nullptr;  // op(A) read in place: bf16 rows a_ld_ apart, k contiguous (pack_a says when)
  int64_t a_ld_ = 0;
  std::array<Packed, kSlots> b_;
};

}  // namespace tinygpt::cpu

// bf16 products of the small tiles inside the CPU flash-attention kernels (kernels/cpu/attention.cpp), on AMX-BF16.
#pragma once

#include <cstdint>
#include <vector>

namespace tinygpt::cpu {

/// C (M x N, row stride ldc) = or += A (M x K, element (r, k) at A[r * ars + k * aks], ars or aks 1) @ B (K x N, row
/// stride ldb), each operand rounded to bf16 as it is packed (exactly as gemm's bf16 products round it) and the
/// products summed in f32 on AMX-BF16 tiles. One per thread, and only where bf16_kernel() is Amx: constructing it
/// configures the calling thread's tiles, destroying it releases them.
class AmxTiles {
 public:
  AmxTiles();
  ~AmxTiles();
  AmxTiles(const AmxTiles&) = delete;
  AmxTiles& operator=(const AmxTiles&) = delete;

  void product(float* C, int64_t ldc, const float* A, int64_t ars, int64_t aks, const float* B, int64_t ldb, int64_t M,
               int64_t K, int64_t N, bool accumulate);

 private:
  std::vector<uint16_t> a_, b_;  // the packed operands, grown on demand
};

}  // namespace tinygpt::cpu

// Warp-level tensor-core primitives (compute capability 8.0+): operand rounding (bf16, tf32), mma.sync with f32
// accumulation (m16n8k16 bf16, m16n8k8 tf32), fragment loads from shared memory (ldmatrix), asynchronous copies to
// shared memory (cp.async) and paired f32 atomic adds to global memory. tests/emulated_cuda.h defines the same
// functions for the CPU, with the fragment layouts of the PTX ISA ("Matrix Fragments for mma.m16n8k16 with
// floating point type", "... for mma.m16n8k8"), so the kernels built on them (flash_mma.cuh) can be checked
// without a GPU.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace tinygpt::cuda {

/// Two floats rounded to bf16 (nearest even) in one 32-bit register: `lo` in bits 0-15, `hi` in bits 16-31.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

/// d += a * b for one warp: a 16x16 bf16 A, a 16x8 bf16 B, a 16x8 f32 accumulator. With g = lane / 4 and
/// t = lane % 4, a lane holds A (rows g, g+8; columns 2t, 2t+1, 2t+8, 2t+9) as a[0] = (g, 2t..), a[1] = (g+8, 2t..),
/// a[2] = (g, 2t+8..), a[3] = (g+8, 2t+8..); B (rows 2t, 2t+1 | 2t+8, 2t+9; column g) as b[0], b[1]; and d[i] at
/// row g + 8 (i / 2), column 2t + i % 2.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();  // the host dispatch never launches these kernels below compute capability 8.0
#endif
}

/// x rounded to tf32 (10-bit mantissa, nearest, ties away from zero) in an f32 bit pattern.
__device__ __forceinline__ uint32_t to_tf32(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
#else
  return __float_as_uint(x);
#endif
}

/// d += a * b for one warp with tf32 operands: a 16x8 A, an 8x8 B, a 16x8 f32 accumulator. A lane (g = lane / 4,
/// t = lane % 4) holds A as a[0] = (g, t), a[1] = (g+8, t), a[2] = (g, t+4), a[3] = (g+8, t+4); B as b[0] = (t, g),
/// b[1] = (t+4, g); d as in mma_bf16.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();
#endif
}

/// ldmatrix (compute capability 8.0+): four 8x8 matrices of 16-bit elements from shared memory, one register each.
/// Lane l gives the address of row l % 8 of matrix l / 8 (16 bytes, 16-byte aligned); with g = lane / 4 and
/// t = lane % 4, r[m] gets matrix m's elements (g, 2t) in bits 0-15 and (g, 2t+1) in bits 16-31: a row-major tile's
/// A or B fragment of mma_bf16. ldmatrix_x4_trans gives the transposed matrix's: (2t, g) and (2t+1, g), the B
/// fragment of a tile stored with the reduction index along its rows (V in O = P V).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
#else
  __trap();
#endif
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
#else
  __trap();
#endif
}

/// cp.async (compute capability 8.0+): copies `bytes` (4 or 16) from global to shared memory without passing through
/// registers, asynchronously; bytes past `valid` (0 or all of them here) are zero-filled and the source not read.
/// cp_async_commit closes the group of the copies this thread issued since the last one; cp_async_wait<N> waits
/// until at most N of this thread's groups are still in flight (other threads' copies need a barrier after their
/// waits to be seen).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid) : "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, int valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid) : "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

/// dst[0] += a and dst[1] += b, atomically (dst 8-byte aligned): one vector reduction on compute capability 9.0+,
/// two scalar ones before it.
__device__ __forceinline__ void atomic_add2(float* dst, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(dst), make_float2(a, b));
#else
  atomicAdd(dst, a);
  atomicAdd(dst + 1, b);
#endif
}

}  // namespace tinygpt::cuda

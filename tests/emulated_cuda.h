// Runs CUDA device code on the CPU, so kernels written over kernels/cuda/mma.cuh (the tensor-core flash attention
// in kernels/cuda/flash_mma.cuh) are checked on machines without a GPU: one std::thread per CUDA thread, blocks one
// after another, __syncthreads as a block barrier, and the warp collectives (shuffles, mma.sync) as an exchange
// through per-warp slots between two warp barriers. mma_bf16 and mma_tf32 rebuild A and B from the 32 lanes'
// registers with the fragment layouts of the PTX ISA, which is exactly what a layout mistake in a kernel would
// get wrong; operands are rounded as the hardware rounds them (bf16 nearest-even, tf32 nearest-away).
//
// What it cannot show: speed, bank conflicts, register spills, and memory races between warps that the barriers
// happen to order (compute-sanitizer's racecheck covers those on a GPU). Asynchronous copies (cp.async) land when
// their thread waits for them, so a read of a stage before the wait sees the old contents. Dynamic shared memory starts filled with
// 0xff bytes (bf16 NaN), so a fragment read of a word no thread wrote shows up as NaN; static __shared__ arrays are
// plain statics (zero at first, then whatever the last block left).
//
// Include this before any header of device code: it defines the CUDA keywords and built-ins those use.
#pragma once

#include <algorithm>
#include <barrier>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/numerics.h"
#include "kernels/scalar_math.h"

#define TINYGPT_EMULATED_CUDA 1
#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
// Blocks run one after another, so one static array per declaration is each block's own shared memory.
#define __shared__ static

struct dim3 {
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
  unsigned x, y, z;
};
// CUDA's vectors (one 64- or 128-bit load or store on the GPU).
struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};

// CUDA's device math that the host's <cmath> lacks.
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t max(int64_t a, int64_t b) { return a > b ? a : b; }

namespace tinygpt::emu {

struct Warp {
  explicit Warp(unsigned lanes) : bar(lanes) {}
  std::barrier<> bar;
  uint32_t slot[32][8]{};  // each lane's operands of the collective in flight (zero for lanes a partial warp lacks)
};

struct Block {
  explicit Block(unsigned threads) : bar(threads) {
    for (unsigned w = 0; w < (threads + 31) / 32; ++w) warps.push_back(std::make_unique<Warp>(std::min(32u, threads - 32 * w)));
  }
  std::barrier<> bar;
  std::vector<std::unique_ptr<Warp>> warps;
};

inline thread_local Warp* tl_warp = nullptr;
inline thread_local Block* tl_block = nullptr;
inline thread_local unsigned char* tl_smem = nullptr;  // the block's dynamic shared memory

}  // namespace tinygpt::emu

inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

inline void __syncthreads() { tinygpt::emu::tl_block->bar.arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { tinygpt::emu::tl_warp->bar.arrive_and_wait(); }

/// Every lane publishes `words` (n of them), the warp waits, `read` builds this lane's result from all slots, and
/// the warp waits again before the slots can be reused.
template <class Read>
auto warp_exchange(const uint32_t* words, int n, Read read) {
  tinygpt::emu::Warp& w = *tinygpt::emu::tl_warp;
  const unsigned lane = threadIdx.x % 32;
  std::memcpy(w.slot[lane], words, sizeof(uint32_t) * size_t(n));
  w.bar.arrive_and_wait();
  auto result = read(w.slot, lane);
  w.bar.arrive_and_wait();
  return result;
}

inline float __shfl_xor_sync(unsigned, float x, int lane_mask) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  return warp_exchange(&bits, 1, [&](const uint32_t (*slot)[8], unsigned lane) {
    return std::bit_cast<float>(slot[lane ^ unsigned(lane_mask)][0]);
  });
}

inline float __shfl_sync(unsigned, float x, int src_lane) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  return warp_exchange(&bits, 1, [&](const uint32_t (*slot)[8], unsigned) {
    return std::bit_cast<float>(slot[unsigned(src_lane) % 32][0]);
  });
}

namespace tinygpt::cuda {

inline uint16_t to_bf16_bits(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  if (std::isnan(x)) return 0x7fc0;
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // round to nearest, ties to even
}

inline float bf16_bits_to_float(uint16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }

inline uint32_t pack_bf16(float lo, float hi) { return uint32_t(to_bf16_bits(lo)) | (uint32_t(to_bf16_bits(hi)) << 16); }

using Slots = const uint32_t (*)[8];

/// d += A x B for the warp: A (16 x K) and B (K x 8) are rebuilt from all lanes' a and b registers by
/// A(slots, r, k) and B(slots, k, n), where slots[lane][0..3] hold a lane's a and slots[lane][4..5] its b.
template <int K, class ReadA, class ReadB>
void emulated_mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], ReadA A, ReadB B) {
  const uint32_t words[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
  struct Out {
    float v[4];
  };
  const Out out = warp_exchange(words, 6, [&](Slots slots, unsigned lane) {
    Out o;
    const int g = int(lane / 4), t = int(lane % 4);
    for (int i = 0; i < 4; ++i) {  // d[i] is row g + 8 (i / 2), column 2t + i % 2
      const int r = g + 8 * (i / 2), n = 2 * t + i % 2;
      float acc = 0.0f;
      for (int k = 0; k < K; ++k) acc += A(slots, r, k) * B(slots, k, n);
      o.v[i] = d[i] + acc;
    }
    return o;
  });
  for (int i = 0; i < 4; ++i) d[i] = out.v[i];
}

inline float bf16_half(uint32_t w, int i) { return bf16_bits_to_float(uint16_t(i ? w >> 16 : w & 0xffffu)); }

/// mma.m16n8k16 bf16: A(r, k) is held by lane (r % 8) * 4 + (k % 8) / 2 in register r / 8 + 2 (k / 8), half k % 2;
/// B(k, n) by lane n * 4 + (k % 8) / 2 in register 4 + k / 8, half k % 2.
inline void mma_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  emulated_mma<16>(
      d, a, b, [](Slots s, int r, int k) { return bf16_half(s[(r % 8) * 4 + (k % 8) / 2][r / 8 + 2 * (k / 8)], k % 2); },
      [](Slots s, int k, int n) { return bf16_half(s[n * 4 + (k % 8) / 2][4 + k / 8], k % 2); });
}

/// ldmatrix.x4 (non-transposed and .trans): every lane publishes its row address, and each lane reads its elements
/// of the four matrices from the rows the others named (mma.cuh states the layout).
template <bool kTrans>
void emulated_ldmatrix(uint32_t (&r)[4], const void* row) {
  const uint64_t addr = reinterpret_cast<uintptr_t>(row);
  const uint32_t words[2] = {uint32_t(addr), uint32_t(addr >> 32)};
  struct Out {
    uint32_t v[4];
  };
  const Out out = warp_exchange(words, 2, [](Slots s, unsigned lane) {
    const auto row_of = [&](int m, int i) {
      return reinterpret_cast<const uint16_t*>(uintptr_t(s[8 * m + i][0]) | (uintptr_t(s[8 * m + i][1]) << 32));
    };
    const int g = int(lane / 4), t = int(lane % 4);
    Out o;
    for (int m = 0; m < 4; ++m) {
      const uint16_t lo = kTrans ? row_of(m, 2 * t)[g] : row_of(m, g)[2 * t];
      const uint16_t hi = kTrans ? row_of(m, 2 * t + 1)[g] : row_of(m, g)[2 * t + 1];
      o.v[m] = uint32_t(lo) | (uint32_t(hi) << 16);
    }
    return o;
  });
  for (int m = 0; m < 4; ++m) r[m] = out.v[m];
}
inline void ldmatrix_x4(uint32_t (&r)[4], const void* row) { emulated_ldmatrix<false>(r, row); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) { emulated_ldmatrix<true>(r, row); }

}  // namespace tinygpt::cuda

namespace tinygpt::emu {

/// A cp.async in flight: it lands (the copy, zero-filled past `valid` bytes) only when its thread waits for its
/// group, so a kernel that reads a stage before waiting reads what was there before, as it may on a GPU.
struct PendingCopy {
  void* dst;
  const void* src;
  int bytes, valid;
};
inline thread_local std::vector<PendingCopy> tl_open_copies;                  // issued, not yet committed
inline thread_local std::vector<std::vector<PendingCopy>> tl_copy_groups;     // committed, oldest first

}  // namespace tinygpt::emu

namespace tinygpt::cuda {

inline void cp_async16(void* smem, const void* gmem, int valid) { emu::tl_open_copies.push_back({smem, gmem, 16, valid}); }
inline void cp_async4(void* smem, const void* gmem, int valid) { emu::tl_open_copies.push_back({smem, gmem, 4, valid}); }
inline void cp_async_commit() {
  emu::tl_copy_groups.push_back(std::move(emu::tl_open_copies));
  emu::tl_open_copies.clear();
}
template <int N>
void cp_async_wait() {
  while (emu::tl_copy_groups.size() > size_t(N)) {
    for (const emu::PendingCopy& c : emu::tl_copy_groups.front()) {
      std::memcpy(c.dst, c.src, size_t(c.valid));
      std::memset(static_cast<unsigned char*>(c.dst) + c.valid, 0, size_t(c.bytes - c.valid));
    }
    emu::tl_copy_groups.erase(emu::tl_copy_groups.begin());
  }
}

/// cvt.rna.tf32.f32: nearest, ties away from zero, to a 10-bit mantissa; the low 13 bits are zero.
inline uint32_t to_tf32(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  if (!std::isfinite(x)) return u;
  return (u + 0x1000u) & 0xffffe000u;
}

/// mma.m16n8k8 tf32: A(r, k) is held by lane (r % 8) * 4 + k % 4 in register r / 8 + 2 (k / 4); B(k, n) by lane
/// n * 4 + k % 4 in register 4 + k / 4. The unit reads the top 19 bits of each register.
inline void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  const auto value = [](uint32_t w) { return std::bit_cast<float>(w & 0xffffe000u); };
  emulated_mma<8>(
      d, a, b, [&](Slots s, int r, int k) { return value(s[(r % 8) * 4 + k % 4][r / 8 + 2 * (k / 4)]); },
      [&](Slots s, int k, int n) { return value(s[n * 4 + k % 4][4 + k / 4]); });
}

}  // namespace tinygpt::cuda

namespace tinygpt::emu {

/// Runs body(shared memory) as every thread of every block of the grid.
inline void launch(dim3 grid, unsigned threads, size_t smem_bytes, const std::function<void(unsigned char*)>& body) {
  std::vector<unsigned char> smem(smem_bytes);
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        if (!smem.empty()) std::memset(smem.data(), 0xff, smem.size());
        Block block(threads);
        std::vector<std::thread> pool;
        for (unsigned i = 0; i < threads; ++i) {
          pool.emplace_back([&, i] {
            threadIdx = {i, 0, 0};
            blockIdx = {x, y, z};
            blockDim = {threads, 1, 1};
            gridDim = grid;
            tl_block = &block;
            tl_warp = block.warps[i / 32].get();
            tl_smem = smem.data();
            body(smem.data());
            if (!tl_open_copies.empty() || !tl_copy_groups.empty()) {  // copies a kernel never waited for
              std::fprintf(stderr, "emulated CUDA: a thread ended with cp.async copies it never waited for\n");
              std::abort();
            }
            // A returned thread no longer holds up its block's or warp's barriers (as on the GPU).
            tl_warp->bar.arrive_and_drop();
            tl_block->bar.arrive_and_drop();
          });
        }
        for (std::thread& t : pool) t.join();
      }
    }
  }
}

}  // namespace tinygpt::emu

// The runtime the kernel headers (kernels/cuda/*.cuh) launch through, on the host: launches run under the
// emulator, device memory is host memory, and cuBLAS's products are a plain loop (the CPU stands in for cuBLAS:
// what this checks is the arguments our code hands it, not cuBLAS). The kernel headers define their functions in
// tinygpt::cuda::emulated when included after this header, so they never clash with the real CUDA backend.
namespace tinygpt::cuda::emulated {

struct DeviceProperties;
const DeviceProperties& properties();

template <class... Params, class... Args>
void launch_kernel(const char* what, void (*kernel)(Params...), dim3 grid, unsigned threads, size_t smem_bytes,
                   Args&&... args);

/// Scratch device memory: host memory, filled with NaN bytes so a read of what no kernel wrote shows.
class Scratch {
 public:
  explicit Scratch(size_t bytes) : bytes_(bytes, 0xff) {}
  template <class T> T* as() { return reinterpret_cast<T*>(bytes_.data()); }

 private:
  std::vector<unsigned char> bytes_;
};

/// Copies back to the host: each would be a host synchronisation on the GPU.
inline int64_t host_copies = 0;
inline void copy_to_host(void* dst, const void* src, size_t bytes) {
  ++host_copies;
  if (bytes) std::memcpy(dst, src, bytes);
}
inline void copy_to_device(void* dst, const void* src, size_t bytes) { if (bytes) std::memcpy(dst, src, bytes); }

/// What the launchers read of the GPU: an H100's shared memory per block.
struct DeviceProperties {
  size_t sharedMemPerBlockOptin = 227 * 1024;
  int major = 9, minor = 0;
};
inline const DeviceProperties& properties() {
  static const DeviceProperties p;
  return p;
}

/// Runs the kernel under the emulator; refuses what a GPU would refuse to launch (as an Error naming `what`).
template <class... Params, class... Args>
void launch_kernel(const char* what, void (*kernel)(Params...), dim3 grid, unsigned threads, size_t smem_bytes,
                   Args&&... args) {
  if (threads == 0 || threads > 1024 || smem_bytes > properties().sharedMemPerBlockOptin || grid.y > 65535 ||
      grid.z > 65535) {
    throw std::runtime_error(std::string(what) + ": launch configuration a GPU refuses");
  }
  emu::launch(grid, threads, smem_bytes, [&](unsigned char*) { kernel(args...); });
}

/// Row-major C (M, N) = alpha * op(A) @ op(B) + beta * C, `batch` times with the given element strides, each
/// operand element read as `value(element)`, in f64 sums: the loop that stands in for cuBLAS below. C is f32, or bf16
/// (each result computed in f32 and rounded once).
template <class E, class CT, class Value>
void gemm_loop(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const E* A, int64_t lda,
               int64_t stride_a, const E* B, int64_t ldb, int64_t stride_b, float beta, CT* C, int64_t ldc,
               int64_t stride_c, int64_t batch, Value value) {
  for (int64_t i = 0; i < batch; ++i) {
    const E* a = A + i * stride_a;
    const E* b = B + i * stride_b;
    CT* c = C + i * stride_c;
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0.0;
        for (int64_t k = 0; k < K; ++k) {
          acc += value(trans_a ? a[k * lda + m] : a[m * lda + k]) * value(trans_b ? b[n * ldb + k] : b[k * ldb + n]);
        }
        CT& out = c[m * ldc + n];
        out = float(alpha * acc + (beta == 0.0f ? 0.0 : double(beta) * double(float(out))));
      }
    }
  }
}

/// What the cuBLAS call in kernels/cuda/cublas.cu computes. With tf32 the operands are rounded to TF32 first, as the
/// tensor cores read them, so a launcher that drops the flag shows.
inline void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                 int64_t stride_a, const float* B, int64_t ldb, int64_t stride_b, float beta, float* C, int64_t ldc,
                 int64_t stride_c, int64_t batch, bool tf32, const char*) {
  gemm_loop(trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc, stride_c, batch,
            [tf32](float x) { return double(tf32 ? std::bit_cast<float>(to_tf32(x)) : x); });
}

/// What gemm_bf16 in kernels/cuda/cublas.cu computes: operands read as bf16 bit patterns.
inline void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
                      int64_t lda, int64_t stride_a, const uint16_t* B, int64_t ldb, int64_t stride_b, float beta,
                      float* C, int64_t ldc, int64_t stride_c, int64_t batch, const char*) {
  gemm_loop(trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc, stride_c, batch,
            [](uint16_t x) { return double(bf16_bits_to_float(x)); });
}

/// The same with C in bf16.
inline void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
                      int64_t lda, int64_t stride_a, const uint16_t* B, int64_t ldb, int64_t stride_b, float beta,
                      bf16* C, int64_t ldc, int64_t stride_c, int64_t batch, const char*) {
  gemm_loop(trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc, stride_c, batch,
            [](uint16_t x) { return double(bf16_bits_to_float(x)); });
}

/// Whether the stand-in for cublasLt (fused_gemm) finds an algorithm: tests turn it off to run the launchers' own
/// epilogue kernels, which the real backend runs when cublasLt has none for a call.
inline bool fused_gemm_available = true;
/// How many times the launchers have called fused_gemm (tests check when they ask cublasLt at all).
inline int fused_gemm_calls = 0;

/// What fused_gemm in kernels/cuda/cublas.cu computes: the product as gemm or gemm_bf16 would, then the epilogue
/// (cublasLt's GELU is the tanh form that kernels/scalar_math.h computes).
inline bool fused_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda,
                       const void* B, int64_t ldb, float* D, int64_t ldd, MatmulMath math, Epilogue epilogue,
                       const float* bias, float* aux, int64_t ldaux, const char* what) {
  ++fused_gemm_calls;
  if (!fused_gemm_available) return false;
  if (math == MatmulMath::BF16) {
    gemm_bf16(trans_a, trans_b, M, N, K, 1.0f, static_cast<const uint16_t*>(A), lda, 0,
              static_cast<const uint16_t*>(B), ldb, 0, 0.0f, D, ldd, 0, 1, what);
  } else {
    gemm(trans_a, trans_b, M, N, K, 1.0f, static_cast<const float*>(A), lda, 0, static_cast<const float*>(B), ldb, 0,
         0.0f, D, ldd, 0, 1, math == MatmulMath::TF32, what);
  }
  const auto tanh = [](float u) { return std::tanh(u); };
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      float& d = D[m * ldd + n];
      if (epilogue == Epilogue::Bias || epilogue == Epilogue::GeluBias) d += bias[n];
      if (epilogue == Epilogue::Gelu || epilogue == Epilogue::GeluBias) {
        aux[m * ldaux + n] = d;
        d = gelu(d, tanh);
      }
      if (epilogue == Epilogue::DGelu) d *= gelu_grad(aux[m * ldaux + n], tanh);
    }
  }
  return true;
}

}  // namespace tinygpt::cuda::emulated

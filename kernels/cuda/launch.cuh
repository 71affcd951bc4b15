// What every kernel header (kernels/cuda/*.cuh) is written against, so that one text compiles twice:
//   - by nvcc, in the matching .cu file: the real backend in tinygpt::cuda, kernels launched with <<<>>>;
//   - by the host compiler after tests/emulated_cuda.h: the same kernels and launchers in tinygpt::cuda::emulated,
//     every CUDA thread a std::thread, device memory host memory (tests/test_cuda_emulated.cpp checks each launcher
//     against its CPU twin that way, on machines without a GPU).
// Kernels are launched only through launch_kernel, never with <<<>>> at a call site, and dynamic shared memory is
// declared with TINYGPT_DYNAMIC_SMEM. The kernel headers are not a public API.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "kernels/base.h"
#include "kernels/bf16.h"
#include "kernels/cuda/cuda_kernels.h"

#if defined(TINYGPT_EMULATED_CUDA)
// tests/emulated_cuda.h, included first, provides launch_kernel, Scratch, copies, properties() and gemm.
#define TINYGPT_CUDA_BEGIN namespace tinygpt::cuda::emulated {
#define TINYGPT_DYNAMIC_SMEM(T, name) T* name = reinterpret_cast<T*>(::tinygpt::emu::tl_smem)
#else
#include "kernels/cuda/runtime.cuh"
#define TINYGPT_CUDA_BEGIN namespace tinygpt::cuda {
#define TINYGPT_DYNAMIC_SMEM(T, name) extern __shared__ __align__(16) T name[]

namespace tinygpt::cuda {

/// kernel<<<grid, threads, smem_bytes>>>(args...) on the stream (stream()); throws naming `what` when the launch
/// fails. Dynamic shared memory above the default 48 KiB is opted into first.
template <class... Params, class... Args>
void launch_kernel(const char* what, void (*kernel)(Params...), dim3 grid, unsigned threads, size_t smem_bytes,
                   Args&&... args) {
  if (smem_bytes > 48 * 1024) {
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_bytes)), what);
  }
  const ProfiledRegion timed(what);
  // clang-format off
  kernel<<<grid, threads, smem_bytes, stream()>>>(std::forward<Args>(args)...);
  // clang-format on
  check_launch(what);
}

}  // namespace tinygpt::cuda

/// In a .cu file after its kernel header: fails to compile unless tinygpt::cuda::name has exactly one signature.
#define TINYGPT_DEFINED_AS_DECLARED(name) \
  using name##_defined_as_declared [[maybe_unused]] = decltype(&::tinygpt::cuda::name);
#endif
#define TINYGPT_CUDA_END }

TINYGPT_CUDA_BEGIN

inline constexpr int kThreads = 256;

inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 1 ? 1 : (b > (int64_t(1) << 30) ? (int64_t(1) << 30) : b));
}

/// Grid-stride loop over [0, n).
#define TINYGPT_CUDA_LOOP(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(blockDim.x) * gridDim.x)

__device__ inline float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ inline float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

/// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ inline float block_sum(float x) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  x = warp_sum(x);
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = x;
  __syncthreads();
  x = lane < warps ? partial[lane] : 0.0f;
  return warp_sum(x);
}

/// Eight bf16 values: one 16-byte load or store.
struct alignas(16) Bf16x8 {
  bf16 v[8];
};

/// Whether p may be read or written as 16-byte vectors.
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

/// Eight elements of storage (16-byte aligned) as floats, and back: two float4 for f32, one Bf16x8 for bf16, so a
/// kernel templated on its storage type moves 16 bytes per load and store either way.
__device__ __forceinline__ void load8(float (&v)[8], const float* p) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void load8(float (&v)[8], const bf16* p) {
  const Bf16x8 x = *reinterpret_cast<const Bf16x8*>(p);
  for (int j = 0; j < 8; ++j) v[j] = float(x.v[j]);
}
__device__ __forceinline__ void store8(float* p, const float (&v)[8]) {
  reinterpret_cast<float4*>(p)[0] = float4{v[0], v[1], v[2], v[3]};
  reinterpret_cast<float4*>(p)[1] = float4{v[4], v[5], v[6], v[7]};
}
__device__ __forceinline__ void store8(bf16* p, const float (&v)[8]) {
  Bf16x8 x;
  for (int j = 0; j < 8; ++j) x.v[j] = bf16(v[j]);
  *reinterpret_cast<Bf16x8*>(p) = x;
}

/// Whether every pointer given may be read or written in groups of eight elements of 16 bytes' alignment (null
/// pointers pass): a bf16 group is one vector, an f32 group two.
template <class... P>
bool vectors_fit(const P*... p) {
  return ((p == nullptr || aligned16(p)) && ...);
}

/// The maps below take f32 or bf16 storage (f32 arithmetic inside, each result rounded once for bf16). With vec (every
/// pointer 16-byte aligned: vectors_fit) a thread takes groups of eight elements as 16-byte vectors, group(e) for the
/// group starting at element e (load8, store8), and the last partial group an element at a time; otherwise a thread
/// takes an element, element(i).
template <class Group, class Element>
__device__ __forceinline__ void map_elements(int64_t n, bool vec, Group group, Element element) {
  if (vec) {
    TINYGPT_CUDA_LOOP(g, (n + 7) / 8) {
      const int64_t e = 8 * g;
      if (e + 8 <= n) {
        group(e);
      } else {
        for (int64_t i = e; i < n; ++i) element(i);
      }
    }
  } else {
    TINYGPT_CUDA_LOOP(i, n) element(i);
  }
}

/// Threads for a map over n elements (map_elements): one per group of eight with vec, else one per element.
inline unsigned map_blocks(int64_t n, bool vec) { return blocks_for(vec ? (n + 7) / 8 : n); }

/// Up to eight elements of x from element c on (as many as remain before n) as floats, the rest zero: one vector load
/// when vec and all eight are there, else one at a time. Returns how many. store_group writes them back likewise.
template <class T>
__device__ __forceinline__ int load_group(float (&v)[8], const T* x, int64_t c, int64_t n, bool vec) {
  if (vec && c + 8 <= n) {
    load8(v, x + c);
    return 8;
  }
  const int k = int(min(int64_t(8), n - c));
  for (int j = 0; j < 8; ++j) v[j] = j < k ? float(x[c + j]) : 0.0f;
  return k;
}

template <class T>
__device__ __forceinline__ void store_group(T* y, const float (&v)[8], int64_t c, int64_t n, bool vec) {
  if (vec && c + 8 <= n) {
    store8(y + c, v);
    return;
  }
  for (int j = 0; j < 8 && c + j < n; ++j) y[c + j] = v[j];
}

namespace {

/// out[c] += the sum over r < rows of partial[r * stride + c], for c < C; a warp a column, lane l summing rows l,
/// l + 32, ... in turn, then the warp's shuffle tree: a fixed order, so results repeat exactly. bf16 storage: added
/// in f32 and rounded once.
template <class T>
__global__ void add_partial_rows_kernel(T* out, const float* partial, int64_t rows, int64_t stride, int64_t C) {
  const int64_t c = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (c >= C) return;  // the whole warp: c is the same for its lanes
  const int lane = int(threadIdx.x % 32);
  float acc = 0.0f;
  for (int64_t r = lane; r < rows; r += 32) acc += partial[r * stride + c];
  acc = warp_sum(acc);
  if (lane == 0) out[c] = float(out[c]) + acc;
}

}  // namespace

/// Adds the column sums of the partial sums of blocks of rows (add_partial_rows_kernel). A warp a column: a thread a
/// column looping over a few hundred rows kept a handful of multiprocessors busy and waited on each load in turn.
template <class T>
void add_partial_rows(const char* what, T* out, const float* partial, int64_t rows, int64_t stride, int64_t C) {
  if (C == 0) return;
  launch_kernel(what, add_partial_rows_kernel<T>, blocks_for(C * 32), kThreads, 0, out, partial, rows, stride, C);
}

/// Blocks of rows for a column sum over N rows in two passes (partial sums of blocks of rows, then
/// add_partial_rows): about 1024 blocks of at least 16 rows, enough to keep every multiprocessor's loads in flight.
inline int64_t rows_per_partial(int64_t N) { return std::max<int64_t>(16, (N + 1023) / 1024); }

TINYGPT_CUDA_END

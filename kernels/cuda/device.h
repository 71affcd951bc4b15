// GPU memory and device queries. Implemented in device.cu when the CUDA backend is built, and by
// cpu_only_stubs.cpp otherwise, so callers never need an #ifdef.
//
// All GPU work runs on one stream (the default stream), so memory handed back to the caching allocator
// can be reused at once by later work: the stream orders it after every kernel that used it.
#pragma once

#include <cstddef>

namespace tinygpt::cuda {

/// Number of usable GPUs; 0 when none is present or the build has no CUDA backend.
int device_count();
/// True when this binary was built with the CUDA backend.
bool built_with_cuda();
/// "NVIDIA H100 80GB HBM3, 132 SMs, compute 9.0" for the current GPU.
const char* device_description();

/// Device memory from a caching allocator: freed blocks are kept and reused (no cudaMalloc/cudaFree per op).
/// Out of memory: the cache is released and the allocation retried once, then an Error names the bytes
/// requested and free.
void* malloc(size_t bytes);
void free(void* ptr);
/// Returns every cached block to the driver.
void empty_cache();
struct MemoryStats {
  size_t allocated = 0;       // in use by tensors now
  size_t cached = 0;          // held by the allocator, in use or not
  size_t peak_allocated = 0;  // high-water mark of `allocated` since the last reset
};
MemoryStats memory_stats();
void reset_peak_memory();
/// Bytes that can still be allocated: the GPU's free memory plus what the caching allocator holds unused (0 without
/// a GPU).
size_t free_memory();

void memset_zero(void* ptr, size_t bytes);
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
void copy_on_device(void* dst, const void* src, size_t bytes);
/// Waits for all queued GPU work; throws if any of it failed.
void synchronize();

/// True when the environment sets TINYGPT_CUDA_PROFILE=1: launch() then synchronizes around every GPU kernel
/// and adds its time to a per-kernel table printed to stderr at exit (a coarse profiler; it slows runs down).
bool profiling();
void profile_add(const char* kernel, double ms);

/// Lets cuBLAS use TF32 tensor cores for f32 matmuls (10-bit mantissa products, f32 accumulation). Off by default.
void set_allow_tf32(bool on);
bool allow_tf32();

/// The operands of flash attention's products on the GPU; accumulation, softmax, logsumexp, inputs and outputs are
/// f32 in every case. F32: CUDA cores (the default). TF32, BF16: tensor cores (mma.sync), Q, K, V, dO, P and dS
/// rounded to that format as they are loaded; TF32 falls back to F32 for head dims whose tiles do not fit in the
/// GPU's shared memory (128 on an A100).
enum class AttentionMath { F32, TF32, BF16 };
/// Throws when TF32 or BF16 is asked of a GPU without those tensor cores (compute capability below 8.0).
void set_attention_math(AttentionMath math);
AttentionMath attention_math();
inline const char* attention_math_name(AttentionMath math) {
  return math == AttentionMath::BF16 ? "bf16" : math == AttentionMath::TF32 ? "tf32" : "f32";
}

/// Sets the attention math for its lifetime and restores the previous one after.
class AttentionMathScope {
 public:
  explicit AttentionMathScope(AttentionMath math) : previous_(attention_math()) { set_attention_math(math); }
  ~AttentionMathScope() { set_attention_math(previous_); }
  AttentionMathScope(const AttentionMathScope&) = delete;
  AttentionMathScope& operator=(const AttentionMathScope&) = delete;

 private:
  AttentionMath previous_;
};

}  // namespace tinygpt::cuda

// Device queries the layers above the kernels may use: GPU memory and devices (the part of the CUDA backend they may
// use; implemented in kernels/cuda/device.cu when the CUDA backend is built, and by kernels/cuda/cpu_only_stubs.cpp
// otherwise, so callers never need an #ifdef), and which CPU unit runs bf16 products. How kernels compute (TF32, the
// attention operand format) is not set here: it is an argument of each call (kernels/numerics.h).
//
// All GPU work runs on one stream (cuda::stream() in kernels/cuda/runtime.cuh), so memory handed back to the caching
// allocator can be reused at once by later work: the stream orders it after every kernel that used it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "numerics.h"

namespace tinygpt::cuda {

/// Number of usable GPUs; 0 when none is present or the build has no CUDA backend.
int device_count();
/// True when this binary was built with the CUDA backend.
bool built_with_cuda();
/// "NVIDIA H100 80GB HBM3, 132 SMs, compute 9.0" for the current GPU.
const char* device_description();
/// The current GPU's compute capability as 10 * major + minor (90 for an H100); 0 without a GPU.
int compute_capability();

/// Whether this GPU's flash attention kernels run `math`'s operands (TF32 or BF16) on tensor cores at head dim
/// `head_dim` (the larger of E and Ev): compute capability 8.0 or newer, and tiles that fit in its shared memory (TF32
/// at head dim 128 does not on an A100; those calls run on CUDA cores). False for F32 and without a GPU. The attention
/// op's list of paths asks it, and the kernels follow the same answer.
bool flash_tensor_cores(AttentionMath math, int64_t head_dim);

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
/// Queued after the GPU work before it (cudaMemcpyAsync): the host does not wait for that work; the driver stages
/// the pageable source before returning, so it may be reused at once.
void copy_to_device(void* dst, const void* src, size_t bytes);
/// Waits for the GPU work queued before it: a host synchronisation.
void copy_to_host(void* dst, const void* src, size_t bytes);
void copy_on_device(void* dst, const void* src, size_t bytes);
/// Waits for all queued GPU work; throws if any of it failed.
void synchronize();
/// How many times this process has waited for the GPU (copy_to_host and synchronize calls): tests hold a training
/// step to one.
int64_t host_syncs();

/// Makes GPU `index` (0 .. device_count() - 1) this process's GPU, before any other GPU work: one GPU per rank.
void set_device(int index);

// --- CUDA graphs. The GPU work queued between begin_capture() and end_capture() is recorded instead of run, and
// Graph::replay() queues all of it again, with the same arguments and the same memory: what changes between replays
// must be in device memory the captured work reads (copied there before each replay). Memory allocated or freed
// while capturing belongs to the graph from then on: the allocator hands it to nothing else until the graph is
// destroyed, so the captured work finds its buffers as it left them.
class Graph {
 public:
  Graph() = default;
  Graph(Graph&& other) noexcept;
  Graph& operator=(Graph&& other) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph();
  explicit operator bool() const { return exec_ != nullptr; }
  /// Queues the recorded work on the stream; the host does not wait for it.
  void replay() const;
  /// The recorded kernels, copies and memsets.
  size_t nodes() const { return nodes_; }

 private:
  friend Graph end_capture();
  void* exec_ = nullptr;  // cudaGraphExec_t
  uint64_t pool_ = 0;     // the allocator's pool of the graph's memory
  size_t nodes_ = 0;
};
/// Starts recording the GPU work this thread queues. Anything that waits for the GPU while recording (a copy to the
/// host, synchronize) makes end_capture throw.
void begin_capture();
/// Ends the recording and returns it as a graph; throws an Error naming CUDA's reason when the work could not be
/// captured (the capture is then abandoned, and its memory returned to the allocator).
Graph end_capture();
/// True between begin_capture and end_capture: host-side shortcuts that bake this step's data into the recorded work
/// (the embedding's host sort of the ids) must not be taken.
bool capturing();
/// Abandons a capture begun by begin_capture (after an exception in the captured code); nothing when none is open.
void abort_capture();

// --- NCCL, the CUDA toolkit's collectives, for data-parallel training on several GPUs: one communicator per
// process, bootstrapped by the caller, which hands rank 0's id to every rank (over MPI, as llm.c does).
/// True when this binary was built with NCCL (a CUDA build that found nccl.h and libnccl).
bool built_with_nccl();
struct NcclId {
  char bytes[128];  // NCCL_UNIQUE_ID_BYTES
};
/// A new communicator's id, made by rank 0.
NcclId nccl_unique_id();
/// Joins the communicator `id` as `rank` of `world`, on the current GPU.
void nccl_init(const NcclId& id, int rank, int world);
/// Sums `n` floats of device memory over the ranks, in place, in a fixed order, so the same job repeats bit for
/// bit: each rank owns a slice, receives every rank's part of it (grouped ncclSend/ncclRecv), adds the parts in rank
/// order, and ncclAllGather hands every rank every slice. (ncclAllReduce's order depends on the algorithm NCCL
/// picks for the size and topology.)
void nccl_all_reduce_sum(float* data, int64_t n);

/// True when the environment sets TINYGPT_CUDA_PROFILE=1: launch() then synchronizes around every GPU op and adds
/// its time to a per-op table, and every kernel launch and cuBLAS call inside is timed with CUDA events into a
/// per-kernel table (kernels/cuda/runtime.cuh: ProfiledRegion); both are printed to stderr at exit (a coarse
/// profiler: it slows runs down, and is off while a CUDA graph is captured).
bool profiling();
/// Adds an op's time to the per-op table, and the times of the kernels queued since the last call to the per-kernel
/// table (after the caller has synchronized).
void profile_add(const char* op, double ms);

}  // namespace tinygpt::cuda

// --- The CPU's units: which one runs bf16 products (implemented with the GEMM, kernels/cpu/cpu_units.cpp), for the
// layers above the kernels (the trainer's model line and defaults, the meter).
namespace tinygpt::cpu {

/// How bf16 products are computed. All take the same rounded operands and sum in f32, in different orders.
/// F32Units: rounded as packed, then the f32 micro-kernel (every CPU). Avx512Bf16: `vdpbf16ps`, two products per
/// f32 lane per instruction. Amx: AMX-BF16 tiles (16 x 16 x 32 products per instruction).
enum class Bf16Kernel : uint8_t { F32Units, Avx512Bf16, Amx };

/// "f32 units", "AVX512-BF16" or "AMX-BF16".
const char* bf16_kernel_name(Bf16Kernel kernel);

/// f32 lanes of the f32 micro-kernel's vectors: 16 (AVX-512), 8 (AVX2) or 4 (the portable build), fixed at compile
/// time.
int f32_lanes();

/// The kernels this CPU and OS can run, F32Units first, the fastest last (AMX after Linux granted the tile state).
const std::vector<Bf16Kernel>& bf16_kernels_available();

/// The kernel gemm uses for bf16 products in float: of those available, the unit with the most FLOPs a cycle as
/// measured at the first call (kernels/cpu/cpu_probe.h: AMX where present; AVX512-BF16 where its dot products run at
/// twice the f32 FMAs' rate, as on AMD Zen 4 and Zen 5; else the f32 units). The environment variable
/// TINYGPT_CPU_BF16=amx|avx512|f32, read once, picks one; throws Error (kernels/base.h) when it names something else
/// or a kernel this CPU lacks.
Bf16Kernel bf16_kernel();

/// Whether decoding's matrix-vector products (a few rows of C, bf16 products) run on vdpbf16ps: where the CPU has
/// AVX512-BF16, whatever bf16_kernel() chose for the blocked products (a matrix-vector product is bound by reading
/// the weights, not by the dot products' rate, and vdpbf16ps reads them as stored, in bf16), unless
/// TINYGPT_CPU_BF16=f32 asks for the f32 units everywhere.
bool bf16_decode_unit();

/// What the cores do, measured (the probes: kernels/cpu/cpu_probe.h): the clock and each unit's FLOPs a cycle.
struct UnitRates {
  double ghz = 0;          // the clock the cores run at: the chain of dependent adds on every thread at once
  double f32 = 0;          // FLOPs a cycle of one core's f32 FMAs at f32_lanes() lanes
  double avx512_bf16 = 0;  // vdpbf16ps (0 where absent)
  double amx = 0;          // tdpbf16ps (0 where absent)
  bool cached = false;     // set_unit_rates gave them (read from a cache) rather than measured now
};

/// The rates, measured by the first call (about 0.1 s, every thread at once: the clock as the best of 7 timings of
/// the chain; each unit's FLOPs a cycle as the best of 7 ratios of the unit's rate to the chain's, the two timed one
/// right after the other, so a core shared with another process for a while slows both alike; rounded up to a power
/// of two, the steps between microarchitectures, so that it is a ceiling), unless set_unit_rates gave them first.
const UnitRates& unit_rates();
/// Uses `rates` (as read from a cache) instead of measuring them: before the first unit_rates() or bf16_kernel().
/// Throws Error when either was already called, or a rate is not a positive power of two where its unit exists.
/// unit_rates() then says `cached`, unless `from_cache` is false (a cache's rates with a clock read now).
void set_unit_rates(const UnitRates& rates, bool from_cache = true);
/// Raises the FLOPs a cycle of `kernel`'s unit to `per_cycle` (a power of two above it): a step ran faster than the
/// rates allow, so the probe read the unit low. unit_rates() then says not `cached` (the cache is to be rewritten).
void raise_unit_rate(Bf16Kernel kernel, double per_cycle);
/// The clock the cores run at, as unit_rates() measures it (every thread at once, the best of 7 timings of the
/// chain of dependent adds, about 20 ms); 0 where there is no such probe (not x86-64).
double measure_clock_ghz();
/// FLOPs a cycle of one core of `kernel`'s unit (F32Units: the f32 FMAs).
double flops_per_cycle(Bf16Kernel kernel);
/// "AMD EPYC 9R14 96-Core Processor (family 25, model 17)": CPUID's brand string, family and model.
std::string cpu_model_name();

}  // namespace tinygpt::cpu

// GPU memory and device queries, the part of the CUDA backend the layers above the kernels may use. Implemented in
// kernels/cuda/device.cu when the CUDA backend is built, and by kernels/cuda/cpu_only_stubs.cpp otherwise, so
// callers never need an #ifdef. How kernels compute (TF32, the attention operand format) is not set here: it is
// an argument of each call (kernels/numerics.h).
//
// All GPU work runs on one stream (cuda::stream() in kernels/cuda/runtime.cuh), so memory handed back to the caching
// allocator can be reused at once by later work: the stream orders it after every kernel that used it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tinygpt::cuda {

/// Number of usable GPUs; 0 when none is present or the build has no CUDA backend.
int device_count();
/// True when this binary was built with the CUDA backend.
bool built_with_cuda();
/// "NVIDIA H100 80GB HBM3, 132 SMs, compute 9.0" for the current GPU.
const char* device_description();
/// The current GPU's compute capability as 10 * major + minor (90 for an H100); 0 without a GPU.
int compute_capability();

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

// GPU memory, the caching allocator, copies and device queries. CUDA errors become tinygpt::Error naming
// the call that failed.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/cuda/runtime.cuh"
#include "kernels/env.h"

namespace tinygpt::cuda {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear a non-sticky error so the next call starts clean
    throw Error(fmt::format("{}: CUDA error: {} ({})", what, cudaGetErrorString(status), int(status)));
  }
}

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw Error(fmt::format("{}: cuBLAS error: {} ({})", what, cublasGetStatusString(status), int(status)));
  }
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

bool built_with_cuda() { return true; }

const cudaDeviceProp& properties() {
  static const cudaDeviceProp props = [] {
    int dev = 0;
    cudaDeviceProp p{};
    check(cudaGetDevice(&dev), "cudaGetDevice");
    check(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties");
    return p;
  }();
  return props;
}

int compute_capability() {
  if (device_count() == 0) return 0;
  return 10 * properties().major + properties().minor;
}

const char* device_description() {
  static const std::string description = [] {
    if (device_count() == 0) return std::string("no GPU");
    const cudaDeviceProp& p = properties();
    return fmt::format("{}, {} SMs, compute {}.{}, {:.0f} GiB", p.name, p.multiProcessorCount, p.major, p.minor,
                       double(p.totalGlobalMem) / double(1 << 30));
  }();
  return description.c_str();
}

// --- caching allocator
//
// Block sizes are rounded (512 B granules below 1 MiB, 2 MiB granules above) so similar requests share
// blocks; a freed block goes to a free list keyed by its size and is handed to the next request of the same
// rounded size. Every step of a training loop asks for the same sizes, so after the first step no
// cudaMalloc happens at all. While a CUDA graph is captured, every block allocated or freed joins the graph's pool,
// whose free blocks go only to allocations of that capture, until the graph is destroyed and the pool released:
// a replay must find its buffers where the capture left them, untouched by work outside the graph.
namespace {

size_t round_size(size_t bytes) {
  constexpr size_t kSmall = 512, kLarge = size_t(2) << 20;
  if (bytes < (size_t(1) << 20)) return (std::max<size_t>(bytes, 1) + kSmall - 1) / kSmall * kSmall;
  return (bytes + kLarge - 1) / kLarge * kLarge;
}

class CachingAllocator {
 public:
  void* allocate(size_t bytes) {
    const size_t size = round_size(bytes);
    std::lock_guard lock(mutex_);
    void* ptr = nullptr;
    std::multimap<size_t, void*>* lists[2] = {capture_pool_ ? &pool_free_[capture_pool_] : nullptr, &free_};
    for (auto* list : lists) {
      if (list == nullptr || ptr != nullptr) continue;
      if (auto it = list->find(size); it != list->end()) {
        ptr = it->second;
        list->erase(it);
      }
    }
    if (ptr == nullptr) {
      ptr = device_malloc(bytes, size);
      cached_ += size;
    }
    if (capture_pool_) owner_[ptr] = capture_pool_;
    in_use_[ptr] = size;
    allocated_ += size;
    peak_ = std::max(peak_, allocated_);
    return ptr;
  }

  void release(void* ptr) {
    std::lock_guard lock(mutex_);
    const auto it = in_use_.find(ptr);
    if (it == in_use_.end()) return;
    allocated_ -= it->second;
    const auto own = owner_.find(ptr);
    const uint64_t pool = own != owner_.end() ? own->second : capture_pool_;
    if (pool) {
      owner_[ptr] = pool;
      pool_free_[pool].emplace(it->second, ptr);
    } else {
      free_.emplace(it->second, ptr);
    }
    in_use_.erase(it);
  }

  /// While capturing into `pool` (0: not capturing).
  void set_capture_pool(uint64_t pool) {
    std::lock_guard lock(mutex_);
    capture_pool_ = pool;
  }
  /// The pool's blocks back to everyone: free ones to the free list, ones still in use when they are freed.
  void release_pool(uint64_t pool) {
    std::lock_guard lock(mutex_);
    if (const auto it = pool_free_.find(pool); it != pool_free_.end()) {
      for (const auto& [size, ptr] : it->second) free_.emplace(size, ptr);
      pool_free_.erase(it);
    }
    for (auto it = owner_.begin(); it != owner_.end();) it = it->second == pool ? owner_.erase(it) : std::next(it);
  }

  void empty_cache() {
    std::lock_guard lock(mutex_);
    release_free_blocks();
  }

  MemoryStats stats() {
    std::lock_guard lock(mutex_);
    return {allocated_, cached_, peak_};
  }
  void reset_peak() {
    std::lock_guard lock(mutex_);
    peak_ = allocated_;
  }

 private:
  void* device_malloc(size_t bytes, size_t size) {
    void* ptr = nullptr;
    cudaError_t status = cudaMalloc(&ptr, size);
    if (status == cudaErrorMemoryAllocation) {  // give the cached blocks back and try once more
      cudaGetLastError();
      release_free_blocks();
      status = cudaMalloc(&ptr, size);
    }
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      size_t free_bytes = 0, total = 0;
      cudaMemGetInfo(&free_bytes, &total);
      throw Error(
          fmt::format("out of GPU memory: requested {:.1f} MiB ({} bytes), {:.1f} MiB free of {:.1f} MiB; "
                      "{:.1f} MiB in use by tensors. Lower --batch-size or the model size",
                      double(bytes) / 1048576.0, bytes, double(free_bytes) / 1048576.0, double(total) / 1048576.0,
                      double(allocated_) / 1048576.0));
    }
    check(status, "cudaMalloc");
    return ptr;
  }

  void release_free_blocks() {
    cudaDeviceSynchronize();  // a cached block may still be in use by queued work
    for (auto& [size, ptr] : free_) {
      cudaFree(ptr);
      cached_ -= size;
    }
    free_.clear();
  }

  std::mutex mutex_;
  std::multimap<size_t, void*> free_;
  std::unordered_map<void*, size_t> in_use_;
  uint64_t capture_pool_ = 0;
  std::unordered_map<void*, uint64_t> owner_;                             // blocks of a graph's pool
  std::unordered_map<uint64_t, std::multimap<size_t, void*>> pool_free_;  // their free ones, per pool
  size_t allocated_ = 0, cached_ = 0, peak_ = 0;
};

// Never destroyed: tensors with static lifetime may free into it during exit, after the CUDA context is gone.
CachingAllocator& allocator() {
  static auto* a = new CachingAllocator;
  return *a;
}

}  // namespace

void* malloc(size_t bytes) { return allocator().allocate(bytes); }
void free(void* ptr) { allocator().release(ptr); }
void empty_cache() { allocator().empty_cache(); }
MemoryStats memory_stats() { return allocator().stats(); }
void reset_peak_memory() { allocator().reset_peak(); }
size_t free_memory() {
  size_t free_bytes = 0, total = 0;
  check(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
  const MemoryStats s = memory_stats();
  return free_bytes + (s.cached - s.allocated);
}

cudaStream_t stream() {
  static const cudaStream_t s = [] {
    cudaStream_t created = nullptr;
    check(cudaStreamCreate(&created), "cudaStreamCreate");  // blocking: ordered with the legacy default stream
    return created;
  }();
  return s;
}

void memset_zero(void* ptr, size_t bytes) { check(cudaMemsetAsync(ptr, 0, bytes, stream()), "cudaMemsetAsync"); }

namespace {
std::atomic<int64_t> syncs{0};
uint64_t g_capturing = 0;  // the pool of the open CUDA graph capture (0: none); captures come from one host thread
uint64_t g_next_pool = 1;
}  // namespace

int64_t host_syncs() { return syncs.load(); }

void copy_to_device(void* dst, const void* src, size_t bytes) {
  // A captured copy would read its host source again at every replay, long after the caller freed or changed it.
  if (g_capturing) throw Error("copy_to_device: an upload from host memory cannot be captured in a CUDA graph");
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()), "cudaMemcpyAsync (host to device)");
}

void copy_to_host(void* dst, const void* src, size_t bytes) {
  ++syncs;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream()), "cudaMemcpyAsync (device to host)");
  check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize (device to host)");
}

void copy_on_device(void* dst, const void* src, size_t bytes) {
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()), "cudaMemcpyAsync (device to device)");
}

void synchronize() {
  ++syncs;
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

// --- CUDA graphs

namespace {

/// Ends the open capture; the recorded graph (null when CUDA refused it) and CUDA's status.
std::pair<cudaGraph_t, cudaError_t> finish_capture() {
  const uint64_t pool = g_capturing;
  g_capturing = 0;
  allocator().set_capture_pool(0);
  cudaGraph_t graph = nullptr;
  const cudaError_t status = cudaStreamEndCapture(stream(), &graph);
  if (status != cudaSuccess) {
    cudaGetLastError();
    if (graph) cudaGraphDestroy(graph);
    allocator().release_pool(pool);
    return {nullptr, status};
  }
  return {graph, status};
}
}  // namespace

Graph::Graph(Graph&& other) noexcept
    : exec_(std::exchange(other.exec_, nullptr)),
      pool_(std::exchange(other.pool_, 0)),
      nodes_(std::exchange(other.nodes_, 0)) {}

Graph& Graph::operator=(Graph&& other) noexcept {
  if (this != &other) {
    Graph dropped(std::move(*this));
    exec_ = std::exchange(other.exec_, nullptr);
    pool_ = std::exchange(other.pool_, 0);
    nodes_ = std::exchange(other.nodes_, 0);
  }
  return *this;
}

Graph::~Graph() {
  if (exec_ == nullptr) return;
  // Work queued after a replay is ordered after it on the stream, so the pool's blocks can go back at once.
  cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  allocator().release_pool(pool_);
}

void Graph::replay() const {
  if (exec_ == nullptr) throw Error("Graph::replay: an empty graph");
  check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), stream()), "cudaGraphLaunch");
}

void begin_capture() {
  if (g_capturing) throw Error("begin_capture: a capture is already open");
  const uint64_t pool = g_next_pool++;
  allocator().set_capture_pool(pool);
  // Relaxed: the allocator may still cudaMalloc a block the capture needs; waits for the GPU fail all the same.
  const cudaError_t status = cudaStreamBeginCapture(stream(), cudaStreamCaptureModeRelaxed);
  if (status != cudaSuccess) {
    allocator().set_capture_pool(0);
    allocator().release_pool(pool);
    check(status, "cudaStreamBeginCapture");
  }
  g_capturing = pool;
}

Graph end_capture() {
  if (!g_capturing) throw Error("end_capture: no capture is open");
  const uint64_t pool = g_capturing;
  const auto [graph, status] = finish_capture();
  check(status, "cudaStreamEndCapture (the captured work waited for the GPU, or was invalidated by an error)");
  size_t nodes = 0;
  cudaGraphGetNodes(graph, nullptr, &nodes);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (made != cudaSuccess) allocator().release_pool(pool);
  check(made, "cudaGraphInstantiate");
  Graph g;
  g.exec_ = exec;
  g.pool_ = pool;
  g.nodes_ = nodes;
  return g;
}

bool capturing() { return g_capturing != 0; }

void abort_capture() {
  if (!g_capturing) return;
  const uint64_t pool = g_capturing;
  const auto [graph, status] = finish_capture();  // which releases the pool when CUDA refused the capture
  if (graph) {
    cudaGraphDestroy(graph);
    allocator().release_pool(pool);
  }
  cudaGetLastError();
}

void set_device(int index) {
  const int n = device_count();
  if (index < 0 || index >= n) throw Error(fmt::format("GPU {} does not exist: {} visible", index, n));
  check(cudaSetDevice(index), "cudaSetDevice");
}

namespace {

struct Profile {
  /// Times of one op or kernel; the first call is kept apart, as it includes loading the kernel's module (CUDA loads
  /// modules lazily) and cuBLAS's choice of an algorithm.
  struct Entry {
    double ms = 0, first_ms = 0;
    int64_t calls = 0;
    void add(double t) {
      if (calls++ == 0) first_ms = t;
      ms += t;
    }
  };
  struct Pending {
    std::string what;
    cudaEvent_t start, stop;
  };
  std::mutex mutex;
  std::map<std::string, Entry> ops, kernels;
  std::vector<Pending> pending;

  /// The pending kernels' times into `kernels` (waits for their stop events).
  void flush() {
    for (Pending& p : pending) {
      float ms = 0;
      if (cudaEventSynchronize(p.stop) == cudaSuccess && cudaEventElapsedTime(&ms, p.start, p.stop) == cudaSuccess) {
        kernels[p.what].add(ms);
      }
      cudaEventDestroy(p.start);
      cudaEventDestroy(p.stop);
    }
    pending.clear();
  }

  static void print(const char* title, const char* what, const std::map<std::string, Entry>& entries) {
    double total = 0;
    for (const auto& [name, e] : entries) total += e.ms - e.first_ms;
    fmt::print(stderr, "{}\n{:<44} {:>7} {:>10} {:>9} {:>7} {:>9}\n", title, what, "calls", "ms", "us/call", "share",
               "first ms");
    std::vector<std::pair<std::string, Entry>> by_time(entries.begin(), entries.end());
    std::sort(by_time.begin(), by_time.end(), [](const auto& a, const auto& b) {
      return a.second.ms - a.second.first_ms > b.second.ms - b.second.first_ms;
    });
    for (const auto& [name, e] : by_time) {  // the costliest first
      const double ms = e.ms - e.first_ms;
      const int64_t calls = e.calls - 1;
      fmt::print(stderr, "{:<44} {:>7} {:>10.2f} {:>9.1f} {:>6.1f}% {:>9.2f}\n", name, calls, ms,
                 calls > 0 ? 1000.0 * ms / double(calls) : 0.0, 100.0 * ms / std::max(total, 1e-9), e.first_ms);
    }
  }

  ~Profile() {
    flush();
    print("TINYGPT_CUDA_PROFILE: GPU time by op (each op synchronized alone, host time; without each op's first call)",
          "op", ops);
    print(
        "TINYGPT_CUDA_PROFILE: GPU time by kernel (CUDA events around each launch and cuBLAS call; without each "
        "kernel's first call)",
        "kernel", kernels);
  }
};

Profile& profile() {
  static Profile p;
  return p;
}

}  // namespace

bool profiling() {
  static const bool on = [] { return TINYGPT_ENV_IS("TINYGPT_CUDA_PROFILE", "1"); }();
  return on;
}

void profile_add(const char* op, double ms) {
  Profile& p = profile();
  std::lock_guard lock(p.mutex);
  p.ops[op].add(ms);
  p.flush();
}

void ProfiledRegion::begin(const char* what) {
  what_ = what;
  if (cudaEventCreate(&start_) != cudaSuccess) {
    start_ = nullptr;
    return;
  }
  cudaEventRecord(start_, stream());
}

void ProfiledRegion::end() {
  cudaEvent_t stop = nullptr;
  if (cudaEventCreate(&stop) != cudaSuccess) {
    cudaEventDestroy(start_);
    return;
  }
  cudaEventRecord(stop, stream());
  Profile& p = profile();
  std::lock_guard lock(p.mutex);
  p.pending.push_back({what_, start_, stop});
}

cublasHandle_t cublas() {
  static cublasHandle_t handle = [] {
    cublasHandle_t h = nullptr;
    check(cublasCreate(&h), "cublasCreate");
    check(cublasSetStream(h, stream()), "cublasSetStream");
    // A workspace of our own, so cuBLAS never allocates inside a captured graph.
    constexpr size_t kWorkspace = size_t(32) << 20;
    void* ws = nullptr;
    check(cudaMalloc(&ws, kWorkspace), "cudaMalloc (cuBLAS workspace)");
    check(cublasSetWorkspace(h, ws, kWorkspace), "cublasSetWorkspace");
    return h;
  }();
  return handle;
}

cublasLtHandle_t cublaslt() {
  static cublasLtHandle_t handle = [] {
    cublasLtHandle_t h = nullptr;
    check(cublasLtCreate(&h), "cublasLtCreate");
    return h;
  }();
  return handle;
}

void* cublaslt_workspace(size_t* bytes) {
  constexpr size_t kBytes = size_t(32) << 20;
  static void* ws = [] {
    void* p = nullptr;
    check(cudaMalloc(&p, kBytes), "cudaMalloc (cublasLt workspace)");
    return p;
  }();
  *bytes = kBytes;
  return ws;
}

}  // namespace tinygpt::cuda

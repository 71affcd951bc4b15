// GPU memory, the caching allocator, copies and device queries. CUDA errors become tinygpt::Error naming
// the call that failed.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include "kernels/cuda/runtime.cuh"

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
// cudaMalloc happens at all.
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
    if (auto it = free_.find(size); it != free_.end()) {
      ptr = it->second;
      free_.erase(it);
    } else {
      ptr = device_malloc(bytes, size);
      cached_ += size;
    }
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
    free_.emplace(it->second, ptr);
    in_use_.erase(it);
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
      throw Error(fmt::format("out of GPU memory: requested {:.1f} MiB ({} bytes), {:.1f} MiB free of {:.1f} MiB; "
                              "{:.1f} MiB in use by tensors. Lower --batch-size or the model size",
                              double(bytes) / 1048576.0, bytes, double(free_bytes) / 1048576.0,
                              double(total) / 1048576.0, double(allocated_) / 1048576.0));
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

void memset_zero(void* ptr, size_t bytes) { check(cudaMemsetAsync(ptr, 0, bytes), "cudaMemsetAsync"); }

namespace {
std::atomic<int64_t> syncs{0};
}

int64_t host_syncs() { return syncs.load(); }

void copy_to_device(void* dst, const void* src, size_t bytes) {
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpyAsync (host to device)");
}

void copy_to_host(void* dst, const void* src, size_t bytes) {
  ++syncs;
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (device to host)");
}

void copy_on_device(void* dst, const void* src, size_t bytes) {
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpyAsync (device to device)");
}

void synchronize() {
  ++syncs;
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

void set_device(int index) {
  const int n = device_count();
  if (index < 0 || index >= n) throw Error(fmt::format("GPU {} does not exist: {} visible", index, n));
  check(cudaSetDevice(index), "cudaSetDevice");
}

namespace {

struct Profile {
  struct Entry {
    double ms = 0;
    int64_t calls = 0;
  };
  std::mutex mutex;
  std::map<std::string, Entry> entries;
  ~Profile() {
    double total = 0;
    for (const auto& [name, e] : entries) total += e.ms;
    fmt::print(stderr, "TINYGPT_CUDA_PROFILE: GPU kernel time (each kernel synchronized alone)\n{:<28} {:>10} {:>10} {:>7}\n",
               "kernel", "calls", "ms", "share");
    for (const auto& [name, e] : entries) {
      fmt::print(stderr, "{:<28} {:>10} {:>10.1f} {:>6.1f}%\n", name, e.calls, e.ms, 100.0 * e.ms / std::max(total, 1e-9));
    }
  }
};

Profile& profile() {
  static Profile p;
  return p;
}

}  // namespace

bool profiling() {
  static const bool on = [] {
    const char* v = std::getenv("TINYGPT_CUDA_PROFILE");
    return v != nullptr && std::string(v) == "1";
  }();
  return on;
}

void profile_add(const char* kernel, double ms) {
  Profile& p = profile();
  std::lock_guard lock(p.mutex);
  Profile::Entry& e = p.entries[kernel];
  e.ms += ms;
  ++e.calls;
}

cublasHandle_t cublas() {
  static cublasHandle_t handle = [] {
    cublasHandle_t h = nullptr;
    check(cublasCreate(&h), "cublasCreate");
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

// Linked instead of the CUDA sources in a CPU-only build: every GPU request fails with a clear message.
#include "kernels/base.h"
#include "kernels/device.h"

namespace tinygpt::cuda {
namespace {

[[noreturn]] void unavailable() {
  throw Error("this tinygpt was built without CUDA (nvcc was not found at configure time); use --device cpu");
}

}  // namespace

int device_count() { return 0; }
bool built_with_cuda() { return false; }
const char* device_description() { return "no CUDA backend in this build"; }
int compute_capability() { return 0; }
bool flash_tensor_cores(AttentionMath, int64_t) { return false; }
void* malloc(size_t) { unavailable(); }
void free(void*) {}
void empty_cache() {}
MemoryStats memory_stats() { return {}; }
void reset_peak_memory() {}
size_t free_memory() { return 0; }
void memset_zero(void*, size_t) { unavailable(); }
void copy_to_device(void*, const void*, size_t) { unavailable(); }
void copy_to_host(void*, const void*, size_t) { unavailable(); }
void copy_on_device(void*, const void*, size_t) { unavailable(); }
void synchronize() {}
int64_t host_syncs() { return 0; }
void set_device(int) { unavailable(); }
Graph::Graph(Graph&&) noexcept {}
Graph& Graph::operator=(Graph&&) noexcept { return *this; }
Graph::~Graph() {}
void Graph::replay() const { unavailable(); }
void begin_capture() { unavailable(); }
Graph end_capture() { unavailable(); }
void abort_capture() {}
bool capturing() { return false; }
bool profiling() { return false; }
void profile_add(const char*, double) {}

}  // namespace tinygpt::cuda

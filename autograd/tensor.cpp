#include "autograd/tensor.h"

#include <fmt/ranges.h>

// Large host blocks are mapped from the system where there is mmap, except under AddressSanitizer, which checks the
// heap's blocks only.
#if defined(__SANITIZE_ADDRESS__)
#define TINYGPT_HOST_MMAP 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TINYGPT_HOST_MMAP 0
#endif
#endif
#if !defined(TINYGPT_HOST_MMAP) && defined(__unix__) || !defined(TINYGPT_HOST_MMAP) && defined(__APPLE__)
#define TINYGPT_HOST_MMAP 1
#include <sys/mman.h>
#endif
#if !defined(TINYGPT_HOST_MMAP)
#define TINYGPT_HOST_MMAP 0
#endif

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "autograd/autograd.h"
#include "kernels/device.h"
#include "kernels/env.h"
#include "kernels/kernels.h"

namespace tinygpt {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return 4;
    case DType::F64:
      return 8;
    case DType::I32:
      return 4;
    case DType::Bool:
      return 1;
    case DType::BF16:
      return 2;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "f32";
    case DType::F64:
      return "f64";
    case DType::I32:
      return "i32";
    case DType::Bool:
      return "bool";
    case DType::BF16:
      return "bf16";
  }
  return "?";
}

// --- Shape

Shape::Shape(std::initializer_list<int64_t> dims) : Shape(std::span<const int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const int64_t> dims) {
  if (dims.size() > size_t(kMaxDims)) {
    throw Error(fmt::format("shape: at most {} dimensions are supported, got {}", kMaxDims, dims.size()));
  }
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0) throw Error(fmt::format("shape: negative size {} in dimension {}", dims[i], i));
    dims_[i] = dims[i];
  }
  ndim_ = int(dims.size());
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) n *= dims_[size_t(i)];
  return n;
}

int Shape::normalize_dim(int d) const {
  const int nd = d < 0 ? d + ndim_ : d;
  if (nd < 0 || nd >= ndim_) throw Error(fmt::format("dimension {} is out of range for shape {}", d, str()));
  return nd;
}

std::array<int64_t, kMaxDims> Shape::padded() const {
  std::array<int64_t, kMaxDims> p;
  p.fill(1);
  for (int i = 0; i < ndim_; ++i) p[size_t(kMaxDims - ndim_ + i)] = dims_[size_t(i)];
  return p;
}

std::string Shape::str() const { return fmt::format("({})", fmt::join(begin(), end(), ", ")); }

bool Shape::operator==(const Shape& o) const { return ndim_ == o.ndim_ && std::equal(begin(), end(), o.begin()); }

void shape_error(const std::string& op, const std::string& what, const Shape& a, const Shape& b) {
  throw Error(fmt::format("{}: {}: shapes {} and {}", op, what, a.str(), b.str()));
}

// --- Storage and TensorImpl

namespace {

constexpr std::align_val_t kHostAlign{64};  // cache lines and AVX loads

/// Host memory for tensors. Blocks of 64 KiB and more are mapped from the system (mmap) and, when freed, kept by size
/// and handed out again, as the GPU's caching allocator does: a training step allocates blocks of the sizes the last
/// step freed, and reusing them saves fresh pages (each faults in on first touch) every step. The cache never lets
/// what it holds plus what is in use exceed the most ever in use at once, or kFloorBytes if that is more: a block of
/// a new size first unmaps cached blocks of other sizes, so a run's memory stays at its peak of live tensors (blocks
/// from glibc's heap, where large ones land once its mmap threshold has risen, held more: docs/RESULTS.md, "bf16
/// storage"). The floor is for a small live set cycling through more sizes than it holds at once, an evaluation's
/// forward passes before any training step: held to its peak, the cache unmapped and faulted in ~20 MB a pass, which
/// made the three-minute job's first evaluation twice as slow as the later ones.
/// Smaller blocks, and every block under AddressSanitizer (which checks heap blocks only) or with
/// TINYGPT_HOST_CACHE=0, go through operator new (bench_attention turns the cache off and replaces operator new to
/// count what each algorithm allocates).
class HostCache {
 public:
  void* allocate(size_t bytes) {
    if (enabled_ && bytes >= kMinBytes) {
      std::lock_guard lock(mutex_);
      const size_t peak_before = peak_in_use_;
      in_use_ += bytes;
      peak_in_use_ = std::max(peak_in_use_, in_use_);
      if (auto it = free_.find(bytes); it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_ -= bytes;
        return p;
      }
      // A new block: make room by giving back cached blocks of other sizes.
      const size_t limit = std::max(peak_in_use_, kFloorBytes);
      for (auto it = free_.begin(); it != free_.end() && in_use_ + cached_ > limit;) {
        auto& [size, blocks] = *it;
        while (!blocks.empty() && in_use_ + cached_ > limit) {
          unmap(blocks.back(), size);
          blocks.pop_back();
          cached_ -= size;
        }
        it = blocks.empty() ? free_.erase(it) : std::next(it);
      }
      void* p = map(bytes);
      if (p == nullptr) {  // give back every cached block, then once more; a second failure goes to the caller
        release_locked();
        p = map(bytes);
      }
      if (p == nullptr) {  // as if never asked for
        in_use_ -= bytes;
        peak_in_use_ = peak_before;
        throw std::bad_alloc();
      }
      return p;
    }
    try {
      return ::operator new(bytes, kHostAlign);
    } catch (const std::bad_alloc&) {
      release();  // then once more; a second failure goes to the caller
      return ::operator new(bytes, kHostAlign);
    }
  }

  void deallocate(void* p, size_t bytes) {
    if (enabled_ && bytes >= kMinBytes) {
      std::lock_guard lock(mutex_);
      in_use_ -= bytes;
      free_[bytes].push_back(p);  // in use + cached is unchanged, so still within the peak
      cached_ += bytes;
      return;
    }
    ::operator delete(p, kHostAlign);
  }

  void release() {
    std::lock_guard lock(mutex_);
    release_locked();
  }

 private:
  void release_locked() {
    for (auto& [bytes, blocks] : free_) {
      for (void* p : blocks) unmap(p, bytes);
    }
    free_.clear();
    cached_ = 0;
  }

  /// A fresh block (page-aligned, so kHostAlign-aligned), or null when the system has no memory for it.
  static void* map(size_t bytes) {
#if TINYGPT_HOST_MMAP
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    // Transparent huge pages where the system grants them on request ("madvise", a common default): the big
    // activations are walked with strides (a head's rows of a fused qkv) and streamed by the GEMMs, and 2 MiB pages
    // spare their TLB misses (a faster 6-layer bf16 step, the same peak resident set: docs/RESULTS.md, "bf16 storage").
    if (bytes >= kHugeBytes) madvise(p, bytes, MADV_HUGEPAGE);
    return p;
#else
    return ::operator new(bytes, kHostAlign, std::nothrow);
#endif
  }
  static void unmap(void* p, size_t bytes) {
#if TINYGPT_HOST_MMAP
    munmap(p, bytes);
#else
    (void)bytes;
    ::operator delete(p, kHostAlign);
#endif
  }

  static constexpr size_t kMinBytes = size_t(1) << 16;
  static constexpr size_t kHugeBytes = size_t(2) << 20;
  static constexpr size_t kFloorBytes = size_t(64) << 20;
  const bool enabled_ = [] { return !TINYGPT_ENV_IS("TINYGPT_HOST_CACHE", "0"); }();
  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;  // by size in bytes
  size_t cached_ = 0, in_use_ = 0, peak_in_use_ = 0;
};

HostCache& host_cache() {
  static auto* cache = new HostCache;  // never destroyed: tensors in static objects free into it at exit
  return *cache;
}

}  // namespace

Storage::Storage(size_t nbytes, Device dev) : bytes(nbytes), device(dev) {
  if (device == Device::CPU) {
    try {
      data = host_cache().allocate(std::max<size_t>(nbytes, 1));
    } catch (const std::bad_alloc&) {
      throw Error(fmt::format("out of host memory allocating {} bytes", nbytes));
    }
  } else {
    data = cuda::malloc(std::max<size_t>(nbytes, 1));
  }
}

Storage::Storage(std::shared_ptr<Storage> b, size_t offset, size_t nbytes)
    : data(static_cast<char*>(b->data) + offset), bytes(nbytes), device(b->device), base(std::move(b)) {}

Storage::~Storage() {
  if (base) return;  // a slice: the base frees the memory
  if (device == Device::CPU) {
    host_cache().deallocate(data, std::max<size_t>(bytes, 1));
  } else {
    cuda::free(data);
  }
}

std::atomic<int64_t> TensorImpl::live_count{0};

TensorImpl::TensorImpl(std::shared_ptr<Storage> st, Shape sh, DType dt) : storage(std::move(st)), shape(sh), dtype(dt) {
  ++live_count;
}

TensorImpl::~TensorImpl() { --live_count; }

// --- Tensor

TensorImpl& Tensor::impl() const {
  if (!impl_) throw Error("use of an undefined tensor");
  return *impl_;
}

namespace {
std::atomic<int64_t> float_reads{0};

/// Counts a read of floating-point data to the host (see Tensor::float_host_reads).
void count_read(DType dtype) {
  if (dtype == DType::F32 || dtype == DType::F64 || dtype == DType::BF16) ++float_reads;
}
}  // namespace

int64_t Tensor::float_host_reads() { return float_reads.load(); }

Tensor Tensor::read_to_host() const {
  count_read(dtype());
  return device() == Device::CPU ? *this : copy_to(Device::CPU);
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  const Tensor host = read_to_host();
  const T* p = host.data<T>();
  return std::vector<T>(p, p + numel());
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<uint8_t> Tensor::to_vector<uint8_t>() const;
template std::vector<bf16> Tensor::to_vector<bf16>() const;

double Tensor::item() const {
  if (numel() != 1) throw Error(fmt::format("item: tensor has {} elements (shape {}), not 1", numel(), shape().str()));
  const Tensor host = read_to_host();
  switch (dtype()) {
    case DType::F32:
      return *host.data<float>();
    case DType::F64:
      return *host.data<double>();
    case DType::I32:
      return *host.data<int32_t>();
    case DType::Bool:
      return *host.data<uint8_t>() != 0;
    case DType::BF16:
      return float(*host.data<bf16>());
  }
  throw Error("item: unknown dtype");
}

Tensor Tensor::to(Device dev) const {
  if (dev == device()) return *this;
  if (dev == Device::CPU) count_read(dtype());
  return copy_to(dev);
}

namespace {
/// A host copy of `bytes` bytes at data (Storage::host_copy).
std::shared_ptr<const Storage> host_snapshot(const void* data, size_t bytes) {
  auto copy = std::make_shared<Storage>(bytes, Device::CPU);
  if (bytes) std::memcpy(copy->data, data, bytes);
  return copy;
}
}  // namespace

Tensor Tensor::copy_to(Device dev) const {
  Tensor out = empty(shape(), dtype(), dev);
  const size_t bytes = size_t(numel()) * dtype_size(dtype());
  if (dev == Device::CUDA) {
    cuda::copy_to_device(out.raw_data(), raw_data(), bytes);
    if (dtype() == DType::I32) out.impl().storage->host_copy = host_snapshot(raw_data(), bytes);
  } else if (const int32_t* ids = host_copy()) {
    if (bytes) std::memcpy(out.raw_data(), ids, bytes);
  } else {
    cuda::copy_to_host(out.raw_data(), raw_data(), bytes);
  }
  return out;
}

const int32_t* Tensor::host_copy() const {
  const auto& copy = impl().storage->host_copy;
  return copy ? static_cast<const int32_t*>(copy->data) : nullptr;
}

void Tensor::move_to_(Device dev) {
  if (dev == device()) return;
  if (impl().storage->base) {
    throw Error("move_to_: this tensor is a slice of a buffer (packed parameters?); move it before packing");
  }
  impl().storage = to(dev).impl().storage;
  impl().grad.reset();
}

Tensor Tensor::to(DType dt) const {
  if (dt == dtype()) return *this;
  if (device() != Device::CPU) {
    Tensor out = empty(shape(), dt, device());
    if (dtype() == DType::F32 && dt == DType::BF16) {
      launch(kernels::round_to_bf16, device(), out.data<bf16>(), data<float>(), numel());
    } else if (dtype() == DType::BF16 && dt == DType::F32) {
      launch(kernels::widen_bf16, device(), out.data<float>(), data<bf16>(), numel());
    } else {
      throw Error(
          fmt::format("to(dtype): {} -> {} converts on the CPU only (f32 <-> bf16 on the GPU too); move the "
                      "tensor there first",
                      dtype_name(dtype()), dtype_name(dt)));
    }
    return out;
  }
  Tensor out = empty(shape(), dt);
  const int64_t n = numel();
  if (dtype() == DType::F32 && dt == DType::BF16) {
    launch(kernels::round_to_bf16, Device::CPU, out.data<bf16>(), data<float>(), n);
    return out;
  }
  if (dtype() == DType::BF16 && dt == DType::F32) {
    launch(kernels::widen_bf16, Device::CPU, out.data<float>(), data<bf16>(), n);
    return out;
  }
  auto convert = [&]<class From>(const From* src) {
    switch (dt) {
      case DType::F32:
        std::transform(src, src + n, out.data<float>(), [](From x) { return float(x); });
        return;
      case DType::F64:
        std::transform(src, src + n, out.data<double>(), [](From x) { return double(x); });
        return;
      case DType::I32:
        std::transform(src, src + n, out.data<int32_t>(), [](From x) { return int32_t(x); });
        return;
      case DType::Bool:
        std::transform(src, src + n, out.data<uint8_t>(), [](From x) { return uint8_t(x != From(0)); });
        return;
      case DType::BF16:
        std::transform(src, src + n, out.data<bf16>(), [](From x) { return bf16(float(x)); });
        return;
    }
  };
  switch (dtype()) {
    case DType::F32:
      convert(data<float>());
      break;
    case DType::F64:
      convert(data<double>());
      break;
    case DType::I32:
      convert(data<int32_t>());
      break;
    case DType::Bool:
      convert(data<uint8_t>());
      break;
    case DType::BF16: {
      std::vector<float> wide(static_cast<size_t>(n));
      std::copy_n(data<bf16>(), n, wide.begin());
      convert(wide.data());
      break;
    }
  }
  return out;
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), dtype(), device());
  const size_t bytes = size_t(numel()) * dtype_size(dtype());
  if (device() == Device::CPU) {
    std::memcpy(out.raw_data(), raw_data(), bytes);
  } else {
    cuda::copy_on_device(out.raw_data(), raw_data(), bytes);
  }
  return out;
}

void Tensor::copy_(const Tensor& src) {
  if (!(src.shape() == shape()) || src.dtype() != dtype()) {
    throw Error(fmt::format("copy_: source {} {} does not match destination {} {}", dtype_name(src.dtype()),
                            src.shape().str(), dtype_name(dtype()), shape().str()));
  }
  const size_t bytes = size_t(numel()) * dtype_size(dtype());
  Storage& storage = *impl().storage;
  // Ids uploaded over a whole device tensor keep their host copy, as Tensor::to's do; any other write drops it.
  const bool upload = device() == Device::CUDA && src.device() == Device::CPU && dtype() == DType::I32 &&
                      !storage.base && bytes == storage.bytes;
  storage.host_copy = upload ? host_snapshot(src.raw_data(), bytes) : nullptr;
  if (device() == Device::CPU && src.device() == Device::CPU) {
    std::memcpy(raw_data(), src.raw_data(), bytes);
  } else if (device() == Device::CPU) {
    cuda::copy_to_host(raw_data(), src.raw_data(), bytes);
  } else if (src.device() == Device::CPU) {
    cuda::copy_to_device(raw_data(), src.raw_data(), bytes);
  } else {
    cuda::copy_on_device(raw_data(), src.raw_data(), bytes);
  }
}

Tensor& Tensor::requires_grad_(bool on) {
  if (on && !is_leaf()) throw Error("requires_grad_: only leaf tensors can be marked (use detach() first)");
  if (on && dtype() != DType::F32 && dtype() != DType::F64 && dtype() != DType::BF16) {
    throw Error(
        fmt::format("requires_grad_: only floating tensors have gradients, this one is {}", dtype_name(dtype())));
  }
  impl().requires_grad = on;
  return *this;
}

Tensor Tensor::grad() const { return Tensor(impl().grad); }

void Tensor::set_grad(const Tensor& g) {
  if (g.defined() && !(g.shape() == shape()))
    shape_error("set_grad", "gradient must match the tensor", g.shape(), shape());
  impl().grad = g.impl_ptr();
}

void Tensor::zero_grad() { impl().grad.reset(); }

void Tensor::backward(bool retain_graph) const {
  if (numel() != 1) {
    throw Error(fmt::format("backward: an implicit gradient needs a one-element tensor, got shape {}; pass a gradient",
                            shape().str()));
  }
  backward(ones(shape(), dtype(), device()), retain_graph);
}

void Tensor::backward(const Tensor& grad, bool retain_graph) const { run_backward(*this, grad, retain_graph); }

Tensor Tensor::detach() const { return Tensor(std::make_shared<TensorImpl>(impl().storage, shape(), dtype())); }

const char* Tensor::op_name() const { return impl().grad_fn ? impl().grad_fn->name : "leaf"; }

// --- creation

Tensor empty(const Shape& shape, DType dtype, Device device) {
  auto storage = std::make_shared<Storage>(size_t(shape.numel()) * dtype_size(dtype), device);
  return Tensor(std::make_shared<TensorImpl>(std::move(storage), shape, dtype));
}

Tensor buffer_slice(const Tensor& buffer, int64_t offset, const Shape& shape) {
  if (offset < 0 || offset + shape.numel() > buffer.numel()) {
    throw Error(fmt::format("buffer_slice: elements [{}, {}) are outside a buffer of {}", offset,
                            offset + shape.numel(), buffer.numel()));
  }
  const size_t elem = dtype_size(buffer.dtype());
  auto storage = std::make_shared<Storage>(buffer.impl().storage, size_t(offset) * elem, size_t(shape.numel()) * elem);
  return Tensor(std::make_shared<TensorImpl>(std::move(storage), shape, buffer.dtype()));
}

void Tensor::rebind_(const Tensor& slice) {
  if (!(slice.shape() == shape()) || slice.dtype() != dtype() || slice.device() != device()) {
    throw Error(fmt::format("rebind_: the slice is {} {} on {}, the tensor {} {} on {}", dtype_name(slice.dtype()),
                            slice.shape().str(), device_name(slice.device()), dtype_name(dtype()), shape().str(),
                            device_name(device())));
  }
  Tensor(slice).copy_(*this);
  impl().storage = slice.impl().storage;
}

void Tensor::convert_(DType dtype) {
  if (!is_leaf() || requires_grad()) throw Error("convert_: only leaves that need no gradient convert in place");
  if (dtype == this->dtype()) return;
  const Tensor converted = to(dtype);
  impl().storage = converted.impl().storage;
  impl().dtype = dtype;
  impl().grad.reset();
  impl().bf16_copy.reset();
}

void Tensor::zero_() {
  const size_t bytes = size_t(numel()) * dtype_size(dtype());
  if (device() == Device::CPU) {
    std::memset(raw_data(), 0, bytes);
  } else {
    cuda::memset_zero(raw_data(), bytes);
  }
}

Tensor zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero_();
  return t;
}

Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.dtype(), t.device()); }

namespace {

/// Fills a new host tensor element by element with gen(i), then moves it to `device`.
template <class F>
Tensor generate(const Shape& shape, DType dtype, Device device, const char* op, F gen) {
  Tensor t = empty(shape, dtype);
  const int64_t n = shape.numel();
  switch (dtype) {
    case DType::F32:
      for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = float(gen(i));
      break;
    case DType::F64:
      for (int64_t i = 0; i < n; ++i) t.data<double>()[i] = gen(i);
      break;
    case DType::I32:
      for (int64_t i = 0; i < n; ++i) t.data<int32_t>()[i] = int32_t(gen(i));
      break;
    case DType::Bool:
      for (int64_t i = 0; i < n; ++i) t.data<uint8_t>()[i] = gen(i) != 0.0;
      break;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) t.data<bf16>()[i] = bf16(float(gen(i)));
      break;
  }
  return t.to(device);
}

}  // namespace

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  if (device == Device::CUDA && dtype == DType::F32) {  // filled where it lives: no upload, so a CUDA graph can hold it
    Tensor t = empty(shape, dtype, device);
    launch(kernels::fill<float>, device, t.data<float>(), float(value), t.numel());
    return t;
  }
  return generate(shape, dtype, device, "full", [value](int64_t) { return value; });
}

Tensor ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }

Tensor arange(int64_t n, DType dtype, Device device) {
  return generate(Shape{n}, dtype, device, "arange", [](int64_t i) { return double(i); });
}

Tensor randn(const Shape& shape, Generator& gen, DType dtype, Device device, double stddev) {
  if (gen.draws_nothing()) return zeros(shape, dtype, device);
  return generate(shape, dtype, device, "randn", [&](int64_t) { return stddev * gen.normal(); });
}

Tensor rand(const Shape& shape, Generator& gen, DType dtype, Device device, double low, double high) {
  if (gen.draws_nothing()) return zeros(shape, dtype, device);
  return generate(shape, dtype, device, "rand", [&](int64_t) { return low + (high - low) * gen.uniform(); });
}

namespace {

template <class T>
Tensor from_values(const std::vector<T>& values, const Shape& shape, Device device) {
  if (int64_t(values.size()) != shape.numel()) {
    throw Error(fmt::format("from_vector: {} values do not fill shape {} ({} elements)", values.size(), shape.str(),
                            shape.numel()));
  }
  Tensor t = empty(shape, dtype_of<T>());
  std::copy(values.begin(), values.end(), t.data<T>());
  return t.to(device);
}

}  // namespace

Tensor from_vector(const std::vector<float>& v, const Shape& s, Device d) { return from_values(v, s, d); }
Tensor from_vector(const std::vector<double>& v, const Shape& s, Device d) { return from_values(v, s, d); }
Tensor from_vector(const std::vector<int32_t>& v, const Shape& s, Device d) { return from_values(v, s, d); }
Tensor from_vector(const std::vector<bf16>& v, const Shape& s, Device d) { return from_values(v, s, d); }
Tensor from_vector(const std::vector<uint8_t>& v, const Shape& s, Device d) {
  std::vector<uint8_t> bits(v.size());
  std::transform(v.begin(), v.end(), bits.begin(), [](uint8_t x) { return uint8_t(x != 0); });
  return from_values(bits, s, d);
}

}  // namespace tinygpt

// Tensor: a value-semantic handle over shared, contiguous, row-major storage, with reverse-mode autograd.
// Copying a Tensor copies the handle (both see the same data and gradient), as in PyTorch.
#pragma once

#include <fmt/format.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "../kernels/base.h"
#include "../kernels/bf16.h"
#include "../kernels/geometry.h"
#include "random.h"

namespace tinygpt {

/// f32 everywhere; f64 on the CPU (gradient checks); bf16 (kernels/bf16.h) as a storage type, computed in f32 by the
/// ops that take it (kernels/kernel_list.h lists them); i32 for token ids; bool (one byte, 0 or 1) for masks.
enum class DType : uint8_t { F32, F64, I32, Bool, BF16 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);

/// A shape of up to kMaxDims dimensions.
class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::span<const int64_t> dims);

  int ndim() const { return ndim_; }
  int64_t numel() const;
  /// Size of dimension d; negative d counts from the end.
  int64_t operator[](int d) const { return dims_[size_t(normalize_dim(d))]; }
  /// Maps a possibly negative dimension to [0, ndim), or throws naming the shape.
  int normalize_dim(int d) const;
  const int64_t* begin() const { return dims_.data(); }
  const int64_t* end() const { return dims_.data() + ndim_; }
  std::vector<int64_t> vec() const { return {begin(), end()}; }
  /// The shape padded on the left with ones to kMaxDims dims.
  std::array<int64_t, kMaxDims> padded() const;
  std::string str() const;
  bool operator==(const Shape& o) const;

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int ndim_ = 0;
};

/// Throws Error("<op>: <what>: shapes <a> and <b>").
[[noreturn]] void shape_error(const std::string& op, const std::string& what, const Shape& a, const Shape& b);

/// Device or host memory, freed when the last tensor using it goes; or a slice of another Storage (`base`), which
/// the slice keeps alive and never frees itself.
struct Storage {
  Storage(size_t bytes, Device device);
  /// Bytes [offset, offset + bytes) of `base`.
  Storage(std::shared_ptr<Storage> base, size_t offset, size_t bytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data = nullptr;
  size_t bytes = 0;
  Device device = Device::CPU;
  std::shared_ptr<Storage> base;  // set for a slice
  /// Device ids (i32) uploaded from the host with Tensor::to keep a host copy, so reading them back (checks, the
  /// embedding's sort) needs no host synchronisation; copy_ of host ids over the whole storage replaces it, any other
  /// copy_ into the storage drops it.
  std::shared_ptr<const Storage> host_copy;
};

struct Node;

struct TensorImpl {
  TensorImpl(std::shared_ptr<Storage> storage, Shape shape, DType dtype);
  ~TensorImpl();

  std::shared_ptr<Storage> storage;
  Shape shape;
  DType dtype;
  bool requires_grad = false;
  bool from_op = false;              // produced by a recorded op: not a leaf, even once its graph is freed
  std::shared_ptr<TensorImpl> grad;  // accumulated gradient of a leaf
  std::shared_ptr<Node> grad_fn;     // the op that produced this tensor; null for leaves
  bool unwritten = false;            // a gradient slot handed out uninitialized (Node::writes_unwritten)
  /// A parameter's bf16 working copy (bf16 storage: autograd/ops.h working_copy), written where the parameter is
  /// (write_bf16_copy, FlatParameters::write_bf16_copies after an optimizer step).
  std::shared_ptr<TensorImpl> bf16_copy;

  /// Number of live TensorImpl objects: tests use it to prove the graph is freed.
  static std::atomic<int64_t> live_count;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  int ndim() const { return shape().ndim(); }
  int64_t size(int d) const { return shape()[d]; }
  int64_t numel() const { return shape().numel(); }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device; }

  /// Typed pointer to the first element; throws when T does not match the dtype.
  template <class T>
  T* data();
  template <class T>
  const T* data() const;
  void* raw_data() const { return impl().storage->data; }

  /// Copies to a std::vector<T> on the host (T must match the dtype).
  template <class T>
  std::vector<T> to_vector() const;
  /// The single value of a one-element tensor, as double.
  double item() const;

  Tensor to(Device device) const;
  /// How many times floating-point data has been read to the host: item() and to_vector() calls whatever the
  /// tensor's device, to(Device::CPU) of a GPU tensor. On the GPU each waits for it; tests count them on the CPU to
  /// hold a training step to one.
  static int64_t float_host_reads();
  /// The host copy of an i32 tensor uploaded to the GPU with to(Device::CUDA), or null (see Storage::host_copy).
  const int32_t* host_copy() const;
  /// A copy converted to `dtype` (on the same device): to bf16 rounds to nearest even (f64 through f32), from bf16
  /// is exact. On the GPU only f32 <-> bf16 converts (a kernel); other pairs convert on the CPU.
  Tensor to(DType dtype) const;
  /// Moves this tensor's data to `device` in place, so every handle of it (a module's parameter lists, the
  /// optimizer) sees the moved data; the gradient is dropped. For leaves outside any graph, and not for a slice of
  /// a buffer (buffer_slice; it throws): move the buffer's tensors before packing them.
  void move_to_(Device device);
  /// Makes this tensor's data the slice `slice` (same shape, dtype and device), in place, after copying its
  /// values there: every handle of it sees the slice from now on. For packing leaves into one buffer.
  void rebind_(const Tensor& slice);
  /// Converts this leaf's data to `dtype` in place (as to(dtype) rounds), so every handle of it sees the new storage;
  /// its working copy is dropped. For a leaf that needs no gradient: a frozen weight kept only in bf16.
  void convert_(DType dtype);
  /// A new tensor with its own copy of the data, outside the graph.
  Tensor clone() const;
  /// Overwrites this tensor's data with src's (same shape and dtype, any device), in place and outside the
  /// graph: for loading weights and optimizer state.
  void copy_(const Tensor& src);
  /// Sets every element to zero, in place and outside the graph.
  void zero_();

  // --- autograd
  bool requires_grad() const { return impl().requires_grad; }
  /// Marks a leaf as needing a gradient; returns *this for chaining.
  Tensor& requires_grad_(bool on = true);
  bool is_leaf() const { return !impl().from_op; }
  /// The accumulated gradient (undefined until a backward pass reaches this leaf).
  Tensor grad() const;
  void set_grad(const Tensor& g);
  /// Drops the gradient (the next backward pass starts from zero).
  void zero_grad();
  /// Backpropagates from this one-element tensor with gradient 1.
  void backward(bool retain_graph = false) const;
  /// Backpropagates with an explicit gradient of this tensor's shape.
  void backward(const Tensor& grad, bool retain_graph = false) const;
  /// Same data, no history: gradients stop here.
  Tensor detach() const;
  /// Name of the op that produced this tensor, or "leaf".
  const char* op_name() const;

  TensorImpl& impl() const;
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

 private:
  /// A copy on the other device (to() without its counting).
  Tensor copy_to(Device device) const;
  /// This tensor's data on the host, for item() and to_vector(), counted as a read (float_host_reads).
  Tensor read_to_host() const;

  std::shared_ptr<TensorImpl> impl_;
};

// --- creation
Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU);
Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU);
Tensor ones(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU);
Tensor full(const Shape& shape, double value, DType dtype = DType::F32, Device device = Device::CPU);
Tensor zeros_like(const Tensor& t);
/// A contiguous tensor of `shape` over elements [offset, offset + shape.numel()) of the contiguous tensor `buffer`,
/// sharing its memory (same dtype and device, no history): a writer to either sees the other change.
Tensor buffer_slice(const Tensor& buffer, int64_t offset, const Shape& shape);
/// 0, 1, ..., n-1
Tensor arange(int64_t n, DType dtype = DType::F32, Device device = Device::CPU);
/// Standard normal samples times `stddev`, from `gen` (default: the global generator).
Tensor randn(const Shape& shape, Generator& gen = default_generator(), DType dtype = DType::F32,
             Device device = Device::CPU, double stddev = 1.0);
/// Uniform samples in [low, high).
Tensor rand(const Shape& shape, Generator& gen = default_generator(), DType dtype = DType::F32,
            Device device = Device::CPU, double low = 0.0, double high = 1.0);
Tensor from_vector(const std::vector<float>& values, const Shape& shape, Device device = Device::CPU);
Tensor from_vector(const std::vector<double>& values, const Shape& shape, Device device = Device::CPU);
Tensor from_vector(const std::vector<int32_t>& values, const Shape& shape, Device device = Device::CPU);
/// A bool tensor (0 = false, anything else = true).
Tensor from_vector(const std::vector<uint8_t>& values, const Shape& shape, Device device = Device::CPU);
Tensor from_vector(const std::vector<bf16>& values, const Shape& shape, Device device = Device::CPU);

/// Calls f.template operator()<T>() with T = float or double for the tensor's dtype; throws naming `op`
/// for any other dtype.
template <class F>
decltype(auto) dispatch_float(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::F32:
      return f.template operator()<float>();
    case DType::F64:
      return f.template operator()<double>();
    case DType::BF16:
      throw Error(fmt::format(
          "{}: dtype bf16 is not supported by this op (it takes f32 or f64: convert with .to(DType::F32))", op));
    default:
      throw Error(fmt::format("{}: dtype {} is not supported here (use f32 or f64)", op, dtype_name(dtype)));
  }
}

/// dispatch_float, with T = bf16 too: for the ops whose kernels take bf16 storage (computing in f32 inside). The
/// kernel tables refuse at compile time an op that dispatches bf16 to a kernel without it (kernels/kernels.h).
template <class F>
decltype(auto) dispatch_storage(DType dtype, const char* op, F&& f) {
  if (dtype == DType::BF16) return f.template operator()<bf16>();
  return dispatch_float(dtype, op, std::forward<F>(f));
}

template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return DType::F32;
  else if constexpr (std::is_same_v<T, double>)
    return DType::F64;
  else if constexpr (std::is_same_v<T, int32_t>)
    return DType::I32;
  else if constexpr (std::is_same_v<T, uint8_t>)
    return DType::Bool;
  else if constexpr (std::is_same_v<T, bf16>)
    return DType::BF16;
  else
    static_assert(sizeof(T) == 0, "no DType for this C++ type");
}

template <class T>
T* Tensor::data() {
  if (dtype() != dtype_of<T>()) {
    throw Error(fmt::format("data: tensor is {}, not {}", dtype_name(dtype()), dtype_name(dtype_of<T>())));
  }
  return static_cast<T*>(raw_data());
}

template <class T>
const T* Tensor::data() const {
  return const_cast<Tensor*>(this)->data<T>();
}

}  // namespace tinygpt

template <>
struct fmt::formatter<tinygpt::Shape> : fmt::formatter<std::string> {
  auto format(const tinygpt::Shape& s, fmt::format_context& ctx) const {
    return fmt::formatter<std::string>::format(s.str(), ctx);
  }
};

/// Prints like PyTorch: tensor([[1.0000, 2.0000], ...], dtype=f32), eliding the middle of large tensors.
template <>
struct fmt::formatter<tinygpt::Tensor> : fmt::formatter<std::string> {
  auto format(const tinygpt::Tensor& t, fmt::format_context& ctx) const -> fmt::format_context::iterator;
};

// Printing a tensor (fmt::formatter<Tensor>): PyTorch's layout, the edges of long dimensions with "..." between.
#include <fmt/format.h>

#include <string>
#include <type_traits>

#include "autograd/tensor.h"

namespace {

constexpr int64_t kEdgeItems = 3;

template <class T>
void format_dim(std::string& out, const T* p, const tinygpt::Shape& shape, int dim, int64_t offset, int64_t stride) {
  const int64_t n = shape[dim];
  const int64_t inner = stride / n;
  const bool elide = n > 2 * kEdgeItems;
  out += '[';
  for (int64_t i = 0; i < n; ++i) {
    if (elide && i == kEdgeItems) {
      out += dim == shape.ndim() - 1 ? "..., " : "...,\n";
      i = n - kEdgeItems;
    }
    if (dim == shape.ndim() - 1) {
      if constexpr (std::is_same_v<T, uint8_t>) {
        out += p[offset + i] ? "true" : "false";
      } else if constexpr (std::is_integral_v<T>) {
        out += fmt::format("{}", p[offset + i]);
      } else {
        out += fmt::format("{:.4f}", double(float(p[offset + i])));
      }
    } else {
      format_dim(out, p, shape, dim + 1, offset + i * inner, inner);
    }
    if (i + 1 < n) out += dim == shape.ndim() - 1 ? ", " : ",\n";
  }
  out += ']';
}

}  // namespace

auto fmt::formatter<tinygpt::Tensor>::format(const tinygpt::Tensor& t, fmt::format_context& ctx) const
    -> fmt::format_context::iterator {
  using tinygpt::DType;
  if (!t.defined()) return fmt::formatter<std::string>::format("tensor(undefined)", ctx);
  std::string s = "tensor(";
  const tinygpt::Tensor host = t.to(tinygpt::Device::CPU);
  auto body = [&]<class T>(const T* p) {
    if (t.numel() == 0) {
      s += "[]";
    } else if (t.ndim() == 0) {
      if constexpr (std::is_integral_v<T>) {
        s += fmt::format("{}", int64_t(p[0]));
      } else {
        s += fmt::format("{:.4f}", double(float(p[0])));
      }
    } else {
      format_dim(s, p, t.shape(), 0, 0, t.numel());
    }
  };
  switch (t.dtype()) {
    case DType::F32:
      body(host.data<float>());
      break;
    case DType::F64:
      body(host.data<double>());
      break;
    case DType::I32:
      body(host.data<int32_t>());
      break;
    case DType::Bool:
      body(host.data<uint8_t>());
      break;
    case DType::BF16:
      body(host.data<tinygpt::bf16>());
      break;
  }
  s += fmt::format(", dtype={}", tinygpt::dtype_name(t.dtype()));
  if (t.device() != tinygpt::Device::CPU) s += ", device=cuda";
  if (t.requires_grad()) s += ", requires_grad";
  s += ')';
  return fmt::formatter<std::string>::format(s, ctx);
}

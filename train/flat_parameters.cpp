#include "train/flat_parameters.h"

#include <fmt/format.h>

#include "kernels/kernels.h"

namespace tinygpt {

namespace {

constexpr int64_t kAlignBytes = 64;

}  // namespace

FlatParameters::FlatParameters(std::vector<std::pair<std::string, Tensor>> params) {
  if (params.empty()) throw Error("FlatParameters: no parameters");
  const DType dtype = params[0].second.dtype();
  const Device device = params[0].second.device();
  const int64_t align = kAlignBytes / int64_t(dtype_size(dtype));
  int64_t n = 0;
  for (auto& [name, p] : params) {
    if (p.dtype() != dtype || p.device() != device) {
      throw Error(
          fmt::format("FlatParameters: '{}' is {} on {}, '{}' {} on {}: one buffer holds one dtype on one "
                      "device",
                      name, dtype_name(p.dtype()), device_name(p.device()), params[0].first, dtype_name(dtype),
                      device_name(device)));
    }
    slots_.push_back({name, p, n});
    n += (p.numel() + align - 1) / align * align;
  }
  values_ = zeros({n}, dtype, device);
  grads_ = zeros({n}, dtype, device);
  for (Slot& s : slots_) s.param.rebind_(buffer_slice(values_, s.offset, s.param.shape()));
  zero_grad();
}

void FlatParameters::zero_grad() {
  grads_.zero_();
  for (Slot& s : slots_) s.param.set_grad(buffer_slice(grads_, s.offset, s.param.shape()));
}

void FlatParameters::write_bf16_copies() {
  if (!values16_.defined()) {
    values16_ = zeros(values_.shape(), DType::BF16, values_.device());
    for (const Slot& s : slots_)
      s.param.impl().bf16_copy = buffer_slice(values16_, s.offset, s.param.shape()).impl_ptr();
  }
  launch(kernels::round_to_bf16, values_.device(), values16_.data<bf16>(), values_.data<float>(), values_.numel());
}

std::pair<Tensor, std::vector<Tensor>> FlatParameters::make_like() const {
  Tensor buffer = zeros(values_.shape(), values_.dtype(), values_.device());
  std::vector<Tensor> views;
  for (const Slot& s : slots_) views.push_back(buffer_slice(buffer, s.offset, s.param.shape()));
  return {buffer, views};
}

}  // namespace tinygpt

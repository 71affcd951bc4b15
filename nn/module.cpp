#include "nn/module.h"

namespace tinygpt::nn {

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out = params_;
  for (const auto& [prefix, child] : children_) {
    for (auto& [name, t] : child->named_parameters()) out.emplace_back(prefix + "." + name, t);
  }
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const Tensor& t : parameters()) n += t.numel();
  return n;
}

void Module::zero_grad() {
  for (Tensor& t : parameters()) t.zero_grad();
}

void Module::to(Device device) {
  for (Tensor& t : parameters()) t.move_to_(device);
}

Device Module::device() const {
  const auto params = parameters();
  return params.empty() ? Device::CPU : params.front().device();
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

Tensor Module::register_parameter(std::string name, Tensor t) {
  t.requires_grad_(true);
  params_.emplace_back(std::move(name), t);
  return t;
}

void Module::set_numerics(const Numerics& numerics) {
  numerics_ = numerics;
  for (auto& [name, child] : children_) child->set_numerics(numerics);
  if (numerics.bf16_storage) write_bf16_copies();
}

void Module::write_bf16_copies() {
  for (auto& [name, p] : params_) {
    if (p.dtype() == DType::F32) write_bf16_copy(p);
  }
  for (auto& [name, child] : children_) child->write_bf16_copies();
}

void Module::register_module(std::string name, Module& child) { children_.emplace_back(std::move(name), &child); }

}  // namespace tinygpt::nn

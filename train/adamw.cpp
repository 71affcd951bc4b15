#include "train/adamw.h"

#include "autograd/autograd.h"

namespace tinygpt {

AdamW::AdamW(std::vector<std::pair<std::string, Tensor>> params, AdamWConfig config) : config_(config) {
  for (auto& [name, p] : params) {
    slots_.push_back({name, p, zeros_like(p), zeros_like(p), p.ndim() >= 2});
  }
}

void AdamW::step(double lr) {
  NoGradGuard no_grad;
  ++step_;
  for (Slot& s : slots_) {
    const Tensor g = s.param.grad();
    if (!g.defined()) continue;
    const float wd = s.decay ? float(config_.weight_decay) : 0.0f;
    dispatch_float(s.param.dtype(), "adamw", [&]<class T>() {
      launch(kernels::adamw_update<T>, s.param.device(), s.param.data<T>(), g.data<T>(), s.m.data<T>(), s.v.data<T>(),
             s.param.numel(), float(lr), float(config_.beta1), float(config_.beta2), float(config_.eps), wd, step_);
    });
  }
}

std::vector<std::pair<std::string, Tensor>> AdamW::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const Slot& s : slots_) {
    out.emplace_back(s.name + ".exp_avg", s.m);
    out.emplace_back(s.name + ".exp_avg_sq", s.v);
  }
  return out;
}

void AdamW::zero_grad() {
  for (Slot& s : slots_) s.param.zero_grad();
}

}  // namespace tinygpt

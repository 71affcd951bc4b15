#include "train/adamw.h"

#include <type_traits>

#include "autograd/autograd.h"
#include "autograd/ops.h"
#include "kernels/kernels.h"
#include "kernels/scalar_math.h"

namespace tinygpt {

AdamW::AdamW(std::vector<std::pair<std::string, Tensor>> params, AdamWConfig config) : config_(config) {
  for (auto& [name, p] : params) {
    slots_.push_back({name, p, zeros_like(p), zeros_like(p), p.ndim() >= 2});
  }
}

AdamW::AdamW(FlatParameters& flat, AdamWConfig config, const std::function<bool(const FlatParameters::Slot&)>& only)
    : flat_(&flat), config_(config) {
  auto [m, m_views] = flat.make_like();
  auto [v, v_views] = flat.make_like();
  flat_m_ = m, flat_v_ = v;
  const auto& params = flat.slots();
  bool joins = false;  // the previous slot was updated: a run may continue through this one
  for (size_t i = 0; i < params.size(); ++i) {
    if (only && !only(params[i])) {
      joins = false;
      continue;
    }
    const bool decay = params[i].param.ndim() >= 2;
    slots_.push_back({params[i].name, params[i].param, m_views[i], v_views[i], decay});
    const int64_t begin = params[i].offset, end = i + 1 < params.size() ? params[i + 1].offset : flat.numel();
    const float wd = decay ? float(config_.weight_decay) : 0.0f;
    // Runs of neighbouring parameters with the same weight decay, AdamWRuns::kMaxRuns to a launch: one launch for a
    // GPT of up to 15 layers without biases (four runs a layer), 7 with them (eight).
    AdamWRuns* last = launches_.empty() ? nullptr : &launches_.back();
    if (joins && last->weight_decay[last->count - 1] == wd) {
      last->upto[last->count - 1] += end - begin;  // the run goes on through this parameter
    } else {
      if (!last || last->full()) last = &launches_.emplace_back();
      last->add(begin, end - begin, wd);
    }
    joins = true;
  }
}

template <class F>
void AdamW::for_each_launch(F update) {
  Tensor p = flat_->values(), g = flat_->grads();
  bf16* const copies = flat_->bf16_copies();  // bf16 storage: the working copies, written in the update's pass
  for (const AdamWRuns& runs : launches_) {
    dispatch_float(p.dtype(), "adamw", [&]<class T>() {
      AdamWRuns with_copies = runs;
      if constexpr (std::is_same_v<T, float>) with_copies.copy = copies;
      update.template operator()<T>(p.data<T>(), g.data<T>(), flat_m_.data<T>(), flat_v_.data<T>(), with_copies,
                                    p.device());
    });
  }
}

std::vector<float> AdamW::schedule(double lr) {
  ++step_;
  return {float(lr), float(adamw_correction(float(config_.beta1), step_)),
          float(adamw_correction(float(config_.beta2), step_))};
}

void AdamW::step(const Tensor& sched, const Tensor& stats, double max_norm) {
  NoGradGuard no_grad;
  const auto beta1 = float(config_.beta1), beta2 = float(config_.beta2), eps = float(config_.eps);
  if (flat_) {
    for_each_launch([&]<class T>(T* p, T* g, T* m, T* v, const AdamWRuns& runs, Device device) {
      launch(kernels::adamw_update<T>, device, p, g, m, v, runs, sched.data<float>(), stats.data<T>(), max_norm, beta1,
             beta2, eps);
    });
    return;
  }
  for (Slot& s : slots_) {
    const Tensor g = s.param.grad();
    if (!g.defined()) continue;
    const AdamWRuns runs = AdamWRuns::one(s.param.numel(), s.decay ? float(config_.weight_decay) : 0.0f);
    dispatch_float(s.param.dtype(), "adamw", [&]<class T>() {
      launch(kernels::adamw_update<T>, s.param.device(), s.param.data<T>(), g.data<T>(), s.m.data<T>(), s.v.data<T>(),
             runs, sched.data<float>(), stats.data<T>(), max_norm, beta1, beta2, eps);
    });
    if (s.param.impl().bf16_copy) write_bf16_copy(s.param);  // bf16 storage: the copy the model reads follows
  }
}

const Tensor& AdamW::any_parameter() const {
  if (slots_.empty()) throw Error("AdamW: no parameters to update");
  return slots_.front().param;
}

void Optimizer::step(double lr, double grad_sum_squares, double max_norm) {
  NoGradGuard no_grad;
  const Tensor& p = any_parameter();
  const std::vector<float> values = schedule(lr);
  const Tensor sched = from_vector(values, {int64_t(values.size())}).to(p.device());
  const Tensor stats = from_vector(std::vector<double>{0.0, grad_sum_squares}, {2}).to(p.dtype()).to(p.device());
  step(sched, stats, max_norm);
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
  if (flat_) return flat_->zero_grad();
  for (Slot& s : slots_) s.param.zero_grad();
}

}  // namespace tinygpt

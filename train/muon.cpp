#include "train/muon.h"

#include <fmt/core.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <map>
#include <mutex>
#include <tuple>

#include "autograd/autograd.h"
#include "autograd/ops.h"
#include "kernels/kernels.h"

namespace tinygpt {

namespace {

/// y = beta y + alpha x in place (beta 0: y = alpha x, y's old values not read).
void axpby(Tensor& y, const Tensor& x, double alpha, double beta) {
  dispatch_float(y.dtype(), "muon", [&]<class T>() {
    launch(kernels::axpby<T>, y.device(), y.data<T>(), x.data<T>(), y.numel(), alpha, beta, nullptr, nullptr, 0.0);
  });
}

/// value as a 0-d tensor, made once per device, dtype and value: on the GPU no upload per step (which a captured
/// CUDA graph could not replay).
Tensor constant(double value, DType dtype, Device device) {
  if (device == Device::CPU) return full({}, value, dtype, device);
  static std::mutex mutex;
  static std::map<std::tuple<double, DType, Device>, Tensor> made;
  std::lock_guard lock(mutex);
  Tensor& t = made[{value, dtype, device}];
  if (!t.defined()) t = full({}, value, dtype, device);
  return t;
}

}  // namespace

Tensor newton_schulz(const Tensor& g, int steps, double eps, bool bf16) {
  NoGradGuard no_grad;
  if (g.ndim() != 2) throw Error(fmt::format("newton_schulz: needs a matrix, got shape {}", g.shape().str()));
  // A tall G (M > N) is iterated transposed, so the Gram matrix A is the smaller one. (Copied, not read through the
  // products' transpose flags: a chain of op(A) = A^T products ran far slower with 2 threads than with 1;
  // docs/RESULTS.md, "Measurements behind design decisions".)
  const bool tall = g.shape()[0] > g.shape()[1];
  // X = G / max(||G||_F, eps), the norm kept where G is (on the GPU: no host synchronisation).
  const Tensor norm = sqrt(sum_squares(g));
  const Tensor floored = norm + relu(constant(eps, g.dtype(), g.device()) - norm);
  Tensor x = (tall ? transpose(g, 0, 1) : g) / floored;
  Numerics numerics;
  numerics.bf16 = bf16;
  for (int i = 0; i < steps; ++i) {
    const Tensor a = matmul(x, x, false, true, numerics);
    Tensor b = matmul(a, a, false, false, numerics);
    axpby(b, a, kNewtonSchulzB, kNewtonSchulzC);  // b A + c A^2
    Tensor next = matmul(b, x, false, false, numerics);
    axpby(next, x, kNewtonSchulzA, 1.0);  // a X + B X
    x = next;
  }
  return tall ? transpose(x, 0, 1) : x;
}

double muon_scale(MuonScale scale, int64_t rows, int64_t cols) {
  switch (scale) {
    case MuonScale::Original:
      return std::sqrt(std::max(1.0, double(rows) / double(cols)));
    case MuonScale::MatchAdamW:
      return 0.2 * std::sqrt(double(std::max(rows, cols)));
  }
  return 1.0;
}

bool muon_updates(const std::string& name, const Tensor& param) {
  return param.ndim() == 2 && name.starts_with("transformer.h.") && name.ends_with(".weight");
}

Muon::Muon(FlatParameters& flat, MuonConfig muon, AdamWConfig adamw)
    : adamw_(flat, adamw, [](const FlatParameters::Slot& s) { return !muon_updates(s.name, s.param); }),
      config_(muon),
      adamw_lr_(adamw.lr) {
  if (!(adamw.lr > 0)) throw Error("Muon: AdamW's base rate must be positive (the matrices' rate follows it)");
  for (const FlatParameters::Slot& s : flat.slots()) {
    if (!muon_updates(s.name, s.param)) continue;
    slots_.push_back({s.name, s.param, buffer_slice(flat.grads(), s.offset, s.param.shape()), zeros_like(s.param),
                      muon_scale(config_.scale, s.param.shape()[0], s.param.shape()[1])});
  }
}

/// update(slot, i) for every matrix, then (bf16 storage) its working copy, while the matrix is in cache: the step
/// writes the copies the layers read.
template <class F>
void Muon::for_each_slot(F update_matrix) {
  const auto update = [&](Slot& s, size_t i) {
    update_matrix(s, i);
    if (s.param.impl().bf16_copy) write_bf16_copy(s.param);
  };
  // On the CPU the matrices are orthogonalized side by side, one per thread: their products are small (the main
  // job's are 128 x 128 x 384 at most), so a product spread over every thread spends more on starting and joining
  // its team than it saves. Each product's result does not depend on its thread count, so neither does the step.
  const bool cpu = !slots_.empty() && slots_.front().param.device() == Device::CPU;
  if (!cpu) {
    for (size_t i = 0; i < slots_.size(); ++i) update(slots_[i], i);
    return;
  }
  std::exception_ptr error;
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < slots_.size(); ++i) {
    try {
      NoGradGuard no_grad_here;  // the caller's guard is its own thread's; a worker thread needs its own
      update(slots_[i], i);
    } catch (...) {
#pragma omp critical(tinygpt_muon_error)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

std::vector<float> Muon::schedule(double lr) {
  std::vector<float> sched = adamw_.schedule(lr);
  const double rate = config_.lr * lr / adamw_lr_;
  for (const Slot& s : slots_) {  // each matrix's update factors, rounded as axpby rounds them
    sched.push_back(float(-rate * s.scale));
    sched.push_back(float(1.0 - rate * config_.weight_decay));
  }
  return sched;
}

void Muon::step(const Tensor& sched, const Tensor& stats, double max_norm) {
  NoGradGuard no_grad;
  adamw_.step(sched, stats, max_norm);
  const double mu = config_.momentum;
  // The momentum takes clipping's factor from stats; the update, the rate's factors from sched.
  auto axpby_from = [&](Tensor& y, const Tensor& x, double alpha, double beta, const float* coef) {
    dispatch_float(y.dtype(), "muon", [&]<class T>() {
      launch(kernels::axpby<T>, y.device(), y.data<T>(), x.data<T>(), y.numel(), alpha, beta, coef, stats.data<T>(),
             max_norm);
    });
  };
  for_each_slot([&](Slot& s, size_t i) {
    axpby_from(s.momentum, s.grad, 1 - mu, mu, nullptr);
    Tensor update = s.momentum;
    if (config_.nesterov) {
      update = empty(s.param.shape(), s.param.dtype(), s.param.device());
      axpby_from(update, s.grad, 1 - mu, 0.0, nullptr);
      axpby(update, s.momentum, mu, 1.0);
    }
    const Tensor o = newton_schulz(update, config_.ns_steps, 1e-7, config_.bf16);
    axpby_from(s.param, o, 0, 0, sched.data<float>() + 3 + 2 * i);
  });
}

const Tensor& Muon::any_parameter() const { return slots_.empty() ? adamw_.any_parameter() : slots_.front().param; }

std::vector<std::pair<std::string, Tensor>> Muon::state() const {
  auto out = adamw_.state();
  for (const Slot& s : slots_) out.emplace_back(s.name + ".momentum_buffer", s.momentum);
  return out;
}

double Muon::step_flops() const {
  double flops = 0;
  for (const Slot& slot : slots_) {
    const double rows = double(slot.param.size(0)), cols = double(slot.param.numel()) / rows;
    const double m = std::min(rows, cols), n = std::max(rows, cols);
    flops += 4 * m * m * n + 2 * m * m * m;
  }
  return flops * config_.ns_steps;
}

}  // namespace tinygpt

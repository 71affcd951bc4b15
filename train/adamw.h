// AdamW as nanoGPT configures it: weight decay on matrices and embeddings (dims >= 2) only.
#pragma once

#include <array>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "../autograd/tensor.h"
#include "../kernels/geometry.h"
#include "flat_parameters.h"
#include "optimizer.h"

namespace tinygpt {

struct AdamWConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<std::pair<std::string, Tensor>> params, AdamWConfig config);
  /// Over packed parameters: the moments get the buffers' layout, and a step is one update of every run of
  /// neighbouring parameters with the same weight decay: one kernel launch for up to AdamWRuns::kMaxRuns runs. Every
  /// parameter is updated every step (a gradient that stayed zero still decays the weights and the moments). With
  /// `only`, the parameters it accepts (the others are another optimizer's: no moments are saved for them, and a step
  /// leaves them alone).
  AdamW(FlatParameters& flat, AdamWConfig config,
        const std::function<bool(const FlatParameters::Slot&)>& only = nullptr);

  /// sched = {lr, c1, c2} (c1, c2 the bias corrections).
  std::vector<float> schedule(double lr) override;
  /// adamw_update over the runs of the packed buffers, or over each parameter that has a gradient.
  void step(const Tensor& sched, const Tensor& stats, double max_norm) override;
  using Optimizer::step;
  /// One step at the configured rate.
  void step() { step(config_.lr); }
  void zero_grad() override;
  int64_t steps() const override { return step_; }
  void set_steps(int64_t steps) override { step_ = steps; }
  /// The moment estimates, named "<param>.exp_avg" and "<param>.exp_avg_sq" (PyTorch's names).
  std::vector<std::pair<std::string, Tensor>> state() const override;
  const char* name() const override { return "adamw"; }

 protected:
  const Tensor& any_parameter() const override;

 private:
  friend class Muon;
  struct Slot {
    std::string name;
    Tensor param, m, v;
    bool decay;
  };
  std::vector<Slot> slots_;
  /// Calls update<T>(param, grad, m, v, runs, device) with the flat buffers, once per launch.
  template <class F>
  void for_each_launch(F update);
  FlatParameters* flat_ = nullptr;  // packed: the runs cover the buffers
  Tensor flat_m_, flat_v_;
  std::vector<AdamWRuns> launches_;  // the runs of neighbouring parameters with the same weight decay
  AdamWConfig config_;
  int64_t step_ = 0;
};

}  // namespace tinygpt

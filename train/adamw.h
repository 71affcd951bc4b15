// AdamW as nanoGPT configures it: weight decay on matrices and embeddings (dims >= 2) only.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "../autograd/tensor.h"
#include "flat_parameters.h"

namespace tinygpt {

struct AdamWConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

class AdamW {
 public:
  AdamW(std::vector<std::pair<std::string, Tensor>> params, AdamWConfig config);
  /// Over packed parameters: the moments get the buffers' layout, and a step is one update per run of
  /// neighbouring parameters with the same weight decay (two runs when the matrices come first). Every parameter
  /// is updated every step (a gradient that stayed zero still decays the weights and the moments).
  AdamW(FlatParameters& flat, AdamWConfig config);

  /// One update of every parameter that has a gradient, at learning rate `lr`, taking each gradient times
  /// `grad_scale` (how gradient clipping scales them, without a pass over the gradients of its own).
  void step(double lr, double grad_scale = 1.0);
  void step() { step(config_.lr); }
  void zero_grad();
  int64_t steps() const { return step_; }
  /// Restores the step count (bias correction) of a resumed run.
  void set_steps(int64_t steps) { step_ = steps; }
  /// The moment estimates, named "<param>.exp_avg" and "<param>.exp_avg_sq" (PyTorch's names); they are the
  /// optimizer's own tensors, so copying into them restores a saved state.
  std::vector<std::pair<std::string, Tensor>> state() const;

 private:
  struct Slot {
    std::string name;
    Tensor param, m, v;
    bool decay;
  };
  std::vector<Slot> slots_;
  struct Run {
    int64_t begin, end;  // elements of the flat buffers
    bool decay;
  };
  FlatParameters* flat_ = nullptr;  // packed: the runs cover the buffers
  Tensor flat_m_, flat_v_;
  std::vector<Run> runs_;
  AdamWConfig config_;
  int64_t step_ = 0;
};

}  // namespace tinygpt

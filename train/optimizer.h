// What the trainer and the checkpoints ask of an optimizer: AdamW (adamw.h), or Muon with AdamW beside it (muon.h).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../autograd/tensor.h"

namespace tinygpt {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  /// One update of every parameter at learning rate `lr` (AdamW's rate: an optimizer with a rate of its own for some
  /// parameters keeps it in proportion), taking each gradient times `grad_scale` (how gradient clipping scales them,
  /// without a pass over the gradients of its own).
  virtual void step(double lr, double grad_scale = 1.0) = 0;
  virtual void zero_grad() = 0;
  /// Steps taken (AdamW's bias correction counts them).
  virtual int64_t steps() const = 0;
  /// Restores the step count of a resumed run.
  virtual void set_steps(int64_t steps) = 0;
  /// The optimizer's state tensors under their checkpoint names ("<param>.exp_avg", "<param>.momentum_buffer", as
  /// PyTorch names them); they are the optimizer's own, so copying into them restores a saved state.
  virtual std::vector<std::pair<std::string, Tensor>> state() const = 0;
  /// "adamw" or "muon": what --optimizer and the checkpoint's metadata call it.
  virtual const char* name() const = 0;
};

}  // namespace tinygpt

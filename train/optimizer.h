// What the trainer and the checkpoints ask of an optimizer: AdamW (adamw.h), or Muon with AdamW beside it (muon.h).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../autograd/tensor.h"

namespace tinygpt {

/// An optimizer's step is one form on every device: what changes from step to step (the rate, the bias corrections,
/// the gradient's clipping) is read from memory the step's own work writes, so a step on the GPU can be captured once
/// as a CUDA graph and replayed (train/trainer.cpp).
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  /// Counts the step and returns the values its update reads from memory at learning rate `lr` (AdamW's rate: an
  /// optimizer with a rate of its own for some parameters keeps it in proportion): `sched`, the rate, AdamW's bias
  /// corrections, ...
  virtual std::vector<float> schedule(double lr) = 0;
  /// Queues the update reading schedule()'s values from `sched` (f32) and {loss, gradient sum of squares} from
  /// `stats` (the parameters' dtype), both where the parameters are: each gradient clipped to max_norm (0: not
  /// clipped) as it is read, and no update at all when either value is not finite. The parameters' bf16 working
  /// copies (bf16 storage) are written as they are updated.
  virtual void step(const Tensor& sched, const Tensor& stats, double max_norm) = 0;
  /// One step at rate `lr` for a loop of one's own (examples, tests): schedule(lr) and {0, grad_sum_squares} put where
  /// the parameters are; clipped to max_norm when it is above 0.
  void step(double lr, double grad_sum_squares = 0, double max_norm = 0);
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
  /// FLOPs of one step's matrix products (Muon's Newton-Schulz iterations; 0 for AdamW's elementwise update), for
  /// the meter.
  virtual double step_flops() const { return 0; }

 protected:
  /// A parameter it updates, whose device and dtype step(lr)'s values take.
  virtual const Tensor& any_parameter() const = 0;
};

}  // namespace tinygpt

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
  /// Whether step() writes each parameter's bf16 working copy (bf16 storage) as it updates the f32 master, where
  /// the copies exist (FlatParameters::bf16_copies), so the trainer need not write them after it.
  virtual bool writes_bf16_copies() const { return false; }
  /// FLOPs of one step's matrix products (Muon's Newton-Schulz iterations; 0 for AdamW's elementwise update), for
  /// the meter.
  virtual double step_flops() const { return 0; }

  // The GPU's step form (DeviceStep in train/trainer.cpp): what changes from step to step is read from device memory,
  // so the step can be captured once as a CUDA graph and replayed.
  /// Whether this optimizer has that form (over packed parameters).
  virtual bool has_indirect() const { return false; }
  /// Counts the step and returns the values its update reads from memory this step (`sched`: the rate, AdamW's bias
  /// corrections, ...).
  virtual std::vector<float> next_indirect(double lr);
  /// Queues the update reading next_indirect's values from `sched` and {loss, gradient sum of squares} from `stats`:
  /// clipped to max_norm (0: not clipped), and no update at all when either is not finite.
  virtual void step_indirect(const Tensor& sched, const Tensor& stats, double max_norm);

 private:
  [[noreturn]] void no_indirect() const;
};

inline std::vector<float> Optimizer::next_indirect(double) { no_indirect(); }
inline void Optimizer::step_indirect(const Tensor&, const Tensor&, double) { no_indirect(); }
inline void Optimizer::no_indirect() const {
  throw Error(std::string(name()) + ": no step form that reads its values from device memory");
}

}  // namespace tinygpt

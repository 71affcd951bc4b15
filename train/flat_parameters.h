// Every parameter in one contiguous buffer and every gradient in another, each parameter (and its gradient) a
// view of its slice: a training step reduces the gradients over the ranks in one call on one buffer, clips them
// with one norm, and AdamW updates stretches of neighbouring parameters instead of one tensor at a time. Checkpoints
// still see the parameters one by one, under their names.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "../autograd/tensor.h"

namespace tinygpt {

class FlatParameters {
 public:
  /// Moves each parameter's values into its slice of one buffer, in the order given, each slice starting on a
  /// 64-byte boundary (the gaps hold zeros), and gives it the matching slice of a zeroed gradient buffer as its
  /// gradient. Every handle of a parameter (the module's) sees the move. The parameters must share one float
  /// dtype and one device, and must not be moved to another device afterwards.
  explicit FlatParameters(std::vector<std::pair<std::string, Tensor>> params);

  struct Slot {
    std::string name;
    Tensor param;
    int64_t offset;  // of its first element in the buffers
  };
  const std::vector<Slot>& slots() const { return slots_; }
  /// The buffers, 1-D: values and gradients, with one layout.
  const Tensor& values() const { return values_; }
  const Tensor& grads() const { return grads_; }
  int64_t numel() const { return values_.numel(); }

  /// Zeroes the gradient buffer and makes each parameter's gradient its slice again (in case something replaced
  /// it with a tensor of its own: that gradient would be lost to the buffer).
  void zero_grad();
  /// A tensor of the buffer's layout (zeros) and, for each slot, the view of its slice: for state that follows
  /// the parameters, such as AdamW's moments.
  std::pair<Tensor, std::vector<Tensor>> make_like() const;
  /// Writes every parameter's bf16 working copy (bf16 storage: working_copy in autograd/ops.h) in one pass over the
  /// values, into a bf16 buffer of the same layout whose slices become the copies. After each optimizer step, and
  /// after anything else wrote the values (a resumed checkpoint, the ranks' broadcast).
  void write_bf16_copies();
  /// The bf16 working copies' buffer (the values' layout), or null before the first write_bf16_copies: the
  /// optimizers write into it as they update (AdamWRuns::copy), so a step needs no pass of its own for the copies.
  bf16* bf16_copies() { return values16_.defined() ? values16_.data<bf16>() : nullptr; }

 private:
  std::vector<Slot> slots_;
  Tensor values_, grads_;
  Tensor values16_;  // the bf16 working copies, made by the first write_bf16_copies
};

}  // namespace tinygpt

// The graph: each op's result points at a Node holding the op's inputs and one backward closure.
// A Node never holds its own output, so the graph is a DAG of shared pointers with no cycles; backward()
// walks it in reverse topological order (iteratively: no recursion limit) and frees it as it goes.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "tensor.h"

namespace tinygpt {

/// Receives the gradient of the op's output and the op's inputs; accumulates (+=) into grads[i] for every
/// input that needs a gradient (grads[i] is undefined otherwise), or, for a node that writes_unwritten, writes (=)
/// into a slot whose `unwritten` is set. Captures only saved plain tensors.
using BackwardFn = std::function<void(const Tensor& dout, std::span<const Tensor> inputs, std::span<Tensor> grads)>;

struct Node {
  Node(const char* name, std::vector<Tensor> inputs, BackwardFn backward);
  ~Node();

  const char* name;
  std::vector<Tensor> inputs;
  BackwardFn backward;
  /// Bit i set: the backward writes (=) input i's gradient slot when no op has written it yet
  /// (TensorImpl::unwritten, detail::unwritten) instead of adding to it, so backward hands such a slot out
  /// uninitialized rather than zeroed: no memset, and no read of zeros, for the large activation gradients (a slot
  /// reached by several ops is written by the first and added to by the others). Leaves' .grad stay zeroed.
  /// Instead of writing such a slot the backward may replace it (grads[i] = a tensor of the input's shape, dtype and
  /// device): a gradient computed ahead, in the forward (the fused classifier's), is then taken as it is.
  uint32_t writes_unwritten = 0;
  /// One tensor at several inputs whose writes_unwritten bits are all set: the backward writes a different part of
  /// it for each, the parts together the whole (fused attention's q, k and v, three views that partition one qkv
  /// tensor), so that slot may start unwritten too. Without it such a slot is zeroed (x * x adds twice into one).
  bool unwritten_disjoint = false;

  static std::atomic<int64_t> live_count;
};

/// True unless a NoGradGuard is active on this thread.
bool grad_enabled();

/// Turns graph recording off for its lifetime (evaluation, sampling, optimizer updates).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

/// For its lifetime, backward passes on this thread call `on_ready(leaf)` for each leaf as soon as its gradient is
/// final (every op that adds to it has run), in that order: a data-parallel trainer starts reducing gradients while
/// the rest of backward still runs.
class GradReadyHook {
 public:
  explicit GradReadyHook(std::function<void(const Tensor& leaf)> on_ready);
  ~GradReadyHook();
  GradReadyHook(const GradReadyHook&) = delete;
  GradReadyHook& operator=(const GradReadyHook&) = delete;

 private:
  std::function<void(const Tensor&)> on_ready_;
  const std::function<void(const Tensor&)>* previous_;
};

/// Attaches `backward` to `out` when recording is on and any input requires a gradient; returns `out`.
/// writes_unwritten (bit i for input i) and unwritten_disjoint: see Node.
Tensor record(const char* name, Tensor out, std::vector<Tensor> inputs, BackwardFn backward,
              uint32_t writes_unwritten = 0, bool unwritten_disjoint = false);

/// Backpropagates `grad` (the gradient of `root`) through the graph into the leaves' .grad.
void run_backward(const Tensor& root, const Tensor& grad, bool retain_graph);

/// dst += src (same shape and dtype), on dst's device.
void accumulate_into(Tensor& dst, const Tensor& src);

}  // namespace tinygpt

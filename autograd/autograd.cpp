#include "autograd/autograd.h"

#include <unordered_map>
#include <unordered_set>

#include "autograd/ops.h"
#include "kernels/kernels.h"

namespace tinygpt {
namespace {

thread_local bool g_grad_enabled = true;

}  // namespace

std::atomic<int64_t> Node::live_count{0};

Node::Node(const char* n, std::vector<Tensor> in, BackwardFn bw)
    : name(n), inputs(std::move(in)), backward(std::move(bw)) {
  ++live_count;
}

namespace {

/// Moves t's producer out when t is about to die with it, so the caller can destroy it later.
void take_if_last(Tensor& t, std::vector<std::shared_ptr<Node>>& out) {
  if (!t.defined() || t.impl_ptr().use_count() != 1) return;
  std::shared_ptr<Node>& fn = t.impl().grad_fn;
  if (fn && fn.use_count() == 1) out.push_back(std::move(fn));
}

}  // namespace

// Tearing down a long chain by plain recursion (node -> input -> node ...) would overflow the stack,
// so a dying node releases the chain below it iteratively, one node at a time.
Node::~Node() {
  std::vector<std::shared_ptr<Node>> dying;
  for (Tensor& t : inputs) take_if_last(t, dying);
  inputs.clear();
  while (!dying.empty()) {
    std::shared_ptr<Node> node = std::move(dying.back());
    dying.pop_back();
    for (Tensor& t : node->inputs) take_if_last(t, dying);
    node->inputs.clear();
  }
  --live_count;
}

namespace {
thread_local const std::function<void(const Tensor&)>* g_grad_ready = nullptr;
}  // namespace

bool grad_enabled() { return g_grad_enabled; }

GradReadyHook::GradReadyHook(std::function<void(const Tensor&)> on_ready)
    : on_ready_(std::move(on_ready)), previous_(g_grad_ready) {
  g_grad_ready = &on_ready_;
}
GradReadyHook::~GradReadyHook() { g_grad_ready = previous_; }

NoGradGuard::NoGradGuard() : previous_(g_grad_enabled) { g_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { g_grad_enabled = previous_; }

Tensor record(const char* name, Tensor out, std::vector<Tensor> inputs, BackwardFn backward, uint32_t writes_unwritten,
              bool unwritten_disjoint) {
  if (!g_grad_enabled) return out;
  bool needs = false;
  for (const Tensor& t : inputs) needs = needs || (t.defined() && t.requires_grad());
  if (!needs) return out;
  out.impl().requires_grad = true;
  out.impl().from_op = true;
  out.impl().grad_fn = std::make_shared<Node>(name, std::move(inputs), std::move(backward));
  out.impl().grad_fn->writes_unwritten = writes_unwritten;
  out.impl().grad_fn->unwritten_disjoint = unwritten_disjoint;
  return out;
}

void accumulate_into(Tensor& dst, const Tensor& src) {
  if (!(dst.shape().numel() == src.shape().numel()) || dst.dtype() != src.dtype()) {
    shape_error("accumulate", "gradient does not match", dst.shape(), src.shape());
  }
  dispatch_storage(dst.dtype(), "accumulate", [&]<class T>() {
    launch(kernels::axpy<T>, dst.device(), dst.data<T>(), src.data<T>(), compute_t<T>(1), dst.numel());
  });
}

namespace {

/// Tensors reachable from root through grad_fn edges, inputs before the ops that use them.
/// Iterative depth-first search: a 100,000-op chain needs no deep call stack.
std::vector<std::shared_ptr<TensorImpl>> topological_order(const std::shared_ptr<TensorImpl>& root) {
  std::vector<std::shared_ptr<TensorImpl>> order;
  std::unordered_set<TensorImpl*> visited;
  struct Frame {
    std::shared_ptr<TensorImpl> impl;
    size_t next_input;
  };
  std::vector<Frame> stack{{root, 0}};
  visited.insert(root.get());
  while (!stack.empty()) {
    Frame& top = stack.back();
    const Node* node = top.impl->grad_fn.get();
    if (node != nullptr && top.next_input < node->inputs.size()) {
      const Tensor& in = node->inputs[top.next_input++];
      if (in.defined() && in.requires_grad() && visited.insert(in.impl_ptr().get()).second) {
        stack.push_back({in.impl_ptr(), 0});
      }
      continue;
    }
    order.push_back(std::move(top.impl));
    stack.pop_back();
  }
  return order;
}

bool is_leaf_input(const Tensor& in) {
  return in.defined() && in.requires_grad() && !in.impl().grad_fn && !in.impl().from_op;
}

/// For each leaf, how many of the graph's ops add to its gradient (the ready hook fires when the last one has).
std::unordered_map<TensorImpl*, int> leaf_adders(const std::vector<std::shared_ptr<TensorImpl>>& order) {
  std::unordered_map<TensorImpl*, int> adders;
  for (const auto& impl : order) {
    if (!impl->grad_fn) continue;
    for (const Tensor& in : impl->grad_fn->inputs) {
      if (is_leaf_input(in)) ++adders[&in.impl()];
    }
  }
  return adders;
}

/// Whether the node writes input i's gradient slot whole (=), so the slot may start uninitialized. An input read twice
/// by the node (x * x) gets one slot for both: it must start at zero, unless the node writes disjoint parts of it that
/// cover it (unwritten_disjoint), one at each of its places, each with its bit set.
bool slot_unwritten(const Node& node, size_t i) {
  auto writes = [&](size_t j) { return j < 32 && (node.writes_unwritten >> j & 1u); };
  bool unwritten = writes(i);
  for (size_t j = 0; j < node.inputs.size(); ++j) {
    if (j != i && node.inputs[j].impl_ptr() == node.inputs[i].impl_ptr())
      unwritten = unwritten && node.unwritten_disjoint && writes(j);
  }
  return unwritten;
}

}  // namespace

void run_backward(const Tensor& root, const Tensor& grad, bool retain_graph) {
  if (!root.requires_grad()) {
    throw Error("backward: the tensor does not require grad (no input was marked with requires_grad_())");
  }
  if (!(grad.shape() == root.shape()))
    shape_error("backward", "gradient must match the output", grad.shape(), root.shape());
  if (grad.dtype() != root.dtype()) throw Error("backward: gradient dtype differs from the output's");

  NoGradGuard no_grad;  // backward closures run ops on plain tensors; nothing is recorded
  std::vector<std::shared_ptr<TensorImpl>> order = topological_order(root.impl_ptr());
  std::unordered_map<TensorImpl*, Tensor> pending;  // gradients of non-leaf tensors not yet propagated
  pending[root.impl_ptr().get()] = grad;

  // With a ready hook: how many ops still add to each leaf's gradient.
  const auto* on_ready = g_grad_ready;
  std::unordered_map<TensorImpl*, int> adders;
  if (on_ready != nullptr) adders = leaf_adders(order);

  // uninitialized: the slot goes to a node that writes this input's unwritten slot (and reads t once).
  auto gradient_slot = [&](const Tensor& t, bool uninitialized = false) -> Tensor {
    TensorImpl& impl = t.impl();
    if (impl.from_op && !impl.grad_fn) {
      throw Error(
          "backward: this graph was already freed by an earlier backward(); pass retain_graph=true to "
          "the first backward() to run it again");
    }
    if (impl.grad_fn) {
      Tensor& slot = pending[&impl];
      if (!slot.defined()) {
        slot = uninitialized ? empty(t.shape(), t.dtype(), t.device()) : zeros_like(t);
        slot.impl().unwritten = uninitialized;
      }
      return slot;
    }
    if (!impl.grad) impl.grad = zeros_like(t).impl_ptr();
    return Tensor(impl.grad);
  };

  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    TensorImpl& impl = **it;
    auto found = pending.find(&impl);
    if (found == pending.end()) continue;
    Tensor dout = std::move(found->second);
    pending.erase(found);
    if (!impl.grad_fn) {  // the root itself is a leaf (or a freed graph: gradient_slot says so)
      Tensor slot = gradient_slot(Tensor(*it));
      accumulate_into(slot, dout);
      continue;
    }
    Node& node = *impl.grad_fn;
    std::vector<Tensor> grads(node.inputs.size());
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      const Tensor& in = node.inputs[i];
      if (!in.defined() || !in.requires_grad()) continue;
      grads[i] = gradient_slot(in, slot_unwritten(node, i));
    }
    const std::vector<Tensor> slots = grads;
    node.backward(dout, node.inputs, grads);
    for (size_t i = 0; i < grads.size(); ++i) {
      Tensor& g = grads[i];
      if (!g.defined()) continue;
      if (g.impl_ptr() != slots[i].impl_ptr()) {  // the node handed back a gradient of its own for an unwritten slot
        const Tensor& in = node.inputs[i];
        if (!slots[i].defined() || !slots[i].impl().unwritten || !(g.shape() == in.shape()) ||
            g.dtype() != in.dtype() || g.device() != in.device()) {
          throw Error(std::string("backward: ") + node.name + " replaced a gradient slot it may not replace");
        }
        pending[&in.impl()] = g;
      }
      g.impl().unwritten = false;
    }
    if (on_ready != nullptr) {
      for (const Tensor& in : node.inputs) {
        if (is_leaf_input(in) && --adders[&in.impl()] == 0) (*on_ready)(in);
      }
    }
    if (!retain_graph) impl.grad_fn.reset();
  }
}

}  // namespace tinygpt

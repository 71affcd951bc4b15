#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "autograd/ops.h"
#include "test_util.h"

using namespace tinygpt;
using tinygpt::test::check_close;

namespace {

Tensor scalar_leaf(double v) {
  Tensor t = full({1}, v, DType::F64);
  t.requires_grad_();
  return t;
}

}  // namespace

TEST_CASE("autograd: gradient of a small expression") {
  Tensor x = scalar_leaf(3.0);
  const Tensor y = x * x + x;  // dy/dx = 2x + 1
  CHECK(y.requires_grad());
  CHECK(!y.is_leaf());
  CHECK(std::string(y.op_name()) == "add");
  y.backward();
  CHECK(x.grad().item() == doctest::Approx(7.0));
}

TEST_CASE("autograd: broadcast gradients of empty tensors are zero, not a crash") {
  Tensor a = zeros({2, 0});
  Tensor b = ones({2, 1});
  a.requires_grad_();
  b.requires_grad_();
  sum(mul(a, b)).backward();
  CHECK(a.grad().numel() == 0);
  check_close(b.grad(), {0, 0});
}

TEST_CASE("autograd: backward with an explicit gradient") {
  Tensor x = from_vector(std::vector<double>{1, 2, 3}, {3});
  x.requires_grad_();
  const Tensor y = x * 2.0;
  y.backward(from_vector(std::vector<double>{1, 10, 100}, {3}));
  check_close(x.grad(), {2, 20, 200});
  CHECK_THROWS_AS(y.backward(), Error);  // not a scalar
}

TEST_CASE("autograd: gradients accumulate at fan-out and across backward calls") {
  Tensor x = scalar_leaf(2.0);
  const Tensor a = exp(x);
  const Tensor y = a * a + a;  // a used three times; dy/dx = (2a + 1) a
  y.backward();
  const double e2 = std::exp(2.0);
  CHECK(x.grad().item() == doctest::Approx((2 * e2 + 1) * e2));
  const Tensor z = x * 3.0;
  z.backward();  // leaf gradients accumulate until zero_grad
  CHECK(x.grad().item() == doctest::Approx((2 * e2 + 1) * e2 + 3));
  x.zero_grad();
  CHECK(!x.grad().defined());
  (x * 3.0).backward();
  CHECK(x.grad().item() == doctest::Approx(3.0));
}

TEST_CASE("autograd: the graph is freed after backward unless retained") {
  Tensor x = scalar_leaf(1.5);
  const Tensor y = tanh(x) * 2.0;
  y.backward(true);
  const double once = x.grad().item();
  y.backward();  // retained: runs again and accumulates
  CHECK(x.grad().item() == doctest::Approx(2 * once));
  CHECK_THROWS_WITH_AS(y.backward(), doctest::Contains("already freed"), Error);
}

TEST_CASE("autograd: NoGradGuard and detach stop recording") {
  Tensor x = scalar_leaf(1.0);
  {
    NoGradGuard guard;
    CHECK(!grad_enabled());
    const Tensor y = x * x;
    CHECK(!y.requires_grad());
  }
  CHECK(grad_enabled());
  const Tensor y = x.detach() * x;  // only the second factor carries gradient
  y.backward();
  CHECK(x.grad().item() == doctest::Approx(1.0));
  CHECK_THROWS_AS(zeros({1}).backward(), Error);  // nothing requires grad
}

TEST_CASE("autograd: a node never holds its own output, and everything is freed") {
  const int64_t tensors_before = TensorImpl::live_count.load();
  const int64_t nodes_before = Node::live_count.load();
  {
    Generator gen(1);
    Tensor w = randn({4, 3}, gen, DType::F64);
    w.requires_grad_();
    const Tensor x = randn({5, 3}, gen, DType::F64);
    const Tensor h = tanh(linear(x, w));
    CHECK(h.impl_ptr().use_count() == 1);  // only our handle: the node keeps no reference to h
    const Tensor loss = mean(exp(h) * h);
    CHECK(Node::live_count.load() > nodes_before);
    loss.backward();
    CHECK(Node::live_count.load() == nodes_before);  // freed by backward
  }
  CHECK(TensorImpl::live_count.load() == tensors_before);
  {
    Tensor x = scalar_leaf(0.5);
    const Tensor y = exp(tanh(x)) * x;  // never backpropagated: freed when dropped
  }
  CHECK(Node::live_count.load() == nodes_before);
  CHECK(TensorImpl::live_count.load() == tensors_before);
}

TEST_CASE("autograd: a 100,000-op chain backpropagates and frees without recursion") {
  const int64_t nodes_before = Node::live_count.load();
  Tensor x = scalar_leaf(1.0);
  Tensor y = x;
  constexpr int kDepth = 100000;
  for (int i = 0; i < kDepth; ++i) y = y * 1.00001;
  y.backward();
  CHECK(x.grad().item() == doctest::Approx(std::pow(1.00001, kDepth)).epsilon(1e-9));
  {
    Tensor z = x;
    for (int i = 0; i < kDepth; ++i) z = z * 1.0;  // dropped without backward: iterative teardown
  }
  y = Tensor();
  CHECK(Node::live_count.load() == nodes_before);
}

TEST_CASE("autograd: a ready hook sees each leaf once, as soon as its gradient is final") {
  Generator gen(11);
  Tensor a = randn({3}, gen), b = randn({3}, gen), c = randn({3}, gen);
  for (Tensor* t : {&a, &b, &c}) t->requires_grad_();
  // a reaches the loss three ways; its gradient is final only when the last of them has run.
  const Tensor loss = sum((a * b + a) * c) + sum(a);
  std::vector<std::pair<const TensorImpl*, std::vector<float>>> seen;
  {
    GradReadyHook hook([&](const Tensor& leaf) { seen.emplace_back(&leaf.impl(), leaf.grad().to_vector<float>()); });
    loss.backward();
  }
  REQUIRE(seen.size() == 3);
  std::vector<const TensorImpl*> leaves;
  for (const auto& [impl, grad] : seen) {
    leaves.push_back(impl);
    const Tensor& t = impl == &a.impl() ? a : impl == &b.impl() ? b : c;
    CHECK(grad == t.grad().to_vector<float>());  // what the hook saw is the final gradient
  }
  std::sort(leaves.begin(), leaves.end());
  CHECK(std::unique(leaves.begin(), leaves.end()) == leaves.end());
  // Without a hook in scope, nothing is called.
  seen.clear();
  (sum(a * b)).backward();
  CHECK(seen.empty());
}

TEST_CASE("autograd: cross-entropy's fused gradient, kept, rewritten, added to, and handed out once") {
  // logits (3, 4) = 1 * leaf, so their gradient slot starts unwritten and cross_entropy's backward takes the gradient
  // its forward wrote; row 1 is ignored. Expected: d mean / d logits = (softmax - onehot) / 2 on the rows kept.
  const std::vector<double> values = {0.5, -1, 2, 0.25, 3, 1, -2, 0, -0.75, 1.5, 0.5, -1};
  const Tensor targets = from_vector(std::vector<int32_t>{2, -1, 0}, {3});  // -1: ignore_index
  std::vector<double> expected(values.size(), 0.0);
  for (int r : {0, 2}) {
    double total = 0;
    for (int v = 0; v < 4; ++v) total += std::exp(values[size_t(r * 4 + v)]);
    const int t = r == 0 ? 2 : 0;
    for (int v = 0; v < 4; ++v) {
      expected[size_t(r * 4 + v)] = (std::exp(values[size_t(r * 4 + v)]) / total - (v == t ? 1.0 : 0.0)) / 2;
    }
  }
  auto scaled = [&](double s) {
    std::vector<double> e = expected;
    for (double& x : e) x *= s;
    return e;
  };
  for (const DType dtype : {DType::F32, DType::F64}) {
    CAPTURE(std::string(dtype_name(dtype)));
    Tensor leaf = from_vector(values, {3, 4}).to(dtype);
    leaf.requires_grad_();
    SUBCASE("a loss gradient of 1 keeps the fused gradient") {
      cross_entropy(leaf * 1.0, targets).backward();
      check_close(leaf.grad(), expected, 1e-6);
    }
    SUBCASE("another loss gradient rewrites it from the logits") {
      (cross_entropy(leaf * 1.0, targets) * 0.25).backward();
      check_close(leaf.grad(), scaled(0.25), 1e-6);
    }
    SUBCASE("a slot another op wrote first is added to") {
      const Tensor logits = leaf * 1.0;
      (cross_entropy(logits, targets) + sum(logits) * 3.0).backward();
      std::vector<double> e = expected;
      for (double& x : e) x += 3.0;
      check_close(leaf.grad(), e, 1e-6);
    }
    SUBCASE("a retained graph run twice: the second backward does not reuse what the first handed out") {
      // The first backward hands the fused gradient out and the sum then adds 3 to it, in place.
      const Tensor logits = leaf * 1.0;
      const Tensor loss = sum(logits) * 3.0 + cross_entropy(logits, targets);
      loss.backward(true);
      loss.backward();
      std::vector<double> e = expected;
      for (double& x : e) x = 2 * (x + 3.0);
      check_close(leaf.grad(), e, 1e-6);
    }
    SUBCASE("without recording, no gradient is computed and the loss is the same") {
      const double recorded = cross_entropy(leaf * 1.0, targets).item();
      NoGradGuard no_grad;
      CHECK(cross_entropy(leaf * 1.0, targets).item() == recorded);
    }
  }
}

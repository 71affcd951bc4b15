#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <string>

#include "nn/layers.h"
#include "test_util.h"
#include "train/adamw.h"

using namespace tinygpt;
using tinygpt::test::check_close;

namespace {

class TwoLayer : public nn::Module {
 public:
  explicit TwoLayer(Generator& gen) : ln(4, true), fc(4, 3, true, gen), head(3, 2, false, gen) {
    register_module("ln", ln);
    register_module("fc", fc);
    register_module("head", head);
  }
  nn::LayerNorm ln;
  nn::Linear fc, head;
};

}  // namespace

TEST_CASE("nn: modules name their parameters with dotted paths") {
  Generator gen(1);
  TwoLayer m(gen);
  std::vector<std::string> names;
  for (auto& [name, t] : m.named_parameters()) names.push_back(name);
  CHECK(names == std::vector<std::string>{"ln.weight", "ln.bias", "fc.weight", "fc.bias", "head.weight"});
  CHECK(m.num_parameters() == 4 + 4 + 12 + 3 + 6);
  for (const Tensor& p : m.parameters()) CHECK(p.requires_grad());
  m.train(false);
  CHECK(!m.fc.training());
}

TEST_CASE("nn: layers compute what their ops compute, with GPT-2 initialization") {
  Generator gen(2);
  nn::Linear fc(64, 256, true, gen);
  const auto w = fc.weight.to_vector<float>();
  double var = 0;
  for (float v : w) var += double(v) * v;
  CHECK(std::sqrt(var / double(w.size())) == doctest::Approx(0.02).epsilon(0.05));
  check_close(fc.bias, std::vector<double>(256, 0.0));
  const Tensor x = randn({3, 64}, gen);
  check_close(fc.forward(x), linear(x, fc.weight, fc.bias));
  nn::Embedding emb(10, 4, gen);
  check_close(emb.forward(from_vector(std::vector<int32_t>{7}, {1})), narrow(emb.weight, 0, 7, 1).detach());
}

TEST_CASE("adamw: first steps match the closed form, decay only on matrices") {
  Tensor w = full({2, 2}, 1.0);  // decayed
  Tensor b = full({2}, 1.0);     // not decayed
  w.requires_grad_();
  b.requires_grad_();
  AdamW opt({{"w", w}, {"b", b}}, {.lr = 0.1, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.5});
  w.set_grad(full({2, 2}, 3.0));
  b.set_grad(full({2}, -2.0));
  opt.step();
  // Step 1: bias-corrected m = g, v = g^2, so the update is sign(g) (up to eps), plus decay lr*wd*w.
  check_close(w, {1 - 0.1 * (1 + 0.5), 1 - 0.1 * (1 + 0.5), 1 - 0.1 * (1 + 0.5), 1 - 0.1 * (1 + 0.5)}, 1e-6);
  check_close(b, {1.1, 1.1}, 1e-6);
  // Step 2 with gradient 0: m = 0.9*0.1*g, v = 0.99*0.01*g^2; corrected m/(1-0.81), v/(1-0.9801).
  b.set_grad(zeros({2}));
  opt.step(0.1);
  const double m_hat = 0.9 * 0.1 * -2.0 / (1 - 0.81);
  const double v_hat = 0.99 * 0.01 * 4.0 / (1 - 0.9801);
  check_close(b, {1.1 - 0.1 * m_hat / std::sqrt(v_hat), 1.1 - 0.1 * m_hat / std::sqrt(v_hat)}, 1e-6);
}

TEST_CASE("nn: a small model learns (loss falls) through autograd and AdamW") {
  Generator gen(3);
  TwoLayer m(gen);
  AdamW opt(m.named_parameters(), {.lr = 0.05});
  const Tensor x = randn({16, 4}, gen);
  std::vector<int32_t> t;
  for (int i = 0; i < 16; ++i) t.push_back(x.to_vector<float>()[size_t(i * 4)] > 0 ? 1 : 0);
  const Tensor targets = from_vector(t, {16});
  auto loss_fn = [&] { return cross_entropy(m.head.forward(gelu(m.fc.forward(m.ln.forward(x)))), targets); };
  const double first = loss_fn().item();
  for (int step = 0; step < 200; ++step) {
    const Tensor loss = loss_fn();
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  const double last = loss_fn().item();
  CHECK(first > 0.5);
  CHECK(last < 0.1);
}

TEST_CASE("flat parameters: one buffer of values and one of gradients, each parameter a view of its slice") {
  Generator gen(4);
  TwoLayer m(gen);
  std::vector<std::vector<float>> before;
  for (const Tensor& p : m.parameters()) before.push_back(p.to_vector<float>());
  FlatParameters flat(m.named_parameters());
  const auto* base = static_cast<const char*>(flat.values().raw_data());
  const auto* grad_base = static_cast<const char*>(flat.grads().raw_data());
  size_t i = 0;
  int64_t end = 0;
  for (const auto& slot : flat.slots()) {
    const Tensor p = m.named_parameters()[i].second;  // the module's own handle sees the move
    CHECK(p.to_vector<float>() == before[i]);
    CHECK(static_cast<const char*>(p.raw_data()) == base + slot.offset * 4);
    CHECK(static_cast<const char*>(p.grad().raw_data()) == grad_base + slot.offset * 4);
    CHECK(slot.offset % 16 == 0);  // 64-byte aligned
    CHECK(slot.offset >= end);     // slices never overlap
    end = slot.offset + p.numel();
    ++i;
  }
  CHECK(flat.numel() >= end);

  // Backward accumulates into the buffer; zero_grad zeroes it and relinks a gradient something replaced.
  const Tensor x = randn({5, 4}, gen);
  auto loss = [&] { return sum(m.head.forward(gelu(m.fc.forward(m.ln.forward(x))))); };
  loss().backward();
  const auto once = flat.grads().to_vector<float>();
  loss().backward();
  const auto twice = flat.grads().to_vector<float>();
  double norm = 0;
  for (size_t k = 0; k < once.size(); ++k) {
    CHECK(twice[k] == doctest::Approx(2 * once[k]));
    norm += std::fabs(once[k]);
  }
  CHECK(norm > 0);
  m.fc.weight.set_grad(ones({3, 4}));
  flat.zero_grad();
  CHECK(flat.grads().to_vector<float>() == std::vector<float>(size_t(flat.numel()), 0.0f));
  loss().backward();
  CHECK(flat.grads().to_vector<float>() == once);
  CHECK_THROWS_WITH(m.fc.weight.move_to_(Device::CUDA), doctest::Contains("slice of a buffer"));
}

TEST_CASE("adamw over flat parameters updates as it does tensor by tensor, bit for bit") {
  Generator g1(6), g2(6);
  TwoLayer a(g1), b(g2);
  std::vector<std::pair<std::string, Tensor>> order = b.named_parameters();  // vectors and matrices interleaved
  FlatParameters flat(order);
  const AdamWConfig config{.lr = 0.01, .weight_decay = 0.3};
  AdamW per_tensor(a.named_parameters(), config), packed(flat, config);
  const Tensor x = randn({5, 4}, g1);
  for (int step = 0; step < 3; ++step) {
    for (TwoLayer* m : {&a, &b}) sum(m->head.forward(gelu(m->fc.forward(m->ln.forward(x))))).backward();
    per_tensor.step(0.01 * (step + 1));
    packed.step(0.01 * (step + 1));
    per_tensor.zero_grad();
    packed.zero_grad();
  }
  const auto pa = a.parameters(), pb = b.parameters();
  for (size_t i = 0; i < pa.size(); ++i) CHECK(pa[i].to_vector<float>() == pb[i].to_vector<float>());
  const auto sa = per_tensor.state(), sb = packed.state();
  REQUIRE(sa.size() == sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    CHECK(sa[i].first == sb[i].first);
    CHECK(sa[i].second.to_vector<float>() == sb[i].second.to_vector<float>());
  }
}

TEST_CASE("adamw over flat parameters with more runs than one launch takes (AdamWRuns::kMaxRuns)") {
  // Matrices and vectors alternating: a run each, 2 kMaxRuns + 6 of them, so three launches.
  Generator g(7);
  std::vector<std::pair<std::string, Tensor>> a, b;
  for (int i = 0; i < AdamWRuns::kMaxRuns + 3; ++i) {
    for (const Shape& shape : {Shape{2, 3}, Shape{3}}) {
      Tensor p = randn(shape, g);
      const std::string name = fmt::format("p{}.{}", i, shape.ndim());
      a.emplace_back(name, p.clone().requires_grad_());
      b.emplace_back(name, p.clone().requires_grad_());
    }
  }
  FlatParameters flat(b);
  const AdamWConfig config{.lr = 0.01, .weight_decay = 0.3};
  AdamW per_tensor(a, config), packed(flat, config);
  for (int step = 0; step < 2; ++step) {
    for (auto* params : {&a, &b}) {
      Tensor loss = zeros({});
      for (size_t i = 0; i < params->size(); ++i) loss = loss + sum(scale((*params)[i].second, double(i % 7) - 3.0));
      loss.backward();
    }
    per_tensor.step(0.01);
    packed.step(0.01);
    per_tensor.zero_grad();
    packed.zero_grad();
  }
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i].second.to_vector<float>() == b[i].second.to_vector<float>());
}

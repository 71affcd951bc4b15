#include <doctest/doctest.h>

#include <cmath>

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

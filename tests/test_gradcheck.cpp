// Central-difference gradient checks in f64 for every differentiable op.
#include <doctest/doctest.h>

#include <cmath>

#include "autograd/ops.h"
#include "test_util.h"
#include "tests/kernel_cases.h"

using namespace tinygpt;
using tinygpt::test::expect_gradcheck;
using tinygpt::test::leaf;
using Inputs = std::vector<Tensor>;

TEST_CASE("gradcheck: binary ops with broadcasting") {
  Generator gen(1);
  const std::vector<std::pair<Shape, Shape>> shapes = {{{2, 3, 4}, {2, 3, 4}}, {{2, 3, 4}, {4}}, {{2, 3, 4}, {3, 1}},
                                                       {{3, 1}, {1, 4}},       {{2, 1, 4}, {1}}, {{5}, {2, 3, 5}},
                                                       {{2, 300}, {300}}};  // rows longer than the broadcast gradient's
                                                                            // 256-element pieces
  for (const auto& [sa, sb] : shapes) {
    CAPTURE(sa.str());
    CAPTURE(sb.str());
    expect_gradcheck([](const Inputs& in) { return add(in[0], in[1]); }, {leaf(sa, gen), leaf(sb, gen)});
    expect_gradcheck([](const Inputs& in) { return sub(in[0], in[1]); }, {leaf(sa, gen), leaf(sb, gen)});
    expect_gradcheck([](const Inputs& in) { return mul(in[0], in[1]); }, {leaf(sa, gen), leaf(sb, gen)});
    Tensor denom = exp(randn(sb, gen, DType::F64)).detach();  // kept away from zero
    denom.requires_grad_();
    expect_gradcheck([](const Inputs& in) { return div(in[0], in[1]); }, {leaf(sa, gen), denom});
  }
}

TEST_CASE("gradcheck: unary ops") {
  Generator gen(2);
  expect_gradcheck([](const Inputs& in) { return scale(in[0], -1.7); }, {leaf({3, 4}, gen)});
  expect_gradcheck([](const Inputs& in) { return neg(in[0]); }, {leaf({3, 4}, gen)});
  expect_gradcheck([](const Inputs& in) { return exp(in[0]); }, {leaf({3, 4}, gen)});
  Tensor positive = exp(randn({3, 4}, gen, DType::F64)).detach();
  positive.requires_grad_();
  expect_gradcheck([](const Inputs& in) { return log(in[0]); }, {positive});
  expect_gradcheck([](const Inputs& in) { return sqrt(in[0]); }, {positive});
  expect_gradcheck([](const Inputs& in) { return tanh(in[0]); }, {leaf({3, 4}, gen)});
  expect_gradcheck([](const Inputs& in) { return gelu(in[0]); }, {leaf({3, 4}, gen, 2.0)});
  // relu: inputs kept away from the kink at 0, where the central difference is meaningless.
  Tensor away = from_vector(std::vector<double>{-2.0, -0.5, 0.3, 1.2, 2.5, -1.1}, {2, 3});
  away.requires_grad_();
  expect_gradcheck([](const Inputs& in) { return relu(in[0]); }, {away});
}

TEST_CASE("gradcheck: reductions and softmax") {
  Generator gen(3);
  expect_gradcheck([](const Inputs& in) { return sum(in[0]); }, {leaf({2, 3, 4}, gen)});
  expect_gradcheck([](const Inputs& in) { return mean(in[0]); }, {leaf({2, 3, 4}, gen)});
  for (int dim : {0, 1, 2, -1}) {
    CAPTURE(dim);
    expect_gradcheck([dim](const Inputs& in) { return sum(in[0], dim); }, {leaf({2, 3, 4}, gen)});
    expect_gradcheck([dim](const Inputs& in) { return mean(in[0], dim, true); }, {leaf({2, 3, 4}, gen)});
  }
  expect_gradcheck([](const Inputs& in) { return softmax(in[0]); }, {leaf({3, 5}, gen, 2.0)});
  expect_gradcheck([](const Inputs& in) { return log_softmax(in[0]); }, {leaf({2, 2, 5}, gen, 2.0)});
}

TEST_CASE("gradcheck: matmul in every layout, and linear") {
  Generator gen(4);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      CAPTURE(ta);
      CAPTURE(tb);
      const Shape a2 = ta ? Shape{4, 3} : Shape{3, 4};  // op(a) is (3, 4)
      const Shape b2 = tb ? Shape{5, 4} : Shape{4, 5};  // op(b) is (4, 5)
      const Shape a3 = ta ? Shape{2, 4, 3} : Shape{2, 3, 4};
      const Shape b3 = tb ? Shape{2, 5, 4} : Shape{2, 4, 5};
      auto f = [ta, tb](const Inputs& in) { return matmul(in[0], in[1], ta, tb); };
      expect_gradcheck(f, {leaf(a2, gen), leaf(b2, gen)});
      expect_gradcheck(f, {leaf(a3, gen), leaf(b3, gen)});  // batched
      expect_gradcheck(f, {leaf(a3, gen), leaf(b2, gen)});  // b shared by the batch
      expect_gradcheck(f, {leaf(a2, gen), leaf(b3, gen)});  // a shared by the batch
    }
  }
  expect_gradcheck([](const Inputs& in) { return linear(in[0], in[1], in[2]); },
                   {leaf({2, 3, 4}, gen), leaf({5, 4}, gen), leaf({5}, gen)});
  expect_gradcheck([](const Inputs& in) { return linear(in[0], in[1]); }, {leaf({3, 4}, gen), leaf({2, 4}, gen)});
  // The fused MLP, both activations, with and without biases (the hidden width 6 from w_fc (6, 4)).
  for (const Activation act : {Activation::Gelu, Activation::ReluSquared}) {
    CAPTURE(int(act));
    expect_gradcheck([act](const Inputs& in) { return mlp(in[0], in[1], in[2], in[3], in[4], act); },
                     {leaf({2, 3, 4}, gen), leaf({6, 4}, gen), leaf({6}, gen), leaf({5, 6}, gen), leaf({5}, gen)});
    expect_gradcheck([act](const Inputs& in) { return mlp(in[0], in[1], Tensor(), in[2], Tensor(), act); },
                     {leaf({3, 4}, gen), leaf({6, 4}, gen), leaf({4, 6}, gen)});
  }
}

TEST_CASE("gradcheck: layer norm, embedding, cross-entropy, dropout, rotary embedding") {
  Generator gen(5);
  expect_gradcheck([](const Inputs& in) { return layer_norm(in[0], in[1], in[2]); },
                   {leaf({2, 3, 6}, gen), leaf({6}, gen), leaf({6}, gen)});
  expect_gradcheck([](const Inputs& in) { return layer_norm(in[0], in[1], Tensor()); },
                   {leaf({4, 5}, gen), leaf({5}, gen)});
  // The fused residual add and norm: both outputs, the sum also read by a second op (as the next residual add does).
  expect_gradcheck(
      [](const Inputs& in) {
        const auto [sum, normed] = add_layer_norm(in[0], in[1], in[2], in[3]);
        return concat({sum * 0.7, normed * normed}, 0);
      },
      {leaf({2, 3, 6}, gen), leaf({2, 3, 6}, gen), leaf({6}, gen), leaf({6}, gen)});
  expect_gradcheck([](const Inputs& in) { return add_layer_norm(in[0], in[1], in[2], Tensor()).second; },
                   {leaf({4, 5}, gen), leaf({4, 5}, gen), leaf({5}, gen)});
  // With the residual's dropout inside (a fixed seed: a fixed mask).
  expect_gradcheck(
      [](const Inputs& in) {
        const auto [sum, normed] = add_layer_norm(in[0], in[1], in[2], in[3], 1e-5, 0.4, 99);
        return concat({sum * 0.7, normed * normed}, 0);
      },
      {leaf({2, 3, 6}, gen), leaf({2, 3, 6}, gen), leaf({6}, gen), leaf({6}, gen)});
  const Tensor ids = from_vector(std::vector<int32_t>{1, 3, 1, 0, 3, 3}, {2, 3});  // repeated ids accumulate
  expect_gradcheck([ids](const Inputs& in) { return embedding(ids, in[0]); }, {leaf({4, 3}, gen)});
  const Tensor targets = from_vector(std::vector<int32_t>{2, -1, 0, 4, 1, -1}, {2, 3});
  expect_gradcheck([targets](const Inputs& in) { return cross_entropy(in[0], targets); }, {leaf({2, 3, 5}, gen, 2.0)});
  expect_gradcheck([](const Inputs& in) { return dropout(in[0], 0.4, 99); }, {leaf({4, 6}, gen)});
  expect_gradcheck([](const Inputs& in) { return rope(in[0], 4, 2, 3); }, {leaf({2, 5, 12}, gen)});
  // Llama 3's scaling with every band at E = 8: pair 0 kept, pair 1 blended, pairs 2 and 3 slowed.
  const RopeFreqs llama3(10000.0, RopeScaling{.factor = 8, .original_context = 64});
  expect_gradcheck([llama3](const Inputs& in) { return rope(in[0], 8, 1, 2, llama3); }, {leaf({2, 5, 16}, gen)});
}

TEST_CASE("gradcheck: RMSNorm (alone and after a residual add, with dropout) and SwiGLU") {
  Generator gen(15);
  expect_gradcheck([](const Inputs& in) { return rms_norm(in[0], in[1]); }, {leaf({2, 3, 6}, gen), leaf({6}, gen)});
  expect_gradcheck(
      [](const Inputs& in) {
        const auto [sum, normed] = add_rms_norm(in[0], in[1], in[2]);
        return concat({sum * 0.7, normed * normed}, 0);
      },
      {leaf({2, 3, 6}, gen), leaf({2, 3, 6}, gen), leaf({6}, gen)});
  expect_gradcheck(
      [](const Inputs& in) {
        const auto [sum, normed] = add_rms_norm(in[0], in[1], in[2], 1e-6, 0.4, 99);
        return concat({sum * 0.7, normed * normed}, 0);
      },
      {leaf({4, 5}, gen), leaf({4, 5}, gen), leaf({5}, gen)});
  // Gate values well into both tails of the sigmoid; the output read twice (fan-out into the gradient).
  expect_gradcheck(
      [](const Inputs& in) {
        const Tensor y = swiglu(in[0]);
        return y * y + y;
      },
      {leaf({2, 3, 8}, gen, 3.0)});
}

TEST_CASE("gradcheck: shape ops") {
  Generator gen(6);
  expect_gradcheck([](const Inputs& in) { return reshape(in[0], {4, -1}) * 1.5; }, {leaf({2, 3, 4}, gen)});
  expect_gradcheck([](const Inputs& in) { return permute(in[0], {2, 0, 1}); }, {leaf({2, 3, 4}, gen)});
  expect_gradcheck([](const Inputs& in) { return transpose(in[0], 1, 3); }, {leaf({2, 3, 2, 4}, gen)});
  expect_gradcheck([](const Inputs& in) { return narrow(in[0], 1, 1, 2); }, {leaf({2, 4, 3}, gen)});
  expect_gradcheck([](const Inputs& in) { return slice(in[0], -1, 1, -1); }, {leaf({2, 5}, gen)});
  expect_gradcheck([](const Inputs& in) { return split(in[0], 2, 0)[1] * split(in[0], 2, 0)[0]; }, {leaf({4, 3}, gen)});
  expect_gradcheck(
      [](const Inputs& in) {
        return concat({in[0], in[1], in[0]}, 1);
      },
      {leaf({2, 2, 3}, gen), leaf({2, 1, 3}, gen)});
}

TEST_CASE("gradcheck: fan-out, a deep chain and a composite expression") {
  Generator gen(7);
  // The same tensor feeds several ops.
  expect_gradcheck([](const Inputs& in) { return in[0] * in[0] + tanh(in[0]) * in[0]; }, {leaf({3, 3}, gen)});
  // 10,200 ops deep, with a gradient far from 0 and 1: y <- y + 0.001 tanh(y), 3,400 times.
  expect_gradcheck(
      [](const Inputs& in) {
        Tensor y = in[0];
        for (int i = 0; i < 3400; ++i) y = y + tanh(y) * 1e-3;
        return y;
      },
      {leaf({2}, gen)});
  // A tiny transformer-ish block: layer norm, projection, GELU, residual, log-softmax loss.
  const Tensor targets = from_vector(std::vector<int32_t>{1, 0, 3, 2}, {4});
  expect_gradcheck(
      [targets](const Inputs& in) {
        const Tensor& x = in[0];
        const Tensor h = gelu(linear(layer_norm(x, in[1], in[2]), in[3], in[4]));
        const Tensor y = x + linear(h, in[5]);
        return cross_entropy(y, targets) + mean(softmax(y) * y);
      },
      {leaf({4, 4}, gen), leaf({4}, gen), leaf({4}, gen), leaf({6, 4}, gen, 0.5), leaf({6}, gen),
       leaf({4, 6}, gen, 0.5)});
}

TEST_CASE("gradcheck: catches a wrong backward and names the element") {
  Generator gen(8);
  // exp with the backward of 2*exp: the check must fail.
  auto broken_exp = [](const Inputs& in) {
    Tensor out;
    {
      NoGradGuard no_grad;
      out = exp(in[0]);
    }
    const Tensor saved = out.detach();
    return record("broken_exp", out, {in[0]},
                  [saved](const Tensor& dout, std::span<const Tensor>, std::span<Tensor> g) {
                    accumulate_into(g[0], dout * saved * 2.0);
                  });
  };
  const GradcheckResult r = gradcheck(broken_exp, {leaf({3}, gen)});
  CHECK(!r.ok);
  CHECK(r.input == 0);
  CHECK(r.analytic == doctest::Approx(2 * r.numeric).epsilon(1e-6));
  CHECK(r.report.find("FAILED") != std::string::npos);
  // Inputs that are not f64 are refused.
  Tensor f32 = ones({2});
  f32.requires_grad_();
  CHECK_THROWS_AS(gradcheck([](const Inputs& in) { return in[0]; }, {f32}), Error);
}

// Every kernel of kernels/kernel_list.h and the f64 gradient check that runs its backward, or why it has none (a
// kernel added to the list without a row here fails to build this file: tests/kernel_cases.h).
constexpr std::string_view case_of(test::Kernel k) {
  using K = test::Kernel;
  switch (k) {
    case K::round_to_bf16:
    case K::widen_bf16:
    case K::accumulate_bf16:
      return "none: conversions with no gradient of their own (tests/test_bf16.cpp: rounds to nearest, ties to even)";
    case K::fill:
      return "none: no gradient";
    case K::axpy:
      return "fan-out, a deep chain and a composite expression (gradients accumulate by axpy)";
    case K::axpby:
      return "none: an optimizer's step, not an op (tests/test_optim.cpp, against PyTorch's Muon)";
    case K::sum_squares:
      return "none: records no gradient (the clipping norm); its value in tests/test_ops_forward.cpp";
    case K::adamw_update:
      return "none: an optimizer's step, not an op (tests/test_optim.cpp, against PyTorch)";
    case K::unary_forward:
    case K::unary_backward:
      return "unary ops";
    case K::binary_forward:
    case K::binary_backward:
      return "binary ops with broadcasting";
    case K::sum_forward:
    case K::sum_backward:
    case K::softmax_forward:
    case K::softmax_backward:
    case K::log_softmax_forward:
    case K::log_softmax_backward:
      return "reductions and softmax";
    case K::layernorm_forward:
    case K::add_layernorm_forward:
    case K::layernorm_backward:
    case K::embedding_forward:
    case K::embedding_backward:
    case K::crossentropy_forward:
    case K::crossentropy_backward:
    case K::crossentropy_fused:
    case K::dropout_forward:
    case K::dropout_backward:
    case K::rope_forward:
    case K::rope_backward:
      return "layer norm, embedding, cross-entropy, dropout, rotary embedding";
    case K::rmsnorm_forward:
    case K::add_rmsnorm_forward:
    case K::rmsnorm_backward:
    case K::swiglu_forward:
    case K::swiglu_backward:
      return "RMSNorm (alone and after a residual add, with dropout) and SwiGLU";
    case K::permute:
    case K::copy_slice:
      return "shape ops";
    case K::matmul_forward:
    case K::matmul_backward:
    case K::linear_forward:
    case K::linear_backward:
      return "matmul in every layout, and linear";
    case K::attention_naive_forward:
    case K::attention_naive_backward:
    case K::attention_flash_forward:
    case K::attention_flash_backward:
      return "tests/test_attention.cpp: gradient checks of both implementations; tests/test_score_mods.cpp: tables";
    case K::attention_flash_forward_bf16:
    case K::attention_flash_backward_bf16:
      return "none: bf16 storage has no f64 form; against f32 attention in tests/attention_bf16_case.h";
  }
  return "";
}
TINYGPT_EVERY_KERNEL_HAS_A_CASE()

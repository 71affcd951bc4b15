// The attention op and nn::MultiHeadAttention: flash against naive (values and gradients), gradient
// checks of both implementations, masks, grouped-query heads, weights, and the module against the same
// computation composed from basic ops.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <set>
#include <string>

#include "autograd/attention.h"
#include "nn/attention.h"
#include "test_util.h"
#include "tests/attention_bf16_case.h"

using namespace tinygpt;
using tinygpt::test::check_close;
using tinygpt::test::expect_gradcheck;
using tinygpt::test::leaf;
using Inputs = std::vector<Tensor>;

namespace {

/// (B, 2, T, E) key or value heads -> (B, 4, T, E): each repeated for the two query heads that read it.
Tensor repeat_2_kv_heads(const Tensor& t) {
  return concat({narrow(t, 1, 0, 1), narrow(t, 1, 0, 1), narrow(t, 1, 1, 1), narrow(t, 1, 1, 1)}, 1);
}

struct Case {
  int64_t B, NH, NKV, T, S, E, Ev;
  bool causal, padding, mask, bool_mask, dropout;
};

AttentionOptions options_for(const Case& c, Generator& gen, AttentionImpl impl) {
  AttentionOptions o;
  o.is_causal = c.causal;
  o.impl = impl;
  if (c.padding) {
    std::vector<uint8_t> pad(size_t(c.B * c.S), 0);
    for (int64_t s = 0; s < c.S; s += 3) pad[size_t(s)] = 1;  // every third key of batch 0 ignored
    if (c.B > 1) std::fill(pad.begin() + c.S, pad.end(), 1);  // batch 1: every key ignored -> zero rows
    o.key_padding_mask = from_vector(pad, {c.B, c.S});
  }
  if (c.mask) {
    if (c.bool_mask) {
      std::vector<uint8_t> m(size_t(c.T * c.S));
      for (auto& x : m) x = gen.uniform() < 0.3;
      o.attn_mask = from_vector(m, {c.T, c.S});  // broadcast over B and NH
    } else {
      Tensor m = randn({1, c.NH, c.T, c.S}, gen, DType::F64);
      o.attn_mask = m;
    }
  }
  if (c.dropout) {
    o.dropout_p = 0.3;
    o.dropout_seed = 77;
  }
  return o;
}

/// Flash, and the composed ops that return weights, agree with the naive kernel on the output and on all three
/// gradients (with dropout too: all three draw the same mask).
void check_implementations_agree(const Case& c, Generator& gen) {
  const Tensor q = leaf({c.B, c.NH, c.T, c.E}, gen), k = leaf({c.B, c.NKV, c.S, c.E}, gen),
               v = leaf({c.B, c.NKV, c.S, c.Ev}, gen);
  const Tensor dout = randn({c.B, c.NH, c.T, c.Ev}, gen, DType::F64);
  AttentionOptions naive = options_for(c, gen, AttentionImpl::Naive);
  AttentionOptions flash = naive, composed = naive;
  flash.impl = AttentionImpl::Flash;
  composed.impl = AttentionImpl::Auto;
  composed.need_weights = true;
  std::vector<Tensor> grads[3];
  Tensor outs[3];
  int i = 0;
  for (const AttentionOptions* o : {&naive, &flash, &composed}) {
    for (Tensor t : {q, k, v}) t.zero_grad();
    outs[i] = scaled_dot_product_attention(q, k, v, *o).out;
    outs[i].backward(dout);
    grads[i] = {q.grad(), k.grad(), v.grad()};
    ++i;
  }
  for (int other : {1, 2}) {
    CAPTURE(other);
    for (double x : outs[other].to_vector<double>()) REQUIRE(std::isfinite(x));
    check_close(outs[other], outs[0], 1e-10, 1e-8);
    for (int g = 0; g < 3; ++g) {
      CAPTURE(g);
      check_close(grads[other][size_t(g)], grads[0][size_t(g)], 1e-10, 1e-8);
    }
  }
}

}  // namespace

TEST_CASE("attention: flash and the weights path equal naive, forward and gradients, over shapes and masks") {
  Generator gen(11);
  const std::vector<Case> cases = {
      {1, 2, 2, 5, 5, 16, 16, false, false, false, false, false},
      {2, 4, 2, 7, 13, 32, 32, true, false, false, false, false},     // GQA, causal with T < S
      {2, 4, 1, 13, 7, 16, 24, true, false, false, false, false},     // MQA, causal with T > S, Ev != E
      {1, 2, 2, 1, 9, 64, 64, false, false, false, false, false},     // T = 1
      {2, 3, 3, 33, 33, 80, 80, false, true, false, false, false},    // padding: batch 1 fully masked
      {1, 4, 2, 17, 21, 128, 128, false, false, true, false, false},  // additive mask, per head
      {2, 2, 1, 9, 9, 32, 32, true, true, true, true, false},         // every mask at once, bool attn_mask
      {1, 2, 2, 65, 70, 16, 16, false, false, false, false, true},    // dropout with a fixed seed
      {2, 4, 2, 40, 40, 32, 16, true, true, false, false, true},
  };
  for (const Case& c : cases) {
    CAPTURE(c.T);
    CAPTURE(c.S);
    CAPTURE(c.E);
    check_implementations_agree(c, gen);
  }
}

TEST_CASE("attention: gradient checks of both implementations") {
  Generator gen(12);
  for (AttentionImpl impl : {AttentionImpl::Naive, AttentionImpl::Flash}) {
    const Case c{1, 4, 2, 5, 6, 4, 3, true, false, true, false, true};
    AttentionOptions o = options_for(c, gen, impl);
    o.key_padding_mask = from_vector(std::vector<uint8_t>{0, 1, 0, 0, 0, 0}, {1, 6});
    expect_gradcheck([o](const Inputs& in) { return scaled_dot_product_attention(in[0], in[1], in[2], o).out; },
                     {leaf({1, 4, 5, 4}, gen), leaf({1, 2, 6, 4}, gen), leaf({1, 2, 6, 3}, gen)});
    // From a fused projection: q, k and v are strided views of one tensor.
    AttentionOptions f;
    f.is_causal = true;
    f.impl = impl;
    expect_gradcheck([f](const Inputs& in) { return fused_self_attention(in[0], 2, 1, f).out; },
                     {leaf({2, 5, 4 * 4}, gen)});
  }
}

TEST_CASE("attention: a fully masked row gives zeros and zero gradients") {
  Generator gen(13);
  for (AttentionImpl impl : {AttentionImpl::Naive, AttentionImpl::Flash}) {
    const Tensor q = leaf({1, 1, 2, 8}, gen), k = leaf({1, 1, 3, 8}, gen), v = leaf({1, 1, 3, 8}, gen);
    AttentionOptions o;
    o.impl = impl;
    o.attn_mask = from_vector(std::vector<uint8_t>{1, 1, 1, 0, 1, 0}, {2, 3});  // row 0 sees nothing
    const Tensor out = scaled_dot_product_attention(q, k, v, o).out;
    sum(out).backward();
    const auto y = out.to_vector<double>();
    for (int e = 0; e < 8; ++e) CHECK(y[size_t(e)] == 0.0);
    for (double g : q.grad().to_vector<double>()) CHECK(std::isfinite(g));
    const auto dq = q.grad().to_vector<double>();
    for (int e = 0; e < 8; ++e) CHECK(dq[size_t(e)] == 0.0);
  }
}

TEST_CASE("attention: the returned weights are part of the graph (gradient checks in f64)") {
  Generator gen(19);
  // GQA, causal with T < S, a padded key, a per-head float mask and dropout: every input of the weights path.
  const Case c{1, 4, 2, 5, 6, 4, 3, true, false, true, false, true};
  AttentionOptions o = options_for(c, gen, AttentionImpl::Auto);
  o.key_padding_mask = from_vector(std::vector<uint8_t>{0, 1, 0, 0, 0, 0}, {1, 6});
  o.need_weights = true;
  const Inputs qkv = {leaf({1, 4, 5, 4}, gen), leaf({1, 2, 6, 4}, gen), leaf({1, 2, 6, 3}, gen)};
  expect_gradcheck([o](const Inputs& in) { return scaled_dot_product_attention(in[0], in[1], in[2], o).weights; }, qkv);
  expect_gradcheck(
      [o](const Inputs& in) { return mean(scaled_dot_product_attention(in[0], in[1], in[2], o).weights, 1); }, qkv);
  // A loss on both the output and the weights, read out of a fused projection.
  AttentionOptions f;
  f.is_causal = true;
  f.need_weights = true;
  expect_gradcheck(
      [f](const Inputs& in) {
        const AttentionResult r = fused_self_attention(in[0], 2, 1, f);
        return concat({reshape(r.out, {-1}), reshape(r.weights, {-1})}, 0);
      },
      {leaf({2, 5, 4 * 4}, gen)});
  const AttentionResult r = scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], o);
  CHECK(r.weights.requires_grad());
  AttentionOptions flash = o;
  flash.impl = AttentionImpl::Flash;
  CHECK_THROWS_WITH_AS(scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], flash), doctest::Contains("need_weights"),
                       Error);
}

TEST_CASE("attention: weights sum to one over unmasked keys, and match the output") {
  Generator gen(14);
  const Tensor q = randn({2, 2, 4, 8}, gen, DType::F64), k = randn({2, 2, 6, 8}, gen, DType::F64),
               v = randn({2, 2, 6, 8}, gen, DType::F64);
  AttentionOptions o;
  o.is_causal = true;  // bottom-right: query t sees keys s <= t + 2
  o.need_weights = true;
  o.key_padding_mask = from_vector(std::vector<uint8_t>{0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {2, 6});
  const AttentionResult r = scaled_dot_product_attention(q, k, v, o);
  const auto w = r.weights.to_vector<double>();
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t t = 0; t < 4; ++t) {
        double total = 0;
        for (int64_t s = 0; s < 6; ++s) {
          const double x = w[size_t(((b * 2 + h) * 4 + t) * 6 + s)];
          if (s > t + 2 || (b == 0 && s == 2)) CHECK(x == 0.0);
          total += x;
        }
        CHECK(total == doctest::Approx(1.0));
      }
  check_close(r.out, matmul(r.weights, v), 1e-12, 1e-10);
}

TEST_CASE("attention: grouped-query heads equal multi-head attention with repeated key/value heads") {
  Generator gen(15);
  const Tensor q = randn({1, 4, 5, 8}, gen, DType::F64), k = randn({1, 2, 5, 8}, gen, DType::F64),
               v = randn({1, 2, 5, 8}, gen, DType::F64);
  auto repeat = [](const Tensor& t) {  // (1, 2, S, E) -> (1, 4, S, E): heads 0,0,1,1
    return concat({narrow(t, 1, 0, 1), narrow(t, 1, 0, 1), narrow(t, 1, 1, 1), narrow(t, 1, 1, 1)}, 1);
  };
  AttentionOptions o;
  o.is_causal = true;
  check_close(scaled_dot_product_attention(q, k, v, o).out,
              scaled_dot_product_attention(q, repeat(k), repeat(v), o).out, 1e-12, 1e-10);
}

TEST_CASE("attention: shape and mask errors are named") {
  const Tensor q = zeros({1, 3, 4, 8}), k = zeros({1, 2, 4, 8});
  CHECK_THROWS_WITH_AS(scaled_dot_product_attention(q, k, k), doctest::Contains("not divisible"), Error);
  AttentionOptions o;
  o.key_padding_mask = zeros({1, 4});  // not bool
  CHECK_THROWS_WITH_AS(scaled_dot_product_attention(k, k, k, o), doctest::Contains("key_padding_mask"), Error);
  AttentionOptions m;
  m.attn_mask = from_vector(std::vector<uint8_t>{1, 0, 1}, {3});
  CHECK_THROWS_WITH_AS(scaled_dot_product_attention(k, k, k, m), doctest::Contains("attn_mask must broadcast"), Error);
}

TEST_CASE("MultiHeadAttention: self-attention equals the computation composed from basic ops") {
  Generator gen(16);
  for (bool rope_on : {false, true}) {
    CAPTURE(rope_on);
    nn::MultiHeadAttention mha({.embed_dim = 16, .num_heads = 4, .num_kv_heads = 2, .rope = rope_on}, gen);
    const Tensor x = randn({2, 5, 16}, gen);
    const Tensor pad = from_vector(std::vector<uint8_t>{0, 0, 0, 1, 0, 0, 0, 0, 0, 0}, {2, 5});
    const auto got = mha.forward(
        x, x, x, {.key_padding_mask = pad, .is_causal = true, .need_weights = true, .average_attn_weights = false});
    // Reference: separate projections, explicit head split, masked softmax, merge, output projection.
    const int64_t B = 2, T = 5, NH = 4, NKV = 2, E = 4;
    Tensor qkv = linear(x, mha.c_attn->weight, mha.c_attn->bias);  // (B, T, (4 + 2 + 2) * 4)
    if (rope_on) qkv = rope(qkv, E, NH + NKV);
    auto heads = [&](int64_t first, int64_t count) {  // -> (B, count, T, E)
      return permute(reshape(narrow(qkv, 2, first * E, count * E), {B, T, count, E}), {0, 2, 1, 3});
    };
    const Tensor q = heads(0, NH), k = heads(NH, NKV), v = heads(NH + NKV, NKV);
    std::vector<float> bias(size_t(B * T * T), 0.0f);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t s = 0; s < T; ++s)
          if (s > t || (b == 0 && s == 3)) bias[size_t((b * T + t) * T + s)] = -1e30f;
    const Tensor scores = matmul(q, repeat_2_kv_heads(k), false, true) * (1.0 / std::sqrt(double(E))) +
                          reshape(from_vector(bias, {B, T, T}), {B, 1, T, T});
    const Tensor p = softmax(scores);
    const Tensor merged = reshape(permute(matmul(p, repeat_2_kv_heads(v)), {0, 2, 1, 3}), {B, T, NH * E});
    check_close(got.out, linear(merged, mha.c_proj.weight, mha.c_proj.bias), 1e-5, 1e-4);
    check_close(got.weights, p, 1e-6, 1e-4);
  }
}

TEST_CASE("MultiHeadAttention: cross-attention, kdim/vdim, averaged weights, gradient check") {
  Generator gen(17);
  nn::MultiHeadAttention cross({.embed_dim = 8, .num_heads = 2, .kdim = 6, .vdim = 5}, gen);
  const Tensor q = randn({2, 3, 8}, gen), kv_k = randn({2, 7, 6}, gen), kv_v = randn({2, 7, 5}, gen);
  const auto r = cross.forward(q, kv_k, kv_v, {.need_weights = true});
  CHECK(r.out.shape() == Shape{2, 3, 8});
  CHECK(r.weights.shape() == Shape{2, 3, 7});
  for (double s : sum(r.weights, -1).to_vector<float>()) CHECK(s == doctest::Approx(1.0));
  std::vector<std::string> names;
  for (auto& [n, t] : cross.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias",
                                          "v_proj.weight", "v_proj.bias", "c_proj.weight", "c_proj.bias"});
  CHECK_THROWS_WITH_AS(nn::MultiHeadAttention({.embed_dim = 10, .num_heads = 4}), doctest::Contains("not divisible"),
                       Error);
  CHECK_THROWS_AS(cross.forward(q, q, q), Error);  // key has the wrong width
}

TEST_CASE("MultiHeadAttention: gradient check of the whole module in f64") {
  Generator gen(18);
  nn::MultiHeadAttention mha({.embed_dim = 8, .num_heads = 4, .num_kv_heads = 2, .rope = true}, gen);
  // Move the parameters to f64 leaves and check every one through the module.
  std::vector<Tensor> params;
  for (auto& [name, p] : mha.named_parameters()) params.push_back(p);
  std::vector<Tensor> inputs = {leaf({2, 4, 8}, gen)};
  for (Tensor& p : params) {
    Tensor d = p.detach().to(DType::F64);
    d.requires_grad_();
    inputs.push_back(d);
  }
  nn::MultiHeadAttention* m = &mha;
  for (bool need_weights : {false, true}) {  // with weights: a loss on the averaged weights reaches every parameter
    CAPTURE(need_weights);
    expect_gradcheck(
        [m, need_weights](const Inputs& in) {
          // Point the module's tensors at the f64 inputs for this evaluation.
          m->c_attn->weight = in[1], m->c_attn->bias = in[2], m->c_proj.weight = in[3], m->c_proj.bias = in[4];
          const auto r = m->forward(in[0], in[0], in[0], {.is_causal = true, .need_weights = need_weights});
          return need_weights ? concat({reshape(r.out, {-1}), reshape(r.weights, {-1})}, 0) : r.out;
        },
        inputs);
  }
}

TEST_CASE("MultiHeadAttention with QK-norm: gradient check in f64 (self- and cross-attention), and its invariance") {
  Generator gen(19);
  for (const bool cross : {false, true}) {
    CAPTURE(cross);
    nn::MultiHeadAttention mha({.embed_dim = 8,
                                .num_heads = 4,
                                .num_kv_heads = 2,
                                .kdim = cross ? 6 : 0,
                                .vdim = cross ? 6 : 0,
                                .bias = false,
                                .rope = true,
                                .qk_norm = true},
                               gen);
    std::vector<Tensor> inputs = {leaf({2, 4, 8}, gen), leaf({2, 5, cross ? 6 : 8}, gen)};
    std::vector<Tensor*> slots;  // the module's tensors, pointed at the f64 inputs for each evaluation
    for (Tensor* t :
         {mha.c_attn ? &mha.c_attn->weight : &mha.q_proj->weight, mha.c_attn ? nullptr : &mha.k_proj->weight,
          mha.c_attn ? nullptr : &mha.v_proj->weight, &mha.c_proj.weight, &mha.q_norm->weight, &mha.k_norm->weight}) {
      if (t == nullptr) continue;
      Tensor d = t->detach().to(DType::F64);
      if (t == &mha.q_norm->weight || t == &mha.k_norm->weight) d = d + randn(d.shape(), gen, DType::F64) * 0.3;
      d = d.detach();
      d.requires_grad_();
      inputs.push_back(d);
      slots.push_back(t);
    }
    nn::MultiHeadAttention* m = &mha;
    expect_gradcheck(
        [m, slots, cross](const Inputs& in) {
          for (size_t i = 0; i < slots.size(); ++i) *slots[i] = in[i + 2];
          return cross ? m->forward(in[0], in[1], in[1]).out : m->forward(in[0], in[0], in[0], {.is_causal = true}).out;
        },
        inputs);
  }
  // LayerNorm makes each head's query and key blind to their scale: scaling the q and k rows of the fused projection
  // changes nothing; scaling the v rows scales the output (no biases), which QK-norm leaves alone. (Unit weights, so
  // LayerNorm's eps, 1e-5 beside a variance of about 8, does not show.)
  nn::MultiHeadAttention mha({.embed_dim = 8, .num_heads = 2, .bias = false, .qk_norm = true}, gen);
  NoGradGuard no_grad;
  const Tensor x = randn({2, 5, 8}, gen);
  mha.c_attn->weight = randn({24, 8}, gen);
  const Tensor before = mha.forward(x, x, x, {.is_causal = true}).out;
  const Tensor w = mha.c_attn->weight;
  auto scaled_rows = [&](int64_t first, int64_t count, double s) {
    std::vector<float> v = w.to_vector<float>();
    for (int64_t i = first * 8; i < (first + count) * 8; ++i) v[size_t(i)] *= float(s);
    return from_vector(v, w.shape());
  };
  mha.c_attn->weight = scaled_rows(0, 16, 3.0);  // every q and k row
  check_close(mha.forward(x, x, x, {.is_causal = true}).out, before, 1e-5);
  mha.c_attn->weight = scaled_rows(16, 8, 2.0);  // the v rows
  check_close(mha.forward(x, x, x, {.is_causal = true}).out, before * 2.0, 1e-5);
  // Without QK-norm the same q and k scaling sharpens the softmax: the output moves.
  Generator same(0);
  nn::MultiHeadAttention plain({.embed_dim = 8, .num_heads = 2, .bias = false}, same);
  plain.c_attn->weight = w, plain.c_proj.weight = mha.c_proj.weight;
  const Tensor plain_before = plain.forward(x, x, x, {.is_causal = true}).out;
  plain.c_attn->weight = scaled_rows(0, 16, 3.0);
  const auto moved = (plain.forward(x, x, x, {.is_causal = true}).out - plain_before).to_vector<float>();
  CHECK(std::any_of(moved.begin(), moved.end(), [](float d) { return std::abs(d) > 1e-2f; }));
}

TEST_CASE(
    "MultiHeadAttention: add_bias_kv and add_zero_attn with grouped-query heads equal the computation composed "
    "from basic ops, sequence-first") {
  Generator gen(20);
  const int64_t B = 2, T = 5, S = T + 2, NH = 4, NKV = 2, E = 4;
  nn::MultiHeadAttention mha({.embed_dim = 16,
                              .num_heads = 4,
                              .num_kv_heads = 2,
                              .add_bias_kv = true,
                              .add_zero_attn = true,
                              .batch_first = false},
                             gen);
  std::vector<std::string> names;
  for (auto& [n, t] : mha.named_parameters()) names.push_back(n);
  CHECK(names ==
        std::vector<std::string>{"bias_k", "bias_v", "c_attn.weight", "c_attn.bias", "c_proj.weight", "c_proj.bias"});
  CHECK(mha.bias_k.shape() == Shape{1, 1, NKV * E});  // one bias per key/value head
  CHECK(mha.bias_v.shape() == Shape{1, 1, NKV * E});
  const Tensor x = randn({T, B, 16}, gen);  // sequence-first
  const std::vector<uint8_t> pad_bits = {0, 0, 0, 1, 0, 0, 1, 0, 0, 0};
  const auto got = mha.forward(x, x, x,
                               {.key_padding_mask = from_vector(pad_bits, {B, T}),
                                .is_causal = true,
                                .need_weights = true,
                                .average_attn_weights = false});
  CHECK(got.out.shape() == Shape{T, B, 16});
  CHECK(got.weights.shape() == Shape{B, NH, T, S});  // the T keys, bias_k, the zero key
  // Reference: batch-first x, explicit heads, bias_k / bias_v and a zero row appended to every key/value head, causal
  // and padding over the T real keys only.
  const Tensor qkv = linear(transpose(x, 0, 1), mha.c_attn->weight, mha.c_attn->bias);  // (B, T, (4 + 2 + 2) * 4)
  auto heads = [&](int64_t first, int64_t count) {                                      // -> (B, count, T, E)
    return permute(reshape(narrow(qkv, 2, first * E, count * E), {B, T, count, E}), {0, 2, 1, 3});
  };
  auto appended = [&](const Tensor& t, const Tensor& bias) {  // (B, NKV, T, E) -> (B, NKV, T + 2, E)
    const Tensor b = zeros({B, NKV, 1, E}) + permute(reshape(bias, {1, 1, NKV, E}), {0, 2, 1, 3});
    return concat({t, b, zeros({B, NKV, 1, E})}, 2);
  };
  const Tensor q = heads(0, NH), k = appended(heads(NH, NKV), mha.bias_k),
               v = appended(heads(NH + NKV, NKV), mha.bias_v);
  std::vector<float> bias(size_t(B * T * S), 0.0f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t s = 0; s < T; ++s)
        if (s > t || pad_bits[size_t(b * T + s)]) bias[size_t((b * T + t) * S + s)] = -1e30f;
  const Tensor scores = matmul(q, repeat_2_kv_heads(k), false, true) * (1.0 / std::sqrt(double(E))) +
                        reshape(from_vector(bias, {B, T, S}), {B, 1, T, S});
  const Tensor p = softmax(scores);
  const Tensor merged = reshape(permute(matmul(p, repeat_2_kv_heads(v)), {0, 2, 1, 3}), {B, T, NH * E});
  check_close(got.out, transpose(linear(merged, mha.c_proj.weight, mha.c_proj.bias), 0, 1), 1e-5, 1e-4);
  check_close(got.weights, p, 1e-6, 1e-4);

  // is_causal is the causal mask over the real keys, padded: the same as that mask given as attn_mask, and it combines
  // with a float attn_mask as -inf at the causal positions.
  std::vector<uint8_t> causal(size_t(T * T), 0);
  std::vector<float> additive(size_t(T * T)), additive_causal(size_t(T * T));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < T; ++s) {
      causal[size_t(t * T + s)] = s > t;
      additive[size_t(t * T + s)] = float(0.1 * double(t - 2 * s));
      additive_causal[size_t(t * T + s)] =
          s > t ? -std::numeric_limits<float>::infinity() : additive[size_t(t * T + s)];
    }
  const auto with_mask = mha.forward(
      x, x, x, {.attn_mask = from_vector(causal, {T, T}), .need_weights = true, .average_attn_weights = false});
  const auto with_flag = mha.forward(x, x, x, {.is_causal = true, .need_weights = true, .average_attn_weights = false});
  check_close(with_flag.out, with_mask.out, 1e-6, 1e-6);
  check_close(with_flag.weights, with_mask.weights, 1e-6, 1e-6);
  const auto both = mha.forward(x, x, x, {.attn_mask = from_vector(additive, {T, T}), .is_causal = true});
  const auto folded = mha.forward(x, x, x, {.attn_mask = from_vector(additive_causal, {T, T})});
  check_close(both.out, folded.out, 1e-6, 1e-6);
}

TEST_CASE("MultiHeadAttention: batch_first = false is batch_first = true on transposed inputs, forward_cached too") {
  for (bool extra : {false, true}) {
    CAPTURE(extra);
    Generator gen_a(21), gen_b(21);  // the same parameters
    nn::MultiHeadAttention bf({.embed_dim = 8, .num_heads = 4, .num_kv_heads = 2, .add_bias_kv = extra}, gen_a);
    nn::MultiHeadAttention sf(
        {.embed_dim = 8, .num_heads = 4, .num_kv_heads = 2, .add_bias_kv = extra, .batch_first = false}, gen_b);
    Generator gen(22);
    const Tensor x = randn({2, 5, 8}, gen), mem = randn({2, 7, 8}, gen);
    const Tensor xs = transpose(x, 0, 1), ms = transpose(mem, 0, 1);
    const auto a = bf.forward(x, x, x, {.is_causal = true, .need_weights = true, .average_attn_weights = false});
    const auto b = sf.forward(xs, xs, xs, {.is_causal = true, .need_weights = true, .average_attn_weights = false});
    CHECK(b.out.shape() == Shape{5, 2, 8});
    check_close(b.out, transpose(a.out, 0, 1), 1e-6, 1e-6);
    check_close(b.weights, a.weights, 1e-6, 1e-6);  // (B, NH, T, S) in both layouts
    const Tensor pad = from_vector(std::vector<uint8_t>{0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0}, {2, 7});
    const auto c = bf.forward(x, mem, mem, {.key_padding_mask = pad, .need_weights = true});
    const auto d = sf.forward(xs, ms, ms, {.key_padding_mask = pad, .need_weights = true});
    check_close(d.out, transpose(c.out, 0, 1), 1e-6, 1e-6);
    check_close(d.weights, c.weights, 1e-6, 1e-6);
    if (!extra) {
      NoGradGuard no_grad;
      Tensor kb = zeros({2, 8, 4}), vb = zeros({2, 8, 4}), ks = zeros({2, 8, 4}), vs = zeros({2, 8, 4});
      const Tensor yb = bf.forward_cached(x, kb, vb, 0), ys = sf.forward_cached(xs, ks, vs, 0);
      CHECK(ys.shape() == Shape{5, 2, 8});
      check_close(ys, transpose(yb, 0, 1), 1e-6, 1e-6);
      check_close(yb, a.out, 1e-5, 1e-4);  // the cache's causal pass is forward's
    }
  }
}

TEST_CASE("MultiHeadAttention: gradient check with bias_k, bias_v, the zero key and sequence-first inputs in f64") {
  Generator gen(24);
  nn::MultiHeadAttention mha({.embed_dim = 8,
                              .num_heads = 4,
                              .num_kv_heads = 2,
                              .add_bias_kv = true,
                              .add_zero_attn = true,
                              .batch_first = false},
                             gen);
  auto f64_leaf = [](const Tensor& p) {
    Tensor d = p.detach().to(DType::F64);
    d.requires_grad_();
    return d;
  };
  const std::vector<Tensor> inputs = {
      leaf({4, 2, 8}, gen),      f64_leaf(mha.c_attn->weight), f64_leaf(mha.c_attn->bias), f64_leaf(mha.c_proj.weight),
      f64_leaf(mha.c_proj.bias), f64_leaf(mha.bias_k),         f64_leaf(mha.bias_v)};
  const Tensor pad = from_vector(std::vector<uint8_t>{0, 0, 1, 0, 0, 0, 0, 0}, {2, 4});
  nn::MultiHeadAttention* m = &mha;
  for (bool need_weights : {false, true}) {  // with weights: a loss on the per-head weights reaches bias_k too
    CAPTURE(need_weights);
    expect_gradcheck(
        [m, pad, need_weights](const Inputs& in) {
          m->c_attn->weight = in[1], m->c_attn->bias = in[2], m->c_proj.weight = in[3], m->c_proj.bias = in[4];
          m->bias_k = in[5], m->bias_v = in[6];
          const auto r = m->forward(in[0], in[0], in[0],
                                    {.key_padding_mask = pad,
                                     .is_causal = true,
                                     .need_weights = need_weights,
                                     .average_attn_weights = false});
          return need_weights ? concat({reshape(r.out, {-1}), reshape(r.weights, {-1})}, 0) : r.out;
        },
        inputs);
  }
}

TEST_CASE(
    "MultiHeadAttention: add_bias_kv, add_zero_attn and batch_first = false refuse what they cannot mean, named") {
  using Config = nn::MultiHeadAttentionConfig;
  auto build = [](const Config& c) { nn::MultiHeadAttention m(c); };
  CHECK_THROWS_WITH_AS(build({.embed_dim = 8, .num_heads = 2, .add_bias_kv = true, .rope = true}),
                       doctest::Contains("add_bias_kv and add_zero_attn append key positions"), Error);
  CHECK_THROWS_WITH_AS(build({.embed_dim = 8, .num_heads = 2, .add_zero_attn = true, .mods = {.max_rel = 2}}),
                       doctest::Contains("max_rel"), Error);
  CHECK_THROWS_WITH_AS(build({.embed_dim = 8, .num_heads = 2, .add_zero_attn = true, .mods = {.alibi = true}}),
                       doctest::Contains("alibi"), Error);
  CHECK_THROWS_WITH_AS(build({.embed_dim = 8, .num_heads = 2, .add_bias_kv = true, .mods = {.t5_buckets = 8}}),
                       doctest::Contains("t5_buckets"), Error);
  CHECK_THROWS_WITH_AS(build({.embed_dim = 8, .num_heads = 2, .add_bias_kv = true, .mods = {.window = 3}}),
                       doctest::Contains("window"), Error);
  CHECK_NOTHROW(
      build({.embed_dim = 8, .num_heads = 2, .add_bias_kv = true, .add_zero_attn = true, .mods = {.softcap = 5.0}}));

  Generator gen(23);
  nn::MultiHeadAttention mha({.embed_dim = 8, .num_heads = 2, .add_bias_kv = true, .add_zero_attn = true}, gen);
  const Tensor x = randn({2, 5, 8}, gen);
  {
    NoGradGuard no_grad;
    Tensor kc = zeros({2, 8, 8}), vc = zeros({2, 8, 8});
    CHECK_THROWS_WITH_AS(mha.forward_cached(x, kc, vc, 0),
                         doctest::Contains("forward_cached does not support add_bias_kv"), Error);
  }
  const Tensor docs = from_vector(std::vector<int32_t>(10, 0), {2, 5});
  CHECK_THROWS_WITH_AS(mha.forward(x, x, x, {.doc_ids = docs}),
                       doctest::Contains("doc_ids with add_bias_kv or add_zero_attn"), Error);
  CHECK_THROWS_WITH_AS(mha.forward(x, x, x, {.key_padding_mask = zeros({2, 5})}),
                       doctest::Contains("key_padding_mask must be a bool"), Error);
  CHECK_THROWS_WITH_AS(mha.forward(x, x, x, {.attn_mask = from_vector(std::vector<uint8_t>(10, 0), {5, 2})}),
                       doctest::Contains("does not end in the 5 keys"), Error);

  nn::MultiHeadAttention sf({.embed_dim = 8, .num_heads = 2, .batch_first = false}, gen);
  const Tensor mem = randn({3, 2, 8}, gen);  // (S, B, E), but x read sequence-first has B = 5
  CHECK_THROWS_WITH_AS(sf.forward(x, mem, mem), doctest::Contains("key must be (S, B, 8)"), Error);
  CHECK_THROWS_WITH_AS(sf.forward(randn({5, 2, 6}, gen), mem, mem), doctest::Contains("query must be (T, B, 8)"),
                       Error);
}

TEST_CASE("attention on bf16 tensors tracks the f32 op with bf16 operands (CPU: the bf16-storage forward's twin)") {
  for (const int64_t E : {64, 128}) test::check_bf16_attention_tracks_f32(Device::CPU, true, E);
  test::check_bf16_attention_tracks_f32(Device::CPU, false, 64);
  test::check_bf16_attention_tracks_f32(Device::CPU, true, 64, /*misaligned_dout=*/true);
  // The CPU's kernels take any head dim (widening tile by tile) and dropout; key padding still goes through f32.
  test::check_bf16_attention_tracks_f32(Device::CPU, true, 32);
  test::check_bf16_attention_tracks_f32(Device::CPU, true, 24, false, /*dropout=*/0.2);
  test::check_bf16_attention_tracks_f32(Device::CPU, false, 24, false, /*dropout=*/0.2);
}

// The op's one decision (attention_paths in autograd/attention.h): every path is taken by some call, each call by the
// path the list's order says, and what each computes is what the naive kernel computes on the same values.
TEST_CASE("attention: the paths in order: every one taken by its calls, each equal to the naive kernel") {
  Generator gen(17);
  const int64_t B = 2, NH = 2, T = 9, E = 8;
  const Tensor q = randn({B, NH, T, E}, gen), k = randn({B, NH, T, E}, gen), v = randn({B, NH, T, E}, gen);
  const Tensor pad = from_vector(std::vector<uint8_t>{0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0}, {B, T});
  struct Want {
    const char* path;
    bool bf16;
    AttentionOptions o;
  };
  std::vector<Want> calls;
  AttentionOptions causal;
  causal.is_causal = true;
  AttentionOptions padded = causal;
  padded.key_padding_mask = pad;
  AttentionOptions naive = causal;
  naive.impl = AttentionImpl::Naive;
  AttentionOptions weights = causal;
  weights.need_weights = true;
  AttentionOptions weights_alibi = weights;
  weights_alibi.mods.alibi = true;
  calls.push_back({"flash_bf16_storage", true, causal});
  calls.push_back({"bf16_through_f32", true, padded});
  calls.push_back({"weights_graph", false, weights});
  calls.push_back({"naive", false, naive});
  calls.push_back({"naive", false, weights_alibi});
  calls.push_back({"flash", false, causal});
  calls.push_back({"flash", false, padded});
  std::set<std::string_view> taken;
  for (const Want& w : calls) {
    const DType dt = w.bf16 ? DType::BF16 : DType::F32;
    const Tensor qd = q.to(dt), kd = k.to(dt), vd = v.to(dt);
    const std::string_view path = attention_path(qd, kd, vd, w.o);
    CAPTURE(std::string(path));
    CHECK(path == w.path);
    taken.insert(path);
    NoGradGuard no_grad;
    AttentionOptions reference = w.o;
    reference.impl = AttentionImpl::Naive;
    reference.need_weights = false;
    // bf16 tensors against the naive kernel on the same (rounded) values in f32, bf16 operands.
    const Tensor got = scaled_dot_product_attention(qd, kd, vd, w.o).out.to(DType::F32);
    if (w.bf16) reference.numerics.attention = AttentionMath::BF16;
    const Tensor want =
        scaled_dot_product_attention(qd.to(DType::F32), kd.to(DType::F32), vd.to(DType::F32), reference).out;
    check_close(got, want, w.bf16 ? 2e-2 : 1e-5, w.bf16 ? 2e-2 : 1e-5);
  }
  // Every path is taken but the GPU's tensor-core one, which no CPU tensor takes (tests/test_cuda.cpp asks it).
  const std::vector<std::string_view> paths = attention_paths();
  for (const std::string_view p : paths) {
    CAPTURE(std::string(p));
    CHECK(taken.count(p) == (p == "flash_tensor_cores" ? 0u : 1u));
  }
  CHECK(paths.size() == taken.size() + 1);
}

// Agreement with PyTorch on a committed fixture (tests/reference/make_attention_fixture.py): for every configuration,
// nn::MultiHeadAttention against torch.nn.MultiheadAttention (batch_first true and false, add_bias_kv and add_zero_attn
// with their bias_k / bias_v copied from torch), scaled_dot_product_attention with
// grouped-query heads against F.scaled_dot_product_attention on repeated k/v heads, and RoPE with grouped-query heads
// against a plain torch composition. Checked: the output, the attention weights, and the gradient of every input and
// parameter for loss = sum(out * dout) + sum(weights * dweights), so a loss on the weights must reach q, k and the
// projections as it does in torch. tinygpt computes in float32 from the fixture's float32 values; torch's reference
// was computed in float64.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cmath>

#include "autograd/attention.h"
#include "nn/attention.h"
#include "reference_fixture.h"
#include "train/safetensors.h"

using namespace tinygpt;
using test::check_against;
using test::Fixture;
using test::input_leaf;

namespace {

constexpr double kOutRtol = 1e-5, kOutFloor = 1e-5;    // outputs and weights: 1e-5 relative
constexpr double kGradRtol = 1e-4, kGradFloor = 1e-5;  // gradients: atol + rtol * |ref|

/// loss = sum(out * dout) + sum(weights * dweights), backpropagated.
void backward_loss(const Fixture& f, const Tensor& out, const Tensor& weights) {
  Tensor loss = sum(out * f.at("dout"));
  if (weights.defined()) loss = loss + sum(weights * f.at("dweights"));
  loss.backward();
}

void check_outputs(const Fixture& f, const Tensor& out, const Tensor& weights, bool need_weights) {
  check_against(out, f.at("expected.out"), kOutRtol, kOutFloor, "output");
  if (need_weights) {
    check_against(weights, f.at("expected.weights"), kOutRtol, kOutFloor, "attention weights");
  } else {
    CHECK(!weights.defined());
  }
}

void check_grad(const Fixture& f, const std::string& name, const Tensor& t) {
  check_against(t.grad(), f.at("expected.grad." + name), kGradRtol, kGradFloor, "gradient of " + name);
}

/// torch's attn_mask as tinygpt takes it: 2-D (T, S) broadcasts as it is; torch's per-head 3-D (B * NH, T, S)
/// holds batch-major blocks of NH heads, which is (B, NH, T, S).
Tensor attn_mask_for(const Fixture& f, int64_t B, int64_t NH) {
  const Tensor m = f.maybe("attn_mask");
  if (!m.defined() || m.ndim() != 3) return m;
  return reshape(m, {B, NH, m.size(1), m.size(2)});
}

void run_module_case(const Fixture& f, const nlohmann::json& c, int64_t B) {
  nn::MultiHeadAttentionConfig config;
  config.embed_dim = c.at("E");
  config.num_heads = c.at("NH");
  config.num_kv_heads = c.value("NKV", int64_t(0));
  config.kdim = c.value("kdim", int64_t(0));
  config.vdim = c.value("vdim", int64_t(0));
  config.bias = c.at("bias");
  config.rope = c.at("kind") == "mha_rope";
  config.add_bias_kv = c.value("add_bias_kv", false);
  config.add_zero_attn = c.value("add_zero_attn", false);
  config.batch_first = c.value("batch_first", true);  // false: the fixture's inputs, dout and output are (T, B, E)
  Generator gen(0);
  nn::MultiHeadAttention mha(config, gen);
  for (auto& [name, p] : mha.named_parameters()) p.copy_(f.at(name));  // bias_k, bias_v: (1, 1, E) as torch's
  CHECK(mha.bias_k.defined() == config.add_bias_kv);

  const bool self = c.at("self");
  const bool need_weights = c.at("need_weights");
  const Tensor x = self ? input_leaf(f, "x") : Tensor();
  const Tensor query = self ? x : input_leaf(f, "query");
  const Tensor key = self ? x : input_leaf(f, "key");
  const Tensor value = self ? x : input_leaf(f, "value");
  // With appended keys torch got the causal mask itself (combined with the case's attn_mask); tinygpt gets is_causal.
  const auto r = mha.forward(query, key, value,
                             {.key_padding_mask = f.maybe("key_padding_mask"),
                              .attn_mask = attn_mask_for(f, B, config.num_heads),
                              .is_causal = c.value("causal", false),
                              .need_weights = need_weights,
                              .average_attn_weights = c.value("average", true)});
  if (need_weights) {  // S plus the appended bias and zero key positions
    CHECK(r.weights.size(-1) == c.value("S_total", c.at("S").get<int64_t>()));
  }
  check_outputs(f, r.out, r.weights, need_weights);
  backward_loss(f, r.out, r.weights);
  for (const auto& [name, p] : mha.named_parameters()) check_grad(f, name, p);
  if (self) {
    check_grad(f, "x", x);
  } else {
    check_grad(f, "query", query);
    check_grad(f, "key", key);
    check_grad(f, "value", value);
  }
}

void run_sdpa_case(const Fixture& f, const nlohmann::json& c) {
  const Tensor q = input_leaf(f, "q"), k = input_leaf(f, "k"), v = input_leaf(f, "v");
  AttentionOptions o;
  o.is_causal = c.value("causal", false);
  o.need_weights = c.at("need_weights");
  o.key_padding_mask = f.maybe("key_padding_mask");
  o.attn_mask = f.maybe("attn_mask");
  const AttentionResult r = scaled_dot_product_attention(q, k, v, o);
  check_outputs(f, r.out, r.weights, o.need_weights);
  backward_loss(f, r.out, r.weights);
  check_grad(f, "q", q);
  check_grad(f, "k", k);
  check_grad(f, "v", v);
}

}  // namespace

TEST_CASE(
    "attention agrees with PyTorch: outputs, weights and every gradient "
    "(tests/reference/attention_fixture.safetensors)") {
  Fixture f{safetensors::load(test::reference_fixture("TINYGPT_ATTENTION_FIXTURE", "attention_fixture.safetensors")),
            ""};
  const auto cases = nlohmann::json::parse(f.contents.metadata.at("cases"));
  const int64_t B = std::stoll(f.contents.metadata.at("B"));
  REQUIRE(cases.size() >= 35);
  for (const auto& c : cases) {
    const std::string name = c.at("name");
    CAPTURE(name);
    f.prefix = name + ".";
    if (c.at("kind") == "sdpa") {
      run_sdpa_case(f, c);
    } else {
      run_module_case(f, c, B);
    }
  }
}

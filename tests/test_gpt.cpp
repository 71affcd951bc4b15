// nn::GPT: nanoGPT's names and sizes, GPT-2 initialization, the KV cache against the full forward pass,
// generation, and agreement with PyTorch on a committed fixture (tests/reference/make_gpt_fixture.py).
#include <doctest/doctest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "autograd/ops.h"
#include "nn/gpt.h"
#include "train/checkpoint.h"
#include "train/generate.h"
#include "train/safetensors.h"

using namespace tinygpt;

namespace {

nn::GPTConfig tiny_config() {
  nn::GPTConfig c;
  c.vocab_size = 11;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  c.bias = true;
  return c;
}

Tensor random_ids(int64_t B, int64_t T, int64_t vocab, Generator& gen) {
  std::vector<int32_t> ids(size_t(B * T));
  for (auto& id : ids) id = int32_t(gen.next_u64() % uint64_t(vocab));
  return from_vector(ids, {B, T});
}

/// Columns [start, start + len) of a (B, T) id tensor.
Tensor id_columns(const Tensor& ids, int64_t start, int64_t len) {
  const auto v = ids.to_vector<int32_t>();
  const int64_t B = ids.size(0), T = ids.size(1);
  std::vector<int32_t> out;
  for (int64_t b = 0; b < B; ++b) out.insert(out.end(), v.begin() + b * T + start, v.begin() + b * T + start + len);
  return from_vector(out, {B, len});
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  const auto x = a.to_vector<float>(), y = b.to_vector<float>();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, double(std::abs(x[i] - y[i])));
  return m;
}

}  // namespace

TEST_CASE("gpt: parameter names are nanoGPT's, in its order") {
  nn::GPTConfig c = tiny_config();
  c.n_layer = 1;
  Generator gen(1);
  const nn::GPT model(c, gen);
  std::vector<std::string> names;
  for (const auto& [name, t] : model.named_parameters()) names.push_back(name);
  const std::vector<std::string> expected = {
      "transformer.wte.weight",          "transformer.wpe.weight",           "transformer.h.0.ln_1.weight",
      "transformer.h.0.ln_1.bias",       "transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_attn.bias",
      "transformer.h.0.attn.c_proj.weight", "transformer.h.0.attn.c_proj.bias", "transformer.h.0.ln_2.weight",
      "transformer.h.0.ln_2.bias",       "transformer.h.0.mlp.c_fc.weight",  "transformer.h.0.mlp.c_fc.bias",
      "transformer.h.0.mlp.c_proj.weight", "transformer.h.0.mlp.c_proj.bias", "transformer.ln_f.weight",
      "transformer.ln_f.bias"};
  CHECK(names == expected);
}

TEST_CASE("gpt: parameter count of nanoGPT's CPU Shakespeare recipe (nanoGPT prints 0.80M)") {
  nn::GPTConfig c;
  c.vocab_size = 65, c.block_size = 64, c.n_layer = 4, c.n_head = 4, c.n_embd = 128, c.bias = false;
  Generator gen(1);
  const nn::GPT model(c, gen);
  // Per block: 2 LayerNorm gains (2 * 128) + c_attn (384 * 128) + c_proj (128 * 128) + MLP (2 * 512 * 128);
  // plus wte (65 * 128) and ln_f (128); wpe (64 * 128) is left out, as nanoGPT counts.
  CHECK(model.num_parameters_non_embedding() == 4 * (256 + 49152 + 16384 + 131072) + 8320 + 128);
  CHECK(model.num_parameters() == model.num_parameters_non_embedding() + 64 * 128);
}

TEST_CASE("gpt: GPT-2 initialization (0.02, residual projections 0.02 / sqrt(2 n_layer), zero biases, unit gains)") {
  nn::GPTConfig c = tiny_config();
  c.n_layer = 8, c.n_embd = 64;
  Generator gen(7);
  const nn::GPT model(c, gen);
  auto stddev = [](const Tensor& t) {
    const auto v = t.to_vector<float>();
    double s = 0;
    for (float x : v) s += double(x) * x;
    return std::sqrt(s / double(v.size()));
  };
  CHECK(stddev(model.h[0]->attn.c_attn->weight) == doctest::Approx(0.02).epsilon(0.05));
  CHECK(stddev(model.h[0]->mlp.c_fc.weight) == doctest::Approx(0.02).epsilon(0.05));
  CHECK(stddev(model.h[0]->attn.c_proj.weight) == doctest::Approx(0.02 / 4.0).epsilon(0.05));
  CHECK(stddev(model.h[0]->mlp.c_proj.weight) == doctest::Approx(0.02 / 4.0).epsilon(0.05));
  CHECK(stddev(model.h[0]->mlp.c_proj.bias) == 0.0);
  CHECK(model.ln_f.weight.to_vector<float>() == std::vector<float>(64, 1.0f));
}

TEST_CASE("gpt: bad configs are refused with the field named") {
  nn::GPTConfig c = tiny_config();
  c.n_embd = 30;
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("n_embd (30) must be divisible by n_head (4)"), Error);
  c = tiny_config();
  c.n_kv_head = 3;
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("divisible by n_kv_head (3)"), Error);
  c = tiny_config();
  c.block_size = 0;
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("block_size must be positive"), Error);
  Generator gen(1);
  const nn::GPT model(tiny_config(), gen);
  CHECK_THROWS_WITH_AS(model.forward(random_ids(1, 17, 11, gen)), doctest::Contains("longer than the block size 16"), Error);
}

TEST_CASE("gpt: the loss at initialization is about ln(vocab), and backward reaches every parameter") {
  Generator gen(3);
  const nn::GPT model(tiny_config(), gen);
  const auto out = model.forward(random_ids(4, 16, 11, gen), random_ids(4, 16, 11, gen));
  CHECK(out.logits.shape() == Shape{4, 16, 11});
  CHECK(out.loss.item() == doctest::Approx(std::log(11.0)).epsilon(0.05));
  out.loss.backward();
  for (const auto& [name, p] : model.named_parameters()) {
    INFO(name);
    REQUIRE(p.grad().defined());
    const auto g = p.grad().to_vector<float>();
    CHECK(std::any_of(g.begin(), g.end(), [](float x) { return x != 0.0f; }));
  }
}

TEST_CASE("gpt: the KV cache gives the full forward pass's logits, position by position and in chunks") {
  for (const auto& [rope, kv_heads] : {std::pair{false, 0}, {true, 2}, {true, 1}}) {
    CAPTURE(rope);
    CAPTURE(kv_heads);
    nn::GPTConfig c = tiny_config();
    c.rope = rope;
    c.n_kv_head = kv_heads;
    Generator gen(11);
    nn::GPT model(c, gen);
    model.train(false);
    NoGradGuard no_grad;
    const Tensor ids = random_ids(2, 16, 11, gen);
    const Tensor full = model.forward(ids).logits;  // (2, 16, 11)
    nn::KVCache cache = model.make_cache(2);
    // A 5-token chunk, then one token at a time.
    Tensor last = model.forward_cached(id_columns(ids, 0, 5), cache);
    CHECK(max_abs_diff(last, reshape(narrow(full, 1, 4, 1), {2, 11})) < 1e-5);
    for (int64_t t = 5; t < 16; ++t) {
      last = model.forward_cached(id_columns(ids, t, 1), cache);
      CHECK(max_abs_diff(last, reshape(narrow(full, 1, t, 1), {2, 11})) < 1e-5);
    }
    CHECK(cache.len == 16);
    CHECK_THROWS_WITH_AS(model.forward_cached(id_columns(ids, 0, 1), cache),
                         doctest::Contains("exceed the block size"), Error);
  }
}

TEST_CASE("generate: same seed, same text; the cache changes nothing until the context is cropped") {
  Generator init(5);
  nn::GPT model(tiny_config(), init);
  model.train(false);
  const std::vector<int32_t> prompt = {1, 2, 3};
  GenerateOptions o;
  o.max_new_tokens = 13;  // prompt + 13 = block_size: no crop yet
  o.temperature = 1.0;
  o.top_k = 0;
  Generator g1(42), g2(42), g3(42), g4(43);
  const auto with_cache = generate(model, prompt, o, g1);
  o.kv_cache = false;
  const auto without = generate(model, prompt, o, g2);
  CHECK(with_cache == without);
  CHECK(generate(model, prompt, o, g3) == without);
  CHECK(generate(model, prompt, o, g4) != without);
  o.max_new_tokens = 100;  // far past block_size, both ways
  o.kv_cache = true;
  Generator g5(1), g6(1);
  CHECK(generate(model, prompt, o, g5).size() == 100);
  o.kv_cache = false;
  CHECK(generate(model, prompt, o, g6).size() == 100);
}

TEST_CASE("sample_token: temperature 0 and top-k 1 pick the argmax; top-k never picks outside the k best") {
  Generator gen(9);
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.5f, 0.3f};
  CHECK(sample_token(logits, 0.0, 0, gen) == 1);
  CHECK(sample_token(logits, 1.0, 1, gen) == 1);
  for (int i = 0; i < 200; ++i) {
    const int32_t t = sample_token(logits, 2.0, 2, gen);
    CHECK((t == 1 || t == 3));
  }
}

TEST_CASE("gpt agrees with PyTorch: logits, loss and every gradient (tests/reference/gpt_fixture.safetensors)") {
  const auto fixture = safetensors::load(std::string(TINYGPT_SOURCE_DIR) + "/tests/reference/gpt_fixture.safetensors");
  const nn::GPTConfig c = gpt_config_from_json(nlohmann::json::parse(fixture.metadata.at("config")));
  Generator gen(0);
  nn::GPT model(c, gen);
  for (auto& [name, p] : model.named_parameters()) {
    INFO(name);
    const Tensor w = fixture.find(name);
    REQUIRE(w.defined());
    p.copy_(w);
  }
  const auto out = model.forward(fixture.find("input.x"), fixture.find("input.y"));
  const double ref_loss = fixture.find("expected.loss").item();
  CHECK(std::abs(out.loss.item() - ref_loss) <= 1e-5 * std::abs(ref_loss));
  const auto logits = out.logits.to_vector<float>();
  const auto ref_logits = fixture.find("expected.logits").to_vector<double>();
  REQUIRE(logits.size() == ref_logits.size());
  for (size_t i = 0; i < logits.size(); ++i) CHECK(std::abs(logits[i] - ref_logits[i]) <= 1e-5 + 1e-4 * std::abs(ref_logits[i]));
  out.loss.backward();
  for (const auto& [name, p] : model.named_parameters()) {
    INFO(name);
    const auto g = p.grad().to_vector<float>();
    const auto ref = fixture.find("expected.grad." + name).to_vector<double>();
    REQUIRE(g.size() == ref.size());
    double worst = 0;
    for (size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::abs(g[i] - ref[i]) - (1e-6 + 1e-3 * std::abs(ref[i])));
    CHECK(worst <= 0.0);
  }
}

// nn::GPT: nanoGPT's names and sizes, GPT-2 initialization, the KV cache against the full forward pass,
// generation, and agreement with PyTorch on a committed fixture (tests/reference/make_gpt_fixture.py).
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <set>

#include "autograd/ops.h"
#include "nn/gpt.h"
#include "test_util.h"
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

/// Feeds ids (B, T) through a fresh KV cache, the first `chunk` positions at once and then one at a time, and checks
/// the logits of each step against the full pass's (B, T, V) at the same position. Returns the filled cache.
nn::KVCache check_cache_matches_full(const nn::GPT& model, const Tensor& ids, const Tensor& full, int64_t chunk) {
  const int64_t B = ids.size(0), T = ids.size(1), V = full.size(2);
  nn::KVCache cache = model.make_cache(B);
  Tensor last = model.forward_cached(id_columns(ids, 0, chunk), cache);
  CHECK(max_abs_diff(last, reshape(narrow(full, 1, chunk - 1, 1), {B, V})) < 1e-5);
  for (int64_t t = chunk; t < T; ++t) {
    CAPTURE(t);
    last = model.forward_cached(id_columns(ids, t, 1), cache);
    CHECK(max_abs_diff(last, reshape(narrow(full, 1, t, 1), {B, V})) < 1e-5);
  }
  return cache;
}

}  // namespace

TEST_CASE("gpt: parameter names are nanoGPT's, in its order") {
  nn::GPTConfig c = tiny_config();
  c.n_layer = 1;
  Generator gen(1);
  const nn::GPT model(c, gen);
  std::vector<std::string> names;
  for (const auto& [name, t] : model.named_parameters()) names.push_back(name);
  const std::vector<std::string> expected = {"transformer.wte.weight",
                                             "transformer.wpe.weight",
                                             "transformer.h.0.ln_1.weight",
                                             "transformer.h.0.ln_1.bias",
                                             "transformer.h.0.attn.c_attn.weight",
                                             "transformer.h.0.attn.c_attn.bias",
                                             "transformer.h.0.attn.c_proj.weight",
                                             "transformer.h.0.attn.c_proj.bias",
                                             "transformer.h.0.ln_2.weight",
                                             "transformer.h.0.ln_2.bias",
                                             "transformer.h.0.mlp.c_fc.weight",
                                             "transformer.h.0.mlp.c_fc.bias",
                                             "transformer.h.0.mlp.c_proj.weight",
                                             "transformer.h.0.mlp.c_proj.bias",
                                             "transformer.ln_f.weight",
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
  CHECK_THROWS_WITH_AS(model.forward(random_ids(1, 17, 11, gen)), doctest::Contains("longer than the block size 16"),
                       Error);
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

TEST_CASE(
    "gpt: bf16 storage: bf16 activations from the embedding on, f32 loss and f32 gradients close to f32 storage's") {
  // The same model and batch with bf16 products (f32 tensors), then with bf16 storage: every activation rounded to bf16
  // between ops, the weights read through their bf16 working copies. The loss is f32 and close; every parameter's
  // gradient lands in its f32 master and is close to the f32 run's (relative to its largest element: the values
  // are sums of thousands of rounded terms). Positions learned and rotary, with and without dropout; head dims 8
  // and 64 (the 6-layer model's).
  for (const auto pos : {nn::Positions::Learned, nn::Positions::Rope})
    for (const int64_t head_dim : {8, 64}) {
      for (const double dropout : {0.0, 0.1}) {
        CAPTURE(int(pos));
        CAPTURE(dropout);
        CAPTURE(head_dim);
        nn::GPTConfig c = tiny_config();
        c.pos = pos;
        c.dropout = dropout;
        c.n_embd = c.n_head * head_dim;
        Generator gen(5);
        nn::GPT model(c, gen);
        const Tensor ids = random_ids(3, 16, 11, gen), targets = random_ids(3, 16, 11, gen);
        Numerics n;
        n.bf16 = true;
        model.set_numerics(n);
        Generator& g = gen;  // the model draws its dropout seeds from it
        const auto rng = g.state();
        const auto ref = model.forward(ids, targets);
        ref.loss.backward();
        std::vector<Tensor> ref_grads;
        for (const Tensor& p : model.parameters()) ref_grads.push_back(p.grad().clone());
        model.zero_grad();
        n.bf16_storage = true;
        model.set_numerics(n);
        g.set_state(rng);
        const auto out = model.forward(ids, targets);
        CHECK(out.logits.dtype() == DType::BF16);
        CHECK(out.loss.dtype() == DType::F32);
        CHECK(std::abs(out.loss.item() - ref.loss.item()) < 0.01);
        out.loss.backward();
        const auto params = model.named_parameters();
        for (size_t i = 0; i < params.size(); ++i) {
          INFO(params[i].first);
          const Tensor grad = params[i].second.grad();
          REQUIRE(grad.defined());
          CHECK(grad.dtype() == DType::F32);
          const std::vector<float> a = grad.to_vector<float>(), b = ref_grads[i].to_vector<float>();
          double largest = 0, diff = 0;
          for (size_t k = 0; k < a.size(); ++k) {
            largest = std::max(largest, double(std::abs(b[k])));
            diff = std::max(diff, double(std::abs(a[k] - b[k])));
          }
          CHECK(diff <= 0.05 * largest + 1e-6);
        }
      }
    }
}

TEST_CASE("gpt: every dropout seed adds the generator's offset, read when the kernels run (a captured step's masks)") {
  // The trainer seeds the model's generator the same way every step and writes each step's offset to memory, so a
  // CUDA graph that captured the seeds replays with new masks each step. Here: the same seeds with the same offset
  // give the same loss, another offset another one, and no offset is offset 0.
  nn::GPTConfig c = tiny_config();
  c.dropout = 0.2;
  Generator gen(4);
  nn::GPT model(c, gen);
  model.train(true);
  Generator data(5);
  const Tensor ids = random_ids(2, 16, c.vocab_size, data), targets = random_ids(2, 16, c.vocab_size, data);
  uint64_t offset = 0;
  gen.set_dropout_offset(&offset);
  const auto loss_with = [&](uint64_t off) {
    offset = off;
    gen.manual_seed(9);
    return model.forward(ids, targets).loss.item();
  };
  const double a = loss_with(1), b = loss_with(2);
  CHECK(loss_with(1) == a);
  CHECK(b != a);
  const double zero = loss_with(0);
  gen.set_dropout_offset(nullptr);
  gen.manual_seed(9);
  CHECK(model.forward(ids, targets).loss.item() == zero);
}

TEST_CASE(
    "gpt: bf16 storage reads the working copies, not the masters: a stale copy changes the loss until rewritten") {
  // The layers take each weight's bf16 working copy as it was last written; an optimizer step writes the copies
  // (FlatParameters::write_bf16_copies), and write_bf16_copies rewrites them after any other change of the masters.
  Generator gen(6);
  nn::GPT model(tiny_config(), gen);
  Numerics n;
  n.bf16 = n.bf16_storage = true;
  model.set_numerics(n);
  model.train(false);
  const Tensor ids = random_ids(2, 16, 11, gen), targets = random_ids(2, 16, 11, gen);
  const double before = model.forward(ids, targets).loss.item();
  {
    NoGradGuard no_grad;
    for (Tensor p : model.parameters()) p.copy_(scale(p, 1.5));  // the masters change; the copies do not
  }
  CHECK(model.forward(ids, targets).loss.item() == before);
  model.write_bf16_copies();
  CHECK(model.forward(ids, targets).loss.item() != before);
  for (const Tensor& p : model.parameters()) {
    REQUIRE(p.impl().bf16_copy);
    const Tensor copy(std::make_shared<TensorImpl>(p.impl().bf16_copy->storage, p.shape(), DType::BF16));
    CHECK(copy.to_vector<bf16>().size() == size_t(p.numel()));
    const std::vector<float> m = p.to_vector<float>();
    const std::vector<bf16> c16 = copy.to_vector<bf16>();
    size_t same = 0;
    for (size_t k = 0; k < m.size(); ++k) same += c16[k].bits == bf16(m[k]).bits;
    CHECK(same == m.size());  // each copy is its master rounded
  }
}

TEST_CASE("gpt: the forward pass (residual adds fused with the norms after them) matches the blocks one by one") {
  // With dropout too: the fused adds drop out the residual branch with the masks that dropout() draws, from the same
  // generator at the same points (the generator is wound back between the two passes).
  for (const double p : {0.0, 0.2}) {
    CAPTURE(p);
    nn::GPTConfig c = tiny_config();
    c.dropout = p;
    Generator gen(4);
    const nn::GPT model(c, gen);
    const Tensor ids = random_ids(2, 16, 11, gen), targets = random_ids(2, 16, 11, gen);
    auto gradients = [&](const Tensor& loss) {
      for (auto& [name, param] : model.named_parameters()) param.zero_grad();
      loss.backward();
      std::vector<Tensor> g;
      for (const auto& [name, param] : model.named_parameters()) g.push_back(param.grad().clone());
      return g;
    };
    const Generator before = gen;
    const Tensor fused = model.forward(ids, targets).loss;
    const auto fused_grads = gradients(fused);
    // The same model from its public pieces, each block through Block::forward (no fusion), the tied head.
    gen = before;
    std::vector<int32_t> pos(16);
    for (int32_t t = 0; t < 16; ++t) pos[size_t(t)] = t;
    Tensor x = dropout(model.wte.forward(ids) + model.wpe->forward(from_vector(pos, {16})), p, gen, true);
    for (const auto& block : model.h) x = block->forward(x, gen);
    const Tensor apart = cross_entropy(matmul(model.ln_f.forward(x), model.wte.weight, false, true), targets);
    CHECK(fused.item() == doctest::Approx(apart.item()).epsilon(1e-6));
    const auto apart_grads = gradients(apart);
    for (size_t i = 0; i < fused_grads.size(); ++i) {
      INFO("parameter " << model.named_parameters()[i].first);
      test::check_close(fused_grads[i], apart_grads[i], 1e-6, 1e-5);
    }
  }
}

TEST_CASE("gpt: the KV cache gives the full forward pass's logits, position by position and in chunks") {
  for (const auto& [rope, kv_heads] : {std::pair{false, 0}, {true, 2}, {true, 1}}) {
    CAPTURE(rope);
    CAPTURE(kv_heads);
    nn::GPTConfig c = tiny_config();
    c.pos = rope ? nn::Positions::Rope : nn::Positions::Learned;
    c.n_kv_head = kv_heads;
    Generator gen(11);
    nn::GPT model(c, gen);
    model.train(false);
    NoGradGuard no_grad;
    const Tensor ids = random_ids(2, 16, 11, gen);
    const Tensor full = model.forward(ids).logits;                      // (2, 16, 11)
    nn::KVCache cache = check_cache_matches_full(model, ids, full, 5);  // a 5-token chunk, then one token at a time
    CHECK(cache.len == 16);
    CHECK_THROWS_WITH_AS(model.forward_cached(id_columns(ids, 0, 1), cache), doctest::Contains("exceed the block size"),
                         Error);
  }
}

TEST_CASE("gpt: every position scheme, window and soft-cap: the KV cache gives the full forward pass's logits") {
  for (const nn::Positions pos :
       {nn::Positions::Relative, nn::Positions::Alibi, nn::Positions::T5, nn::Positions::None}) {
    for (const int64_t window : {0, 5}) {
      CAPTURE(nn::positions_name(pos));
      CAPTURE(window);
      nn::GPTConfig c = tiny_config();
      c.pos = pos, c.window = window, c.attn_softcap = window > 0 ? 3.0 : 0.0, c.max_relative_position = 4;
      c.n_kv_head = 2;
      Generator gen(12);
      nn::GPT model(c, gen);
      CHECK(!model.wpe);
      model.train(false);
      NoGradGuard no_grad;
      const Tensor ids = random_ids(2, 16, 11, gen);
      const Tensor full = model.forward(ids).logits;
      check_cache_matches_full(model, ids, full, 6);
      // Positions enter through distances only: sequences longer than the block run, and a window makes the last
      // position's logits independent of everything before its window.
      const Tensor longer = random_ids(1, 40, 11, gen);
      const Tensor out = model.forward(longer).logits;
      CHECK(out.size(1) == 40);
      if (window > 0 && c.n_layer * (window - 1) < 30) {  // the receptive field of 2 layers: 2 * (window - 1) back
        std::vector<int32_t> changed = longer.to_vector<int32_t>();
        for (int64_t t = 0; t < 20; ++t) changed[size_t(t)] = (changed[size_t(t)] + 1) % 11;
        const Tensor out2 = model.forward(from_vector(changed, {1, 40})).logits;
        CHECK(max_abs_diff(narrow(out, 1, 39, 1), narrow(out2, 1, 39, 1)) < 1e-6);
      }
    }
  }
}

TEST_CASE("gpt: relu^2 MLP, soft-capped logits, zero-initialized projections: their math, gradients and the KV cache") {
  // The two functions in f64, gradient-checked (relu's kink avoided: no input within 1e-3 of 0).
  Generator g64(5);
  Tensor x = test::leaf({3, 7}, g64);
  std::vector<double> xv = x.to_vector<double>();
  for (double& v : xv) v = std::abs(v) < 1e-3 ? 0.5 : v;
  x = from_vector(xv, {3, 7});
  x.requires_grad_();
  test::expect_gradcheck([](const std::vector<Tensor>& in) { return nn::relu_squared(in[0]); }, {x});
  test::expect_gradcheck([](const std::vector<Tensor>& in) { return nn::soft_cap(in[0] * 4.0, 2.5); }, {x});
  const std::vector<double> r = nn::relu_squared(x).to_vector<double>(),
                            c = nn::soft_cap(x * 4.0, 2.5).to_vector<double>();
  for (size_t i = 0; i < xv.size(); ++i) {
    CHECK(r[i] == doctest::Approx(xv[i] > 0 ? xv[i] * xv[i] : 0.0));
    CHECK(c[i] == doctest::Approx(2.5 * std::tanh(4.0 * xv[i] / 2.5)));
  }

  nn::GPTConfig plain = tiny_config();
  nn::GPTConfig modern = plain;
  modern.mlp = nn::MlpKind::Relu2, modern.logit_softcap = 1.5, modern.zero_init_proj = true;
  Generator gen_a(21), gen_b(21);
  nn::GPT a(plain, gen_a), b(modern, gen_b);
  // Zero-initialized output projections.
  for (const auto& [name, p] : b.named_parameters()) {
    INFO(name);
    const auto v = p.to_vector<float>();
    const bool proj = name.find("c_proj.weight") != std::string::npos;
    if (proj) CHECK(std::all_of(v.begin(), v.end(), [](float e) { return e == 0.0f; }));
  }
  auto copy_from_a = [&](nn::GPT& to) {  // the plain model's weights, so every comparison below has nonzero blocks
    const auto from = a.named_parameters();
    for (auto& [name, p] : to.named_parameters()) {
      const auto it = std::find_if(from.begin(), from.end(), [&](const auto& e) { return e.first == name; });
      REQUIRE(it != from.end());
      p.copy_(it->second);
    }
  };
  copy_from_a(b);
  b.train(false);
  a.train(false);
  NoGradGuard no_grad;
  const Tensor ids = random_ids(2, 16, 11, gen_a);
  // The MLP: c_proj(relu(c_fc(x))^2), written out here with the layer's own weights.
  const Tensor h0 = randn({2, 5, 32}, gen_a);
  const Tensor fc = linear(h0, b.h[0]->mlp.c_fc.weight, b.h[0]->mlp.c_fc.bias);
  const Tensor relu_fc = relu(fc);
  CHECK(max_abs_diff(b.h[0]->mlp.forward(h0),
                     linear(relu_fc * relu_fc, b.h[0]->mlp.c_proj.weight, b.h[0]->mlp.c_proj.bias)) < 1e-6);
  // The head: the capped logits are cap * tanh(logits / cap) of a model with the same blocks and no cap.
  nn::GPTConfig uncapped = modern;
  uncapped.logit_softcap = 0;
  Generator gen_c(21);
  nn::GPT u(uncapped, gen_c);
  copy_from_a(u);
  u.train(false);
  const Tensor capped = b.forward(ids).logits, raw = u.forward(ids).logits;
  const std::vector<float> cv = capped.to_vector<float>(), rv = raw.to_vector<float>();
  for (size_t i = 0; i < cv.size(); ++i) {
    REQUIRE(std::abs(cv[i]) < 1.5f);
    CHECK(cv[i] == doctest::Approx(1.5 * std::tanh(rv[i] / 1.5)).epsilon(1e-5));
  }
  // The KV cache goes through the same head.
  check_cache_matches_full(b, ids, capped, 6);
}

TEST_CASE("gpt: heads of their own width (head_dim): the projections' shapes, the config kept, the KV cache") {
  for (const auto& [pos, kv_heads] : {std::pair{nn::Positions::Rope, 2}, {nn::Positions::Learned, 0}}) {
    CAPTURE(nn::positions_name(pos));
    nn::GPTConfig c = tiny_config();
    c.n_embd = 30, c.n_head = 4, c.head_dim = 10, c.pos = pos, c.n_kv_head = kv_heads, c.qk_norm = kv_heads > 0;
    c.validate();  // 30 is no multiple of 4: the heads' width is given
    const int64_t NKV = kv_heads > 0 ? kv_heads : c.n_head;
    Generator gen(19);
    nn::GPT model(c, gen);
    for (auto& [name, p] : model.named_parameters()) {
      CAPTURE(name);
      if (name.ends_with("attn.c_attn.weight")) CHECK(p.shape() == Shape{(4 + 2 * NKV) * 10, 30});
      if (name.ends_with("attn.c_proj.weight")) CHECK(p.shape() == Shape{30, 40});
      if (name.ends_with("attn.q_norm.weight")) CHECK(p.shape() == Shape{10});
    }
    CHECK(gpt_config_from_json(to_json(c)).head_dim == 10);
    model.train(false);
    NoGradGuard no_grad;
    const Tensor ids = random_ids(2, 16, c.vocab_size, gen);
    check_cache_matches_full(model, ids, model.forward(ids).logits, 5);
  }
  nn::GPTConfig odd = tiny_config();
  odd.n_embd = 30;
  CHECK_THROWS_WITH_AS(odd.validate(), doctest::Contains("must be divisible by n_head (4), or give head_dim"), Error);
  odd.head_dim = 7, odd.pos = nn::Positions::Rope;
  CHECK_THROWS_WITH_AS(odd.validate(), doctest::Contains("RoPE needs an even head size, got 7"), Error);
}

TEST_CASE("gpt: QK-norm adds a gain per head dim for queries and keys to each block, and the KV cache normalizes too") {
  for (const nn::Positions pos : {nn::Positions::Learned, nn::Positions::Rope}) {
    nn::GPTConfig c = tiny_config();
    c.qk_norm = true, c.pos = pos, c.n_kv_head = 2;
    Generator gen(23);
    nn::GPT model(c, gen);
    int gains = 0;
    for (auto& [name, p] : model.named_parameters()) {
      if (name.ends_with("attn.q_norm.weight") || name.ends_with("attn.k_norm.weight")) {
        CHECK(p.shape() == Shape{c.n_embd / c.n_head});
        ++gains;
      }
      if (name.ends_with("_norm.weight")) p.copy_(randn(p.shape(), gen) * 0.5 + ones(p.shape()));  // not the identity
    }
    CHECK(gains == 2 * c.n_layer);
    model.train(false);
    NoGradGuard no_grad;
    const Tensor ids = random_ids(2, 16, c.vocab_size, gen);
    check_cache_matches_full(model, ids, model.forward(ids).logits, 5);
  }
}

TEST_CASE("gpt: an untied head has its own weight, last in nanoGPT's order, and the logits go through it") {
  nn::GPTConfig c = tiny_config();
  c.untied_head = true;
  Generator gen_u(31), gen_t(31);
  nn::GPT untied(c, gen_u);
  c.untied_head = false;
  nn::GPT tied(c, gen_t);  // the same draws for everything but the head, which comes last
  const auto names = untied.named_parameters();
  REQUIRE(names.back().first == "lm_head.weight");
  CHECK(names.back().second.shape() == Shape{11, 32});
  CHECK(untied.num_parameters() == tied.num_parameters() + 11 * 32);
  const Tensor ids = random_ids(2, 16, 11, gen_u), targets = random_ids(2, 16, 11, gen_u);
  {
    NoGradGuard no_grad;
    untied.lm_head->weight.copy_(tied.wte.weight);  // the untied head holding the embedding computes the tied model
    CHECK(max_abs_diff(untied.forward(ids).logits, tied.forward(ids).logits) < 1e-6);
    untied.lm_head->weight.copy_(tied.wte.weight * 2.0);
    CHECK(max_abs_diff(untied.forward(ids).logits, tied.forward(ids).logits * 2.0) < 1e-5);
    check_cache_matches_full(untied, ids, untied.forward(ids).logits, 4);
  }
  untied.forward(ids, targets).loss.backward();
  const auto g = untied.lm_head->weight.grad().to_vector<float>();
  CHECK(std::any_of(g.begin(), g.end(), [](float x) { return x != 0.0f; }));
}

TEST_CASE("gpt: a sliding cache drops the oldest positions and keeps the others' keys and values") {
  nn::GPTConfig c = tiny_config();
  c.pos = nn::Positions::Alibi;
  Generator gen(3);
  nn::GPT model(c, gen);
  model.train(false);
  NoGradGuard no_grad;
  nn::KVCache cache = model.make_cache(1);
  model.forward_cached(random_ids(1, 16, 11, gen), cache);
  const std::vector<float> before = cache.k[1].to_vector<float>();
  const int64_t width = cache.k[1].size(2);
  model.slide_cache(cache, 6);
  CHECK(cache.len == 10);
  const std::vector<float> after = cache.k[1].to_vector<float>();
  CHECK(std::equal(after.begin(), after.begin() + 10 * width, before.begin() + 6 * width));
  CHECK_THROWS_AS(model.slide_cache(cache, 11), Error);
  nn::GPT learned(tiny_config(), gen);
  nn::KVCache other = learned.make_cache(1);
  CHECK_THROWS_WITH_AS(learned.slide_cache(other, 0), doctest::Contains("relative positions"), Error);
  // Generation far past the block slides instead of rebuilding, deterministically.
  GenerateOptions o;
  o.max_new_tokens = 60;
  Generator g1(1), g2(1);
  CHECK(generate(model, {1, 2}, o, g1) == generate(model, {1, 2}, o, g2));
}

TEST_CASE("gpt: with a document separator, attention stays within each document, in training and in sampling") {
  nn::GPTConfig c = tiny_config();
  c.pos = nn::Positions::T5;
  c.doc_separator = "ab";  // two tokens, 0 then 1, end a document
  Generator gen(4);
  nn::GPT model(c, gen);
  model.set_document_separator({0, 1});
  model.train(false);
  NoGradGuard no_grad;
  for (Tensor& p : model.parameters()) p.copy_(p * 30.0);  // sharp distributions: the context shows in the samples
  const std::vector<int32_t> ids = {5, 6, 0, 1, 7, 8, 0, 9, 1, 0, 1, 2, 3};
  CHECK(model.document_ids(from_vector(ids, {1, 13})).to_vector<int32_t>() ==
        std::vector<int32_t>{0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 2, 2});
  // Changing the first document changes nothing after it.
  std::vector<int32_t> changed = ids;
  changed[0] = 9, changed[1] = 2;
  const Tensor a = model.forward(from_vector(ids, {1, 13})).logits,
               b = model.forward(from_vector(changed, {1, 13})).logits;
  CHECK(max_abs_diff(narrow(a, 1, 4, 9), narrow(b, 1, 4, 9)) < 1e-6);
  CHECK(max_abs_diff(narrow(a, 1, 0, 4), narrow(b, 1, 0, 4)) > 1e-3);
  CHECK(model.ends_document({3, 0, 1}));
  CHECK(!model.ends_document({0, 1, 3}));
  // Sampling: the token after a separator starts a fresh context, so what came before does not matter.
  GenerateOptions o;
  o.max_new_tokens = 20;
  for (const bool kv : {true, false}) {
    o.kv_cache = kv;
    Generator g1(8), g2(8), g3(8);
    const auto fresh = generate(model, {5, 6, 7, 0, 1, 4}, o, g1);
    CHECK(fresh == generate(model, {2, 3, 0, 1, 4}, o, g2));
    CHECK(fresh != generate(model, {2, 3, 0, 2, 4}, o, g3));  // no separator: one document, another context
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
  // A short sample's cache holds the prompt and its tokens only (8 of the block's 16 positions), to the same text.
  CHECK(model.make_cache(1, 8).capacity() == 8);
  CHECK(model.make_cache(1, 100).capacity() == model.config().block_size);
  CHECK(model.make_cache(1).capacity() == model.config().block_size);
  o.max_new_tokens = 5;
  Generator g7(7), g8(7);
  const auto short_without = generate(model, prompt, o, g7);
  o.kv_cache = true;
  CHECK(generate(model, prompt, o, g8) == short_without);
  o.max_new_tokens = 100;  // far past block_size, both ways
  o.kv_cache = true;
  Generator g5(1), g6(1);
  CHECK(generate(model, prompt, o, g5).size() == 100);
  o.kv_cache = false;
  CHECK(generate(model, prompt, o, g6).size() == 100);
}

TEST_CASE("generate with bf16 storage: bf16 logits, sampled with and without the cache, past the block size") {
  Generator init(5);
  nn::GPT model(tiny_config(), init);
  model.train(false);
  Numerics n;
  n.bf16 = n.bf16_storage = true;
  model.set_numerics(n);
  GenerateOptions o;
  o.max_new_tokens = 40;
  o.temperature = 0.0;  // greedy
  for (const bool cache : {true, false}) {
    CAPTURE(cache);
    o.kv_cache = cache;
    Generator g(1);
    const auto out = generate(model, {1, 2, 3}, o, g);
    CHECK(out.size() == 40);
    CHECK(std::all_of(out.begin(), out.end(), [](int32_t t) { return t >= 0 && t < 11; }));
  }
}

TEST_CASE("sample_token: temperature 0 and top-k 1 pick the argmax; top-k and top-p never pick outside their sets") {
  Generator gen(9);
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.5f, 0.3f};
  CHECK(sample_token(logits, {.temperature = 0.0, .top_k = 0}, gen) == 1);
  CHECK(sample_token(logits, {.temperature = 1.0, .top_k = 1}, gen) == 1);
  for (int i = 0; i < 200; ++i) {
    const int32_t t = sample_token(logits, {.temperature = 2.0, .top_k = 2}, gen);
    CHECK((t == 1 || t == 3));
  }
  // At temperature 1 the probabilities are 0.075, 0.503, 0.025, 0.305, 0.092: top-p 0.5 keeps only 1, 0.6 also 3
  // (0.808), 0.85 also 4 (0.900), 0.95 also 0, never 2.
  const auto drawn = [&](double top_p) {
    std::set<int32_t> seen;
    for (int i = 0; i < 400; ++i)
      seen.insert(sample_token(logits, {.temperature = 1.0, .top_k = 0, .top_p = top_p}, gen));
    return seen;
  };
  CHECK(drawn(0.0) == std::set<int32_t>{1});
  CHECK(drawn(0.5) == std::set<int32_t>{1});
  CHECK(drawn(0.6) == std::set<int32_t>{1, 3});
  CHECK(drawn(0.85) == std::set<int32_t>{1, 3, 4});
  CHECK(drawn(0.95) == std::set<int32_t>{0, 1, 3, 4});
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
  for (size_t i = 0; i < logits.size(); ++i)
    CHECK(std::abs(logits[i] - ref_logits[i]) <= 1e-5 + 1e-4 * std::abs(ref_logits[i]));
  out.loss.backward();
  for (const auto& [name, p] : model.named_parameters()) {
    INFO(name);
    const auto g = p.grad().to_vector<float>();
    const auto ref = fixture.find("expected.grad." + name).to_vector<double>();
    REQUIRE(g.size() == ref.size());
    double worst = 0;
    for (size_t i = 0; i < g.size(); ++i)
      worst = std::max(worst, std::abs(g[i] - ref[i]) - (1e-6 + 1e-3 * std::abs(ref[i])));
    CHECK(worst <= 0.0);
  }
}

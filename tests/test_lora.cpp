// LoRA: the adapted layers compute W + alpha/r B A, their gradients are the base's through A and B, a LoRA run trains
// the adapters alone (the base's weights untouched, its checkpoints holding only the adapters), resumes bit for bit,
// and its checkpoint is read merged (sample, chat, export) or apart (resume); a base that changed is refused.
#include <doctest/doctest.h>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "autograd/ops.h"
#include "nn/gpt.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

using namespace tinygpt;
using tinygpt::test::TempDir;
namespace fs = std::filesystem;

namespace {

double max_abs_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  const auto x = a.to(DType::F32).to_vector<float>(), y = b.to(DType::F32).to_vector<float>();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, double(std::abs(x[i] - y[i])));
  return m;
}

double max_abs(const Tensor& a) {
  double m = 0;
  for (const float v : a.to_vector<float>()) m = std::max(m, double(std::abs(v)));
  return m;
}

nn::GPTConfig small_config(nn::MlpKind mlp) {
  nn::GPTConfig c;
  c.vocab_size = 23, c.block_size = 8, c.n_layer = 2, c.n_head = 4, c.n_kv_head = 2, c.n_embd = 16;
  c.mlp = mlp;
  c.pos = nn::Positions::Rope;
  c.norm = nn::NormKind::RMSNorm;
  return c;
}

Tensor toy_ids(int64_t B, int64_t T, int64_t vocab) {
  std::vector<int32_t> v(size_t(B * T));
  for (size_t i = 0; i < v.size(); ++i) v[i] = int32_t((i * 7 + 3) % size_t(vocab));
  return from_vector(v, {B, T});
}

std::vector<double> losses_of(const fs::path& run) {
  std::vector<double> out;
  std::ifstream in(run / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out.push_back(j["loss"].get<double>());
  }
  return out;
}

}  // namespace

TEST_CASE("LoRA targets: parsed and named in one order; bad lists, ranks and a gate without SwiGLU refused") {
  CHECK(nn::lora_targets_name(nn::parse_lora_targets("v,q")) == "q,v");
  CHECK(nn::lora_targets_name(nn::parse_lora_targets("down,gate,o,k,up,q,v")) == "q,k,v,o,gate,up,down");
  CHECK_THROWS_WITH_AS(nn::parse_lora_targets("q,,v"), doctest::Contains("LoRA target '' is not one of"), Error);
  CHECK_THROWS_WITH_AS(nn::parse_lora_targets("query"), doctest::Contains("'query'"), Error);
  CHECK(nn::is_lora_parameter("transformer.h.3.attn.c_attn.lora_q_A"));
  CHECK(!nn::is_lora_parameter("transformer.h.3.attn.c_attn.weight"));
  nn::GPTConfig c = small_config(nn::MlpKind::Gelu);
  c.lora = {.rank = 4, .alpha = 8, .targets = nn::kLoraGate};
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("gate needs the SwiGLU MLP"), Error);
  c.lora.targets = nn::kLoraK;
  c.lora.rank = 9;  // k's rows: 2 heads x 4 = 8
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("above the narrowest adapted layer's width 8"), Error);
  c.lora.rank = 8;
  c.lora.alpha = 0;
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("alpha must be a finite number above 0"), Error);
}

TEST_CASE("LoRA: the adapted model is the base with W + alpha/r B A, and the adapters' gradients are the base's") {
  for (const nn::MlpKind mlp : {nn::MlpKind::SwiGLU, nn::MlpKind::Gelu}) {
    INFO("mlp " << nn::mlp_name(mlp));
    nn::GPTConfig base_config = small_config(mlp);
    nn::GPTConfig c = base_config;
    const uint32_t all = nn::kLoraQ | nn::kLoraK | nn::kLoraV | nn::kLoraO | nn::kLoraUp | nn::kLoraDown |
                         (mlp == nn::MlpKind::SwiGLU ? uint32_t(nn::kLoraGate) : 0u);
    // Every target, and q and v alone (a gap of k's rows between them in c_attn).
    for (const uint32_t targets : {all, uint32_t(nn::kLoraQ | nn::kLoraV)}) {
      INFO("targets " << nn::lora_targets_name(targets));
      c.lora = {.rank = 3, .alpha = 5, .targets = targets};
      Generator g1(11), g2(11), g3(12);
      nn::GPT adapted(c, g1), merged(base_config, g2);
      adapted.train(false), merged.train(false);
      // The base weights agree (adapters are drawn after them); B starts at zero: the adapted model is its base.
      const Tensor ids = toy_ids(2, 8, c.vocab_size);
      CHECK(max_abs_diff(adapted.forward(ids).logits, merged.forward(ids).logits) == 0.0);
      // Random B, then W + s B A into the plain model, row block by row block.
      const auto merged_params = merged.named_parameters();
      auto param = [](const auto& params, const std::string& name) {
        for (const auto& [n, t] : params) {
          if (n == name) return t;
        }
        FAIL("no parameter " << name);
        return Tensor();
      };
      const auto adapted_params = adapted.named_parameters();
      for (auto& [name, t] : adapted_params) {
        if (name.ends_with("_B")) Tensor(t).copy_(randn(t.shape(), g3, DType::F32, Device::CPU, 0.3));
      }
      for (int64_t layer = 0; layer < c.n_layer; ++layer) {
        for (const nn::LoraSite& s : c.lora_sites()) {
          const std::string prefix = fmt::format("transformer.h.{}.{}.", layer, s.linear);
          const Tensor A = param(adapted_params, fmt::format("{}lora_{}_A", prefix, s.target));
          const Tensor B = param(adapted_params, fmt::format("{}lora_{}_B", prefix, s.target));
          Tensor w = param(merged_params, prefix + "weight");
          const Tensor rows = narrow(w, 0, s.first, s.rows) + matmul(B, A) * c.lora.scale();
          buffer_slice(w, s.first * s.in, rows.shape()).copy_(rows);
        }
      }
      CHECK(max_abs_diff(adapted.forward(ids).logits, merged.forward(ids).logits) < 2e-5);

      // Gradients: y = x W^T + s (x A^T) B^T, so dL/dB = s dL/dW[rows] A^T and dL/dA = s B^T dL/dW[rows].
      adapted.train(true);
      for (auto& [name, t] : adapted.named_parameters()) t.zero_grad();
      const Tensor logits = adapted.forward(ids).logits;
      sum(logits * logits).backward();
      for (int64_t layer = 0; layer < c.n_layer; ++layer) {
        for (const nn::LoraSite& s : c.lora_sites()) {
          INFO("layer " << layer << ", " << s.linear << " " << s.target);
          const std::string prefix = fmt::format("transformer.h.{}.{}.", layer, s.linear);
          const Tensor A = param(adapted_params, fmt::format("{}lora_{}_A", prefix, s.target));
          const Tensor B = param(adapted_params, fmt::format("{}lora_{}_B", prefix, s.target));
          const Tensor dW = narrow(param(adapted_params, prefix + "weight").grad(), 0, s.first, s.rows);
          const Tensor dB = matmul(dW, A, false, true) * c.lora.scale();
          const Tensor dA = matmul(B, dW, true, false) * c.lora.scale();
          const double scale_b = max_abs(dB), scale_a = max_abs(dA);
          REQUIRE(scale_b > 0);
          CHECK(max_abs_diff(B.grad(), dB) < 1e-4 * scale_b);
          CHECK(max_abs_diff(A.grad(), dA) < 1e-4 * std::max(scale_a, 1e-6));
        }
      }
    }
  }
}

TEST_CASE("LoRA run: only the adapters train and are saved; merged and apart loads agree; resumes bit for bit") {
  TempDir dir("lora_run");
  const fs::path text = dir.path / "toy.txt";
  {
    std::ofstream out(text);
    for (int i = 0; i < 300; ++i) out << (i % 2 ? "the cat sat on the mat. " : "a dog ran far away. ");
  }
  TrainConfig base;
  base.data = {text.string()};
  base.model.n_layer = 2, base.model.n_head = 2, base.model.n_embd = 16, base.model.block_size = 16;
  base.model.mlp = nn::MlpKind::SwiGLU;
  base.batch_size = 4, base.max_iters = 30, base.eval_interval = 30, base.eval_iters = 2, base.quiet = true;
  base.lr = 3e-3, base.warmup_iters = 2, base.lr_decay_iters = 30;
  base.out = (dir.path / "base").string();
  const double base_val = train(base).last_val_loss;
  const fs::path base_file = dir.path / "base" / kLatestCheckpoint;
  const Checkpoint before = load_checkpoint(base_file);

  for (const bool bf16 : {false, true}) {
    INFO("bf16 storage " << bf16);
    TrainConfig c = base;
    c.init_from = base_file.string();
    c.lora = {.rank = 2, .alpha = 4, .targets = nn::kLoraQ | nn::kLoraV | nn::kLoraO | nn::kLoraGate | nn::kLoraDown};
    c.lr = 3e-2, c.warmup_iters = 2, c.lr_decay_iters = 40, c.eval_interval = 20, c.model.dropout = 0.1;
    if (bf16) c.dtype = "bf16", c.storage = "bf16";
    c.out = (dir.path / fmt::format("straight{}", bf16)).string();
    c.max_iters = 40;
    const TrainResult r = train(c);
    CHECK(r.iters == 40);
    const auto straight = losses_of(c.out);
    REQUIRE(straight.size() == 40);
    CHECK(r.best_val_loss < base_val - 0.03);  // the adapters learn

    // The checkpoint: the adapters (and their AdamW moments) alone, and the base's identity.
    const Checkpoint apart = load_checkpoint(fs::path(c.out) / kLatestCheckpoint, LoraLoad::Apart);
    CHECK(apart.config.lora == c.lora);
    CHECK(apart.state.lora_base.path == fs::absolute(base_file).lexically_normal().string());
    CHECK(apart.state.lora_base.checksum == base_checksum(before.contents));
    const safetensors::Contents file = safetensors::load(fs::path(c.out) / kLatestCheckpoint);
    for (const auto& [name, t] : file.tensors) {
      INFO(name);
      CHECK((nn::is_lora_parameter(name) ||
             (name.starts_with("optimizer.") && nn::is_lora_parameter(name.substr(0, name.rfind('.'))))));
    }
    // The base's weights, as read apart, are the base's: nothing trained them.
    for (const auto& [name, t] : before.contents.tensors) {
      if (name.starts_with("optimizer.")) continue;
      INFO(name);
      CHECK(max_abs_diff(apart.contents.find(name), t) == 0.0);
    }
    // Merged: a plain model whose logits are the adapted model's.
    const Checkpoint merged = load_checkpoint(fs::path(c.out) / kLatestCheckpoint);
    CHECK(!merged.config.lora.enabled());
    Generator g1(1), g2(1);
    nn::GPT adapted_model(apart.config, g1), merged_model(merged.config, g2);
    load_weights(adapted_model, apart);
    load_weights(merged_model, merged);
    adapted_model.train(false), merged_model.train(false);
    const Tensor ids = toy_ids(2, 16, merged.config.vocab_size);
    CHECK(max_abs_diff(adapted_model.forward(ids).logits, merged_model.forward(ids).logits) < 1e-4);
    CHECK(max_abs_diff(merged_model.forward(ids).logits, [&] {
            Generator g3(1);
            nn::GPT plain(before.config, g3);
            load_weights(plain, before);
            plain.train(false);
            return plain.forward(ids).logits;
          }()) > 1e-3);  // and not the base's

    // Stopped at 20 and resumed: the same losses and adapters, bit for bit.
    c.out = (dir.path / fmt::format("stopped{}", bf16)).string();
    c.max_iters = 20;
    train(c);
    c.max_iters = 40;
    c.resume = true;
    c.init_from.clear();
    c.lora = {};  // taken from the checkpoint
    train(c);
    CHECK(losses_of(c.out) == straight);
    const safetensors::Contents resumed = safetensors::load(fs::path(c.out) / kLatestCheckpoint);
    for (const auto& [name, t] : file.tensors) {
      INFO(name);
      CHECK(max_abs_diff(resumed.find(name), t) == 0.0);
    }
  }

  // A base that changed is refused, naming it; so is resuming with other LoRA flags.
  TrainConfig c = base;
  c.init_from = base_file.string();
  c.lora = {.rank = 2, .alpha = 4, .targets = nn::kLoraQ};
  c.max_iters = 2;
  c.out = (dir.path / "adapted").string();
  train(c);
  c.resume = true;
  c.init_from.clear();
  c.lora.rank = 3;
  c.max_iters = 4;
  CHECK_THROWS_WITH_AS(train(c), doctest::Contains("LoRA rank 3 alpha 4 on q (flags) vs rank 2 alpha 4 on q"), Error);
  base.max_iters = 31;  // the base trained on: its latest checkpoint now differs
  base.resume = true;
  train(base);
  CHECK_THROWS_WITH_AS(load_checkpoint(dir.path / "adapted"),
                       doctest::Contains("has changed since the adapters were trained"), Error);
  fs::remove(base_file);
  CHECK_THROWS_WITH_AS(load_checkpoint(dir.path / "adapted"),
                       doctest::Contains("a LoRA checkpoint holds only its adapters"), Error);
}

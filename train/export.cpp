#include "train/export.h"

#include <fmt/format.h>

#include "autograd/ops.h"
#include "data/text.h"
#include "train/hf_llama.h"
#include "train/safetensors.h"

namespace tinygpt {

namespace fs = std::filesystem;
using nlohmann::json;

void check_hf_exportable(const nn::GPTConfig& c) {
  if (is_llama_shaped(c)) return check_llama_exportable(c);
  if (c.pos != nn::Positions::Learned) {
    throw Error(
        fmt::format("this model's positions are {} (trained with --pos {}), which GPT-2 cannot express: its "
                    "positions are a learned table. Export a model trained with --pos learned",
                    c.pos == nn::Positions::Rope ? "rotary position embeddings" : nn::positions_name(c.pos),
                    nn::positions_name(c.pos)));
  }
  for (const nn::ScoreModifier& m : nn::score_modifiers()) {
    if (nn::modifier_on(m, c)) {
      throw Error(
          fmt::format("this model uses {} ({}), which GPT-2 cannot express: its attention sees the whole "
                      "block, unmodified. Export a model trained without {}",
                      m.what, m.set_by, m.set_by));
    }
  }
  const bool relu2 = c.mlp == nn::MlpKind::Relu2, wide = c.ffn_hidden > 0 && c.ffn_hidden != 4 * c.n_embd;
  if (relu2 || wide || c.logit_softcap > 0 || c.qk_norm) {
    throw Error(
        fmt::format("this model uses {}, which GPT-2 cannot express. Export a model trained without --mlp relu2, "
                    "--ffn-hidden, --logit-softcap and --qk-norm",
                    relu2                 ? "a relu^2 MLP (--mlp relu2): GPT-2's MLP is GELU"
                    : wide                ? "an MLP of another width (--ffn-hidden): GPT-2's is 4 n_embd"
                    : c.logit_softcap > 0 ? "soft-capped logits (--logit-softcap)"
                                          : "normalized queries and keys (--qk-norm)"));
  }
  if (c.qkv_bias && !c.bias) {
    throw Error(
        "this model has biases in its q, k and v projections only (--qkv-bias), which GPT-2 cannot express. "
        "Export a model trained with --bias or without --qkv-bias");
  }
  if (c.n_kv_head > 0 && c.n_kv_head != c.n_head) {
    throw Error(
        fmt::format("this model has grouped-query attention ({} key/value heads for {} query heads), which "
                    "GPT-2 cannot express: each of its heads has its own keys and values. Export a model "
                    "trained without --n-kv-head",
                    c.n_kv_head, c.n_head));
  }
}

std::string hf_architecture(const nn::GPTConfig& c) {
  return is_llama_shaped(c) ? llama_config_to_hf(c, -1, -1)["architectures"][0].get<std::string>() : "GPT2LMHeadModel";
}

namespace {

// GPT-2's tensors, in the order and under the names transformers' GPT2LMHeadModel saves them.
std::vector<std::pair<std::string, Tensor>> gpt2_tensors(const Checkpoint& ckpt) {
  const auto& c = ckpt.config;
  const int64_t C = c.n_embd;
  std::vector<std::pair<std::string, Tensor>> out;
  auto weight = [&](const std::string& name) { return ckpt.contents.find(name); };  // present: the load checked
  // nn::Linear keeps (out, in); GPT-2's Conv1D keeps (in, out).
  auto conv1d = [&](const std::string& name) { return transpose(weight(name), 0, 1); };
  auto bias = [&](const std::string& name, int64_t n) { return c.bias ? weight(name) : zeros({n}); };
  out.emplace_back("transformer.wte.weight", weight("transformer.wte.weight"));
  out.emplace_back("transformer.wpe.weight", weight("transformer.wpe.weight"));
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string h = fmt::format("transformer.h.{}.", i);
    out.emplace_back(h + "ln_1.weight", weight(h + "ln_1.weight"));
    out.emplace_back(h + "ln_1.bias", bias(h + "ln_1.bias", C));
    out.emplace_back(h + "attn.c_attn.weight", conv1d(h + "attn.c_attn.weight"));  // (C, 3C): q, k, v
    out.emplace_back(h + "attn.c_attn.bias", bias(h + "attn.c_attn.bias", 3 * C));
    out.emplace_back(h + "attn.c_proj.weight", conv1d(h + "attn.c_proj.weight"));
    out.emplace_back(h + "attn.c_proj.bias", bias(h + "attn.c_proj.bias", C));
    out.emplace_back(h + "ln_2.weight", weight(h + "ln_2.weight"));
    out.emplace_back(h + "ln_2.bias", bias(h + "ln_2.bias", C));
    out.emplace_back(h + "mlp.c_fc.weight", conv1d(h + "mlp.c_fc.weight"));  // (C, 4C)
    out.emplace_back(h + "mlp.c_fc.bias", bias(h + "mlp.c_fc.bias", 4 * C));
    out.emplace_back(h + "mlp.c_proj.weight", conv1d(h + "mlp.c_proj.weight"));  // (4C, C)
    out.emplace_back(h + "mlp.c_proj.bias", bias(h + "mlp.c_proj.bias", C));
  }
  out.emplace_back("transformer.ln_f.weight", weight("transformer.ln_f.weight"));
  out.emplace_back("transformer.ln_f.bias", bias("transformer.ln_f.bias", C));
  // A tied head has no lm_head.weight: it is transformer.wte.weight (tie_word_embeddings), as transformers saves it.
  if (c.untied_head) out.emplace_back("lm_head.weight", weight("lm_head.weight"));
  return out;
}

json gpt2_config(const nn::GPTConfig& c, int32_t end_of_text) {
  return {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"vocab_size", c.vocab_size},
      {"n_positions", c.block_size},
      {"n_embd", c.n_embd},
      {"n_layer", c.n_layer},
      {"n_head", c.n_head},
      {"n_inner", nullptr},                 // 4 * n_embd
      {"activation_function", "gelu_new"},  // GELU, tanh approximation (ours)
      {"layer_norm_epsilon", 1e-5},
      {"resid_pdrop", c.dropout},
      {"embd_pdrop", c.dropout},
      {"attn_pdrop", c.dropout},
      {"initializer_range", 0.02},
      {"scale_attn_weights", true},  // 1 / sqrt(head size)
      {"tie_word_embeddings", !c.untied_head},
      {"use_cache", true},
      // A BPE's <|endoftext|>, as GPT-2's; a character vocabulary has no special tokens.
      {"bos_token_id", end_of_text >= 0 ? json(end_of_text) : json(nullptr)},
      {"eos_token_id", end_of_text >= 0 ? json(end_of_text) : json(nullptr)},
      {"dtype", "float32"},
  };
}

// One token per character, with no merges, no normalization and no pre-tokenization: text in the vocabulary
// encodes to our ids exactly, and decoding concatenates the characters (the Fuse decoder) without adding spaces.
json tokenizer(const data::CharVocab& vocab) {
  json ids = json::object();
  for (size_t i = 0; i < vocab.chars().size(); ++i) ids[data::encode_utf8(std::u32string(1, vocab.chars()[i]))] = i;
  return {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer", nullptr},
      {"post_processor", nullptr},
      {"decoder", {{"type", "Fuse"}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", ids},
        {"merges", json::array()}}},
  };
}

json tokenizer_config(const nn::GPTConfig& c, const data::Tokenizer& tok) {
  json j = {
      {"tokenizer_class", "PreTrainedTokenizerFast"},
      {"model_max_length", c.block_size},
      {"clean_up_tokenization_spaces", false},  // would remove spaces before punctuation in the decoded text
  };
  const data::TokenizerConfig& tc = tok.config();
  if (!tc.bos_token.empty()) j["bos_token"] = tc.bos_token;
  if (!tc.eos_token.empty()) j["eos_token"] = tc.eos_token;
  if (!tc.chat_template.empty()) j["chat_template"] = tc.chat_template;
  return j;
}

}  // namespace

void export_hf(const Checkpoint& ckpt, const fs::path& dir) {
  check_hf_exportable(ckpt.config);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir)) {
    throw Error(fmt::format("cannot create the export directory '{}'{}", dir.string(), ec ? ": " + ec.message() : ""));
  }
  NoGradGuard no_grad;
  const int32_t eot = ckpt.tokenizer.end_of_text();
  const std::string& bos_token = ckpt.tokenizer.config().bos_token;
  const int32_t bos = bos_token.empty() ? eot : ckpt.tokenizer.bpe().added_id(bos_token);
  if (is_llama_shaped(ckpt.config)) {
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const HfPiece& p : llama_pieces(ckpt.config)) {
      const Tensor t = ckpt.contents.find(p.ours);  // present: the load checked
      tensors.emplace_back(p.hf, p.rows < 0 ? t : narrow(t, 0, p.row0, p.rows));
    }
    safetensors::save(dir / "model.safetensors", tensors, {{"format", "pt"}});
    data::write_text_file(dir / "config.json", llama_config_to_hf(ckpt.config, bos, eot).dump(2) + "\n");
  } else {
    safetensors::save(dir / "model.safetensors", gpt2_tensors(ckpt), {{"format", "pt"}});  // transformers wants "pt"
    data::write_text_file(dir / "config.json", gpt2_config(ckpt.config, eot).dump(2) + "\n");
  }
  data::write_text_file(dir / "tokenizer.json", ckpt.tokenizer.is_bpe()
                                                    ? ckpt.tokenizer.bpe().to_json()
                                                    : tokenizer(ckpt.tokenizer.chars()).dump(2) + "\n");
  data::write_text_file(dir / "tokenizer_config.json", tokenizer_config(ckpt.config, ckpt.tokenizer).dump(2) + "\n");
}

}  // namespace tinygpt

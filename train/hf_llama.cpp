#include "train/hf_llama.h"

#include <fmt/format.h>

#include <cmath>
#include <functional>

#include "data/bpe.h"
#include "train/checkpoint.h"  // rope_scaling_json, rope_scaling_from_json

namespace tinygpt {

using nlohmann::json;

bool is_llama_shaped(const nn::GPTConfig& c) {
  return c.norm == nn::NormKind::RMSNorm || c.mlp == nn::MlpKind::SwiGLU || c.pos == nn::Positions::Rope;
}

namespace {

/// config.json's values by key, each checked for its type; a wrong one throws bad(why).
struct ConfigReader {
  const json& j;
  std::function<Error(const std::string&)> bad;

  /// A positive integer; absent or null: `fallback`, or an error when it is 0.
  int64_t integer(const char* key, int64_t fallback) const {
    if (!j.contains(key) || j[key].is_null()) {
      if (fallback > 0) return fallback;
      throw bad(fmt::format("config.json has no {}", key));
    }
    if (!j[key].is_number_integer() || j[key].get<int64_t>() <= 0) {
      throw bad(fmt::format("config.json's {} is {}, not a positive integer", key, j[key].dump()));
    }
    return j[key].get<int64_t>();
  }
  double number(const char* key, double fallback) const {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_number()) throw bad(fmt::format("config.json's {} is {}, not a number", key, j[key].dump()));
    return j[key].get<double>();
  }
  bool flag(const char* key, bool fallback) const {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_boolean()) throw bad(fmt::format("config.json's {} is {}, not true or false", key, j[key].dump()));
    return j[key].get<bool>();
  }
};

}  // namespace

nn::GPTConfig llama_config_from_hf(const json& j, const std::string& what) {
  const std::string type = j.value("model_type", std::string());
  const auto bad = [&](const std::string& why) {
    return Error(
        fmt::format("'{}' is not a {} tinygpt can import: {}", what, type == "qwen2" ? "Qwen2" : "Llama", why));
  };
  const ConfigReader r{j, bad};
  nn::GPTConfig c;
  c.n_embd = r.integer("hidden_size", 0);
  c.n_layer = r.integer("num_hidden_layers", 0);
  c.n_head = r.integer("num_attention_heads", 0);
  c.n_kv_head = r.integer("num_key_value_heads", c.n_head);
  if (c.n_kv_head == c.n_head) c.n_kv_head = 0;
  c.ffn_hidden = r.integer("intermediate_size", 0);
  c.vocab_size = r.integer("vocab_size", 0);
  c.block_size = r.integer("max_position_embeddings", 2048);
  c.norm = nn::NormKind::RMSNorm;
  c.norm_eps = r.number("rms_norm_eps", 1e-6);
  c.mlp = nn::MlpKind::SwiGLU;
  c.pos = nn::Positions::Rope;
  // transformers 5 keeps the rotary settings in rope_parameters ({"rope_theta", "rope_type"}); 4 at the top level.
  const json rope = j.contains("rope_parameters") && j["rope_parameters"].is_object() ? j["rope_parameters"] : json();
  c.rope_theta = rope.contains("rope_theta") ? rope["rope_theta"].is_number() ? rope["rope_theta"].get<double>() : -1.0
                                             : r.number("rope_theta", 10000.0);
  // Llama 3's rescaled frequencies: in rope_parameters (transformers 5) or rope_scaling (4); other kinds are refused.
  try {
    if (rope.contains("rope_type") && rope["rope_type"] != "default") {
      c.rope_scaling = rope_scaling_from_json(rope);
    } else if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
      c.rope_scaling = rope_scaling_from_json(j["rope_scaling"]);
    }
  } catch (const Error& e) {
    throw bad(fmt::format("its {}", e.what()));
  }
  c.untied_head = !r.flag("tie_word_embeddings", false);  // LlamaConfig's and Qwen2Config's default: untied
  c.dropout = 0;
  if (const std::string act = j.value("hidden_act", std::string("silu")); act != "silu") {
    throw bad(fmt::format("its MLP's activation is {} (tinygpt's SwiGLU gates with silu)", act));
  }
  // head_dim: each head's width where it is not hidden_size / num_attention_heads (as transformers reads it).
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    c.head_dim = r.integer("head_dim", 0);
    if (c.n_head > 0 && c.n_embd % c.n_head == 0 && c.head_dim == c.n_embd / c.n_head) c.head_dim = 0;
  }
  if (c.head_dim == 0 && c.n_head > 0 && c.n_embd % c.n_head != 0) {
    throw bad(fmt::format("hidden_size {} is not a multiple of num_attention_heads {} and no head_dim is given",
                          c.n_embd, c.n_head));
  }
  if (type == "qwen2") {
    c.qkv_bias = true;  // Qwen2's q, k and v projections always have biases, its output projection none
    if (r.flag("use_sliding_window", false)) throw bad("it uses a sliding window (use_sliding_window)");
  } else {
    const bool attention_bias = r.flag("attention_bias", false), mlp_bias = r.flag("mlp_bias", false);
    if (attention_bias != mlp_bias) {
      throw bad(fmt::format("its attention_bias is {} but its mlp_bias {} (tinygpt's biases are all on or all off)",
                            attention_bias, mlp_bias));
    }
    c.bias = attention_bias;
  }
  if (c.vocab_size > data::kMaxBpeVocab) {
    throw bad(fmt::format("its vocabulary of {} is over {}", c.vocab_size, data::kMaxBpeVocab));
  }
  try {
    c.validate();
  } catch (const Error& e) {
    throw bad(e.what());
  }
  return c;
}

void check_llama_exportable(const nn::GPTConfig& c) {
  const auto refuse = [](const std::string& what, const std::string& flag) {
    throw Error(fmt::format("this model uses {}, which LlamaForCausalLM cannot express. Export a model trained {}",
                            what, flag));
  };
  if (c.norm != nn::NormKind::RMSNorm)
    refuse("LayerNorm beside Llama's other parts (Llama's norm is RMSNorm)", "with --norm rmsnorm");
  if (c.mlp != nn::MlpKind::SwiGLU)
    refuse(fmt::format("a {} MLP (Llama's is SwiGLU)", nn::mlp_name(c.mlp)), "with --mlp swiglu");
  if (c.pos != nn::Positions::Rope)
    refuse(fmt::format("{} positions (Llama's are rotary)", nn::positions_name(c.pos)), "with --pos rope");
  for (const nn::ScoreModifier& m : nn::score_modifiers()) {
    if (nn::modifier_on(m, c)) refuse(fmt::format("{} ({})", m.what, m.set_by), fmt::format("without {}", m.set_by));
  }
  if (c.logit_softcap > 0) refuse("soft-capped logits (--logit-softcap)", "without --logit-softcap");
  if (c.qk_norm) refuse("LayerNorm'd queries and keys (--qk-norm)", "without --qk-norm");
}

json llama_config_to_hf(const nn::GPTConfig& c, int64_t bos, int64_t eos) {
  const bool qwen2 = c.qkv_bias && !c.bias;
  json j = {
      {"architectures", {qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"}},
      {"model_type", qwen2 ? "qwen2" : "llama"},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.n_embd},
      {"intermediate_size", c.ffn_width()},
      {"num_hidden_layers", c.n_layer},
      {"num_attention_heads", c.n_head},
      {"num_key_value_heads", c.n_kv_head > 0 ? c.n_kv_head : c.n_head},
      {"head_dim", c.head_size()},
      {"hidden_act", "silu"},
      {"max_position_embeddings", c.block_size},
      {"rms_norm_eps", c.norm_eps},
      {"rope_theta", c.rope_theta},  // transformers 4's key; 5's is rope_parameters
      {"rope_parameters", {{"rope_theta", c.rope_theta}, {"rope_type", "default"}}},
      {"rope_scaling", nullptr},  // transformers 4's key for a scaling; 5's is rope_parameters
      {"tie_word_embeddings", !c.untied_head},
      {"attention_dropout", 0.0},
      {"initializer_range", 0.02},
      {"use_cache", true},
      {"bos_token_id", bos >= 0 ? json(bos) : json(nullptr)},
      {"eos_token_id", eos >= 0 ? json(eos) : json(nullptr)},
      {"torch_dtype", "float32"},
  };
  if (c.rope_scaling != RopeScaling{}) {
    j["rope_scaling"] = rope_scaling_json(c.rope_scaling);
    j["rope_parameters"].update(j["rope_scaling"]);
  }
  if (qwen2) {
    j["use_sliding_window"] = false;
  } else {
    j["attention_bias"] = c.bias;
    j["mlp_bias"] = c.bias;
  }
  return j;
}

std::vector<HfPiece> llama_pieces(const nn::GPTConfig& c) {
  const int64_t E = c.head_size(), q = c.n_head * E, kv = (c.n_kv_head > 0 ? c.n_kv_head : c.n_head) * E;
  const int64_t H = c.ffn_width();
  const bool attn_bias = c.bias || c.qkv_bias;
  std::vector<HfPiece> p;
  p.push_back({"model.embed_tokens.weight", "transformer.wte.weight"});
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string hf = fmt::format("model.layers.{}.", i), ours = fmt::format("transformer.h.{}.", i);
    p.push_back({hf + "input_layernorm.weight", ours + "ln_1.weight"});
    for (const char* part : {"weight", "bias"}) {
      if (std::string(part) == "bias" && !attn_bias) continue;
      const std::string name = ours + "attn.c_attn." + part;
      p.push_back({hf + "self_attn.q_proj." + part, name, 0, q});
      p.push_back({hf + "self_attn.k_proj." + part, name, q, kv});
      p.push_back({hf + "self_attn.v_proj." + part, name, q + kv, kv});
    }
    p.push_back({hf + "self_attn.o_proj.weight", ours + "attn.c_proj.weight"});
    if (c.bias) p.push_back({hf + "self_attn.o_proj.bias", ours + "attn.c_proj.bias"});
    p.push_back({hf + "post_attention_layernorm.weight", ours + "ln_2.weight"});
    for (const char* part : {"weight", "bias"}) {
      if (std::string(part) == "bias" && !c.bias) continue;
      p.push_back({hf + "mlp.gate_proj." + part, ours + "mlp.c_fc." + part, 0, H});
      p.push_back({hf + "mlp.up_proj." + part, ours + "mlp.c_fc." + part, H, H});
      p.push_back({hf + "mlp.down_proj." + part, ours + "mlp.c_proj." + part});
    }
  }
  p.push_back({"model.norm.weight", "transformer.ln_f.weight"});
  if (c.untied_head) p.push_back({"lm_head.weight", "lm_head.weight"});
  return p;
}

}  // namespace tinygpt

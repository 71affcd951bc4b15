#include "train/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "train/memory.h"

namespace tinygpt {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "tinygpt-checkpoint-1";
constexpr const char* kOptimizerPrefix = "optimizer.";

nlohmann::json to_json(const Generator::State& s) {
  // u64 words as strings: JSON readers in other languages lose precision on large integers.
  nlohmann::json words = nlohmann::json::array();
  for (uint64_t w : s.s) words.push_back(std::to_string(w));
  return {{"s", words}, {"has_spare", s.has_spare}, {"spare", s.spare}};
}

Generator::State rng_from_json(const nlohmann::json& j) {
  Generator::State s{};
  for (size_t i = 0; i < 4; ++i) s.s[i] = std::stoull(j.at("s").at(i).get<std::string>());
  s.has_spare = j.at("has_spare").get<bool>();
  s.spare = j.at("spare").get<double>();
  return s;
}

}  // namespace

nlohmann::json rope_scaling_json(const RopeScaling& s) {
  return {{"rope_type", "llama3"},
          {"factor", s.factor},
          {"low_freq_factor", s.low_freq_factor},
          {"high_freq_factor", s.high_freq_factor},
          {"original_max_position_embeddings", s.original_context}};
}

RopeScaling rope_scaling_from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw Error(fmt::format("rope_scaling must be an object, got {}", j.dump()));
  const std::string type = j.contains("rope_type") ? j["rope_type"].dump() : j.contains("type") ? j["type"].dump() : "";
  if (type != "\"llama3\"") {
    throw Error(fmt::format("rope_scaling: rope_type {} is not Llama 3's (\"llama3\", the one tinygpt implements)",
                            type.empty() ? "(none)" : type));
  }
  auto number = [&](const char* key) {
    if (!j.contains(key) || !j[key].is_number()) throw Error(fmt::format("rope_scaling: {} must be a number", key));
    return j[key].get<double>();
  };
  RopeScaling s;
  s.factor = number("factor");
  s.low_freq_factor = number("low_freq_factor");
  s.high_freq_factor = number("high_freq_factor");
  s.original_context = number("original_max_position_embeddings");
  return s;
}

nlohmann::json to_json(const nn::GPTConfig& c) {
  nlohmann::json j = {{"vocab_size", c.vocab_size},
                      {"block_size", c.block_size},
                      {"n_layer", c.n_layer},
                      {"n_head", c.n_head},
                      {"n_kv_head", c.n_kv_head},
                      {"n_embd", c.n_embd},
                      {"dropout", c.dropout},
                      {"bias", c.bias},
                      {"pos", nn::positions_name(c.pos)},
                      {"max_relative_position", c.max_relative_position},
                      {"mlp", nn::mlp_name(c.mlp)},
                      {"ffn_hidden", c.ffn_hidden},
                      {"norm", nn::norm_name(c.norm)},
                      {"norm_eps", c.norm_eps},
                      {"rope_theta", c.rope_theta},
                      {"qkv_bias", c.qkv_bias},
                      {"logit_softcap", c.logit_softcap},
                      {"zero_init_proj", c.zero_init_proj},
                      {"untied_head", c.untied_head},
                      {"qk_norm", c.qk_norm}};
  for (const nn::ScoreModifier& m : nn::score_modifiers()) std::visit([&](auto f) { j[m.key] = c.*f; }, m.field);
  if (c.rope_scaling != RopeScaling{}) j["rope_scaling"] = rope_scaling_json(c.rope_scaling);
  if (c.head_dim > 0) j["head_dim"] = c.head_dim;
  if (c.lora.enabled()) {
    j["lora"] = {{"rank", c.lora.rank}, {"alpha", c.lora.alpha}, {"targets", nn::lora_targets_name(c.lora.targets)}};
  }
  return j;
}

nn::GPTConfig gpt_config_from_json(const nlohmann::json& j) {
  nn::GPTConfig c;
  c.vocab_size = j.at("vocab_size").get<int64_t>();
  c.block_size = j.at("block_size").get<int64_t>();
  c.n_layer = j.at("n_layer").get<int64_t>();
  c.n_head = j.at("n_head").get<int64_t>();
  c.n_kv_head = j.value("n_kv_head", int64_t(0));
  c.n_embd = j.at("n_embd").get<int64_t>();
  c.head_dim = j.value("head_dim", int64_t(0));
  c.dropout = j.value("dropout", 0.0);
  c.bias = j.at("bias").get<bool>();
  // "pos" names the scheme; checkpoints written before it had only "rope" (true or false).
  const std::string pos = j.value("pos", j.value("rope", false) ? "rope" : "learned");
  if (!nn::parse_positions(pos, c.pos)) throw Error(fmt::format("unknown position scheme \"{}\"", pos));
  c.max_relative_position = j.value("max_relative_position", c.max_relative_position);
  for (const nn::ScoreModifier& m : nn::score_modifiers()) {  // absent: off
    std::visit([&](auto f) { c.*f = j.value(m.key, std::decay_t<decltype(c.*f)>{}); }, m.field);
  }
  // "mlp" names the MLP; checkpoints written before it had "relu2" (true or false). Absent keys: GPT-2's values.
  const std::string mlp = j.value("mlp", j.value("relu2", false) ? "relu2" : "gelu");
  if (!nn::parse_mlp(mlp, c.mlp)) throw Error(fmt::format("unknown MLP \"{}\"", mlp));
  const std::string norm = j.value("norm", std::string("layernorm"));
  if (!nn::parse_norm(norm, c.norm)) throw Error(fmt::format("unknown normalization \"{}\"", norm));
  c.ffn_hidden = j.value("ffn_hidden", int64_t(0));
  c.norm_eps = j.value("norm_eps", 1e-5);
  c.rope_theta = j.value("rope_theta", 10000.0);
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    c.rope_scaling = rope_scaling_from_json(j["rope_scaling"]);
  c.qkv_bias = j.value("qkv_bias", false);
  c.logit_softcap = j.value("logit_softcap", 0.0);
  c.zero_init_proj = j.value("zero_init_proj", false);
  c.untied_head = j.value("untied_head", false);
  c.qk_norm = j.value("qk_norm", false);
  if (j.contains("lora") && !j["lora"].is_null()) {
    const auto& l = j["lora"];
    c.lora.rank = l.at("rank").get<int64_t>();
    c.lora.alpha = l.at("alpha").get<double>();
    c.lora.targets = nn::parse_lora_targets(l.at("targets").get<std::string>());
  }
  c.validate();
  return c;
}

void save_checkpoint(const fs::path& path, const nn::GPT& model, const data::Tokenizer& tokenizer, const Optimizer* opt,
                     const TrainState& state) {
  const bool lora = model.config().lora.enabled();
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (auto& [name, t] : model.named_parameters()) {
    if (!lora || nn::is_lora_parameter(name)) tensors.emplace_back(name, t);  // LoRA: the base is in its own file
  }
  if (opt != nullptr) {
    for (auto& [name, t] : opt->state()) tensors.emplace_back(kOptimizerPrefix + name, t);
  }
  std::map<std::string, std::string> meta;
  meta["format"] = kFormat;
  meta["config"] = to_json(model.config()).dump();
  if (tokenizer.is_bpe()) {
    meta["tokenizer"] = tokenizer.bpe().to_json();
    if (const data::TokenizerConfig& tc = tokenizer.config(); !tc.empty()) {
      meta["tokenizer_config"] =
          nlohmann::json{{"bos_token", tc.bos_token}, {"eos_token", tc.eos_token}, {"chat_template", tc.chat_template}}
              .dump();
    }
  } else {
    meta["vocab"] = data::encode_utf8(tokenizer.chars().chars());
  }
  meta["iter"] = std::to_string(state.iter);
  meta["train_seconds"] = fmt::format("{:.17g}", state.train_seconds);
  meta["best_val_loss"] = std::isfinite(state.best_val_loss) ? fmt::format("{:.17g}", state.best_val_loss) : "inf";
  meta["optimizer_step"] = std::to_string(opt != nullptr ? opt->steps() : 0);
  meta["optimizer"] = opt != nullptr ? opt->name() : "none";
  meta["rng"] = nlohmann::json{{"sampler", to_json(state.sampler_rng)}, {"model", to_json(state.model_rng)}}.dump();
  meta["train_config"] = state.train_config.dump();
  meta["numerics"] = nlohmann::json{{"tf32", model.numerics().tf32},
                                    {"bf16", model.numerics().bf16},
                                    {"attention_math", attention_math_name(model.numerics().attention)},
                                    {"storage", model.numerics().bf16_storage ? "bf16" : "f32"}}
                         .dump();
  if (lora) {
    if (state.lora_base.path.empty())
      throw Error("save_checkpoint: a LoRA model needs its base (TrainState::lora_base)");
    meta["lora_base"] =
        nlohmann::json{{"path", state.lora_base.path}, {"checksum", fmt::format("{:016x}", state.lora_base.checksum)}}
            .dump();
  }
  safetensors::save(path, tensors, meta);
}

fs::path resolve_checkpoint(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return path;
  for (const char* name : {kBestCheckpoint, kLatestCheckpoint}) {
    if (fs::exists(path / name, ec)) return path / name;
  }
  throw Error(fmt::format("'{}' holds no checkpoint ({} or {}); train into it first with `tinygpt train --out {}`",
                          path.string(), kBestCheckpoint, kLatestCheckpoint, path.string()));
}

namespace {

/// The index of the first NaN or infinity in an f32 tensor on the host, or -1 (and -1 for other dtypes).
int64_t first_non_finite(const Tensor& t) {
  if (t.dtype() != DType::F32 || t.device() != Device::CPU) return -1;
  const float* x = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (!std::isfinite(x[i])) return i;
  }
  return -1;
}

}  // namespace

namespace {

constexpr int kMaxLoraDepth = 8;  // a LoRA checkpoint's base may itself be one; a chain longer than this is refused
thread_local int lora_depth = 0;

LoraBase lora_base_from_json(const nlohmann::json& j) {
  return {j.at("path").get<std::string>(), std::stoull(j.at("checksum").get<std::string>(), nullptr, 16)};
}

/// A LoRA checkpoint's base read (merged) and its weights added to c.contents; throws naming what is wrong.
void attach_lora_base(Checkpoint& c, const std::function<Error(const std::string&)>& bad) {
  const LoraBase& base_id = c.state.lora_base;
  if (base_id.path.empty()) throw bad("its config has LoRA adapters but its metadata names no base (lora_base)");
  if (lora_depth >= kMaxLoraDepth) {
    throw bad(
        fmt::format("its LoRA base is the end of a chain of over {} LoRA checkpoints (or a loop)", kMaxLoraDepth));
  }
  Checkpoint base;
  ++lora_depth;
  try {
    base = load_checkpoint(base_id.path, LoraLoad::Merged);
  } catch (const std::exception& e) {
    --lora_depth;
    throw bad(
        fmt::format("its LoRA base cannot be read ({}); a LoRA checkpoint holds only its adapters, so it needs the "
                    "base it was trained on at '{}'",
                    e.what(), base_id.path));
  }
  --lora_depth;
  if (const uint64_t sum = base_checksum(base.contents); sum != base_id.checksum) {
    throw bad(
        fmt::format("its LoRA base '{}' has changed since the adapters were trained on it (weights checksum {:016x}, "
                    "recorded {:016x}): put that base back, or train the adapters again on this one",
                    base_id.path, sum, base_id.checksum));
  }
  auto architecture = [](nn::GPTConfig g) {
    g.lora = {};
    g.dropout = 0;
    g.block_size = 0;  // a LoRA run may train on a shorter context (shorter_context)
    return tinygpt::to_json(g);
  };
  if (architecture(base.config) != architecture(c.config)) {
    throw bad(fmt::format("its LoRA base '{}' is another model ({} vs {})", base_id.path,
                          tinygpt::to_json(base.config).dump(), tinygpt::to_json(c.config).dump()));
  }
  for (auto& [name, t] : base.contents.tensors) {
    if (!name.starts_with(kOptimizerPrefix) && !c.contents.find(name).defined())
      c.contents.tensors.emplace_back(name, t);
  }
}

}  // namespace

uint64_t base_checksum(const safetensors::Contents& contents) {
  std::vector<const std::pair<std::string, Tensor>*> weights;
  for (const auto& entry : contents.tensors) {
    if (!entry.first.starts_with(kOptimizerPrefix)) weights.push_back(&entry);
  }
  std::ranges::sort(weights, {}, [](const auto* e) { return e->first; });
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a over the names, then over 8-byte words of the data
  auto mix = [&h](uint64_t v) { h = (h ^ v) * 0x100000001b3ULL; };
  for (const auto* e : weights) {
    for (unsigned char ch : e->first) mix(ch);
    const Tensor t = e->second.to(Device::CPU);
    const auto* bytes = static_cast<const unsigned char*>(t.raw_data());
    const size_t n = size_t(t.numel()) * dtype_size(t.dtype());
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, bytes + i, 8);
      mix(w);
    }
    for (; i < n; ++i) mix(bytes[i]);
  }
  return h;
}

void merge_lora(Checkpoint& ckpt) {
  const nn::GPTConfig& c = ckpt.config;
  if (!c.lora.enabled()) return;
  auto need = [&](const std::string& name) {
    const Tensor t = ckpt.contents.find(name);
    if (!t.defined()) throw Error(fmt::format("'{}': weight '{}' is missing", ckpt.path.string(), name));
    return t;
  };
  const float s = float(c.lora.scale());
  for (int64_t layer = 0; layer < c.n_layer; ++layer) {
    for (const nn::LoraSite& site : c.lora_sites()) {
      const std::string prefix = fmt::format("transformer.h.{}.{}.", layer, site.linear);
      Tensor w = need(prefix + "weight");
      const Tensor A = need(fmt::format("{}lora_{}_A", prefix, site.target));
      const Tensor B = need(fmt::format("{}lora_{}_B", prefix, site.target));
      const Tensor delta = matmul(B, A);  // (rows, in), f32
      float* dst = w.data<float>() + site.first * site.in;
      const float* d = delta.data<float>();
      for (int64_t i = 0; i < site.rows * site.in; ++i) dst[i] += s * d[i];
    }
  }
  std::erase_if(ckpt.contents.tensors, [](const auto& e) { return nn::is_lora_parameter(e.first); });
  ckpt.merged_lora = c.lora;
  ckpt.config.lora = {};
}

/// Every weight the config implies is there with the right shape and dtype, and finite; else throws bad(what).
template <class Bad>
void check_weights(const Checkpoint& c, const Bad& bad) {
  Generator gen = Generator::for_loading();  // shapes only
  nn::GPTConfig shapes_only = c.config;
  shapes_only.n_layer = std::min<int64_t>(shapes_only.n_layer, 1);  // one block shows every block's shapes
  const nn::GPT probe(shapes_only, gen);
  for (int64_t layer = 0; layer < c.config.n_layer; ++layer) {
    for (const auto& [name, p] : probe.named_parameters()) {
      std::string actual = name;
      if (name.rfind("transformer.h.0.", 0) == 0) {
        actual = fmt::format("transformer.h.{}.{}", layer, name.substr(16));
      } else if (layer > 0) {
        continue;
      }
      const Tensor t = c.contents.find(actual);
      if (!t.defined()) throw bad(fmt::format("weight '{}' is missing", actual));
      if (!(t.shape() == p.shape()) || t.dtype() != p.dtype()) {
        throw bad(fmt::format("weight '{}' is {} {}, but the config needs {} {}", actual, dtype_name(t.dtype()),
                              t.shape().str(), dtype_name(p.dtype()), p.shape().str()));
      }
      if (const int64_t at = first_non_finite(t); at >= 0) {
        throw bad(
            fmt::format("weight '{}' holds {} at element {}: the run that saved it had diverged (resume from "
                        "an earlier checkpoint, or train again with a lower --lr)",
                        actual, std::isnan(t.data<float>()[at]) ? "NaN" : "an infinity", at));
      }
    }
  }
}

Checkpoint load_checkpoint(const fs::path& path_in, LoraLoad lora) {
  Checkpoint c;
  c.path = resolve_checkpoint(path_in);
  require_memory_to_read(c.path);
  c.contents = safetensors::load(c.path);
  const auto& meta = c.contents.metadata;
  auto bad = [&](const std::string& what) {
    return Error(fmt::format("'{}' is not a usable tinygpt checkpoint: {}", c.path.string(), what));
  };
  auto field = [&](const char* key) -> const std::string& {
    const auto it = meta.find(key);
    if (it == meta.end()) throw bad(fmt::format("its metadata has no '{}'", key));
    return it->second;
  };
  if (field("format") != kFormat) throw bad(fmt::format("format '{}', expected '{}'", field("format"), kFormat));
  try {
    c.config = gpt_config_from_json(nlohmann::json::parse(field("config")));
    if (meta.contains("tokenizer")) {
      data::TokenizerConfig tc;
      if (meta.contains("tokenizer_config")) {
        const auto j = nlohmann::json::parse(field("tokenizer_config"));
        if (!j.is_object()) throw Error("its tokenizer_config is not a JSON object");
        tc = {j.value("bos_token", ""), j.value("eos_token", ""), j.value("chat_template", "")};
      }
      c.tokenizer = data::Tokenizer(data::BpeTokenizer::from_json(field("tokenizer"), "its tokenizer"), std::move(tc));
    } else {
      c.tokenizer = data::Tokenizer(data::CharVocab::from_chars(data::decode_utf8(field("vocab"))));
    }
    c.state.iter = std::stoll(field("iter"));
    if (c.state.iter < 0) throw Error(fmt::format("its iteration is {}, below 0", c.state.iter));
    c.state.best_val_loss = std::stod(field("best_val_loss"));
    if (std::isnan(c.state.best_val_loss)) throw Error("its best val loss is NaN");
    if (meta.contains("train_seconds")) c.state.train_seconds = std::stod(field("train_seconds"));  // else 0 (older)
    if (!(c.state.train_seconds >= 0 && std::isfinite(c.state.train_seconds))) {
      throw Error(fmt::format("its training time is {} s", c.state.train_seconds));
    }
    c.optimizer_step = std::stoll(field("optimizer_step"));
    if (c.optimizer_step < 0) throw Error(fmt::format("its optimizer step is {}, below 0", c.optimizer_step));
    if (meta.contains("optimizer")) c.optimizer = field("optimizer");
    const auto rng = nlohmann::json::parse(field("rng"));
    c.state.sampler_rng = rng_from_json(rng.at("sampler"));
    c.state.model_rng = rng_from_json(rng.at("model"));
    c.state.train_config = nlohmann::json::parse(field("train_config"));
    if (meta.contains("numerics")) {  // absent in checkpoints written before it was recorded: full f32
      const auto numerics = nlohmann::json::parse(field("numerics"));
      c.numerics.tf32 = numerics.at("tf32").get<bool>();
      c.numerics.bf16 = numerics.value("bf16", false);  // absent before --dtype existed: f32
      if (!parse_attention_math(numerics.at("attention_math").get<std::string>(), c.numerics.attention)) {
        throw Error(fmt::format("unknown attention_math '{}'", numerics.at("attention_math").get<std::string>()));
      }
      c.storage = numerics.value("storage", "");  // absent before it was recorded
      if (c.storage != "" && c.storage != "f32" && c.storage != "bf16") {
        throw Error(fmt::format("unknown storage '{}'", c.storage));
      }
      c.numerics.bf16_storage = c.storage == "bf16";
    }
    if (meta.contains("lora_base")) c.state.lora_base = lora_base_from_json(nlohmann::json::parse(field("lora_base")));
  } catch (const Error& e) {
    throw bad(e.what());
  } catch (const std::exception& e) {
    throw bad(fmt::format("malformed metadata ({})", e.what()));
  }
  // A BPE's model may be padded past it (rows no id reaches, never drawn: GenerateOptions::vocab); characters match.
  if (c.tokenizer.is_bpe() ? c.tokenizer.vocab_size() > c.config.vocab_size
                           : c.tokenizer.vocab_size() != c.config.vocab_size) {
    throw bad(fmt::format("its vocabulary has {} tokens but its config says vocab_size {}", c.tokenizer.vocab_size(),
                          c.config.vocab_size));
  }
  if (c.config.lora.enabled()) attach_lora_base(c, bad);
  check_weights(c, bad);
  if (lora == LoraLoad::Merged) merge_lora(c);
  return c;
}

void load_weights(nn::GPT& model, const Checkpoint& ckpt) {
  for (auto& [name, p] : model.named_parameters()) {
    const Tensor t = ckpt.contents.find(name);
    if (!t.defined() && nn::is_lora_parameter(name) && !ckpt.config.lora.enabled()) continue;  // a base being adapted
    if (!t.defined()) throw Error(fmt::format("'{}': weight '{}' is missing", ckpt.path.string(), name));
    p.copy_(t);
  }
}

void load_weights_grown(nn::GPT& model, const Checkpoint& ckpt) {
  for (auto& [name, p] : model.named_parameters()) {
    const Tensor t = ckpt.contents.find(name);
    if (!t.defined() && nn::is_lora_parameter(name) && !ckpt.config.lora.enabled()) continue;
    if (!t.defined()) throw Error(fmt::format("'{}': weight '{}' is missing", ckpt.path.string(), name));
    const bool rows = name == "transformer.wte.weight" || name == "lm_head.weight";
    if (rows && t.ndim() == 2 && p.ndim() == 2 && t.size(0) < p.size(0) && t.size(1) == p.size(1)) {
      buffer_slice(p, 0, t.shape()).copy_(t);
    } else {
      p.copy_(t);
    }
  }
}

void load_optimizer(Optimizer& opt, const Checkpoint& ckpt) {
  if (ckpt.optimizer != opt.name() && ckpt.optimizer != "none") {
    throw Error(
        fmt::format("'{}' was trained with --optimizer {}, not {}: resume with --optimizer {} or without the "
                    "flag (or start a new run in another --out)",
                    ckpt.path.string(), ckpt.optimizer, opt.name(), ckpt.optimizer));
  }
  for (auto& [name, t] : opt.state()) {
    const Tensor saved = ckpt.contents.find(kOptimizerPrefix + name);
    if (!saved.defined()) {
      throw Error(fmt::format("'{}' has no optimizer state for '{}' (a weights-only checkpoint cannot be resumed)",
                              ckpt.path.string(), name));
    }
    if (!(saved.shape() == t.shape()) || saved.dtype() != t.dtype()) {
      throw Error(fmt::format("'{}': optimizer state '{}' is {} {}, but the model needs {} {}", ckpt.path.string(),
                              name, dtype_name(saved.dtype()), saved.shape().str(), dtype_name(t.dtype()),
                              t.shape().str()));
    }
    if (const int64_t at = first_non_finite(saved); at >= 0) {
      throw Error(
          fmt::format("'{}': optimizer state '{}' holds a NaN or infinity at element {}: the run that saved it "
                      "had diverged (resume from an earlier checkpoint)",
                      ckpt.path.string(), name, at));
    }
    Tensor dst = t;
    dst.copy_(saved);
  }
  opt.set_steps(ckpt.optimizer_step);
}

}  // namespace tinygpt

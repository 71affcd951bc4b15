#include "train/import_gguf.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <set>
#include <unordered_map>

#include "autograd/ops.h"
#include "data/bpe.h"
#include "data/pre_split.h"
#include "data/text.h"
#include "train/checkpoint.h"
#include "train/gguf.h"
#include "train/gguf_read.h"
#include "train/import_hf.h"

namespace tinygpt {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

Error not_importable(const gguf::File& f, const std::string& why) {
  return Error(fmt::format("'{}' is not a GGUF model tinygpt can import: {}", f.path(), why));
}

std::string shape_str(const std::vector<int64_t>& shape) { return fmt::format("({})", fmt::join(shape, ", ")); }

/// Llama 3's scaling from the factors of rope_freqs.weight (each pair's frequency divided by its factor). Only the
/// ratios of the original context to the band edges show in the factors, so low_freq_factor is taken as Llama 3's 1:
/// the largest factor is `factor`, and a pair blended between the bands (blend = (context / wavelength - 1) / (high -
/// 1)) gives, with a second, the context and high_freq_factor (Llama 3's 8192 and 4 come back exactly); with one, high
/// is taken as 4; with none, the context is 8192 or between the two bands. Refused unless the scaling gives every
/// factor back.
RopeScaling scaling_of(const gguf::File& f, const gguf::TensorInfo& t, double theta, int64_t E) {
  if (t.shape != std::vector<int64_t>{E / 2}) {
    throw not_importable(
        f, fmt::format("rope_freqs.weight is {} where its heads have {} rotary pairs", shape_str(t.shape), E / 2));
  }
  const std::vector<float> r = f.values(t);
  if (std::all_of(r.begin(), r.end(), [](float x) { return x == 1.0f; })) return RopeScaling{};
  RopeScaling s;
  s.factor = *std::max_element(r.begin(), r.end());
  const auto nice = [](double v) { return std::stod(fmt::format("{:.6g}", v)); };
  std::vector<std::pair<double, double>> blended;  // (1 / wavelength, blend)
  double kept_max = 0, scaled_min = 1e300;         // the wavelengths either side of the blend
  for (int64_t i = 0; i < E / 2; ++i) {
    const double x = double(r[size_t(i)]),
                 wavelength = 2.0 * 3.14159265358979323846 / std::pow(theta, -2.0 * double(i) / double(E));
    if (x > 1.0 + 1e-6 && x < s.factor * (1.0 - 1e-6)) {
      blended.emplace_back(1.0 / wavelength, (1.0 / x - 1.0 / s.factor) / (1.0 - 1.0 / s.factor));
    } else if (x <= 1.0 + 1e-6) {
      kept_max = std::max(kept_max, wavelength);
    } else {
      scaled_min = std::min(scaled_min, wavelength);
    }
  }
  std::vector<RopeScaling> candidates;
  if (blended.size() >= 2) {  // blend = a / wavelength - b with a = context / (high - 1), b = 1 / (high - 1)
    const auto [x0, b0] = blended.front();
    const auto [x1, b1] = blended.back();
    const double a = (b1 - b0) / (x1 - x0), b = a * x0 - b0;
    RopeScaling c = s;
    c.high_freq_factor = nice(1.0 + 1.0 / b), c.original_context = nice(a / b);
    candidates.push_back(c);
  } else if (blended.size() == 1) {
    RopeScaling c = s;
    c.original_context = nice((1.0 + 3.0 * blended[0].second) / blended[0].first);
    candidates.push_back(c);
  } else {
    candidates.push_back(s);
    RopeScaling c = s;
    c.original_context = nice(std::sqrt(4.0 * kept_max * std::min(scaled_min, 1e30)));
    candidates.push_back(c);
  }
  for (const RopeScaling& c : candidates) {
    const std::vector<float> back = rope_freq_factors(theta, c, E);
    bool same = true;
    for (size_t i = 0; i < r.size(); ++i) same = same && std::fabs(back[i] - r[i]) <= 1e-5f * std::fabs(r[i]);
    if (same) return c;
  }
  throw not_importable(f,
                       "its rope_freqs.weight holds frequency factors that are not Llama 3's scaling (the one "
                       "tinygpt implements)");
}

/// The Llama family's settings: grouped-query heads, RMSNorm, SwiGLU, rotary positions and their scaling, biases.
void llama_settings(const gguf::File& f, const std::string& a, nn::GPTConfig& c) {
  const auto nkv = int64_t(f.integer(a + "attention.head_count_kv", uint64_t(c.n_head)));
  c.n_kv_head = nkv == c.n_head ? 0 : nkv;
  c.norm = nn::NormKind::RMSNorm;
  c.mlp = nn::MlpKind::SwiGLU;
  c.pos = nn::Positions::Rope;
  c.norm_eps = f.number(a + "attention.layer_norm_rms_epsilon", 1e-5);
  c.rope_theta = f.number(a + "rope.freq_base", 10000.0);
  // Each head's width: attention.key_length where given (llama.cpp's default embedding_length / head_count).
  const uint64_t even = c.n_embd % c.n_head == 0 ? uint64_t(c.n_embd / c.n_head) : 0;
  const uint64_t k = f.integer(a + "attention.key_length", even), v = f.integer(a + "attention.value_length", k);
  if (k == 0 || k > 1024) {
    throw not_importable(f, fmt::format("its embedding_length {} is not a multiple of its head_count {} and its {} is "
                                        "{}",
                                        c.n_embd, c.n_head, a + "attention.key_length", k));
  }
  if (v != k) {
    throw not_importable(f,
                         fmt::format("its keys' heads are {} wide and its values' {} (tinygpt's are one width)", k, v));
  }
  c.head_dim = k == even ? 0 : int64_t(k);
  const int64_t E = c.head_size();
  if (const uint64_t d = f.integer(a + "rope.dimension_count", uint64_t(E)); d != uint64_t(E)) {
    throw not_importable(f, fmt::format("it rotates {} of each head's {} features (tinygpt rotates them all)", d, E));
  }
  if (const std::string kind = f.string(a + "rope.scaling.type", "none"); kind != "none") {
    throw not_importable(f, fmt::format("its RoPE scaling is {} (tinygpt implements Llama 3's, which llama.cpp keeps "
                                        "as rope_freqs.weight)",
                                        kind));
  }
  if (const gguf::TensorInfo* t = f.tensor("rope_freqs.weight")) c.rope_scaling = scaling_of(f, *t, c.rope_theta, E);
  const bool out_bias = f.tensor("blk.0.attn_output.bias") != nullptr,
             q_bias = f.tensor("blk.0.attn_q.bias") != nullptr;
  c.bias = out_bias;
  c.qkv_bias = q_bias && !out_bias;
}

/// Every tensor the model has, of its shape, and none it has no place for.
void check_tensors(const gguf::File& f, const nn::GPTConfig& c, const std::string& arch) {
  std::set<std::string, std::less<>> known = {"rope_freqs.weight"};
  for (const GgufPiece& p : gguf_pieces(c, arch)) {
    const gguf::TensorInfo* t = f.tensor(p.gguf);
    if (!t) throw not_importable(f, fmt::format("it has no tensor {}, which its metadata's model has", p.gguf));
    if (t->shape != p.shape) {
      throw not_importable(f, fmt::format("tensor {} is {} where the model its metadata describes has {}", p.gguf,
                                          shape_str(t->shape), shape_str(p.shape)));
    }
    known.insert(p.gguf);
  }
  for (const gguf::TensorInfo& t : f.tensors()) {
    if (!known.contains(t.name))
      throw not_importable(f, fmt::format("it has a tensor tinygpt has no place for, {}", t.name));
  }
}

/// A byte-level pre-split llama.cpp names (tokenizer.ggml.pre) as tokenizers' JSON, or null for one tinygpt lacks.
json pre_tokenizer_of(const std::string& pre) {
  const json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  const auto split = [](std::string_view pattern) {
    return json{{"type", "Sequence"},
                {"pretokenizers",
                 {{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
                  {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
  };
  // The names llama.cpp gives each of these regexes (llama-vocab.cpp), those of models tinygpt reads.
  static const std::set<std::string> kGpt2 = {"gpt-2", "phi-2", "jina-es", "jina-de", "jina-v2-es", "jina-v2-de"};
  static const std::set<std::string> kLlama3 = {"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"};
  static const std::set<std::string> kQwen2 = {"qwen2", "deepseek-r1-qwen"};
  if (kGpt2.contains(pre)) return byte_level;
  if (kLlama3.contains(pre)) return split(data::kLlama3Pattern);
  if (kQwen2.contains(pre)) return split(data::kQwen2Pattern);
  if (pre == "smollm") {
    return json{{"type", "Sequence"},
                {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level}}};
  }
  return nullptr;
}

}  // namespace

/// The pre-tokenizer of the file's byte-level BPE (tokenizer.ggml.pre) as tokenizer.json writes it; throws naming a
/// tokenizer or pre-tokenizer tinygpt does not read.
json gguf_pre_tokenizer(const gguf::File& f) {
  const std::string model = f.string("tokenizer.ggml.model");
  if (model == "llama") {
    throw not_importable(f,
                         "its tokenizer is SentencePiece (tokenizer.ggml.model \"llama\", as Llama 2's, Mistral's, "
                         "TinyLlama's and Gemma's); tinygpt reads byte-level BPE tokenizers (\"gpt2\": GPT-2's, "
                         "Llama 3's, Qwen2's, SmolLM2's)");
  }
  if (model != "gpt2")
    throw not_importable(f, fmt::format("its tokenizer is {} (tinygpt reads gpt2, a byte-level BPE)", model));
  const std::string pre = f.string("tokenizer.ggml.pre", "");
  const json pre_tokenizer = pre_tokenizer_of(pre);
  if (pre_tokenizer.is_null()) {
    throw not_importable(f, pre.empty() ? "it names no pre-tokenizer (tokenizer.ggml.pre; convert it again with a "
                                          "newer llama.cpp)"
                                        : fmt::format("its pre-tokenizer is {} (tinygpt splits as gpt-2, llama-bpe, "
                                                      "qwen2 and smollm do)",
                                                      pre));
  }
  return pre_tokenizer;
}

data::Tokenizer gguf_tokenizer(const gguf::File& f) {
  const json pre_tokenizer = gguf_pre_tokenizer(f);
  const std::vector<std::string> tokens = f.strings("tokenizer.ggml.tokens");
  const std::vector<std::string> merges = f.strings("tokenizer.ggml.merges");
  const std::string chat_template = f.string("tokenizer.chat_template", "");
  for (const auto& [what, strings] : {std::pair{"token", &tokens}, std::pair{"merge", &merges}}) {
    for (size_t i = 0; i < strings->size(); ++i) {
      if (!data::valid_utf8((*strings)[i]))
        throw not_importable(f, fmt::format("its {} {} is not valid UTF-8", what, i));
    }
  }
  if (!data::valid_utf8(chat_template)) throw not_importable(f, "its tokenizer.chat_template is not valid UTF-8");
  std::vector<int64_t> types = f.find("tokenizer.ggml.token_type") ? f.integers("tokenizer.ggml.token_type")
                                                                   : std::vector<int64_t>(tokens.size(), 1);
  if (types.size() != tokens.size()) {
    throw not_importable(f, fmt::format("it has {} tokens but {} token types", tokens.size(), types.size()));
  }
  if (int64_t(tokens.size()) > data::kMaxBpeVocab) {
    throw not_importable(f, fmt::format("its {} tokens are more than {}", tokens.size(), data::kMaxBpeVocab));
  }
  constexpr int64_t kControl = 3, kUserDefined = 4, kUnused = 5;
  size_t n = tokens.size();
  while (n > 0 && types[n - 1] == kUnused) --n;  // the model's padding past its tokenizer ([PADn])
  json vocab = json::object(), added = json::array();
  std::unordered_map<std::string_view, size_t> first;
  for (size_t id = 0; id < n; ++id) {
    if (const auto [it, fresh] = first.emplace(tokens[id], id); !fresh) {
      throw not_importable(f, fmt::format("its tokens {} and {} are both {}", it->second, id, json(tokens[id]).dump()));
    }
    vocab[tokens[id]] = id;
    if (types[id] == kControl || types[id] == kUserDefined) {
      added.push_back({{"id", id}, {"content", tokens[id]}, {"special", types[id] == kControl}});
    }
  }
  const auto token_id = [&](const char* key) -> int64_t {
    if (!f.find(key)) return -1;
    const uint64_t id = f.integer(key);
    if (id >= n) throw not_importable(f, fmt::format("its {} is {}, outside its {} tokens", key, id, n));
    return int64_t(id);
  };
  const int64_t bos = token_id("tokenizer.ggml.bos_token_id"), eos = token_id("tokenizer.ggml.eos_token_id");
  const auto is_added = [&](int64_t id) {
    return id >= 0 && (types[size_t(id)] == kControl || types[size_t(id)] == kUserDefined);
  };
  json post = nullptr;
  if (f.boolean("tokenizer.ggml.add_bos_token", false) && is_added(bos)) {
    const std::string& b = tokens[size_t(bos)];
    const json special = {{"SpecialToken", {{"id", b}, {"type_id", 0}}}};
    post = {{"type", "TemplateProcessing"},
            {"single", {special, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
            {"special_tokens", {{b, {{"id", b}, {"ids", {bos}}, {"tokens", {b}}}}}}};
  }
  const json j = {{"added_tokens", added},
                  {"normalizer", nullptr},
                  {"pre_tokenizer", pre_tokenizer},
                  {"post_processor", post},
                  {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
  data::BpeTokenizer bpe = data::BpeTokenizer::from_json(j.dump(), f.path());
  data::TokenizerConfig tc;
  if (is_added(bos)) tc.bos_token = tokens[size_t(bos)];
  if (is_added(eos)) tc.eos_token = tokens[size_t(eos)];
  tc.chat_template = chat_template;
  return data::Tokenizer(std::move(bpe), std::move(tc));
}

nn::GPTConfig gguf_config(const gguf::File& f, std::string& arch) {
  arch = f.string("general.architecture");
  if (arch != "llama" && arch != "qwen2" && arch != "gpt2") {
    throw not_importable(f, fmt::format("its architecture is {} (tinygpt imports llama, qwen2 and gpt2)", arch));
  }
  const std::string a = arch + ".";
  if (f.integer(a + "expert_count", 0) > 0)
    throw not_importable(f, "it is a mixture of experts (" + a + "expert_count)");
  const auto size = [&](const std::string& key) {
    const uint64_t v = f.integer(key);
    if (v == 0 || v > (uint64_t(1) << 30)) throw not_importable(f, fmt::format("its {} is {}", key, v));
    return int64_t(v);
  };
  nn::GPTConfig c;
  c.n_embd = size(a + "embedding_length");
  c.n_layer = size(a + "block_count");
  c.n_head = size(a + "attention.head_count");
  c.block_size = size(a + "context_length");
  c.ffn_hidden = size(a + "feed_forward_length");
  c.dropout = 0;
  if (arch == "gpt2" && c.n_embd % c.n_head != 0) {
    throw not_importable(
        f, fmt::format("its embedding_length {} is not a multiple of its head_count {}", c.n_embd, c.n_head));
  }
  const gguf::TensorInfo* embd = f.tensor("token_embd.weight");
  if (!embd || embd->shape.size() != 2 || embd->shape[1] != c.n_embd) {
    throw not_importable(f, fmt::format("its token_embd.weight is {}, not (vocabulary, {})",
                                        embd ? shape_str(embd->shape) : "missing", c.n_embd));
  }
  c.vocab_size = embd->shape[0];
  if (c.vocab_size > data::kMaxBpeVocab) {
    throw not_importable(f, fmt::format("its vocabulary of {} is over {}", c.vocab_size, data::kMaxBpeVocab));
  }
  c.untied_head = f.tensor("output.weight") != nullptr;
  if (arch == "gpt2") {
    c.bias = true;
    c.norm_eps = f.number(a + "attention.layer_norm_epsilon", 1e-5);
    if (c.ffn_hidden == 4 * c.n_embd) c.ffn_hidden = 0;
  } else {
    llama_settings(f, a, c);
  }
  try {
    c.validate();
  } catch (const Error& e) {
    throw not_importable(f, e.what());
  }
  if (c.n_layer > int64_t(f.tensors().size())) {  // before a table of its tensors is made
    throw not_importable(f,
                         fmt::format("its block_count {} is more than its {} tensors", c.n_layer, f.tensors().size()));
  }
  check_tensors(f, c, arch);
  return c;
}

fs::path import_gguf(const fs::path& file, const fs::path& out) {
  const gguf::File f(file);
  std::string arch;
  const nn::GPTConfig config = gguf_config(f, arch);
  data::Tokenizer tokenizer = gguf_tokenizer(f);
  if (tokenizer.vocab_size() > config.vocab_size) {
    throw not_importable(f, fmt::format("its tokenizer has {} tokens but token_embd.weight {} rows",
                                        tokenizer.vocab_size(), config.vocab_size));
  }
  // Every tensor is in the file with the model's shape (gguf_config checked): the model is no larger than the file's
  // tensors dequantized.
  Generator gen = Generator::for_loading();  // the weights are loaded next
  nn::GPT model(config, gen);
  NoGradGuard no_grad;
  ParameterWriter writer(model);
  for (const GgufPiece& p : gguf_pieces(config, arch)) {
    std::vector<float> w = f.values(*f.tensor(p.gguf));
    if (p.interleave > 0) w = interleave_rotary_pairs(w, p.interleave, p.shape.size() == 2 ? p.shape[1] : 1, true);
    writer.write(p.ours, p.row0, p.rows, from_vector(w, Shape(std::span<const int64_t>(p.shape))));
  }
  return save_imported(model, tokenizer, file, out);
}

}  // namespace tinygpt

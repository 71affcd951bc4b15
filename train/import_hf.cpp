#include "train/import_hf.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <set>

#include "autograd/ops.h"
#include "data/documents.h"
#include "train/checkpoint.h"
#include "train/hf_llama.h"
#include "train/memory.h"
#include "train/run_dir.h"
#include "train/safetensors.h"

namespace tinygpt {

namespace fs = std::filesystem;

namespace {

nlohmann::json read_json(const fs::path& path, const std::string& dir) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    throw Error(fmt::format("'{}' is not a Hugging Face model directory tinygpt can import: it has no {}", dir,
                            path.filename().string()));
  }
  std::ifstream in(path);
  const auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) throw Error(fmt::format("'{}' is not a JSON object", path.string()));
  return j;
}

/// GPT-2's config as tinygpt's; throws naming a setting tinygpt would compute differently.
nn::GPTConfig gpt_config_of(const nlohmann::json& j, const std::string& dir) {
  const auto bad = [&](const std::string& why) {
    return Error(fmt::format("'{}' is not a GPT-2 tinygpt can import: {}", dir, why));
  };
  const std::string type = j.value("model_type", std::string());
  if (type == "llama" || type == "qwen2") return llama_config_from_hf(j, dir);
  if (type != "gpt2") {
    throw Error(
        fmt::format("'{}' is not a model tinygpt can import: its config.json says model_type {} (tinygpt "
                    "imports gpt2, llama and qwen2)",
                    dir, j.value("model_type", nlohmann::json()).dump()));
  }
  const auto integer = [&](const char* key) -> int64_t {
    if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() <= 0) {
      throw bad(fmt::format("config.json has no positive integer {}", key));
    }
    return j[key].get<int64_t>();
  };
  nn::GPTConfig c;
  c.n_embd = integer("n_embd");
  c.n_layer = integer("n_layer");
  c.n_head = integer("n_head");
  c.block_size = integer("n_positions");
  c.vocab_size = integer("vocab_size");
  c.bias = true;
  c.dropout = 0;
  c.untied_head = !j.value("tie_word_embeddings", true);
  const std::string act = j.value("activation_function", std::string("gelu_new"));
  if (act != "gelu_new" && act != "gelu_pytorch_tanh") {
    throw bad(fmt::format("its activation is {} (tinygpt's GELU is the tanh approximation, gelu_new)", act));
  }
  if (j.contains("n_inner") && !j["n_inner"].is_null() && j["n_inner"] != 4 * c.n_embd) {
    throw bad(fmt::format("its MLP is {} wide (tinygpt's is 4 n_embd = {})", j["n_inner"].dump(), 4 * c.n_embd));
  }
  if (std::abs(j.value("layer_norm_epsilon", 1e-5) - 1e-5) > 1e-12) {
    throw bad(fmt::format("its LayerNorm epsilon is {} (tinygpt's is 1e-5)", j["layer_norm_epsilon"].dump()));
  }
  if (!j.value("scale_attn_weights", true) || j.value("scale_attn_by_inverse_layer_idx", false)) {
    throw bad("its attention scores are not scaled by 1 / sqrt(head size) alone");
  }
  if (c.vocab_size > data::kMaxBpeVocab)
    throw bad(fmt::format("its vocabulary of {} is over {}", c.vocab_size, data::kMaxBpeVocab));
  c.validate();
  return c;
}

/// The weights of a model directory: model.safetensors, or the shards model.safetensors.index.json names.
safetensors::Contents load_weights(const fs::path& dir) {
  std::error_code ec;
  if (fs::is_regular_file(dir / "model.safetensors", ec)) return safetensors::load(dir / "model.safetensors");
  const fs::path index = dir / "model.safetensors.index.json";
  if (!fs::is_regular_file(index, ec)) {
    throw Error(
        fmt::format("'{}' has no model.safetensors nor model.safetensors.index.json (tinygpt reads safetensors "
                    "weights, not pytorch_model.bin: save with save_pretrained(..., safe_serialization=True))",
                    dir.string()));
  }
  const nlohmann::json j = read_json(index, dir.string());
  if (!j.contains("weight_map") || !j["weight_map"].is_object()) {
    throw Error(fmt::format("'{}' has no weight_map object", index.string()));
  }
  std::set<std::string> shards;
  for (const auto& [name, file] : j["weight_map"].items()) {
    const std::string f = file.is_string() ? file.get<std::string>() : std::string();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..") {
      throw Error(
          fmt::format("'{}': tensor {} is in {}, not a file of the directory", index.string(), name, file.dump()));
    }
    shards.insert(f);
  }
  safetensors::Contents all;
  for (const std::string& f : shards) {
    if (!fs::is_regular_file(dir / f, ec)) throw Error(fmt::format("'{}': shard {} is missing", dir.string(), f));
    safetensors::Contents part = safetensors::load(dir / f);
    for (auto& t : part.tensors) all.tensors.push_back(std::move(t));
  }
  return all;
}

/// Fills a GPT-2's parameters. GPT-2's Conv1D keeps (in, out): our Linear's (out, in) transposed. Names with or
/// without "transformer.".
void load_gpt2(nn::GPT& model, const safetensors::Contents& weights, const std::string& dir) {
  const auto find = [&](const std::string& name) {
    Tensor t = weights.find(name);
    if (!t.defined() && name.rfind("transformer.", 0) == 0) t = weights.find(name.substr(12));
    if (!t.defined()) throw Error(fmt::format("'{}': the weights have no tensor {}", dir, name));
    return t.dtype() == DType::F32 ? t : t.to(DType::F32);
  };
  for (auto& [name, param] : model.named_parameters()) {
    const bool conv1d = name.find(".c_attn.weight") != std::string::npos ||
                        name.find(".c_proj.weight") != std::string::npos ||
                        name.find(".c_fc.weight") != std::string::npos;
    Tensor src = find(name);
    if (conv1d) src = transpose(src, 0, 1);
    if (src.shape() != param.shape()) {
      throw Error(fmt::format("'{}': tensor {} is {} where GPT-2 of this config has {}", dir, name,
                              conv1d ? transpose(src, 0, 1).shape().str() : src.shape().str(),
                              conv1d ? transpose(param, 0, 1).shape().str() : param.shape().str()));
    }
    param.copy_(src);
  }
}

/// Fills the model's parameters from a Llama or Qwen2 directory's weights by the one name table (llama_pieces).
void load_llama(nn::GPT& model, const safetensors::Contents& weights, const std::string& dir) {
  ParameterWriter writer(model);
  for (const HfPiece& p : llama_pieces(model.config())) {
    const Tensor src = weights.find(p.hf);
    if (!src.defined()) throw Error(fmt::format("'{}': the weights have no tensor {}", dir, p.hf));
    const Tensor& param = writer.parameter(p.ours);
    const Tensor dst = p.rows < 0 ? param : narrow(param, 0, p.row0, p.rows);
    if (!(src.shape() == dst.shape())) {
      throw Error(fmt::format("'{}': tensor {} is {} where the model its config.json describes has {}", dir, p.hf,
                              src.shape().str(), dst.shape().str()));
    }
    writer.write(p.ours, p.row0, p.rows, src.dtype() == DType::F32 ? src : src.to(DType::F32));
  }
}

/// A special token as tokenizer_config.json spells it: a string, an AddedToken object ({"content": ...}) or null.
std::string token_text(const nlohmann::json& j, const char* key, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return "";
  if (j[key].is_string()) return j[key].get<std::string>();
  if (j[key].is_object() && j[key].contains("content") && j[key]["content"].is_string())
    return j[key]["content"].get<std::string>();
  throw Error(fmt::format("'{}': its {} is neither a string nor a token object", path, key));
}

/// The model's bos, eos and chat template: from tokenizer_config.json (a template there, or in chat_template.jinja as
/// transformers 4.43 and later save it), the eos else from config.json's eos_token_id.
data::TokenizerConfig read_tokenizer_config(const fs::path& dir, const nlohmann::json& config,
                                            const data::BpeTokenizer& bpe) {
  data::TokenizerConfig tc;
  std::error_code ec;
  if (const fs::path path = dir / "tokenizer_config.json"; fs::is_regular_file(path, ec)) {
    const nlohmann::json j = read_json(path, dir.string());
    tc.bos_token = token_text(j, "bos_token", path.string());
    tc.eos_token = token_text(j, "eos_token", path.string());
    if (j.contains("chat_template") && j["chat_template"].is_string()) {
      tc.chat_template = j["chat_template"].get<std::string>();
    } else if (j.contains("chat_template") && j["chat_template"].is_array()) {  // named templates: the default one
      for (const auto& t : j["chat_template"]) {
        if (t.is_object() && t.value("name", "") == "default" && t.contains("template") && t["template"].is_string()) {
          tc.chat_template = t["template"].get<std::string>();
        }
      }
    }
  }
  if (const fs::path path = dir / "chat_template.jinja"; tc.chat_template.empty() && fs::is_regular_file(path, ec)) {
    if (fs::file_size(path, ec) > (1u << 20)) throw Error(fmt::format("'{}' is over 1 MiB", path.string()));
    std::ifstream in(path, std::ios::binary);
    tc.chat_template.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (tc.eos_token.empty()) {
    nlohmann::json id = config.value("eos_token_id", nlohmann::json());
    if (id.is_array() && !id.empty()) id = id[0];
    if (id.is_number_unsigned() && id.get<uint64_t>() < uint64_t(bpe.vocab_size())) {
      const std::string& text = bpe.token_bytes(int32_t(id.get<uint64_t>()));
      if (bpe.added_id(text) >= 0) tc.eos_token = text;
    }
  }
  for (std::string* token : {&tc.bos_token, &tc.eos_token}) {
    if (!token->empty() && bpe.added_id(*token) < 0) token->clear();  // not a token of its own: nothing to keep
  }
  return tc;
}

}  // namespace

ParameterWriter::ParameterWriter(nn::GPT& model) {
  for (auto& [name, t] : model.named_parameters()) params_.emplace(name, t);
}

void ParameterWriter::write(const std::string& ours, int64_t row0, int64_t rows, const Tensor& src) {
  Tensor& param = params_.at(ours);
  if (rows < 0) {
    param.copy_(src);
    return;
  }
  std::vector<Tensor>& parts = parts_[ours];
  parts.push_back(src);
  if (row0 + rows == param.size(0)) {  // the last piece
    param.copy_(concat(parts, 0));
    parts_.erase(ours);
  }
}

fs::path save_imported(const nn::GPT& model, const data::Tokenizer& tokenizer, const fs::path& source,
                       const fs::path& out) {
  const fs::path run = make_output_dir(out.string());
  TrainState state;
  state.train_config = {{"imported_from", fs::absolute(source).lexically_normal().string()}};
  const fs::path path = run / kLatestCheckpoint;
  save_checkpoint(path, model, tokenizer, nullptr, state);
  return path;
}

fs::path import_hf(const fs::path& dir, const fs::path& out) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw Error(fmt::format("--from '{}' is not a directory", dir.string()));
  const nlohmann::json hf_config = read_json(dir / "config.json", dir.string());
  const nn::GPTConfig config = gpt_config_of(hf_config, dir.string());
  if (!fs::is_regular_file(dir / "tokenizer.json", ec)) {
    throw Error(fmt::format("'{}' has no tokenizer.json (a byte-level BPE, as GPT-2's)", dir.string()));
  }
  data::BpeTokenizer bpe = data::read_tokenizer_file(dir / "tokenizer.json");
  data::TokenizerConfig tc = read_tokenizer_config(dir, hf_config, bpe);
  data::Tokenizer tokenizer(std::move(bpe), std::move(tc));
  // An embedding may be padded past the tokenizer (Qwen2.5: 151,936 rows for 151,665 tokens); never the other way.
  if (tokenizer.vocab_size() > config.vocab_size) {
    throw Error(fmt::format("'{}': its tokenizer has {} tokens but its config says vocab_size {}", dir.string(),
                            tokenizer.vocab_size(), config.vocab_size));
  }
  const safetensors::Contents weights = load_weights(dir);
  // Sizes checked against the files before anything is allocated: a config.json describing far more parameters than
  // the weights hold (a hostile one) is refused here, not by an allocation that cannot succeed; a nearer mismatch is
  // named tensor by tensor below.
  double held = 0;
  for (const auto& [name, t] : weights.tensors) held += double(t.numel());
  if (const double need = gpt_parameter_count(config); need > 2 * held + double(1 << 20)) {
    throw Error(
        fmt::format("'{}': its config.json describes a model of {:.0f} parameters but the weights hold {:.0f} "
                    "values",
                    dir.string(), need, held));
  }
  Generator gen = Generator::for_loading();  // the weights are loaded next
  nn::GPT model(config, gen);
  NoGradGuard no_grad;
  (is_llama_shaped(config) ? load_llama : load_gpt2)(model, weights, dir.string());
  return save_imported(model, tokenizer, dir, out);
}

}  // namespace tinygpt

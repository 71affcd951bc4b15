// Checkpoints: one .safetensors file holding the model's weights under nanoGPT's names, the optimizer's
// state under "optimizer.<param>.exp_avg" / ".exp_avg_sq" (AdamW) or ".momentum_buffer" (Muon), and metadata: the model
// config, the vocabulary
// ("vocab": the characters; or "tokenizer": a byte-level BPE's tokenizer.json),
// the iteration, the best validation loss, the random generators' states and the run's training flags.
// A run directory keeps ckpt_latest.safetensors and ckpt_best.safetensors.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <limits>

#include "../autograd/random.h"
#include "../data/tokenizer.h"
#include "../nn/gpt.h"
#include "optimizer.h"
#include "safetensors.h"

namespace tinygpt {

inline constexpr const char* kLatestCheckpoint = "ckpt_latest.safetensors";
inline constexpr const char* kBestCheckpoint = "ckpt_best.safetensors";

/// The base a LoRA run adapts: its checkpoint file and a checksum of its weights (base_checksum), so a LoRA
/// checkpoint, which holds only the adapters, finds its base again and refuses one that changed.
struct LoraBase {
  std::string path;  // absolute
  uint64_t checksum = 0;
  bool operator==(const LoraBase&) const = default;
};

/// Everything beyond the weights that a resumed run needs.
struct TrainState {
  int64_t iter = 0;          // iterations completed
  double train_seconds = 0;  // time spent in those iterations' steps (what --time-budget counts)
  double best_val_loss = std::numeric_limits<double>::infinity();
  Generator::State sampler_rng{};  // the training batch sampler
  Generator::State model_rng{};    // dropout masks
  nlohmann::json train_config = nlohmann::json::object();
  LoraBase lora_base;  // with LoRA
};

struct Checkpoint {
  std::filesystem::path path;
  nn::GPTConfig config;
  data::Tokenizer tokenizer;  // its characters, or its byte-level BPE
  TrainState state;
  int64_t optimizer_step = 0;
  std::string optimizer = "adamw";  // its --optimizer ("adamw" in checkpoints from before Muon); "none": weights only
  Numerics numerics;    // what the model computed with in training (eval and sample use it unless told otherwise)
  std::string storage;  // its activations' storage, "f32" or "bf16"; "" in checkpoints from before it was recorded
  safetensors::Contents contents;
  nn::LoraConfig merged_lora;  // LoRA adapters merge_lora merged into the weights (read with LoraLoad::Merged)
};

/// Writes a checkpoint crash-safely (temporary file, flush, rename). opt may be null (weights only). A model with LoRA
/// adapters saves only them, with state.lora_base naming the base.
void save_checkpoint(const std::filesystem::path& path, const nn::GPT& model, const data::Tokenizer& tokenizer,
                     const Optimizer* opt, const TrainState& state);

/// A run directory means its best checkpoint, else its latest; a file means itself.
std::filesystem::path resolve_checkpoint(const std::filesystem::path& path);

/// How load_checkpoint gives a LoRA checkpoint: its adapters merged into the base's weights (W + alpha/rank B A: a
/// plain checkpoint, config without LoRA, for sampling, chat, eval, export and fine-tuning from it), or the base's
/// weights and the adapters apart (config with LoRA: resuming the run).
enum class LoraLoad { Merged, Apart };

/// Reads and validates a checkpoint (format, config, vocabulary, weights present with the config's shapes); a LoRA
/// checkpoint's base is read too (from LoraBase::path, its checksum checked). Throws naming the file and the problem.
Checkpoint load_checkpoint(const std::filesystem::path& path, LoraLoad lora = LoraLoad::Merged);

/// A checksum of a checkpoint's weights (its tensors but the optimizer's, by name): a LoRA run's LoraBase.
uint64_t base_checksum(const safetensors::Contents& contents);
/// Merges a checkpoint's LoRA adapters into its weights (W += alpha/rank B A, in f32) and drops them; its config then
/// has no LoRA. Nothing for a checkpoint without.
void merge_lora(Checkpoint& ckpt);

/// Copies the checkpoint's weights into a model built from its config (with LoRA adapters the checkpoint lacks, a base
/// being adapted: they keep their initialization).
void load_weights(nn::GPT& model, const Checkpoint& ckpt);
/// load_weights into a model whose vocabulary has more rows than the checkpoint's (tokens added to its tokenizer): the
/// embedding's and an untied head's first rows are the checkpoint's, the others keep the model's initialization.
void load_weights_grown(nn::GPT& model, const Checkpoint& ckpt);
/// Restores the optimizer's state and step count; throws when the checkpoint has none, or another optimizer's.
void load_optimizer(Optimizer& opt, const Checkpoint& ckpt);

nlohmann::json to_json(const nn::GPTConfig& c);
/// Llama 3's RoPE scaling as Hugging Face's config.json writes it (rope_type "llama3", factor, low_freq_factor,
/// high_freq_factor, original_max_position_embeddings), in checkpoints too; the reader throws Error naming another
/// rope_type or a missing number.
nlohmann::json rope_scaling_json(const RopeScaling& s);
RopeScaling rope_scaling_from_json(const nlohmann::json& j);
nn::GPTConfig gpt_config_from_json(const nlohmann::json& j);

}  // namespace tinygpt

// Import from Hugging Face transformers: a GPT2LMHeadModel directory (config.json, model.safetensors, a byte-level BPE
// tokenizer.json) as a tinygpt checkpoint, the reverse of export_hf, so a GPT-2 downloaded from the Hub samples,
// evaluates and fine-tunes (train --init-from) here.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "../data/tokenizer.h"
#include "../nn/gpt.h"

namespace tinygpt {

/// Reads `dir` and writes `out`/ckpt_latest.safetensors (weights, config and tokenizer; no optimizer state, iteration
/// 0). Throws naming what does not fit: a missing file, a model that is not GPT-2 or that GPT-2's tinygpt model cannot
/// compute the same way (another activation or LayerNorm epsilon), a tensor missing or of the wrong shape, a tokenizer
/// that is not a byte-level BPE with GPT-2's pre-split, or one whose size is not the model's vocabulary.
std::filesystem::path import_hf(const std::filesystem::path& dir, const std::filesystem::path& out);

/// An imported model's parameters written piece by piece (the Hugging Face and GGUF imports): a whole parameter at
/// once, a fused one (c_attn as q, k, v; mlp.c_fc as gate, up) when its last rows arrive, in order.
class ParameterWriter {
 public:
  explicit ParameterWriter(nn::GPT& model);
  /// `src` (f32, of the piece's shape: the caller checked) is rows [row0, row0 + rows) of `ours` (rows < 0: all).
  void write(const std::string& ours, int64_t row0, int64_t rows, const Tensor& src);
  const Tensor& parameter(const std::string& ours) const { return params_.at(ours); }

 private:
  std::map<std::string, Tensor> params_;
  std::map<std::string, std::vector<Tensor>> parts_;  // a fused parameter's pieces so far
};

/// Writes an imported model as `out`/ckpt_latest.safetensors (no optimizer state, iteration 0, `source` recorded as
/// imported_from) and returns its path: the run directory is made only now, so a refused import leaves nothing.
std::filesystem::path save_imported(const nn::GPT& model, const data::Tokenizer& tokenizer,
                                    const std::filesystem::path& source, const std::filesystem::path& out);

}  // namespace tinygpt

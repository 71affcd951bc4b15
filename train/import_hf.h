// Import from Hugging Face transformers: a GPT2LMHeadModel directory (config.json, model.safetensors, a byte-level BPE
// tokenizer.json) as a tinygpt checkpoint, the reverse of export_hf, so a GPT-2 downloaded from the Hub samples,
// evaluates and fine-tunes (train --init-from) here.
#pragma once

#include <filesystem>

namespace tinygpt {

/// Reads `dir` and writes `out`/ckpt_latest.safetensors (weights, config and tokenizer; no optimizer state, iteration
/// 0). Throws naming what does not fit: a missing file, a model that is not GPT-2 or that GPT-2's tinygpt model cannot
/// compute the same way (another activation or LayerNorm epsilon), a tensor missing or of the wrong shape, a tokenizer
/// that is not a byte-level BPE with GPT-2's pre-split, or one whose size is not the model's vocabulary.
std::filesystem::path import_hf(const std::filesystem::path& dir, const std::filesystem::path& out);

}  // namespace tinygpt

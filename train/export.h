// Export to Hugging Face transformers: a checkpoint as a GPT2LMHeadModel directory that
// AutoModelForCausalLM.from_pretrained and AutoTokenizer.from_pretrained load.
#pragma once

#include <filesystem>

#include "checkpoint.h"

namespace tinygpt {

/// Throws naming why when GPT-2 cannot express the model: rotary position embeddings (GPT-2 has a learned
/// position table) or grouped-query heads (every GPT-2 head has its own keys and values).
void check_hf_exportable(const nn::GPTConfig& config);

/// Writes into `dir` (created if missing; our four files overwritten, nothing else touched):
///   config.json            GPT2Config: sizes, GELU (tanh), LayerNorm eps 1e-5, tied LM head
///   model.safetensors      GPT-2's names and layouts: the projections of Conv1D as (in, out), so our (out, in)
///                          weights transposed; biases as zeros where the model has none
///   tokenizer.json         the character vocabulary: one token per character, decoding joins them unchanged
///   tokenizer_config.json  PreTrainedTokenizerFast, no clean-up of spaces
void export_hf(const Checkpoint& ckpt, const std::filesystem::path& dir);

}  // namespace tinygpt

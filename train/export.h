// Export to Hugging Face transformers: a checkpoint as a GPT2LMHeadModel directory (a Llama-shaped model as
// LlamaForCausalLM or Qwen2ForCausalLM, train/hf_llama.h) that AutoModelForCausalLM.from_pretrained and
// AutoTokenizer.from_pretrained load.
#pragma once

#include <filesystem>
#include <string>

#include "checkpoint.h"

namespace tinygpt {

/// Throws naming why when the model's Hugging Face class cannot express it: for GPT-2 other position schemes than its
/// learned table, grouped-query heads, another MLP; for Llama the parts of GPT-2 beside its own, score modifiers.
void check_hf_exportable(const nn::GPTConfig& config);

/// The transformers class an export of the model is: GPT2LMHeadModel, LlamaForCausalLM or Qwen2ForCausalLM.
std::string hf_architecture(const nn::GPTConfig& config);

/// Writes into `dir` (created if missing; our four files overwritten, nothing else touched):
///   config.json            GPT2Config: sizes, GELU (tanh), LayerNorm eps 1e-5, tied LM head
///   model.safetensors      GPT-2's names and layouts: the projections of Conv1D as (in, out), so our (out, in)
///                          weights transposed; biases as zeros where the model has none
///   tokenizer.json         the character vocabulary: one token per character, decoding joins them unchanged
///   tokenizer_config.json  PreTrainedTokenizerFast, no clean-up of spaces
void export_hf(const Checkpoint& ckpt, const std::filesystem::path& dir);

}  // namespace tinygpt

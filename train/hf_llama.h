// The Llama family in Hugging Face's terms (LlamaForCausalLM, Qwen2ForCausalLM): the config.json keys that describe
// tinygpt's model with RMSNorm, a SwiGLU MLP, rotary positions and grouped-query heads, and the one table that maps
// its tensors to Hugging Face's names, read by the import and the export alike.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "../nn/gpt.h"

namespace tinygpt {

/// Whether the config is of the Llama family (RMSNorm, SwiGLU or rotary positions): exported as LlamaForCausalLM
/// (or Qwen2ForCausalLM), not GPT-2.
bool is_llama_shaped(const nn::GPTConfig& c);

/// The model of a Llama or Qwen2 config.json ("model_type" llama or qwen2); throws naming the first setting tinygpt
/// would compute differently (another activation, head_dim, rope_scaling, sliding window, biases it cannot place).
/// `what` names the directory in errors.
nn::GPTConfig llama_config_from_hf(const nlohmann::json& j, const std::string& what);

/// Throws naming what LlamaForCausalLM and Qwen2ForCausalLM cannot express (the GPT-2 parts of a mixed model, score
/// modifiers, document masks, soft-capped logits, QK-norm).
void check_llama_exportable(const nn::GPTConfig& c);

/// The config.json of a Llama-shaped model: Qwen2's where the q, k and v projections alone have biases, else Llama's.
/// bos and eos: token ids, or -1 for none.
nlohmann::json llama_config_to_hf(const nn::GPTConfig& c, int64_t bos, int64_t eos);

/// One Hugging Face tensor: rows [row0, row0 + rows) of tinygpt's parameter `ours` (rows -1: all of it). The fused
/// projections hold several: c_attn is [q; k; v], mlp.c_fc is [gate; up].
struct HfPiece {
  std::string hf, ours;
  int64_t row0 = 0, rows = -1;
};
/// Every tensor of the model under Hugging Face's names (model.layers.N.self_attn.q_proj.weight, ...), in order.
std::vector<HfPiece> llama_pieces(const nn::GPTConfig& c);

}  // namespace tinygpt

// LoRA in the trainer: the base frozen, what trains, the log's line. The adapters themselves are the model's
// (nn::LoraConfig, GPTConfig::lora_sites, Linear::add_adapter); their checkpoints are checkpoint.h's (LoraBase).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "../nn/gpt.h"
#include "checkpoint.h"

namespace tinygpt {

/// The identity a LoRA run records for its base: the checkpoint's absolute path and its weights' checksum.
LoraBase lora_base_of(const Checkpoint& base);
/// Turns off the gradient of every parameter but the adapters'.
void freeze_base(nn::GPT& model);
/// Throws, with LoRA, for an sft that would add tokens to the tokenizer (ChatML's): a frozen embedding cannot learn
/// them.
void refuse_lora_new_tokens(const nn::LoraConfig& lora);
/// The parameters that train, each named: all of them, or with LoRA the adapters alone, the frozen base's weights then
/// kept only in bf16 where activations are (they are read as bf16 copies anyway; the f32 values would only hold
/// memory).
std::vector<std::pair<std::string, Tensor>> trainable_parameters(nn::GPT& model, bool bf16_storage);
/// The log's LoRA line: the adapters, what trains, the base.
std::string describe_lora(const nn::GPT& model, const std::vector<std::pair<std::string, Tensor>>& trained,
                          const LoraBase& base);

}  // namespace tinygpt

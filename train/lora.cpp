#include "train/lora.h"

#include <filesystem>

namespace tinygpt {

LoraBase lora_base_of(const Checkpoint& base) {
  return {std::filesystem::absolute(base.path).lexically_normal().string(), base_checksum(base.contents)};
}

void freeze_base(nn::GPT& model) {
  for (auto& [name, p] : model.named_parameters()) {
    if (!nn::is_lora_parameter(name)) p.requires_grad_(false);
  }
}

void refuse_lora_new_tokens(const nn::LoraConfig& lora) {
  if (!lora.enabled()) return;
  throw Error(
      "sft --lora-rank: this model's tokenizer lacks ChatML's tokens, which a frozen embedding cannot learn; "
      "run a full sft (without --lora-rank) first, or give --chat-template a template the tokenizer has the "
      "tokens of");
}

std::vector<std::pair<std::string, Tensor>> trainable_parameters(nn::GPT& model, bool bf16_storage) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [name, p] : model.named_parameters()) {
    if (p.requires_grad()) {
      out.emplace_back(name, p);
    } else if (bf16_storage) {
      p.convert_(DType::BF16);
    }
  }
  return out;
}

std::string describe_lora(const nn::GPT& model, const std::vector<std::pair<std::string, Tensor>>& trained,
                          const LoraBase& base) {
  const nn::LoraConfig& l = model.config().lora;
  int64_t n = 0;
  for (const auto& [name, p] : trained) n += p.numel();
  const int64_t all = model.num_parameters();
  return fmt::format(
      "LoRA: rank {}, alpha {:g}, on {} of {} blocks: {:.2f}M parameters train ({:.2f}% of {:.1f}M), the "
      "base frozen{} ({})\n",
      l.rank, l.alpha, nn::lora_targets_name(l.targets), model.config().n_layer, double(n) / 1e6,
      100.0 * double(n) / double(all), double(all - n) / 1e6, model.numerics().bf16_storage ? " in bf16" : "",
      base.path);
}

}  // namespace tinygpt

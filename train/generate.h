// Text generation from a trained GPT, one token at a time.
//
// With the key/value cache (the default) each new token costs one position's forward pass against the
// cached keys and values of the earlier ones. When the cache is full (block_size positions), the context is
// cropped to its last block_size / 2 tokens and the cache rebuilt from them in one forward pass, so every
// token sees at least block_size / 2 tokens of context and a rebuild happens once per block_size / 2 tokens.
// Models with relative positions (relative, ALiBi, T5, none) slide the cache instead: the oldest block_size / 2
// positions are dropped and the others' keys and values kept, so every token still sees the earlier ones'
// keys as computed with their own longer context, and nothing is recomputed. Without the cache, every token reruns
// the model over the last block_size tokens (nanoGPT's sampler). With a document separator, a token that follows
// one starts a fresh context, as a new document did in training.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "../autograd/random.h"
#include "../nn/gpt.h"

namespace tinygpt {

struct GenerateOptions {
  int64_t max_new_tokens = 500;
  double temperature = 0.8;  // 0: always the most likely token
  int64_t top_k = 200;       // 0: no cut
  double top_p = 1.0;        // < 1: only the most likely tokens whose probabilities sum to top_p (nucleus sampling)
  bool kv_cache = true;
  int64_t vocab = 0;  // > 0: only ids below it are drawn (a model padded past its tokenizer, as Qwen2.5's embedding)
  bool operator==(const GenerateOptions&) const = default;
};

/// Samples one id from logits (vocab) at o.temperature, keeping the o.top_k most likely (ties kept) and of those the
/// most likely whose probabilities sum to o.top_p.
int32_t sample_token(std::vector<float> logits, const GenerateOptions& o, Generator& gen);

/// Continues `prompt` (at least one id); calls on_token(id) for each new one as it is drawn and returns them.
std::vector<int32_t> generate(const nn::GPT& model, const std::vector<int32_t>& prompt, const GenerateOptions& options,
                              Generator& gen, const std::function<void(int32_t)>& on_token = {});

}  // namespace tinygpt

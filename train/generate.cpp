#include "train/generate.h"

#include <algorithm>
#include <cmath>

namespace tinygpt {

int32_t sample_token(std::vector<float> logits, const GenerateOptions& o, Generator& gen) {
  if (logits.empty()) throw Error("sample_token: no logits");
  if (o.temperature <= 0) return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  float cut = -INFINITY;
  if (o.top_k > 0 && o.top_k < int64_t(logits.size())) {
    std::vector<float> sorted = logits;
    std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(), std::greater<float>());
    cut = sorted[size_t(o.top_k - 1)];
  }
  const float max = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    p[i] = logits[i] < cut ? 0.0 : std::exp(double(logits[i] - max) / o.temperature);
    total += p[i];
  }
  if (o.top_p < 1) {
    // The nucleus: the most likely tokens, in order, until their share reaches top_p (the one that crosses it kept).
    std::vector<int32_t> order;
    for (size_t i = 0; i < p.size(); ++i) {
      if (p[i] > 0) order.push_back(int32_t(i));
    }
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[size_t(a)] > p[size_t(b)]; });
    double kept = 0;
    size_t n = 0;
    while (n < order.size() && kept < o.top_p * total) kept += p[size_t(order[n++])];
    for (size_t i = std::max<size_t>(n, 1); i < order.size(); ++i) p[size_t(order[i])] = 0;
    total = std::max(kept, p[size_t(order[0])]);
  }
  double u = gen.uniform() * total;
  for (size_t i = 0; i < p.size(); ++i) {
    if (u < p[i]) return int32_t(i);
    u -= p[i];
  }
  // Rounding left u past the end: the last candidate.
  for (size_t i = p.size(); i-- > 0;) {
    if (p[i] > 0) return int32_t(i);
  }
  return 0;
}

std::vector<int32_t> generate(const nn::GPT& model, const std::vector<int32_t>& prompt, const GenerateOptions& o,
                              Generator& gen, const std::function<void(int32_t)>& on_token) {
  if (prompt.empty()) throw Error("generate: the prompt has no tokens");
  NoGradGuard no_grad;
  const int64_t block = model.config().block_size;
  const Device device = model.device();
  auto ids_tensor = [&](std::vector<int32_t>::const_iterator begin, std::vector<int32_t>::const_iterator end) {
    return from_vector(std::vector<int32_t>(begin, end), {1, int64_t(end - begin)}).to(device);
  };
  std::vector<int32_t> context = prompt;
  // The current document starts here: a token after a document separator sees nothing before it.
  size_t doc_start = 0;
  for (size_t n = 1; n < context.size(); ++n) {
    if (model.ends_document(std::vector<int32_t>(context.begin(), context.begin() + int64_t(n)))) doc_start = n;
  }
  auto in_document = [&] { return int64_t(context.size() - doc_start); };
  std::vector<int32_t> out;
  nn::KVCache cache;
  Tensor logits;
  // The cache is (re)built from the last `keep` tokens of the context.
  auto rebuild = [&](int64_t keep) {
    cache.len = 0;
    logits = model.forward_cached(ids_tensor(context.end() - keep, context.end()), cache);
  };
  if (o.kv_cache) {  // room for the prompt and the tokens to come, within the block
    const int64_t start = std::min<int64_t>(in_document(), block);
    cache = model.make_cache(1, std::min<int64_t>(block, start + std::max<int64_t>(o.max_new_tokens, 1)));
    rebuild(start);
  }
  for (int64_t i = 0; i < o.max_new_tokens; ++i) {
    if (!o.kv_cache) {
      const int64_t keep = std::min<int64_t>(in_document(), block);
      logits = model.last_logits(ids_tensor(context.end() - keep, context.end()));
    }
    // f32 for sampling whatever the storage (bf16 logits with --storage bf16).
    std::vector<float> row = logits.to(Device::CPU).to(DType::F32).to_vector<float>();
    if (o.vocab > 0 && o.vocab < int64_t(row.size())) row.resize(size_t(o.vocab));  // the padding is never drawn
    const int32_t next = sample_token(std::move(row), o, gen);
    const bool new_document = model.ends_document(context);
    out.push_back(next);
    context.push_back(next);
    if (new_document) doc_start = context.size() - 1;
    if (on_token) on_token(next);
    if (o.kv_cache && i + 1 < o.max_new_tokens) {
      if (new_document) {
        rebuild(1);
      } else if (cache.len == cache.capacity() && model.config().relative_positions()) {
        model.slide_cache(cache, std::max<int64_t>(cache.capacity() / 2, 1));  // relative positions: keep the keys
        logits = model.forward_cached(ids_tensor(context.end() - 1, context.end()), cache);
      } else if (cache.len == cache.capacity()) {
        rebuild(std::max<int64_t>(std::min<int64_t>(block, cache.capacity()) / 2, 1));
      } else {
        logits = model.forward_cached(ids_tensor(context.end() - 1, context.end()), cache);
      }
    }
  }
  return out;
}

}  // namespace tinygpt

#include "train/decoder.h"

#include <algorithm>

namespace tinygpt {

CachedDecoder::CachedDecoder(const nn::GPT& model, const data::Tokenizer& tokenizer, int64_t window)
    : model_(model),
      tokenizer_(tokenizer),
      window_(std::min(window, model.config().block_size)),
      cache_(model.make_cache(1, window_)) {}

void CachedDecoder::clear() {
  cache_.len = 0;
  cached_.clear();
}

size_t held_back(std::string_view text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const std::string& stop : stops) {
    for (size_t n = std::min(stop.size() - (stop.empty() ? 0 : 1), text.size()); n > hold; --n) {
      if (text.compare(text.size() - n, n, stop, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  // A UTF-8 character's leading bytes without all of its continuation bytes yet.
  for (size_t back = 1; back <= std::min<size_t>(3, text.size()); ++back) {
    const auto c = static_cast<unsigned char>(text[text.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t length = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (length > back) hold = std::max(hold, back);
    break;
  }
  return hold;
}

CachedDecoder::Result CachedDecoder::draw(const std::vector<int32_t>& prompt, const std::vector<std::string>& stops,
                                          const GenerateOptions& o, Generator& gen,
                                          const std::function<void(std::string_view)>& on_text,
                                          const std::function<bool()>& should_stop) {
  if (prompt.empty()) throw Error("the prompt has no tokens");
  if (int64_t(prompt.size()) >= window_) {
    throw Error(fmt::format("the prompt is {} tokens: it leaves no room for a reply in the window of {}", prompt.size(),
                            window_));
  }
  NoGradGuard no_grad;
  Result r;
  // Keep what the cache shares with this prompt; at least the last token is read again, for its logits.
  size_t keep = 0;
  while (keep < cached_.size() && keep < prompt.size() && cached_[keep] == prompt[keep]) ++keep;
  keep = std::min(keep, prompt.size() - 1);
  cache_.len = int64_t(keep);
  cached_.assign(prompt.begin(), prompt.end());
  r.read = int64_t(prompt.size() - keep);
  const Device device = model_.device();
  auto feed = [&](std::vector<int32_t> tokens) {
    const int64_t n = int64_t(tokens.size());
    return model_.forward_cached(from_vector(std::move(tokens), {1, n}).to(device), cache_);
  };
  Tensor logits = feed({prompt.begin() + int64_t(keep), prompt.end()});
  std::string& text = r.text;  // the reply's bytes so far
  size_t shown = 0;            // of which on_text has had these
  size_t longest_stop = 0;
  for (const std::string& s : stops) longest_stop = std::max(longest_stop, s.size());
  const int32_t end_of_text = tokenizer_.end_of_text();
  while (r.tokens < o.max_new_tokens) {
    if (should_stop && should_stop()) {
      r.stopped = true;
      break;
    }
    std::vector<float> row = logits.to(Device::CPU).to(DType::F32).to_vector<float>();
    if (o.vocab > 0 && o.vocab < int64_t(row.size())) row.resize(size_t(o.vocab));
    const int32_t next = sample_token(std::move(row), o, gen);
    ++r.tokens;
    if (next == end_of_text) {
      r.ended = true;
      break;
    }
    text += tokenizer_.token_bytes(uint32_t(next));
    // A stop string wholly in the text: the first one found, searched from where a new one could begin.
    const size_t from = shown > longest_stop ? shown - longest_stop : 0;
    size_t at = std::string::npos;
    for (const std::string& s : stops) {
      if (!s.empty()) at = std::min(at, text.find(s, from));
    }
    if (at != std::string::npos) {
      text.resize(at);
      r.ended = true;
      break;
    }
    const size_t hold = held_back(text, stops);
    if (on_text && text.size() - hold > shown)
      on_text(std::string_view(text).substr(shown, text.size() - hold - shown));
    shown = std::max(shown, text.size() - hold);
    if (cache_.len + 1 >= cache_.capacity()) {  // the prompt and the reply fill the window
      r.full = true;
      break;
    }
    cached_.push_back(next);
    logits = feed({next});
  }
  if (on_text && text.size() > shown) on_text(std::string_view(text).substr(shown));
  return r;
}

}  // namespace tinygpt

#include "train/chat.h"

#include <fmt/format.h>

#include <algorithm>

namespace tinygpt {

ChatSession::ChatSession(const nn::GPT& model, const data::Tokenizer& tokenizer, data::ChatTemplate chat_template,
                         int64_t window, GenerateOptions options, uint64_t seed)
    : model_(model), tokenizer_(tokenizer), template_(std::move(chat_template)),
      end_of_turn_(template_.end_of_turn(tokenizer.config())), window_(std::min(window, model.config().block_size)),
      options_(options), gen_(seed), cache_(model.make_cache(1, window_)) {
  options_.vocab = tokenizer.vocab_size();  // a vocabulary padded past the tokenizer: the padding is never drawn
}

void ChatSession::reset(std::string system) {
  messages_ = data::Messages::array();
  if (!system.empty()) add("system", system);
  cache_.len = 0;
  cached_.clear();
}

void ChatSession::add(const std::string& role, const std::string& content) {
  messages_.push_back({{"role", role}, {"content", content}});
}

std::vector<int32_t> ChatSession::render_to_fit(int64_t& dropped) {
  // Room kept for the reply: --max-new-tokens, or an eighth of the window where that is less (the reply may still run
  // on until the window is full).
  const int64_t reserve = std::clamp<int64_t>(options_.max_new_tokens, 1, std::max<int64_t>(window_ / 8, 1));
  while (true) {
    const std::string text = template_.render(messages_, true, tokenizer_.config());
    const std::vector<uint32_t> ids = tokenizer_.encode_rendered(text, "the conversation");
    if (int64_t(ids.size()) + reserve <= window_) return {ids.begin(), ids.end()};
    // Drop the oldest message after the system prompt, and then up to the next user message, so turns stay whole.
    const size_t first = !messages_.empty() && messages_[0]["role"] == "system" ? 1 : 0;
    if (messages_.size() - first <= 1) {
      throw Error(fmt::format("the conversation's last message{} is {} tokens; with room for a reply of {} it does not "
                              "fit the window of {} tokens (a shorter message, or a larger --context)",
                              first ? " and the system prompt" : "", ids.size(), reserve, window_));
    }
    do {
      messages_.erase(messages_.begin() + int64_t(first));
      ++dropped;
    } while (messages_.size() - first > 1 && messages_[first]["role"] != "user");
  }
}

ChatSession::Reply ChatSession::reply(const std::string& user, const std::function<void(std::string_view)>& on_text,
                                      const std::atomic<bool>* stop) {
  add("user", user);
  try {
    return respond(on_text, stop);
  } catch (...) {
    messages_.erase(messages_.end() - 1);  // a message that did not fit leaves the conversation as it was
    throw;
  }
}

ChatSession::Reply ChatSession::respond(const std::function<void(std::string_view)>& on_text,
                                        const std::atomic<bool>* stop) {
  NoGradGuard no_grad;
  Reply r;
  const std::vector<int32_t> ids = render_to_fit(r.dropped);
  // Keep what the cache shares with this rendering; at least the last token is read again, for its logits.
  size_t keep = 0;
  while (keep < cached_.size() && keep < ids.size() && cached_[keep] == ids[keep]) ++keep;
  keep = std::min(keep, ids.size() - 1);
  cache_.len = int64_t(keep);
  cached_.assign(ids.begin(), ids.end());
  r.read = int64_t(ids.size() - keep);
  const Device device = model_.device();
  auto feed = [&](std::vector<int32_t> tokens) {
    const int64_t n = int64_t(tokens.size());
    return model_.forward_cached(from_vector(std::move(tokens), {1, n}).to(device), cache_);
  };
  Tensor logits = feed({ids.begin() + int64_t(keep), ids.end()});
  std::string text;    // the reply's bytes so far
  size_t shown = 0;    // of which on_text has had these
  const int32_t end_of_text = tokenizer_.end_of_text();
  while (r.tokens < options_.max_new_tokens) {
    if (stop != nullptr && stop->load()) {
      r.stopped = true;
      break;
    }
    std::vector<float> row = logits.to(Device::CPU).to(DType::F32).to_vector<float>();
    if (options_.vocab > 0 && options_.vocab < int64_t(row.size())) row.resize(size_t(options_.vocab));
    const int32_t next = sample_token(std::move(row), options_.temperature, options_.top_k, gen_);
    ++r.tokens;
    if (next == end_of_text) {
      r.ended = true;
      break;
    }
    text += tokenizer_.token_bytes(uint32_t(next));
    if (!end_of_turn_.empty()) {
      if (const size_t at = text.find(end_of_turn_, shown > end_of_turn_.size() ? shown - end_of_turn_.size() : 0);
          at != std::string::npos) {
        text.resize(at);
        r.ended = true;
        break;
      }
    }
    // Show what cannot be the start of the end-of-turn marker.
    size_t hold = 0;
    for (size_t n = std::min(end_of_turn_.size() - (end_of_turn_.empty() ? 0 : 1), text.size() - shown); n > 0; --n) {
      if (text.compare(text.size() - n, n, end_of_turn_, 0, n) == 0) {
        hold = n;
        break;
      }
    }
    if (on_text && text.size() - hold > shown) on_text(std::string_view(text).substr(shown, text.size() - hold - shown));
    shown = std::max(shown, text.size() - hold);
    if (cache_.len == cache_.capacity()) {  // the window is full
      r.full = true;
      break;
    }
    cached_.push_back(next);
    logits = feed({next});
  }
  if (on_text && text.size() > shown) on_text(std::string_view(text).substr(shown));
  add("assistant", text);
  r.text = std::move(text);
  return r;
}

}  // namespace tinygpt

#include "train/chat.h"

#include <fmt/format.h>

#include <algorithm>

namespace tinygpt {

ChatSession::ChatSession(const nn::GPT& model, const data::Tokenizer& tokenizer, data::ChatTemplate chat_template,
                         int64_t window, GenerateOptions options, uint64_t seed)
    : tokenizer_(tokenizer),
      template_(std::move(chat_template)),
      end_of_turn_(template_.end_of_turn(tokenizer.config())),
      options_(options),
      gen_(seed),
      decoder_(model, tokenizer, window),
      window_(decoder_.window()) {
  options_.vocab = tokenizer.vocab_size();  // a vocabulary padded past the tokenizer: the padding is never drawn
}

void ChatSession::reset(std::string system) {
  messages_ = data::Messages::array();
  if (!system.empty()) add("system", system);
  decoder_.clear();
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
      throw Error(
          fmt::format("the conversation's last message{} is {} tokens; with room for a reply of {} it does not "
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
  Reply r;
  const std::vector<int32_t> ids = render_to_fit(r.dropped);
  std::vector<std::string> stops;
  if (!end_of_turn_.empty()) stops.push_back(end_of_turn_);
  const CachedDecoder::Result d =
      decoder_.draw(ids, stops, options_, gen_, on_text, [stop] { return stop != nullptr && stop->load(); });
  r.text = d.text;
  r.tokens = d.tokens;
  r.read = d.read;
  r.stopped = d.stopped;
  r.ended = d.ended;
  r.full = d.full;
  add("assistant", r.text);
  return r;
}

}  // namespace tinygpt

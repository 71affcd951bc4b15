// A conversation with a model: the messages so far, rendered with the model's chat template, and the keys and values
// of the tokens already read kept across turns. Each turn renders the whole conversation, keeps the cache's longest
// prefix that the new rendering shares and reads only the rest (llama.cpp's server does the same), so a turn costs its
// new tokens, and a template that rewrites earlier turns is still rendered exactly. When the conversation outgrows the
// window, its oldest turns (after the system prompt) are dropped, said so, and the rest read again.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "../autograd/random.h"
#include "../data/chat.h"
#include "../nn/gpt.h"
#include "decoder.h"
#include "generate.h"

namespace tinygpt {

class ChatSession {
 public:
  /// `window`: the most tokens the conversation and a reply take together (at most the block size).
  ChatSession(const nn::GPT& model, const data::Tokenizer& tokenizer, data::ChatTemplate chat_template, int64_t window,
              GenerateOptions options, uint64_t seed);

  /// Starts again from nothing but the system prompt (empty: none), dropping the cache.
  void reset(std::string system = "");
  /// Adds a message to the conversation without drawing a reply (a history read from a file).
  void add(const std::string& role, const std::string& content);
  const data::Messages& messages() const { return messages_; }
  const data::ChatTemplate& chat_template() const { return template_; }

  struct Reply {
    std::string text;      // the reply without its end-of-turn marker
    int64_t tokens = 0;    // drawn
    int64_t read = 0;      // tokens of the conversation read for this turn (the rest came from the cache)
    int64_t dropped = 0;   // oldest messages dropped to fit the window
    bool stopped = false;  // `stop` was raised before the reply ended
    bool ended = false;    // the model ended its turn (end-of-turn marker or end-of-text)
    bool full = false;     // the window filled up before it did
  };
  /// Adds the user's message and draws the assistant's reply, calling on_text with each piece as it is drawn (held
  /// back while it may be the start of the end-of-turn marker). Throws Error when the message does not fit the window.
  Reply reply(const std::string& user, const std::function<void(std::string_view)>& on_text,
              const std::atomic<bool>* stop = nullptr);
  /// Draws the assistant's reply to the conversation as it stands (its last message the user's).
  Reply respond(const std::function<void(std::string_view)>& on_text, const std::atomic<bool>* stop = nullptr);

 private:
  std::vector<int32_t> render_to_fit(int64_t& dropped);

  const data::Tokenizer& tokenizer_;
  data::ChatTemplate template_;
  std::string end_of_turn_;
  GenerateOptions options_;
  Generator gen_;
  data::Messages messages_ = data::Messages::array();
  CachedDecoder decoder_;
  int64_t window_;
};

}  // namespace tinygpt

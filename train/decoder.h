// Drawing a reply to a prompt with the keys and values of the tokens read last time kept: a new prompt reads only
// what follows the longest prefix it shares with them (llama.cpp's server keeps its slots' caches the same way), so a
// conversation's turn, or a client sending its whole conversation again, costs its new tokens. `chat` and `serve`
// draw through it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "../autograd/random.h"
#include "../data/tokenizer.h"
#include "../nn/gpt.h"
#include "generate.h"

namespace tinygpt {

class CachedDecoder {
 public:
  /// `window`: the most tokens a prompt and its reply take together (at most the block size).
  CachedDecoder(const nn::GPT& model, const data::Tokenizer& tokenizer, int64_t window);

  struct Result {
    std::string text;      // the reply, without the stop string that ended it
    int64_t tokens = 0;    // drawn
    int64_t read = 0;      // tokens of the prompt read (the rest came from the cache)
    bool stopped = false;  // should_stop said so before the reply ended
    bool ended = false;    // the model ended it: a stop string or the tokenizer's end of text
    bool full = false;     // the window filled up before it did
  };
  /// Reads `prompt` (at least one token, fewer than the window) and draws up to o.max_new_tokens (prompt and reply
  /// together at most the window), ending at the tokenizer's end of text or at the first of `stops` found in the text.
  /// on_text gets each piece as it is drawn: held back while it may be the start of a stop string, and while it ends
  /// in part of a UTF-8 character.
  Result draw(const std::vector<int32_t>& prompt, const std::vector<std::string>& stops, const GenerateOptions& o,
              Generator& gen, const std::function<void(std::string_view)>& on_text = {},
              const std::function<bool()>& should_stop = {});
  /// Forgets the cached tokens.
  void clear();
  int64_t window() const { return window_; }

 private:
  const nn::GPT& model_;
  const data::Tokenizer& tokenizer_;
  int64_t window_;
  nn::KVCache cache_;
  std::vector<int32_t> cached_;  // the tokens whose keys and values the cache holds, in order
};

/// How many bytes at the end of `text` to hold back so that what is shown cannot end inside a stop string's start or
/// a UTF-8 character's first bytes.
size_t held_back(std::string_view text, const std::vector<std::string>& stops);

}  // namespace tinygpt

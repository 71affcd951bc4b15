#include "data/tokenizer.h"

#include <fmt/format.h>

#include "kernels/base.h"

namespace tinygpt::data {

Tokenizer::Tokenizer(BpeTokenizer bpe, TokenizerConfig config) : config_(std::move(config)) {
  for (const std::string* token : {&config_.bos_token, &config_.eos_token}) {
    if (!token->empty() && bpe.added_id(*token) < 0) {
      throw Error(fmt::format("the tokenizer's {} token {} is not one of its added tokens",
                              token == &config_.bos_token ? "bos" : "eos", *token));
    }
  }
  if (!config_.eos_token.empty()) bpe.set_end_of_text(bpe.added_id(config_.eos_token));
  bpe_ = std::make_shared<const BpeTokenizer>(std::move(bpe));
}

void Tokenizer::encode(std::string_view text, std::vector<uint32_t>& out, const std::string& what,
                       BpeTokenizer::Cache* cache, size_t offset) const {
  if (is_bpe()) {
    if (cache != nullptr) {
      bpe_->encode(text, out, *cache);
    } else {
      bpe_->encode(text, out);
    }
    return;
  }
  try {
    for_each_code_point(text, [&](char32_t c) {
      const int32_t id = chars_.id(c);
      if (id < 0) {
        throw Error(
            fmt::format("{}: character '{}' (U+{:04X}) at byte offset {} is not in the model's vocabulary of {} "
                        "characters (a model trained with --tokenizer bpe takes any text)",
                        what, encode_utf8(std::u32string(1, c)), uint32_t(c), offset, chars_.size()));
      }
      out.push_back(uint32_t(id));
      offset += c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
    });
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (msg.rfind("invalid UTF-8", 0) == 0) throw Error(fmt::format("{}: {}", what, msg));
    throw;
  }
}

std::vector<uint32_t> Tokenizer::encode_prompt(std::string_view text, const std::string& what) const {
  std::vector<uint32_t> ids = document_prefix();
  if (is_bpe()) {
    bpe_->encode(text, ids, BpeTokenizer::Specials::Match);
  } else {
    encode(text, ids, what);
  }
  return ids;
}

std::vector<uint32_t> Tokenizer::encode_rendered(std::string_view text, const std::string& what) const {
  std::vector<uint32_t> ids;
  if (is_bpe()) {
    bpe_->encode(text, ids, BpeTokenizer::Specials::Match);
  } else {
    encode(text, ids, what);
  }
  return ids;
}

std::string Tokenizer::token_bytes(uint32_t id) const {
  if (int64_t(id) >= vocab_size()) {
    throw Error(fmt::format("token id {} is outside the vocabulary (ids 0 to {})", id, vocab_size() - 1));
  }
  if (is_bpe()) return bpe_->token_bytes(int32_t(id));
  return encode_utf8(std::u32string(1, chars_.chars()[id]));
}

int64_t Tokenizer::source_bytes(uint32_t id) const {
  if (is_bpe()) return int32_t(id) == bpe_->end_of_text() ? 0 : int64_t(bpe_->token_bytes(int32_t(id)).size());
  const char32_t c = chars_.chars()[id];
  return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
}

std::string Tokenizer::decode(const std::vector<uint32_t>& ids) const {
  std::string text;
  for (const uint32_t id : ids) text += token_bytes(id);
  return text;
}

}  // namespace tinygpt::data

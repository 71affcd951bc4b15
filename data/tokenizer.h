// A model's tokenizer: its characters (one token per Unicode character of the training text) or a byte-level BPE.
// What the trainer, the checkpoint and the commands that read text (sample, eval, attention) hold.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "bpe.h"
#include "text.h"

namespace tinygpt::data {

class Tokenizer {
 public:
  Tokenizer() = default;
  explicit Tokenizer(CharVocab chars) : chars_(std::move(chars)) {}
  explicit Tokenizer(BpeTokenizer bpe) : bpe_(std::make_shared<const BpeTokenizer>(std::move(bpe))) {}

  bool is_bpe() const { return bpe_ != nullptr; }
  const CharVocab& chars() const { return chars_; }
  const BpeTokenizer& bpe() const { return *bpe_; }
  int64_t vocab_size() const { return is_bpe() ? bpe_->vocab_size() : chars_.size(); }
  /// "characters" or "byte-level BPE", for messages.
  std::string kind() const { return is_bpe() ? "byte-level BPE" : "characters"; }

  /// Appends the ids of `text`. A BPE takes any bytes; characters need valid UTF-8 in the vocabulary: throws naming
  /// `what`, the character and its byte offset otherwise.
  /// `cache`: one thread's cache of encoded pieces (a BPE's; faster over much text).
  void encode(std::string_view text, std::vector<uint32_t>& out, const std::string& what,
              BpeTokenizer::Cache* cache = nullptr) const;
  std::vector<uint32_t> encode(std::string_view text, const std::string& what) const {
    std::vector<uint32_t> ids;
    encode(text, ids, what);
    return ids;
  }
  /// The bytes of one token (a character's UTF-8; a BPE token's bytes, <|endoftext|>'s text for it).
  std::string token_bytes(uint32_t id) const;
  /// Source bytes a token stands for (0 for <|endoftext|>, which stands between documents): bits per byte count these.
  int64_t source_bytes(uint32_t id) const;
  std::string decode(const std::vector<uint32_t>& ids) const;
  /// The end-of-document token of a BPE (-1 for characters: their documents end with --doc-sep's text).
  int32_t end_of_text() const { return is_bpe() ? bpe_->end_of_text() : -1; }

 private:
  CharVocab chars_;
  std::shared_ptr<const BpeTokenizer> bpe_;
};

}  // namespace tinygpt::data

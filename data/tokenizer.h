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

/// What a model's tokenizer_config.json says beside its tokenizer.json: its bos and eos tokens (their text; empty:
/// none said) and its chat template (Jinja text, empty: none). Kept in the checkpoint.
struct TokenizerConfig {
  std::string bos_token, eos_token, chat_template;
  bool empty() const { return bos_token.empty() && eos_token.empty() && chat_template.empty(); }
  bool operator==(const TokenizerConfig&) const = default;
};

class Tokenizer {
 public:
  Tokenizer() = default;
  explicit Tokenizer(CharVocab chars) : chars_(std::move(chars)) {}
  explicit Tokenizer(BpeTokenizer bpe) : bpe_(std::make_shared<const BpeTokenizer>(std::move(bpe))) {}
  /// A BPE with its model's tokenizer_config: an eos_token other than <|endoftext|> ends the documents. Throws Error
  /// naming a bos or eos token that is not an added token of the BPE.
  Tokenizer(BpeTokenizer bpe, TokenizerConfig config);
  const TokenizerConfig& config() const { return config_; }

  bool is_bpe() const { return bpe_ != nullptr; }
  const CharVocab& chars() const { return chars_; }
  const BpeTokenizer& bpe() const { return *bpe_; }
  int64_t vocab_size() const { return is_bpe() ? bpe_->vocab_size() : chars_.size(); }
  /// "characters" or "byte-level BPE", for messages.
  std::string kind() const { return is_bpe() ? "byte-level BPE" : "characters"; }

  /// Appends the ids of `text`. A BPE takes any bytes; characters need valid UTF-8 in the vocabulary: throws naming
  /// `what`, the character and its byte offset otherwise.
  /// `cache`: one thread's cache of encoded pieces (a BPE's; faster over much text). `offset`: where `text` starts
  /// in what `what` names (a part of a file), so the message gives the file's byte offset.
  /// A BPE's special tokens are text here (training documents, --doc-sep): see encode_prompt.
  void encode(std::string_view text, std::vector<uint32_t>& out, const std::string& what,
              BpeTokenizer::Cache* cache = nullptr, size_t offset = 0) const;
  std::vector<uint32_t> encode(std::string_view text, const std::string& what) const {
    std::vector<uint32_t> ids;
    encode(text, ids, what);
    return ids;
  }
  /// The ids of a text the user gives a model (a prompt, a rendered chat), as transformers' tokenizer(text) makes
  /// them: a BPE's special tokens matched whole (<|im_start|>), and its bos first where its post-processor adds one.
  std::vector<uint32_t> encode_prompt(std::string_view text, const std::string& what) const;
  /// The ids of a rendered conversation, as transformers' apply_chat_template(tokenize=True) makes them: a BPE's
  /// special tokens matched whole, nothing added (the template writes its bos itself).
  std::vector<uint32_t> encode_rendered(std::string_view text, const std::string& what) const;
  /// What ends each training document: a BPE's end-of-text token (none where it has none), or the ids of a character
  /// model's --doc-sep text (`doc_separator`; throws naming `what` for a character outside the vocabulary).
  std::vector<uint32_t> document_suffix(const std::string& doc_separator, const std::string& what) const {
    if (!is_bpe()) return encode(doc_separator, what);
    if (end_of_text() < 0) return {};
    return {uint32_t(end_of_text())};
  }
  /// What each training document starts with: a BPE's bos where it has one (Llama 3's <|begin_of_text|>), else none.
  std::vector<uint32_t> document_prefix() const {
    if (!is_bpe() || bpe_->begin_of_text() < 0) return {};
    return {uint32_t(bpe_->begin_of_text())};
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
  TokenizerConfig config_;
};

}  // namespace tinygpt::data

// Byte-level BPE, as GPT-2 and its successors tokenize: added tokens (<|endoftext|>, <|im_start|>) are matched whole
// first, the rest of the text's bytes are cut into pieces by a pre-split pattern (GPT-2's, Llama 3's or Qwen2's:
// contractions, letter runs, number runs, runs of other characters, whitespace), and each piece's bytes are merged
// pairwise by a ranked list of merges learned from a corpus. Every byte string encodes and decodes back exactly (all
// 256 bytes are tokens); one special token, <|endoftext|> unless the model names another, ends each document. Reads and
// writes Hugging Face's tokenizer.json, so `tokenizers`, `transformers` and tiktoken (given the same pattern and ranks)
// give the same ids.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "pre_split.h"
#include "string_map.h"

namespace tinygpt::data {

inline constexpr std::string_view kEndOfText = "<|endoftext|>";
/// Vocabulary sizes a BPE may have: the 256 bytes and <|endoftext|> at least, at most Gemma's 262,144.
inline constexpr int64_t kMinBpeVocab = 257, kMaxBpeVocab = 262144;
/// The largest vocabulary `tokenizer train` and `train --tokenizer bpe` learn (their ids are stored in 16 bits).
inline constexpr int64_t kMaxTrainedBpeVocab = 65536;

class BpeTokenizer {
 public:
  BpeTokenizer();

  struct TrainOptions {
    int64_t vocab_size = 4096;
    /// Called after each merge with (merges done, merges wanted): a progress bar's hook.
    std::function<void(int64_t, int64_t)> progress;
  };
  /// Learns merges from piece counts until the vocabulary (bytes, merges, <|endoftext|>) has vocab_size tokens or
  /// no pair occurs twice (then it is smaller: vocab_size() tells). Each step merges the most frequent adjacent
  /// pair (ties: the smaller pair of ids), skipping a pair whose bytes are already a token.
  static BpeTokenizer train(const PieceCounts& counts, const TrainOptions& options);

  /// Reads a Hugging Face tokenizer.json of a byte-level BPE: GPT-2's pre-split (a ByteLevel pre-tokenizer with
  /// use_regex, or a Split of kGpt2Pattern before one without, either after a Digits pre-tokenizer with
  /// individual_digits as SmolLM2's), or a Split of Llama 3's or Qwen2's pattern before a ByteLevel without; its added
  /// tokens; a post-processor that adds a bos (TemplateProcessing). `what` names the source in errors. Throws Error
  /// naming what is wrong: not JSON, another model, normalizer, pre-tokenizer or post-processor, a byte without a
  /// token, a merge of unknown tokens, duplicate ids, more than kMaxBpeVocab tokens.
  static BpeTokenizer from_json(std::string_view text, const std::string& what);
  /// This tokenizer as a Hugging Face tokenizer.json.
  std::string to_json() const;

  int64_t vocab_size() const { return int64_t(tokens_.size()); }
  /// The id of the token that ends a document (<|endoftext|>, unless set_end_of_text chose another), or -1.
  int32_t end_of_text() const { return end_of_text_; }
  /// Makes `id` (an added token) the end of a document: the model's eos where it is not <|endoftext|> (Llama 3's
  /// <|end_of_text|>). Throws Error for an id that is not an added token.
  void set_end_of_text(int32_t id);
  /// The id the post-processor puts before each text (Llama 3's <|begin_of_text|>), or -1.
  int32_t begin_of_text() const { return bos_; }
  PreSplit pre_split() const { return pre_split_; }
  /// The tokens added to the vocabulary outside the merges (<|endoftext|>, <|im_start|>, ...), in id order; special
  /// ones (`special`) are matched in a text only when the encoding asks for them.
  struct Added {
    uint32_t id;
    std::string content;
    bool special;
  };
  const std::vector<Added>& added() const { return added_; }
  /// The id of an added token's text, or -1.
  int32_t added_id(std::string_view content) const;
  /// Whether each number character is a piece of its own (a Digits pre-tokenizer before the byte-level split).
  bool individual_digits() const { return individual_digits_; }
  /// Whether text is put in Unicode normalization form C before the pre-split (tokenizer.json's normalizer NFC,
  /// Qwen2's); added tokens are matched before, on the text as given, as `tokenizers` matches them.
  bool nfc() const { return nfc_; }
  int64_t merges() const { return int64_t(merges_.size()); }
  /// The bytes of a token (<|endoftext|>'s text for the special token).
  const std::string& token_bytes(int32_t id) const { return tokens_[size_t(id)]; }

  /// Pieces already encoded, kept by one thread (encoding is bound by the merges of pieces seen before).
  class Cache {
   public:
    explicit Cache(size_t max_pieces = size_t(1) << 20) : max_pieces_(max_pieces) {}

   private:
    friend class BpeTokenizer;
    StringMap<std::pair<uint32_t, uint32_t>> pieces_;  // piece -> (offset, count) into ids_
    std::vector<uint32_t> ids_;
    size_t max_pieces_;
  };
  /// Which added tokens encode() matches whole in a text, before the pre-split: the ordinary added tokens always,
  /// the special ones (<|endoftext|>, <|im_start|>) only in prompts and rendered chats, never in training documents
  /// (a file that mentions <|endoftext|> is text).
  enum class Specials : uint8_t { AsText, Match };
  /// Appends the ids of `text` (any bytes) to `out`. No bos is added (a caller that wants one: begin_of_text()).
  void encode(std::string_view text, std::vector<uint32_t>& out, Cache& cache,
              Specials specials = Specials::AsText) const;
  void encode(std::string_view text, std::vector<uint32_t>& out, Specials specials = Specials::AsText) const {
    Cache cache(4096);
    encode(text, out, cache, specials);
  }
  /// The ids of one pre-split piece (uncached).
  void encode_piece(std::string_view piece, std::vector<uint32_t>& out) const;
  /// The bytes of ids; throws Error naming an id outside the vocabulary.
  std::string decode(const std::vector<uint32_t>& ids) const;

 private:
  void index();
  std::vector<std::string> tokens_;  // id -> bytes
  std::array<uint32_t, 256> byte_ids_{};
  struct Merge {
    uint32_t left, right, result;
  };
  std::vector<Merge> merges_;                                             // in rank order
  std::unordered_map<uint64_t, std::pair<uint32_t, uint32_t>> merge_of_;  // (left, right) -> (rank, result)
  void encode_text(std::string_view text, std::vector<uint32_t>& out, Cache& cache) const;  // no added tokens
  std::vector<Added> added_;
  // For each Specials mode: the added tokens it matches (indices into added_, longest first), and their first bytes.
  std::array<std::vector<uint32_t>, 2> matched_;
  std::array<std::array<bool, 256>, 2> first_byte_{};
  size_t model_vocab_ = 0;  // ids below this are the model's vocab in tokenizer.json; the rest only added tokens
  int32_t end_of_text_ = -1, bos_ = -1;
  bool individual_digits_ = false;
  bool nfc_ = false;
  PreSplit pre_split_ = PreSplit::Gpt2;
};

}  // namespace tinygpt::data

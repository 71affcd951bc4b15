// Byte-level BPE, as GPT-2 and its successors tokenize: the text's bytes are cut into pieces by GPT-2's pre-split
// pattern (contractions, letter runs, number runs, runs of other characters, whitespace), and each piece's bytes are
// merged pairwise by a ranked list of merges learned from a corpus. Every byte string encodes and decodes back
// exactly (all 256 bytes are tokens); one special token, <|endoftext|>, ends each document. Reads and writes
// Hugging Face's tokenizer.json, so `tokenizers`, `transformers` and tiktoken (given the same pattern and ranks) give
// the same ids.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "string_map.h"

namespace tinygpt::data {

/// GPT-2's pre-split pattern, as `tokenizers`' ByteLevel pre-tokenizer and tiktoken's "gpt2" encoding spell it.
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kEndOfText = "<|endoftext|>";
/// Vocabulary sizes a BPE may have: the 256 bytes and <|endoftext|> at least; ids are stored in 16 bits.
inline constexpr int64_t kMinBpeVocab = 257, kMaxBpeVocab = 65536;

/// The length in bytes of the pre-split piece of `text` that starts at byte `pos` (< text.size()), as the regex
/// kGpt2Pattern would match it. Bytes that are not valid UTF-8 count as characters of their own, neither letter,
/// number nor space.
size_t gpt2_piece_length(std::string_view text, size_t pos);

/// Where the next number character (\p{N}) at or after byte `pos` starts, or text.size(); and the byte length of the
/// character at `pos` (1 for a byte that is not valid UTF-8).
size_t next_number(std::string_view text, size_t pos);
size_t char_length(std::string_view text, size_t pos);

/// Calls f(piece) for each pre-split piece of `text`, in order; the pieces concatenate to `text`. With
/// individual_digits, as `tokenizers`' Digits(individual_digits) before the byte-level split (SmolLM2's, StarCoder's):
/// each number character is a piece of its own, and GPT-2's split runs on the text between them.
template <class F>
void for_each_piece(std::string_view text, F&& f, bool individual_digits = false) {
  const auto gpt2 = [&f](std::string_view part) {
    for (size_t pos = 0; pos < part.size();) {
      const size_t n = gpt2_piece_length(part, pos);
      f(part.substr(pos, n));
      pos += n;
    }
  };
  if (!individual_digits) return gpt2(text);
  for (size_t pos = 0; pos < text.size();) {
    const size_t digit = next_number(text, pos);
    gpt2(text.substr(pos, digit - pos));
    if (digit == text.size()) break;
    const size_t n = char_length(text, digit);
    f(text.substr(digit, n));
    pos = digit + n;
  }
}

/// How often each pre-split piece occurs in a corpus: what BPE training reads.
class PieceCounts {
 public:
  /// Counts the pieces of `text` (one document, or a part of one cut where a piece ends).
  void add_text(std::string_view text);
  void add(std::string_view piece, int64_t count) { counts_[piece] += count; }
  /// Adds another's counts to these.
  void merge(const PieceCounts& other);
  size_t unique() const { return counts_.size(); }
  const StringMap<int64_t>& map() const { return counts_; }

 private:
  StringMap<int64_t> counts_;
};

/// Where a byte-string can be cut into independent parts for counting or encoding in parallel: the offsets just
/// after a '\n' between two printable ASCII characters (a lone newline is a piece of its own whatever follows it, so
/// the parts split into the same pieces as the whole), about `target` bytes apart. Returns the cut points, the first 0 and the last text.size().
std::vector<size_t> cut_points(std::string_view text, size_t target);

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

  /// Reads a Hugging Face tokenizer.json of a byte-level BPE (GPT-2's pre-split, as a ByteLevel pre-tokenizer with
  /// use_regex or a Split of kGpt2Pattern before one without, either after a Digits pre-tokenizer with
  /// individual_digits as SmolLM2's): `what` names the source in errors. Throws Error naming
  /// what is wrong: not JSON, another model or pre-tokenizer, a byte without a token, a merge of unknown tokens,
  /// duplicate ids, more than kMaxBpeVocab tokens.
  static BpeTokenizer from_json(std::string_view text, const std::string& what);
  /// This tokenizer as a Hugging Face tokenizer.json.
  std::string to_json() const;

  int64_t vocab_size() const { return int64_t(tokens_.size()); }
  /// The id of <|endoftext|>, or -1 when the tokenizer has none.
  int32_t end_of_text() const { return end_of_text_; }
  /// Whether each number character is a piece of its own (a Digits pre-tokenizer before the byte-level split).
  bool individual_digits() const { return individual_digits_; }
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
  /// Appends the ids of `text` (any bytes) to `out`; special tokens' text is encoded as ordinary text.
  void encode(std::string_view text, std::vector<uint32_t>& out, Cache& cache) const;
  void encode(std::string_view text, std::vector<uint32_t>& out) const {
    Cache cache(4096);
    encode(text, out, cache);
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
  std::vector<Merge> merges_;  // in rank order
  std::unordered_map<uint64_t, std::pair<uint32_t, uint32_t>> merge_of_;  // (left, right) -> (rank, result)
  int32_t end_of_text_ = -1;
  bool individual_digits_ = false;
};

}  // namespace tinygpt::data

// The pre-split of a byte-level BPE: the patterns that cut a text into pieces before merging (GPT-2's, Llama 3's,
// Qwen2's, and SmolLM2's digits one by one before GPT-2's), matched by hand alternative by alternative on UTF-8 bytes
// as the regex engines of `tokenizers` and tiktoken match them; the piece counts BPE training reads; and where a text
// can be cut to count or encode its parts in parallel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "string_map.h"

namespace tinygpt::data {

/// GPT-2's pre-split pattern, as `tokenizers`' ByteLevel pre-tokenizer and tiktoken's "gpt2" encoding spell it.
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
/// Llama 3's (tiktoken's cl100k): contractions in any case, a letter run with one non-letter before it, numbers in
/// runs of up to three, other characters with the newlines after them, whitespace up to its last newline.
inline constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
/// Qwen2's: Llama 3's with each number character a piece of its own.
inline constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

/// The pre-split patterns tinygpt knows, matched by hand (each alternative of the regex in order, on UTF-8 bytes).
enum class PreSplit : uint8_t { Gpt2, Llama3, Qwen2 };
std::string_view pattern_of(PreSplit split);

/// The length in bytes of the pre-split piece of `text` that starts at byte `pos` (< text.size()), as the regex
/// kGpt2Pattern would match it. Bytes that are not valid UTF-8 count as characters of their own, neither letter,
/// number nor space.
size_t gpt2_piece_length(std::string_view text, size_t pos);
/// The same for Llama 3's pattern (max_digits 3) and Qwen2's (max_digits 1).
size_t llama3_piece_length(std::string_view text, size_t pos, size_t max_digits);
inline size_t piece_length(std::string_view text, size_t pos, PreSplit split) {
  return split == PreSplit::Gpt2 ? gpt2_piece_length(text, pos)
                                 : llama3_piece_length(text, pos, split == PreSplit::Llama3 ? 3 : 1);
}

/// Where the next number character (\p{N}) at or after byte `pos` starts, or text.size(); and the byte length of the
/// character at `pos` (1 for a byte that is not valid UTF-8).
size_t next_number(std::string_view text, size_t pos);
size_t char_length(std::string_view text, size_t pos);

/// Calls f(piece) for each pre-split piece of `text`, in order; the pieces concatenate to `text`. With
/// individual_digits, as `tokenizers`' Digits(individual_digits) before the byte-level split (SmolLM2's, StarCoder's):
/// each number character is a piece of its own, and the pattern's split runs on the text between them.
template <class F>
void for_each_piece(std::string_view text, F&& f, bool individual_digits = false, PreSplit split = PreSplit::Gpt2) {
  const auto pieces = [&f, split](std::string_view part) {
    for (size_t pos = 0; pos < part.size();) {
      const size_t n = piece_length(part, pos, split);
      f(part.substr(pos, n));
      pos += n;
    }
  };
  if (!individual_digits) return pieces(text);
  for (size_t pos = 0; pos < text.size();) {
    const size_t digit = next_number(text, pos);
    pieces(text.substr(pos, digit - pos));
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
  /// When more than max_pieces pieces are held, drops those seen fewest times (the rarest first, all of a count at
  /// once) until at most max_pieces / 2 are left; returns the largest count dropped (0: nothing dropped).
  int64_t prune(size_t max_pieces);
  /// How many distinct pieces pruning dropped, and the largest count it dropped.
  int64_t dropped() const { return dropped_; }
  int64_t pruned_below() const { return pruned_below_; }

 private:
  StringMap<int64_t> counts_;
  int64_t dropped_ = 0, pruned_below_ = 0;
};

/// Where a byte-string can be cut into independent parts for counting or encoding in parallel: the offsets just
/// after a '\n' between two printable ASCII characters (a lone newline is a piece of its own whatever follows it, so
/// the parts split into the same pieces as the whole), about `target` bytes apart. Returns the cut points, the first 0
/// and the last text.size().
std::vector<size_t> cut_points(std::string_view text, size_t target);

}  // namespace tinygpt::data

#include "data/pre_split.h"

#include <algorithm>
#include <array>

#include "data/text.h"
#include "data/unicode_tables.h"

namespace tinygpt::data {

namespace {

// --- GPT-2's pre-split, by hand: the pattern's alternatives in order, on UTF-8 bytes ---

enum class Class : uint8_t { Letter, Number, Space, Other };

struct Char {
  Class cls;
  uint8_t len;  // bytes
};

template <size_t N>
bool in_ranges(const unicode::CodeRange (&ranges)[N], char32_t c) {
  const auto* it = std::upper_bound(std::begin(ranges), std::end(ranges), c,
                                    [](char32_t v, const unicode::CodeRange& r) { return v < r.first; });
  return it != std::begin(ranges) && c <= (it - 1)->last;
}

/// Unicode's White_Space property (what \s matches in the regex engines of `tokenizers` and tiktoken).
bool is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

Class classify(char32_t c) {
  if (in_ranges(unicode::kLetters, c)) return Class::Letter;
  if (in_ranges(unicode::kNumbers, c)) return Class::Number;
  return is_space(c) ? Class::Space : Class::Other;
}

struct AsciiClasses {
  std::array<Class, 128> cls{};
  AsciiClasses() {
    for (char32_t c = 0; c < 128; ++c) cls[c] = classify(c);
  }
};
const AsciiClasses kAscii;

/// The character at text[i]: a valid UTF-8 sequence, or one byte of Class::Other.
Char char_at(std::string_view text, size_t i) {
  const auto b0 = uint8_t(text[i]);
  if (b0 < 0x80) return {kAscii.cls[b0], 1};
  const Utf8Char c = decode_utf8_at(text, i);
  if (c.len == 0) return {Class::Other, 1};
  return {classify(c.cp), uint8_t(c.len)};
}

/// The end of the run of characters of class `cls` that starts at `i`.
size_t run_end(std::string_view text, size_t i, Class cls) {
  while (i < text.size()) {
    const Char c = char_at(text, i);
    if (c.cls != cls) break;
    i += c.len;
  }
  return i;
}

}  // namespace

size_t next_number(std::string_view text, size_t pos) {
  while (pos < text.size()) {
    const Char c = char_at(text, pos);
    if (c.cls == Class::Number) return pos;
    pos += c.len;
  }
  return text.size();
}

size_t char_length(std::string_view text, size_t pos) { return char_at(text, pos).len; }

std::string_view pattern_of(PreSplit split) {
  return split == PreSplit::Gpt2 ? kGpt2Pattern : split == PreSplit::Llama3 ? kLlama3Pattern : kQwen2Pattern;
}

size_t gpt2_piece_length(std::string_view text, size_t pos) {
  const size_t n = text.size();
  const char b0 = text[pos];
  // 's|'t|'re|'ve|'m|'ll|'d
  if (b0 == '\'' && pos + 1 < n) {
    const char b1 = text[pos + 1];
    if (b1 == 's' || b1 == 't' || b1 == 'm' || b1 == 'd') return 2;
    if (pos + 2 < n) {
      const char b2 = text[pos + 2];
      if ((b1 == 'r' && b2 == 'e') || (b1 == 'v' && b2 == 'e') || (b1 == 'l' && b2 == 'l')) return 3;
    }
  }
  const Char c0 = char_at(text, pos);
  // ' ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+': an optional space, then a run of one class
  size_t start = pos;
  Class cls = c0.cls;
  if (b0 == ' ' && pos + 1 < n) {
    const Char c1 = char_at(text, pos + 1);
    if (c1.cls != Class::Space) start = pos + 1, cls = c1.cls;
  }
  if (cls != Class::Space) return run_end(text, start, cls) - pos;
  // '\s+(?!\S)|\s+': a whitespace run, less its last character when a non-space follows and it has more than one
  size_t end = pos, last = pos;
  while (end < n) {
    const Char c = char_at(text, end);
    if (c.cls != Class::Space) break;
    last = end;
    end += c.len;
  }
  if (end < n && last > pos) return last - pos;
  return end - pos;
}

size_t llama3_piece_length(std::string_view text, size_t pos, size_t max_digits) {
  const size_t n = text.size();
  const char b0 = text[pos];
  const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? char(c + 32) : c; };
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
  if (b0 == '\'' && pos + 1 < n) {
    const char b1 = lower(text[pos + 1]);
    if (b1 == 's' || b1 == 't' || b1 == 'm' || b1 == 'd') return 2;
    if (pos + 2 < n) {
      const char b2 = lower(text[pos + 2]);
      if ((b1 == 'r' && b2 == 'e') || (b1 == 'v' && b2 == 'e') || (b1 == 'l' && b2 == 'l')) return 3;
      if (b1 == '\xc5' && b2 == '\xbf') return 3;  // U+017F, the long s, which case-folds to s
    }
  }
  const Char c0 = char_at(text, pos);
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (c0.cls == Class::Letter) return run_end(text, pos, Class::Letter) - pos;
  if (c0.cls != Class::Number && b0 != '\r' && b0 != '\n' && pos + c0.len < n &&
      char_at(text, pos + c0.len).cls == Class::Letter) {
    return run_end(text, pos + c0.len, Class::Letter) - pos;
  }
  // \p{N}{1,3} (Qwen2: \p{N})
  if (c0.cls == Class::Number) {
    size_t end = pos;
    for (size_t k = 0; k < max_digits && end < n; ++k) {
      const Char c = char_at(text, end);
      if (c.cls != Class::Number) break;
      end += c.len;
    }
    return end - pos;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  size_t start = pos;
  if (b0 == ' ' && pos + 1 < n && char_at(text, pos + 1).cls == Class::Other) start = pos + 1;
  if (start > pos || c0.cls == Class::Other) {
    size_t end = run_end(text, start, Class::Other);
    while (end < n && (text[end] == '\r' || text[end] == '\n')) ++end;
    return end - pos;
  }
  // \s*[\r\n]+ (up to the run's last newline), then \s+(?!\S) and \s+ as GPT-2's
  size_t end = pos, last = pos, after_newline = pos;
  while (end < n) {
    const Char c = char_at(text, end);
    if (c.cls != Class::Space) break;
    last = end;
    end += c.len;
    if (text[last] == '\r' || text[last] == '\n') after_newline = end;
  }
  if (after_newline > pos) return after_newline - pos;
  if (end < n && last > pos) return last - pos;
  return end - pos;
}

void PieceCounts::add_text(std::string_view text) {
  for_each_piece(text, [&](std::string_view piece) { ++counts_[piece]; });
}

void PieceCounts::merge(const PieceCounts& other) {
  other.counts_.for_each([&](std::string_view piece, int64_t count) { counts_[piece] += count; });
}

int64_t PieceCounts::prune(size_t max_pieces) {
  if (counts_.size() <= max_pieces) return 0;
  // The smallest threshold t that leaves at most max_pieces / 2 pieces seen more than t times.
  constexpr size_t kBuckets = size_t(1) << 16;
  std::vector<size_t> seen(kBuckets + 1, 0);  // seen[c]: pieces counted c times (the last: kBuckets or more)
  counts_.for_each([&](std::string_view, int64_t c) { ++seen[std::min(size_t(c), kBuckets)]; });
  size_t above = counts_.size();
  int64_t t = 0;
  while (above > max_pieces / 2 && size_t(t) < kBuckets) above -= seen[size_t(++t)];
  StringMap<int64_t> kept;
  counts_.for_each([&](std::string_view piece, int64_t c) {
    if (c > t) {
      kept[piece] = c;
    } else {
      ++dropped_;
    }
  });
  counts_ = std::move(kept);
  pruned_below_ = std::max(pruned_below_, t);
  return t;
}

std::vector<size_t> cut_points(std::string_view text, size_t target) {
  std::vector<size_t> cuts{0};
  target = std::max<size_t>(target, 1);
  for (size_t next = target; next < text.size();) {
    const size_t nl = text.find('\n', next - 1);
    if (nl == std::string_view::npos || nl + 1 >= text.size()) break;
    const auto before = nl > 0 ? uint8_t(text[nl - 1]) : uint8_t(0), after = uint8_t(text[nl + 1]);
    if (before > 0x20 && before < 0x7f && after > 0x20 && after < 0x7f) {
      cuts.push_back(nl + 1);
      next = nl + 1 + target;
    } else {
      next = nl + 2;
    }
  }
  cuts.push_back(text.size());
  return cuts;
}

}  // namespace tinygpt::data

#include "data/nfc.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "data/text.h"
#include "data/unicode_nfc_tables.h"

namespace tinygpt::data {
namespace {

// Hangul syllables are decomposed and composed by arithmetic (Unicode 16.0, section 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;
// A byte that is not UTF-8 is carried as this plus the byte: no class, no decomposition, composes with nothing.
constexpr char32_t kRawByte = 0x110000;

uint8_t combining_class(char32_t c) {
  if (c < 0x300 || c >= kRawByte) return 0;
  const auto& t = unicode::kCombiningClasses;
  const auto* it = std::upper_bound(std::begin(t), std::end(t), c,
                                    [](char32_t x, const unicode::ClassRange& r) { return x < r.first; });
  if (it == std::begin(t)) return 0;
  --it;
  return c <= it->last ? it->ccc : 0;
}

/// c's canonical decomposition one step deep, or null (Hangul syllables are not listed).
const unicode::Decomposition* decomposition_of(char32_t c) {
  if (c < 0xC0 || c >= kRawByte) return nullptr;
  const auto& t = unicode::kDecompositions;
  const auto* it = std::lower_bound(std::begin(t), std::end(t), c,
                                    [](const unicode::Decomposition& d, char32_t x) { return d.cp < x; });
  return it != std::end(t) && it->cp == c ? it : nullptr;
}

void decompose(char32_t c, std::vector<char32_t>& out) {
  if (c >= kSBase && c < kSBase + kSCount) {
    const char32_t s = c - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  if (const unicode::Decomposition* d = decomposition_of(c)) {
    decompose(d->first, out);
    if (d->second != 0) decompose(d->second, out);
    return;
  }
  out.push_back(c);
}

/// The primary composite of a + b, or 0.
char32_t compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const auto& t = unicode::kCompositions;
  const auto* it = std::lower_bound(std::begin(t), std::end(t), std::pair{a, b},
                                    [](const unicode::Composition& x, const std::pair<char32_t, char32_t>& k) {
                                      return x.first < k.first || (x.first == k.first && x.second < k.second);
                                    });
  return it != std::end(t) && it->first == a && it->second == b ? it->cp : 0;
}

/// The code points of UTF-8 text (data/text.h's decoder), each byte of an ill-formed sequence as kRawByte + byte, with
/// the byte offset each starts at (and the text's size last).
void decode(std::string_view s, std::vector<char32_t>& cps, std::vector<size_t>& at) {
  cps.reserve(s.size());
  at.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size();) {
    const Utf8Char c = decode_utf8_at(s, i);
    at.push_back(i);
    cps.push_back(c.len > 0 ? c.cp : kRawByte + static_cast<unsigned char>(s[i]));
    i += c.len > 0 ? size_t(c.len) : 1;
  }
  at.push_back(s.size());
}

/// Appends code points as UTF-8 (encode_utf8), the raw bytes among them as they were.
void append(const std::vector<char32_t>& cps, std::string& out) {
  for (size_t i = 0; i < cps.size();) {
    size_t j = i;
    while (j < cps.size() && cps[j] < kRawByte) ++j;
    out += encode_utf8(std::u32string_view(cps.data() + i, j - i));
    if (j < cps.size()) out += char(cps[j] - kRawByte);
    i = j + 1;
  }
}

/// Whether NFC leaves c alone wherever it stands: class 0, in NFC by itself (no singleton, excluded or non-starter
/// decomposition), and never the second of a composition (Unicode's NFC_Quick_Check Yes, with class 0). Text between
/// such code points is normalized on its own, the rest copied.
bool inert(char32_t c) {
  static const std::vector<bool> busy = [] {
    std::vector<bool> b(0x110000, false);
    for (const auto& r : unicode::kCombiningClasses) {
      for (char32_t c = r.first; c <= r.last; ++c) b[c] = true;
    }
    std::vector<bool> composite(0x110000, false);
    for (const auto& x : unicode::kCompositions) {
      b[x.second] = true;
      composite[x.cp] = true;
    }
    for (char32_t c = kVBase; c < kVBase + kVCount; ++c) b[c] = true;      // Hangul vowels follow a leading consonant
    for (char32_t c = kTBase + 1; c < kTBase + kTCount; ++c) b[c] = true;  // and trailing ones a syllable
    // A composite whose decomposition starts with a mark or a second composes with what precedes it (U+16124 is
    // U+16129 U+1611F, and U+1611E U+16129 compose); one that is not a primary composite NFC never keeps.
    const auto first_of = [](char32_t c) {
      while (const unicode::Decomposition* d = decomposition_of(c)) c = d->first;
      return c;
    };
    const std::vector<bool> second_or_mark = b;
    for (const auto& d : unicode::kDecompositions) {
      if (!composite[d.cp] || second_or_mark[first_of(d.cp)]) b[d.cp] = true;
    }
    return b;
  }();
  return c < 0x300 || c >= kRawByte || !busy[c];
}

/// NFC of a stretch of text (code points) that no inert code point divides but at its start.
void normalize(const std::vector<char32_t>& text, std::string& s);

}  // namespace

bool nfc_may_change(std::string_view text) {
  return std::any_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) >= 0xCC; });
}

std::string nfc(std::string_view text) {
  if (!nfc_may_change(text)) return std::string(text);
  std::vector<char32_t> cps;
  std::vector<size_t> at;
  decode(text, cps, at);
  std::string s;
  s.reserve(text.size());
  // Copy the bytes of inert code points as they are; normalize each stretch from the inert one before a busy one (a
  // composition's possible start) up to the next inert one.
  std::vector<char32_t> stretch;
  size_t i = 0;
  while (i < cps.size()) {
    size_t j = i;
    while (j < cps.size() && inert(cps[j])) ++j;
    const size_t start = j == cps.size() ? j : j > i ? j - 1 : j;  // the starter before the busy code point
    s.append(text.substr(at[i], at[start] - at[i]));
    if (start == cps.size()) break;
    size_t end = j + 1;
    while (end < cps.size() && !inert(cps[end])) ++end;
    stretch.assign(cps.begin() + std::ptrdiff_t(start), cps.begin() + std::ptrdiff_t(end));
    normalize(stretch, s);
    i = end;
  }
  return s;
}

namespace {

void normalize(const std::vector<char32_t>& text, std::string& s) {
  // Decompose, then put each run of combining marks in canonical order (a stable sort by class).
  std::vector<char32_t> d;
  d.reserve(text.size() + 4);
  for (const char32_t c : text) decompose(c, d);
  std::vector<uint8_t> cls(d.size());
  for (size_t i = 0; i < d.size(); ++i) cls[i] = combining_class(d[i]);
  for (size_t i = 0; i < d.size();) {
    if (cls[i] == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && cls[j] != 0) ++j;
    for (size_t a = i + 1; a < j; ++a) {  // insertion sort: runs are short, and it is stable
      for (size_t b = a; b > i && cls[b - 1] > cls[b]; --b) {
        std::swap(d[b - 1], d[b]);
        std::swap(cls[b - 1], cls[b]);
      }
    }
    i = j;
  }
  // Compose: each mark with the last starter unless a mark of its class or higher, or a starter, stands between.
  std::vector<char32_t> out;
  out.reserve(d.size());
  size_t starter = SIZE_MAX;
  int last = -1;  // the class of the last code point kept after the starter (-1: none)
  for (size_t i = 0; i < d.size(); ++i) {
    const int c = cls[i];
    if (starter != SIZE_MAX && (last == -1 || (last != 0 && last < c))) {
      if (const char32_t p = compose(out[starter], d[i]); p != 0) {
        out[starter] = p;
        continue;
      }
    }
    if (c == 0) {
      starter = out.size();
      last = -1;
    } else {
      last = c;
    }
    out.push_back(d[i]);
  }
  append(out, s);
}

}  // namespace

}  // namespace tinygpt::data

#include "data/bpe.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <queue>
#include <unordered_set>

#include "data/text.h"
#include "data/unicode_tables.h"
#include "kernels/base.h"

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
  return (c >= 0x09 && c <= 0x0d) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) ||
         c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
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

void PieceCounts::add_text(std::string_view text) {
  for_each_piece(text, [&](std::string_view piece) { ++counts_[piece]; });
}

void PieceCounts::merge(const PieceCounts& other) {
  other.counts_.for_each([&](std::string_view piece, int64_t count) { counts_[piece] += count; });
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

// --- The tokenizer ---

namespace {

uint64_t pair_key(uint32_t a, uint32_t b) { return (uint64_t(a) << 32) | b; }

/// An open-addressing map from pair keys to small non-zero values (0: absent), for the millions of lookups training
/// makes. No key is ever ~0 (ids are below 65,536).
class PairIndex {
 public:
  PairIndex() : keys_(1 << 16, kEmpty), values_(1 << 16, 0) {}
  uint32_t& operator[](uint64_t key) {
    size_t i = slot(key);
    if (keys_[i] == kEmpty) {
      if ((size_ + 1) * 2 > keys_.size()) {
        grow();
        i = slot(key);
      }
      keys_[i] = key;
      ++size_;
    }
    return values_[i];
  }
  template <class F>
  void for_each(F&& f) const {
    for (size_t i = 0; i < keys_.size(); ++i) {
      if (keys_[i] != kEmpty) f(keys_[i], values_[i]);
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  size_t slot(uint64_t key) const {
    const size_t mask = keys_.size() - 1;
    size_t i = size_t((key * 0x9e3779b97f4a7c15ull) >> 20) & mask;
    while (keys_[i] != kEmpty && keys_[i] != key) i = (i + 1) & mask;
    return i;
  }
  void grow() {
    std::vector<uint64_t> keys(keys_.size() * 2, kEmpty);
    std::vector<uint32_t> values(keys.size(), 0);
    keys.swap(keys_);
    values.swap(values_);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (keys[i] == kEmpty) continue;
      const size_t j = slot(keys[i]);
      keys_[j] = keys[i];
      values_[j] = values[i];
    }
  }
  std::vector<uint64_t> keys_;
  std::vector<uint32_t> values_;
  size_t size_ = 0;
};

/// GPT-2's map of bytes to printable characters, in which tokenizer.json spells tokens.
struct ByteChars {
  std::array<std::string, 256> of_byte;
  std::unordered_map<char32_t, uint8_t> to_byte;
  ByteChars() {
    std::array<bool, 256> direct{};
    for (int b = '!'; b <= '~'; ++b) direct[size_t(b)] = true;
    for (int b = 0xa1; b <= 0xac; ++b) direct[size_t(b)] = true;
    for (int b = 0xae; b <= 0xff; ++b) direct[size_t(b)] = true;
    char32_t extra = 256;
    for (int b = 0; b < 256; ++b) {
      const char32_t c = direct[size_t(b)] ? char32_t(b) : extra++;
      to_byte[c] = uint8_t(b);
      std::string& s = of_byte[size_t(b)];
      if (c < 0x80) {
        s = char(c);
      } else {
        s += char(0xc0 | (c >> 6));
        s += char(0x80 | (c & 0x3f));
      }
    }
  }
  std::string spell(std::string_view bytes) const {
    std::string s;
    for (const char b : bytes) s += of_byte[uint8_t(b)];
    return s;
  }
  /// The bytes a spelled token stands for; false when a character is not one of the 256.
  bool unspell(std::string_view spelled, std::string& bytes) const {
    bytes.clear();
    for (size_t i = 0; i < spelled.size();) {
      const auto b0 = uint8_t(spelled[i]);
      char32_t c = 0;
      if (b0 < 0x80) {
        c = b0, i += 1;
      } else if ((b0 & 0xe0) == 0xc0 && i + 1 < spelled.size()) {
        c = char32_t((b0 & 0x1f) << 6) | (uint8_t(spelled[i + 1]) & 0x3f), i += 2;
      } else {
        return false;
      }
      const auto it = to_byte.find(c);
      if (it == to_byte.end()) return false;
      bytes += char(it->second);
    }
    return true;
  }
};
const ByteChars kByteChars;

}  // namespace

BpeTokenizer::BpeTokenizer() {
  tokens_.resize(256);
  for (int b = 0; b < 256; ++b) {
    tokens_[size_t(b)] = std::string(1, char(b));
    byte_ids_[size_t(b)] = uint32_t(b);
  }
}

void BpeTokenizer::index() {
  merge_of_.clear();
  merge_of_.reserve(merges_.size() * 2);
  for (size_t r = 0; r < merges_.size(); ++r) {
    merge_of_.emplace(pair_key(merges_[r].left, merges_[r].right), std::pair{uint32_t(r), merges_[r].result});
  }
}

namespace {

/// The merge learning's state: the pieces as words of ids in one arena, each pair's count and the words it occurs in,
/// and a max-heap of (count, pair) entries, stale ones skipped when popped.
class MergeLearner {
 public:
  struct Entry {
    int64_t count;
    uint64_t key;
    bool operator<(const Entry& o) const { return count != o.count ? count < o.count : key > o.key; }
  };

  /// The pieces in a fixed order (the map's is by hash: sorted, the same counts train the same merges on every
  /// machine, and the words a merge visits lie near each other in memory), and every pair counted.
  explicit MergeLearner(const PieceCounts& counts) {
    std::vector<std::pair<std::string_view, int64_t>> sorted;
    sorted.reserve(counts.unique());
    counts.map().for_each([&](std::string_view piece, int64_t count) {
      if (piece.size() >= 2) sorted.emplace_back(piece, count);  // a single byte has nothing to merge
    });
    std::sort(sorted.begin(), sorted.end(), [](const auto& x, const auto& y) {
      return std::lexicographical_compare(x.first.begin(), x.first.end(), y.first.begin(), y.first.end(),
                                          [](char p, char q) { return uint8_t(p) < uint8_t(q); });
    });
    words_.reserve(sorted.size());
    for (const auto& [piece, count] : sorted) {
      words_.push_back({arena_.size(), uint32_t(piece.size()), count});
      for (const char c : piece) arena_.push_back(uint8_t(c));
    }
    std::vector<std::pair<std::string_view, int64_t>>().swap(sorted);
    for (uint32_t w = 0; w < words_.size(); ++w) {
      const uint32_t* ids = arena_.data() + words_[w].offset;
      for (size_t i = 0; i + 1 < words_[w].length; ++i) {
        Pair& p = pair(pair_key(ids[i], ids[i + 1]));
        p.count += words_[w].count;
        if (p.words.empty() || p.words.back() != w) p.words.push_back(w);
      }
    }
    std::vector<Entry> entries;
    index_of_.for_each([&](uint64_t key, uint32_t i) { entries.push_back({pairs_[i - 1].count, key}); });
    heap_ = std::priority_queue<Entry>(std::less<Entry>(), std::move(entries));
  }

  /// The most frequent pair whose entry is current (stale entries pushed again with their count), or none.
  std::optional<Entry> pop() {
    while (!heap_.empty()) {
      const Entry top = heap_.top();
      heap_.pop();
      const Pair& best = pair(top.key);
      if (best.count == top.count) return top;
      if (best.count > 0) heap_.push({best.count, top.key});  // the count fell since this entry was pushed
    }
    return std::nullopt;
  }

  /// The pair is never merged (its bytes are a token already).
  void drop(uint64_t key) {
    Pair& p = pair(key);
    p.count = 0;
    std::vector<uint32_t>().swap(p.words);
  }

  /// Merges pair `key` (a, b) into `id` in every word it occurs in, in place; only the pairs around each occurrence
  /// change: (L, a) and (b, R) become (L, id) and (id, R). The pairs whose count grew are pushed on the heap.
  void merge(uint64_t key, uint32_t id) {
    const auto a = uint32_t(key >> 32), b = uint32_t(key & 0xffffffffu);
    std::vector<uint32_t> list = std::move(pair(key).words);
    std::sort(list.begin(), list.end());  // in memory order, each word once
    list.erase(std::unique(list.begin(), list.end()), list.end());
    grown_.clear();
    const auto change = [&](uint64_t k, int64_t d) {
      Pair& p = pair(k);
      p.count += d;
      if (d > 0 && p.grown_at != id) {
        p.grown_at = id;
        grown_.push_back(k);
      }
    };
    for (const uint32_t w : list) {
      Word& word = words_[w];
      uint32_t* ids = arena_.data() + word.offset;
      const int64_t n = word.count;
      size_t j = 0;  // merged in place: j <= i
      bool hit = false;
      for (size_t i = 0; i < word.length;) {
        if (i + 1 < word.length && ids[i] == a && ids[i + 1] == b) {
          change(key, -n);
          if (j > 0) {
            change(pair_key(ids[j - 1], a), -n);
            change(pair_key(ids[j - 1], id), n);
          }
          if (i + 2 < word.length) {
            change(pair_key(b, ids[i + 2]), -n);
            change(pair_key(id, ids[i + 2]), n);
          }
          ids[j++] = id;
          i += 2;
          hit = true;
        } else {
          ids[j++] = ids[i++];
        }
      }
      if (!hit) continue;
      word.length = uint32_t(j);
      for (size_t i = 0; i + 1 < j; ++i) {
        if (ids[i] == id || ids[i + 1] == id) {
          auto& l = pair(pair_key(ids[i], ids[i + 1])).words;
          if (l.empty() || l.back() != w) l.push_back(w);
        }
      }
    }
    for (const uint64_t k : grown_) {
      const Pair& p = pair(k);
      if (p.count > 0) heap_.push({p.count, k});
    }
  }

 private:
  struct Word {
    uint64_t offset;
    uint32_t length;
    int64_t count;
  };
  // A pair's count and the words it occurs in (a word may be listed after the pair left it: checked when used).
  struct Pair {
    int64_t count = 0;
    uint32_t grown_at = 0;  // the last merge that raised the count (its new id)
    std::vector<uint32_t> words;
  };

  Pair& pair(uint64_t key) {
    uint32_t& i = index_of_[key];
    if (i == 0) {
      pairs_.emplace_back();
      i = uint32_t(pairs_.size());
    }
    return pairs_[i - 1];
  }

  std::vector<Word> words_;
  std::vector<uint32_t> arena_;
  PairIndex index_of_;
  std::vector<Pair> pairs_;
  std::priority_queue<Entry> heap_;
  std::vector<uint64_t> grown_;  // pairs whose count a merge raised: pushed once it is done
};

}  // namespace

BpeTokenizer BpeTokenizer::train(const PieceCounts& counts, const TrainOptions& options) {
  if (options.vocab_size < kMinBpeVocab || options.vocab_size > kMaxBpeVocab) {
    throw Error(fmt::format("the vocabulary size must be in [{}, {}] (256 bytes, the merges and <|endoftext|>), got {}",
                            kMinBpeVocab, kMaxBpeVocab, options.vocab_size));
  }
  BpeTokenizer tok;
  MergeLearner learner(counts);
  std::unordered_set<std::string> known(tok.tokens_.begin(), tok.tokens_.end());
  const int64_t wanted = options.vocab_size - 257;
  while (int64_t(tok.merges_.size()) < wanted) {
    const std::optional<MergeLearner::Entry> top = learner.pop();
    if (!top || top->count < 2) break;  // no pair occurs twice: more merges would learn single pieces
    const auto a = uint32_t(top->key >> 32), b = uint32_t(top->key & 0xffffffffu);
    std::string bytes = tok.tokens_[a] + tok.tokens_[b];
    if (!known.insert(bytes).second) {  // already a token by other merges: never merge this pair
      learner.drop(top->key);
      continue;
    }
    const auto id = uint32_t(tok.tokens_.size());
    tok.tokens_.push_back(std::move(bytes));
    tok.merges_.push_back({a, b, id});
    learner.merge(top->key, id);
    if (options.progress) options.progress(int64_t(tok.merges_.size()), wanted);
  }
  tok.end_of_text_ = int32_t(tok.tokens_.size());
  tok.tokens_.emplace_back(kEndOfText);
  tok.index();
  return tok;
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<uint32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_ids_[uint8_t(piece[0])]);
    return;
  }
  struct Symbol {
    uint32_t id;
    int32_t prev, next;
  };
  std::vector<Symbol> sym(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) sym[i] = {byte_ids_[uint8_t(piece[i])], int32_t(i) - 1, int32_t(i) + 1};
  sym.back().next = -1;
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    uint32_t left, right;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  const auto consider = [&](int32_t pos) {
    if (pos < 0 || sym[size_t(pos)].next < 0) return;
    const uint32_t l = sym[size_t(pos)].id, r = sym[size_t(sym[size_t(pos)].next)].id;
    const auto it = merge_of_.find(pair_key(l, r));
    if (it != merge_of_.end()) heap.push({it->second.first, pos, l, r});
  };
  for (int32_t i = 0; i + 1 < int32_t(piece.size()); ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& s = sym[size_t(c.pos)];
    if (s.id != c.left || s.next < 0 || sym[size_t(s.next)].id != c.right) continue;  // stale
    const int32_t gone = s.next;
    s.id = merges_[c.rank].result;
    s.next = sym[size_t(gone)].next;
    if (s.next >= 0) sym[size_t(s.next)].prev = c.pos;
    sym[size_t(gone)].id = UINT32_MAX;
    consider(s.prev);
    consider(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = sym[size_t(i)].next) out.push_back(sym[size_t(i)].id);
}

void BpeTokenizer::encode(std::string_view text, std::vector<uint32_t>& out, Cache& cache) const {
  for_each_piece(text, [&](std::string_view piece) {
    if (piece.size() == 1) {
      out.push_back(byte_ids_[uint8_t(piece[0])]);
      return;
    }
    if (const auto* hit = cache.pieces_.get(piece)) {
      out.insert(out.end(), cache.ids_.begin() + hit->first, cache.ids_.begin() + hit->first + hit->second);
      return;
    }
    const size_t before = out.size();
    encode_piece(piece, out);
    if (piece.size() > 256) return;  // long runs (a line of '=' or base64) are rare and would crowd the cache
    if (cache.pieces_.size() >= cache.max_pieces_) {
      cache.pieces_.clear();
      cache.ids_.clear();
    }
    cache.pieces_[piece] = {uint32_t(cache.ids_.size()), uint32_t(out.size() - before)};
    cache.ids_.insert(cache.ids_.end(), out.begin() + std::ptrdiff_t(before), out.end());
  }, individual_digits_);
}

std::string BpeTokenizer::decode(const std::vector<uint32_t>& ids) const {
  std::string text;
  for (const uint32_t id : ids) {
    if (id >= tokens_.size()) {
      throw Error(fmt::format("token id {} is outside the vocabulary (ids 0 to {})", id, tokens_.size() - 1));
    }
    text += tokens_[id];
  }
  return text;
}

// --- tokenizer.json ---

std::string BpeTokenizer::to_json() const {
  using ojson = nlohmann::ordered_json;
  ojson vocab = ojson::object();
  for (size_t id = 0; id < tokens_.size(); ++id) {
    vocab[int32_t(id) == end_of_text_ ? tokens_[id] : kByteChars.spell(tokens_[id])] = id;
  }
  ojson merges = ojson::array();
  for (const Merge& m : merges_) merges.push_back(kByteChars.spell(tokens_[m.left]) + " " + kByteChars.spell(tokens_[m.right]));
  ojson added = ojson::array();
  if (end_of_text_ >= 0) {
    added.push_back({{"id", end_of_text_}, {"content", kEndOfText}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  const ojson byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}};
  ojson j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       individual_digits_
           ? ojson{{"type", "Sequence"},
                   {"pretokenizers", ojson::array({{{"type", "Digits"}, {"individual_digits", true}},
                                                   {{"type", "ByteLevel"}, {"add_prefix_space", false},
                                                    {"trim_offsets", true}, {"use_regex", true}}})}}
           : ojson{{"type", "Sequence"},
                   {"pretokenizers",
                    ojson::array({{{"type", "Split"}, {"pattern", {{"Regex", kGpt2Pattern}}}, {"behavior", "Isolated"},
                                   {"invert", false}},
                                  byte_level})}}},
      {"post_processor", nullptr},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
        {"vocab", vocab}, {"merges", merges}}},
  };
  return j.dump(1) + "\n";
}

namespace {

/// Whether a pre_tokenizer is GPT-2's split followed by the byte-level mapping, or that after a Digits pre-tokenizer
/// with individual_digits (then `digits` is set); `why` says what is not.
bool is_gpt2_pre_tokenizer(const nlohmann::json& p, std::string& why, bool& digits) {
  const auto type = [](const nlohmann::json& j) { return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : ""; };
  if (type(p) == "Sequence" && p.contains("pretokenizers") && p["pretokenizers"].is_array() &&
      !p["pretokenizers"].empty() && type(p["pretokenizers"][0]) == "Digits") {
    const nlohmann::json& d = p["pretokenizers"][0];
    if (!d.value("individual_digits", false)) return why = "a Digits pre-tokenizer without individual_digits", false;
    nlohmann::json rest = p;
    rest["pretokenizers"].erase(0);
    if (rest["pretokenizers"].size() == 1) rest = rest["pretokenizers"][0];
    bool again = false;
    if (!is_gpt2_pre_tokenizer(rest, why, again) || again) return false;
    return digits = true;
  }
  if (type(p) == "ByteLevel") {
    if (p.value("add_prefix_space", false)) return why = "a ByteLevel pre-tokenizer with add_prefix_space", false;
    if (!p.value("use_regex", true)) return why = "a ByteLevel pre-tokenizer without a split pattern", false;
    return true;
  }
  if (type(p) == "Sequence" && p.contains("pretokenizers") && p["pretokenizers"].is_array() && p["pretokenizers"].size() == 2) {
    const auto& split = p["pretokenizers"][0];
    const auto& bl = p["pretokenizers"][1];
    if (type(split) == "Split" && split.contains("pattern") && split["pattern"].is_object() &&
        split["pattern"].contains("Regex") && split["pattern"]["Regex"].is_string() && type(bl) == "ByteLevel" &&
        !bl.value("use_regex", true) && !bl.value("add_prefix_space", false) && split.value("behavior", "") == "Isolated" &&
        !split.value("invert", false)) {
      if (split["pattern"]["Regex"].get<std::string>() == kGpt2Pattern) return true;
      why = fmt::format("the split pattern {} (tinygpt knows GPT-2's, {})", split["pattern"]["Regex"].dump(), kGpt2Pattern);
      return false;
    }
  }
  why = fmt::format("the pre-tokenizer {:.200}", p.dump());
  return false;
}

}  // namespace

BpeTokenizer BpeTokenizer::from_json(std::string_view text, const std::string& what) {
  const auto bad = [&](const std::string& why) {
    return Error(fmt::format("'{}' is not a byte-level BPE tokenizer tinygpt can read: {}", what, why));
  };
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw bad("it is not valid JSON");
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) throw bad("no \"model\" object");
  const auto& m = j["model"];
  if (m.value("type", std::string()) != "BPE") throw bad("its model is not \"BPE\"");
  if (j.contains("normalizer") && !j["normalizer"].is_null()) throw bad("it has a normalizer");
  std::string why;
  bool digits = false;
  if (!j.contains("pre_tokenizer") || !is_gpt2_pre_tokenizer(j["pre_tokenizer"], why, digits)) {
    throw bad(why.empty() ? "no pre_tokenizer" : why);
  }
  if (m.contains("ignore_merges") && m["ignore_merges"].is_boolean() && m["ignore_merges"].get<bool>()) {
    throw bad("ignore_merges is set");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (m.contains(key) && !m[key].is_null() && !(m[key].is_string() && m[key].get<std::string>().empty())) {
      throw bad(fmt::format("its model has a {}", key));
    }
  }
  if (m.contains("dropout") && !m["dropout"].is_null()) throw bad("its model has BPE dropout");
  if (!m.contains("vocab") || !m["vocab"].is_object()) throw bad("no vocab object");
  const auto& vocab = m["vocab"];
  if (int64_t(vocab.size()) > kMaxBpeVocab) throw bad(fmt::format("{} tokens, more than {}", vocab.size(), kMaxBpeVocab));

  BpeTokenizer tok;
  tok.individual_digits_ = digits;
  tok.tokens_.assign(vocab.size(), std::string());
  std::vector<bool> seen(vocab.size(), false);
  std::unordered_map<std::string, uint32_t> id_of;  // spelled token -> id
  std::string bytes;
  for (const auto& [spelled, id_json] : vocab.items()) {
    if (!id_json.is_number_unsigned() || id_json.get<uint64_t>() >= vocab.size()) {
      throw bad(fmt::format("token {} has id {}; ids must be 0 to {}, each once", nlohmann::json(spelled).dump(), id_json.dump(),
                            vocab.size() - 1));
    }
    const auto id = id_json.get<uint32_t>();
    if (seen[id]) throw bad(fmt::format("id {} is given to two tokens", id));
    seen[id] = true;
    tok.tokens_[id] = kByteChars.unspell(spelled, bytes) ? bytes : spelled;  // special tokens are spelled as they are
    id_of.emplace(spelled, id);
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = id_of.find(kByteChars.of_byte[size_t(b)]);
    if (it == id_of.end()) throw bad(fmt::format("byte 0x{:02x} has no token", b));
    tok.byte_ids_[size_t(b)] = it->second;
  }
  if (!m.contains("merges") || !m["merges"].is_array()) throw bad("no merges array");
  for (const auto& merge : m["merges"]) {
    std::string left, right;
    if (merge.is_string()) {
      const std::string s = merge.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        throw bad(fmt::format("merge {} is not two tokens separated by one space", merge.dump()));
      }
      left = s.substr(0, space), right = s.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      left = merge[0].get<std::string>(), right = merge[1].get<std::string>();
    } else {
      throw bad(fmt::format("merge {:.100} is neither \"a b\" nor [\"a\", \"b\"]", merge.dump()));
    }
    const auto l = id_of.find(left), r = id_of.find(right), result = id_of.find(left + right);
    if (l == id_of.end() || r == id_of.end() || result == id_of.end()) {
      throw bad(fmt::format("merge {:.100} names a token that is not in the vocabulary", merge.dump()));
    }
    tok.merges_.push_back({l->second, r->second, result->second});
  }
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const auto& t : j["added_tokens"]) {
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_unsigned() || !t.contains("content") ||
          !t["content"].is_string()) {
        throw bad(fmt::format("added token {:.100} has no id or content", t.dump()));
      }
      const auto id = t["id"].get<uint64_t>();
      const std::string content = t["content"].get<std::string>();
      if (id == tok.tokens_.size() && int64_t(id) < kMaxBpeVocab) {
        tok.tokens_.push_back(content);
      } else if (id > tok.tokens_.size()) {
        throw bad(fmt::format("added token {} has id {}, past the vocabulary's {}", content, id, tok.tokens_.size()));
      } else {
        tok.tokens_[id] = content;
      }
      if (content == kEndOfText) tok.end_of_text_ = int32_t(id);
    }
  }
  tok.index();
  return tok;
}

}  // namespace tinygpt::data

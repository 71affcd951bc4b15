#include "data/bpe.h"

#include "data/nfc.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <queue>
#include <unordered_set>

#include "data/nfc.h"
#include "data/text.h"
#include "data/unicode_tables.h"
#include "kernels/base.h"

namespace tinygpt::data {

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
  std::sort(added_.begin(), added_.end(), [](const Added& a, const Added& b) { return a.id < b.id; });
  for (int mode = 0; mode < 2; ++mode) {
    std::vector<uint32_t>& m = matched_[size_t(mode)];
    m.clear();
    first_byte_[size_t(mode)].fill(false);
    for (uint32_t i = 0; i < added_.size(); ++i) {
      if (added_[i].content.empty() || (added_[i].special && Specials(mode) == Specials::AsText)) continue;
      m.push_back(i);
      first_byte_[size_t(mode)][uint8_t(added_[i].content[0])] = true;
    }
    std::stable_sort(m.begin(), m.end(), [&](uint32_t a, uint32_t b) { return added_[a].content.size() > added_[b].content.size(); });
  }
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
  if (options.vocab_size < kMinBpeVocab || options.vocab_size > kMaxTrainedBpeVocab) {
    throw Error(fmt::format("the vocabulary size must be in [{}, {}] (256 bytes, the merges and <|endoftext|>), got {}",
                            kMinBpeVocab, kMaxTrainedBpeVocab, options.vocab_size));
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
  tok.added_.push_back({uint32_t(tok.tokens_.size()), std::string(kEndOfText), true});
  tok.tokens_.emplace_back(kEndOfText);
  tok.model_vocab_ = tok.tokens_.size();
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

int32_t BpeTokenizer::added_id(std::string_view content) const {
  for (const Added& a : added_) {
    if (a.content == content) return int32_t(a.id);
  }
  return -1;
}

void BpeTokenizer::set_end_of_text(int32_t id) {
  for (const Added& a : added_) {
    if (int32_t(a.id) == id) {
      end_of_text_ = id;
      return;
    }
  }
  throw Error(fmt::format("token {} cannot end documents: it is not an added token of the tokenizer", id));
}

void BpeTokenizer::encode(std::string_view text, std::vector<uint32_t>& out, Cache& cache, Specials specials) const {
  const std::vector<uint32_t>& matched = matched_[size_t(specials)];
  if (matched.empty()) return encode_text(text, out, cache);
  const std::array<bool, 256>& first = first_byte_[size_t(specials)];
  size_t start = 0;  // leftmost-longest, as `tokenizers` matches added tokens
  for (size_t pos = 0; pos < text.size();) {
    const Added* hit = nullptr;
    if (first[uint8_t(text[pos])]) {
      for (const uint32_t i : matched) {
        if (text.substr(pos, added_[i].content.size()) == added_[i].content) {
          hit = &added_[i];
          break;
        }
      }
    }
    if (hit == nullptr) {
      ++pos;
      continue;
    }
    encode_text(text.substr(start, pos - start), out, cache);
    out.push_back(hit->id);
    pos += hit->content.size();
    start = pos;
  }
  encode_text(text.substr(start), out, cache);
}

void BpeTokenizer::encode_text(std::string_view given, std::vector<uint32_t>& out, Cache& cache) const {
  std::string normalized;
  if (nfc_ && nfc_may_change(given)) normalized = data::nfc(given);
  const std::string_view text = normalized.empty() ? given : std::string_view(normalized);
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
  }, individual_digits_, pre_split_);
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
  std::vector<bool> is_added(tokens_.size(), false);
  for (const Added& a : added_) is_added[a.id] = true;
  ojson vocab = ojson::object();
  for (size_t id = 0; id < model_vocab_; ++id) vocab[is_added[id] ? tokens_[id] : kByteChars.spell(tokens_[id])] = id;
  ojson merges = ojson::array();
  for (const Merge& m : merges_) merges.push_back(kByteChars.spell(tokens_[m.left]) + " " + kByteChars.spell(tokens_[m.right]));
  ojson added = ojson::array();
  for (const Added& a : added_) {
    added.push_back({{"id", a.id}, {"content", a.content}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", a.special}});
  }
  const ojson byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}};
  const ojson split = {{"type", "Split"}, {"pattern", {{"Regex", pattern_of(pre_split_)}}}, {"behavior", "Isolated"},
                       {"invert", false}};
  ojson pre = individual_digits_
                  ? ojson{{"type", "Sequence"},
                          {"pretokenizers", ojson::array({{{"type", "Digits"}, {"individual_digits", true}},
                                                          {{"type", "ByteLevel"}, {"add_prefix_space", false},
                                                           {"trim_offsets", true}, {"use_regex", true}}})}}
                  : ojson{{"type", "Sequence"}, {"pretokenizers", ojson::array({split, byte_level})}};
  ojson post = nullptr;
  if (bos_ >= 0) {  // the bos before each text (and each of a pair), as Llama 3's TemplateProcessing
    const std::string& bos = tokens_[size_t(bos_)];
    const ojson b = {{"SpecialToken", {{"id", bos}, {"type_id", 0}}}};
    post = {{"type", "TemplateProcessing"},
            {"single", ojson::array({b, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
            {"pair", ojson::array({b, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, b, {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
            {"special_tokens", {{bos, {{"id", bos}, {"ids", {bos_}}, {"tokens", {bos}}}}}}};
  }
  ojson j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nfc_ ? ojson{{"type", "NFC"}} : ojson(nullptr)},
      {"pre_tokenizer", pre},
      {"post_processor", post},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
        {"vocab", vocab}, {"merges", merges}}},
  };
  return j.dump(1) + "\n";
}

namespace {

/// Whether a pre_tokenizer is a split tinygpt knows (GPT-2's, Llama 3's, Qwen2's: set in `split`) followed by the
/// byte-level mapping, or that after a Digits pre-tokenizer with individual_digits (then `digits` is set); `why` says
/// what is not.
bool read_pre_tokenizer(const nlohmann::json& p, std::string& why, bool& digits, PreSplit& split_kind) {
  const auto type = [](const nlohmann::json& j) { return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : ""; };
  if (type(p) == "Sequence" && p.contains("pretokenizers") && p["pretokenizers"].is_array() &&
      !p["pretokenizers"].empty() && type(p["pretokenizers"][0]) == "Digits") {
    const nlohmann::json& d = p["pretokenizers"][0];
    if (!d.value("individual_digits", false)) return why = "a Digits pre-tokenizer without individual_digits", false;
    nlohmann::json rest = p;
    rest["pretokenizers"].erase(0);
    if (rest["pretokenizers"].size() == 1) rest = rest["pretokenizers"][0];
    bool again = false;
    if (!read_pre_tokenizer(rest, why, again, split_kind) || again) return false;
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
      for (const PreSplit known : {PreSplit::Gpt2, PreSplit::Llama3, PreSplit::Qwen2}) {
        if (split["pattern"]["Regex"].get<std::string>() == pattern_of(known)) return split_kind = known, true;
      }
      why = fmt::format("the split pattern {:.300} (tinygpt knows GPT-2's, Llama 3's and Qwen2's: {}, {}, {})",
                        split["pattern"]["Regex"].dump(), kGpt2Pattern, kLlama3Pattern, kQwen2Pattern);
      return false;
    }
  }
  why = fmt::format("the pre-tokenizer {:.200}", p.dump());
  return false;
}

/// The bos id a post_processor puts before a text (-1: none): null, ByteLevel, a TemplateProcessing whose single
/// template is [bos, A] or [A], or a Sequence of those. Throws bad(...) for any other.
template <class Bad>
int32_t read_post_processor(const nlohmann::json& p, const BpeTokenizer& tok, const Bad& bad) {
  if (p.is_null()) return -1;
  const std::string type = p.is_object() ? p.value("type", std::string()) : std::string();
  if (type == "ByteLevel") return -1;
  if (type == "Sequence" && p.contains("processors") && p["processors"].is_array()) {
    int32_t bos = -1;
    for (const auto& q : p["processors"]) bos = std::max(bos, read_post_processor(q, tok, bad));
    return bos;
  }
  if (type == "TemplateProcessing" && p.contains("single") && p["single"].is_array()) {
    const auto& single = p["single"];
    const auto is_sequence = [](const nlohmann::json& piece) { return piece.is_object() && piece.contains("Sequence"); };
    if (single.size() == 1 && is_sequence(single[0])) return -1;
    if (single.size() == 2 && is_sequence(single[1]) && single[0].is_object() && single[0].contains("SpecialToken") &&
        single[0]["SpecialToken"].is_object() && single[0]["SpecialToken"].contains("id") &&
        single[0]["SpecialToken"]["id"].is_string()) {
      const std::string name = single[0]["SpecialToken"]["id"].get<std::string>();
      const int32_t id = tok.added_id(name);
      if (id < 0) throw bad(fmt::format("its post-processor adds {}, which is not an added token", nlohmann::json(name).dump()));
      return id;
    }
    throw bad(fmt::format("its post-processor's template {:.200} (tinygpt adds at most a bos before the text)", single.dump()));
  }
  throw bad(fmt::format("the post-processor {:.200}", p.dump()));
}

/// A merge as tokenizer.json spells it ("a b", or ["a", "b"] as tokenizers 0.20 and later write it): its two tokens.
template <class Bad>
std::pair<std::string, std::string> merge_pair(const nlohmann::json& merge, const Bad& bad) {
  if (merge.is_string()) {
    const std::string s = merge.get<std::string>();
    const size_t space = s.find(' ');
    if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
      throw bad(fmt::format("merge {} is not two tokens separated by one space", merge.dump()));
    }
    return {s.substr(0, space), s.substr(space + 1)};
  }
  if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
    return {merge[0].get<std::string>(), merge[1].get<std::string>()};
  }
  throw bad(fmt::format("merge {:.100} is neither \"a b\" nor [\"a\", \"b\"]", merge.dump()));
}

/// What a tokenizer.json of another kind says, by name: SentencePiece's tokenizers as tokenizers writes them (a
/// Unigram model, as T5's; a BPE over SentencePiece pieces with byte fallback and U+2581 for spaces, as Llama 2's,
/// TinyLlama's, Mistral's, Gemma's), another model type, a normalizer other than NFC (Qwen2's, which tinygpt applies).
/// A normalizer that is Unicode's NFC: {"type": "NFC"}, or a Sequence of that one alone.
bool is_nfc(const nlohmann::json& n) {
  if (!n.is_object() || !n.contains("type")) return false;
  if (n["type"] == "NFC") return true;
  return n["type"] == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array() &&
         n["normalizers"].size() == 1 && is_nfc(n["normalizers"][0]);
}

template <class Bad>
void refuse_other_kinds(const nlohmann::json& j, const Bad& bad) {
  const auto& m = j["model"];
  const bool byte_fallback =
      m.contains("byte_fallback") && m["byte_fallback"].is_boolean() && m["byte_fallback"].get<bool>();
  if (m.value("type", std::string()) == "Unigram" || byte_fallback) {
    throw bad(fmt::format("it is a SentencePiece tokenizer ({}, as Llama 2's, TinyLlama's, Mistral's and Gemma's are); "
                          "tinygpt reads byte-level BPE tokenizers (GPT-2's, Llama 3's, Qwen2's, SmolLM2's)",
                          byte_fallback ? "a BPE with byte_fallback" : "a Unigram model"));
  }
  if (m.value("type", std::string()) != "BPE") throw bad("its model is not \"BPE\"");
  if (j.contains("normalizer") && !j["normalizer"].is_null() && !is_nfc(j["normalizer"])) {
    const auto& n = j["normalizer"];
    throw bad(fmt::format("it has a normalizer ({}), which tinygpt does not apply (it applies NFC)",
                          n.is_object() && n.contains("type") ? n["type"].dump() : n.dump().substr(0, 60)));
  }
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
  refuse_other_kinds(j, bad);
  std::string why;
  bool digits = false;
  PreSplit split = PreSplit::Gpt2;
  if (!j.contains("pre_tokenizer") || !read_pre_tokenizer(j["pre_tokenizer"], why, digits, split)) {
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
  tok.nfc_ = j.contains("normalizer") && !j["normalizer"].is_null();  // refuse_other_kinds let only NFC through
  tok.pre_split_ = split;
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
    const auto [left, right] = merge_pair(merge, bad);
    const auto l = id_of.find(left), r = id_of.find(right), result = id_of.find(left + right);
    if (l == id_of.end() || r == id_of.end() || result == id_of.end()) {
      throw bad(fmt::format("merge {:.100} names a token that is not in the vocabulary", merge.dump()));
    }
    tok.merges_.push_back({l->second, r->second, result->second});
  }
  tok.model_vocab_ = tok.tokens_.size();
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    std::vector<bool> is_added;
    for (const auto& t : j["added_tokens"]) {
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_unsigned() || !t.contains("content") ||
          !t["content"].is_string()) {
        throw bad(fmt::format("added token {:.100} has no id or content", t.dump()));
      }
      const auto id = t["id"].get<uint64_t>();
      const std::string content = t["content"].get<std::string>();
      for (const char* flag : {"single_word", "lstrip", "rstrip"}) {
        if (t.value(flag, false)) throw bad(fmt::format("added token {} has {} set", nlohmann::json(content).dump(), flag));
      }
      if (id >= uint64_t(kMaxBpeVocab)) {
        throw bad(fmt::format("added token {} has id {}: more than {} tokens", content, id, kMaxBpeVocab));
      }
      if (id == tok.tokens_.size()) {
        tok.tokens_.push_back(content);
      } else if (id > tok.tokens_.size()) {
        throw bad(fmt::format("added token {} has id {}, past the vocabulary's {}", content, id, tok.tokens_.size()));
      } else {
        tok.tokens_[id] = content;
      }
      if (is_added.size() <= id) is_added.resize(id + 1, false);
      if (is_added[id]) throw bad(fmt::format("id {} is given to two added tokens", id));
      is_added[id] = true;
      tok.added_.push_back({uint32_t(id), content, t.value("special", false)});
      if (content == kEndOfText) tok.end_of_text_ = int32_t(id);
    }
  }
  if (j.contains("post_processor")) tok.bos_ = read_post_processor(j["post_processor"], tok, bad);
  tok.index();
  return tok;
}

}  // namespace tinygpt::data

#include "data/bpe.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <optional>
#include <queue>
#include <unordered_set>

#include "data/byte_chars.h"
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
    std::stable_sort(m.begin(), m.end(),
                     [&](uint32_t a, uint32_t b) { return added_[a].content.size() > added_[b].content.size(); });
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
  for_each_piece(
      text,
      [&](std::string_view piece) {
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
      },
      individual_digits_, pre_split_);
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

}  // namespace tinygpt::data

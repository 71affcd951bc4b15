// An open-addressing hash map from short byte strings to values, its keys packed into one arena: what counting
// pre-split pieces and caching their encodings need (tens of millions of lookups, millions of keys), without a heap
// allocation per key as std::unordered_map<std::string, V> makes.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace tinygpt::data {

template <class V>
class StringMap {
 public:
  StringMap() : slots_(1024) {}

  /// The value of `key`, inserted value-initialized when absent.
  V& operator[](std::string_view key) {
    const uint64_t h = hash(key);
    Slot* s = find(key, h);
    if (s->used) return s->value;
    if ((size_ + 1) * 4 > slots_.size() * 3) {  // load factor 3/4
      grow();
      s = find(key, h);
    }
    s->used = true;
    s->hash = h;
    s->offset = arena_.size();
    s->length = uint32_t(key.size());
    arena_.append(key);
    ++size_;
    return s->value;
  }
  /// The value of `key`, or null.
  const V* get(std::string_view key) const {
    const Slot* s = const_cast<StringMap*>(this)->find(key, hash(key));
    return s->used ? &s->value : nullptr;
  }
  size_t size() const { return size_; }
  /// Bytes held by the keys.
  size_t key_bytes() const { return arena_.size(); }
  void clear() {
    slots_.assign(1024, Slot{});
    arena_.clear();
    size_ = 0;
  }
  template <class F>
  void for_each(F&& f) const {
    for (const Slot& s : slots_) {
      if (s.used) f(std::string_view(arena_).substr(s.offset, s.length), s.value);
    }
  }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint64_t offset = 0;
    uint32_t length = 0;
    bool used = false;
    V value{};
  };
  static uint64_t hash(std::string_view key) { return std::hash<std::string_view>{}(key); }
  Slot* find(std::string_view key, uint64_t h) {
    const size_t mask = slots_.size() - 1;
    for (size_t i = size_t(h) & mask;; i = (i + 1) & mask) {
      Slot& s = slots_[i];
      if (!s.used) return &s;
      if (s.hash == h && s.length == key.size() && std::memcmp(arena_.data() + s.offset, key.data(), key.size()) == 0) {
        return &s;
      }
    }
  }
  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    const size_t mask = slots_.size() - 1;
    for (Slot& s : old) {
      if (!s.used) continue;
      size_t i = size_t(s.hash) & mask;
      while (slots_[i].used) i = (i + 1) & mask;
      slots_[i] = std::move(s);
    }
  }
  std::vector<Slot> slots_;
  std::string arena_;
  size_t size_ = 0;
};

}  // namespace tinygpt::data

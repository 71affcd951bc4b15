// Token ids as training reads them: a view of 16- or 32-bit ids, held in memory or mapped from a token cache file
// (data/documents.h writes and reads the one cache format), the train/val split and the seeded batch sampler.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <iterator>
#include <span>
#include <string_view>
#include <vector>

#include "../autograd/tensor.h"
#include "text.h"

namespace tinygpt::data {

/// Token ids are stored in 16 bits (characters, and BPEs of up to 65,536 tokens), or in 32 bits for larger BPE
/// vocabularies (Llama 3's 128,256; TokenSpan reads either).
using Token = uint16_t;
inline constexpr int64_t kMaxVocab = 65536;

/// A view of stored token ids, 16 or 32 bits each, read as uint32_t.
class TokenSpan {
 public:
  TokenSpan() = default;
  TokenSpan(std::span<const uint16_t> s) : data_(s.data()), size_(s.size()), wide_(false) {}  // NOLINT: a view
  TokenSpan(std::span<const uint32_t> s) : data_(s.data()), size_(s.size()), wide_(true) {}   // NOLINT: a view
  TokenSpan(const std::vector<uint16_t>& v) : TokenSpan(std::span<const uint16_t>(v)) {}      // NOLINT: a view
  TokenSpan(const std::vector<uint32_t>& v) : TokenSpan(std::span<const uint32_t>(v)) {}      // NOLINT: a view
  TokenSpan(std::span<uint16_t> s) : TokenSpan(std::span<const uint16_t>(s)) {}               // NOLINT: a view

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  /// Bytes an id takes: 2 or 4.
  size_t id_bytes() const { return wide_ ? 4 : 2; }
  const void* data() const { return data_; }
  uint32_t operator[](size_t i) const {
    return wide_ ? static_cast<const uint32_t*>(data_)[i] : static_cast<const uint16_t*>(data_)[i];
  }
  TokenSpan first(size_t n) const { return {data_, n, wide_}; }
  TokenSpan subspan(size_t offset) const { return {at(offset), size_ - offset, wide_}; }
  TokenSpan subspan(size_t offset, size_t n) const { return {at(offset), n, wide_}; }

  struct iterator {
    using iterator_category = std::forward_iterator_tag;
    using value_type = uint32_t;
    using difference_type = std::ptrdiff_t;
    using pointer = void;
    using reference = uint32_t;
    const TokenSpan* span = nullptr;
    size_t i = 0;
    uint32_t operator*() const { return (*span)[i]; }
    iterator& operator++() {
      ++i;
      return *this;
    }
    iterator operator++(int) {
      iterator old = *this;
      ++i;
      return old;
    }
    bool operator==(const iterator& o) const { return i == o.i; }
  };
  iterator begin() const { return {this, 0}; }
  iterator end() const { return {this, size_}; }

 private:
  TokenSpan(const void* data, size_t size, bool wide) : data_(data), size_(size), wide_(wide) {}
  const void* at(size_t offset) const { return static_cast<const char*>(data_) + offset * id_bytes(); }
  const void* data_ = nullptr;
  size_t size_ = 0;
  bool wide_ = false;
};

/// A read-only memory map of a whole file (an empty file maps to no bytes).
class MappedFile {
 public:
  MappedFile() = default;
  /// Throws naming the path when it is missing, a directory or unreadable.
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;

  std::string_view bytes() const { return {static_cast<const char*>(data_), size_}; }
  /// Drops the whole pages of bytes [offset, offset + bytes) from the resident set (madvise MADV_DONTNEED): a pass that
  /// has read them is done with them; a later read pages them in again from the file.
  void release(size_t offset, size_t bytes) const;

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

/// The largest of `count` ids of `id_bytes` (2 or 4) each from byte `offset` of a file, read through a small buffer
/// (the file is not mapped, so the resident set does not grow with it); 0 when count is 0. Throws naming the file
/// when it cannot be read or is cut short.
uint32_t largest_id(const std::filesystem::path& path, uint64_t offset, uint64_t count, size_t id_bytes);

/// Token ids, either memory-mapped from a cache file or held in memory.
class TokenData {
 public:
  TokenData() = default;
  explicit TokenData(std::vector<Token> ids) : owned_(std::move(ids)) {}
  /// `count` ids of `id_bytes` (2 or 4) each from byte `offset` of a mapped cache file.
  TokenData(MappedFile file, size_t offset, size_t count, size_t id_bytes = sizeof(Token));

  TokenSpan ids() const;
  /// Drops the pages of ids[first, first + count) from the resident set, where they are mapped (MappedFile::release).
  void release(size_t first, size_t count) const;

 private:
  std::vector<Token> owned_;
  MappedFile file_;
  size_t offset_ = 0, count_ = 0, id_bytes_ = sizeof(Token);
};

/// The ids that train and those that validate (load_documents' train_count splits them).
struct Split {
  TokenSpan train, val;
};

/// Sequences that each start a batch row (conversations): sequence i is ids[starts[i], starts[i + 1]), and mask[k]
/// says whether ids[k] is a target (an assistant's token).
struct Rows {
  TokenSpan ids;
  std::span<const uint8_t> mask;
  std::span<const uint64_t> starts;  // size() + 1 offsets
  size_t size() const { return starts.empty() ? 0 : starts.size() - 1; }
};

/// Batches of random windows: x = ids[i, i + T), y = ids[i + 1, i + T + 1) with i uniform, from a seeded
/// generator whose state can be saved and restored (exact resume). Over Rows instead: each batch row one sequence
/// drawn uniformly, from its start (cut at T + 1 tokens), padded; y is the next id where the mask marks it, else -1
/// (the loss ignores it), as in the padding.
class BatchSampler {
 public:
  /// Throws when the ids are too few for one window of block_size + 1 tokens (`what` names them).
  BatchSampler(TokenSpan ids, int64_t batch_size, int64_t block_size, uint64_t seed, const char* what);
  /// Throws when there are no rows (`what` names them).
  BatchSampler(Rows rows, int64_t batch_size, int64_t block_size, uint64_t seed, const char* what);

  struct Batch {
    Tensor x, y;  // (B, T) i32
  };
  Batch next();
  /// Draws what next() would and discards it: the generator moves on exactly as after next() (a data-parallel
  /// rank passes over the other ranks' batches this way).
  void skip();
  Generator& generator() { return gen_; }

 private:
  TokenSpan ids_;
  Rows rows_;  // empty: windows of ids_
  int64_t batch_size_, block_size_;
  Generator gen_;
};

/// The batch of rows[first, first + batch) as BatchSampler draws rows (fewer rows where the set ends): x and y, and
/// how many targets y holds.
struct RowBatch {
  Tensor x, y;
  int64_t targets = 0;
};
RowBatch row_batch(const Rows& rows, size_t first, int64_t batch_size, int64_t block_size);

}  // namespace tinygpt::data

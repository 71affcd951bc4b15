// A text corpus as token ids: encoded once into a compact cache file next to the run and memory-mapped after
// that, so memory grows with the number of tokens, never with copies of the text. Plus the train/val split
// and the seeded batch sampler.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>
#include <vector>

#include "../autograd/tensor.h"
#include "text.h"

namespace tinygpt::data {

/// Token ids are stored in 16 bits: vocabularies of up to 65,536 characters.
using Token = uint16_t;
inline constexpr int64_t kMaxVocab = 65536;

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

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

/// Token ids, either memory-mapped from a cache file or held in memory.
class TokenData {
 public:
  TokenData() = default;
  explicit TokenData(std::vector<Token> ids) : owned_(std::move(ids)) {}
  TokenData(MappedFile file, size_t offset, size_t count);

  std::span<const Token> ids() const;

 private:
  std::vector<Token> owned_;
  MappedFile file_;
  size_t offset_ = 0, count_ = 0;
};

struct Corpus {
  CharVocab vocab;
  TokenData tokens;
  bool from_cache = false;  // the cache file was up to date and mapped
};

/// The tokens of the UTF-8 text file `text_path` under its own vocabulary, cached in `cache_dir` as
/// tokens.bin (a small JSON header naming the source's path, size and modification time and the
/// vocabulary, then the ids). A cache that matches the source is mapped; otherwise the text is read
/// through a memory map in two passes (vocabulary, then ids) and the cache rewritten. Throws naming the
/// problem: missing, empty or non-UTF-8 file (with the byte offset), a vocabulary over kMaxVocab.
Corpus load_corpus(const std::filesystem::path& text_path, const std::filesystem::path& cache_dir);

/// The tokens of a text file under a given vocabulary (a checkpoint's), in memory; throws naming the
/// first character outside the vocabulary and its byte offset.
TokenData encode_file(const std::filesystem::path& text_path, const CharVocab& vocab);

/// The first `train_fraction` of the ids train, the rest validate (as nanoGPT splits).
struct Split {
  std::span<const Token> train, val;
};
Split split_tokens(std::span<const Token> ids, double train_fraction);

/// Batches of random windows: x = ids[i, i + T), y = ids[i + 1, i + T + 1) with i uniform, from a seeded
/// generator whose state can be saved and restored (exact resume).
class BatchSampler {
 public:
  /// Throws when the ids are too few for one window of block_size + 1 tokens (`what` names them).
  BatchSampler(std::span<const Token> ids, int64_t batch_size, int64_t block_size, uint64_t seed, const char* what);

  struct Batch {
    Tensor x, y;  // (B, T) i32
  };
  Batch next();
  /// Draws what next() would and discards it: the generator moves on exactly as after next() (a data-parallel
  /// rank passes over the other ranks' batches this way).
  void skip();
  Generator& generator() { return gen_; }

 private:
  std::span<const Token> ids_;
  int64_t batch_size_, block_size_;
  Generator gen_;
};

}  // namespace tinygpt::data

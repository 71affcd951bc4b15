#include "data/corpus.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "data/file_pass.h"

namespace tinygpt::data {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'T', 'G', 'T', 'O', 'K', 'E', 'N', '1'};
constexpr size_t kMaxHeader = size_t(1) << 24;

/// The source file's identity: a cache is valid only for the same path, size and modification time.
nlohmann::json source_identity(const fs::path& text_path) {
  struct stat st {};
  if (::stat(text_path.c_str(), &st) != 0) {
    throw Error(fmt::format("cannot stat '{}': {}", text_path.string(), std::strerror(errno)));
  }
  return {{"source", fs::absolute(text_path).lexically_normal().string()},
          {"size", int64_t(st.st_size)},
          {"mtime_ns", int64_t(st.st_mtim.tv_sec) * 1000000000 + int64_t(st.st_mtim.tv_nsec)}};
}

constexpr size_t kChunk = size_t(64) << 20;  // a pass over a text maps it whole but keeps this much resident

/// Calls f(code point, byte offset) for each character of the mapped text, a chunk at a time, each chunk's pages
/// released once passed (the resident set does not grow with the file); validates as decode_utf8.
template <class F>
void for_each_code_point_of(const MappedFile& text, F&& f) {
  const std::string_view bytes = text.bytes();
  for (size_t i = 0; i < bytes.size();) {
    const size_t from = i, end = std::min(bytes.size(), i + kChunk);
    while (i < end) {
      const Utf8Char c = decode_utf8_at(bytes, i);
      if (c.len == 0) utf8_error(bytes, i, c.why);
      f(c.cp, i);
      i += size_t(c.len);
    }
    text.release(from, i - from);
  }
}

MappedFile map_text(const fs::path& text_path) {
  check_text_path(text_path);
  MappedFile text(text_path);
  const std::string_view bytes = text.bytes();
  if (bytes.empty()) throw Error(fmt::format("data file '{}' is empty", text_path.string()));
  for (size_t at = 0; at < bytes.size(); at += kChunk) {
    const size_t n = std::min(kChunk, bytes.size() - at);
    if (const size_t nul = bytes.substr(at, n).find('\0'); nul != std::string_view::npos) {
      throw Error(fmt::format("'{}' looks like a binary file (a NUL byte at offset {}); tinygpt trains on UTF-8 text",
                              text_path.string(), at + nul));
    }
    text.release(at, n);
  }
  return text;
}

/// Calls emit(ids) with the ids of every character of the text, a chunk at a time, through a code point -> id table.
template <class Emit>
void encode_text(const MappedFile& text, const std::vector<int32_t>& table, const fs::path& text_path, Emit&& emit) {
  std::vector<Token> ids;
  for_each_code_point_of(text, [&](char32_t c, size_t offset) {
    const int32_t id = table[size_t(c)];
    if (id < 0) {
      throw Error(fmt::format("'{}': character '{}' (U+{:04X}) at byte offset {} is not in the model's vocabulary",
                              text_path.string(), encode_utf8(std::u32string(1, c)), uint32_t(c), offset));
    }
    ids.push_back(Token(id));
    if (ids.size() == kChunk / sizeof(Token)) {
      emit(ids);
      ids.clear();
    }
  });
  if (!ids.empty()) emit(ids);
}

std::vector<int32_t> id_table(const CharVocab& vocab) {
  std::vector<int32_t> table(0x110000, -1);
  for (size_t i = 0; i < vocab.chars().size(); ++i) table[size_t(vocab.chars()[i])] = int32_t(i);
  return table;
}

/// The cache's header and ids, when the file is a well-formed cache of `identity`.
std::optional<Corpus> read_cache(const fs::path& cache_path, const nlohmann::json& identity) {
  std::error_code ec;
  if (!fs::is_regular_file(cache_path, ec)) return std::nullopt;
  MappedFile file(cache_path);
  const std::string_view b = file.bytes();
  if (b.size() < 16 || std::memcmp(b.data(), kMagic, 8) != 0) return std::nullopt;
  uint64_t header_len = 0;
  std::memcpy(&header_len, b.data() + 8, 8);
  if (header_len > kMaxHeader || 16 + header_len > b.size()) return std::nullopt;
  const auto header = nlohmann::json::parse(b.substr(16, header_len), nullptr, /*allow_exceptions=*/false);
  if (!header.is_object() || !header.contains("count") || !header.contains("vocab") || !header.contains("offset")) {
    return std::nullopt;
  }
  for (const auto& [key, value] : identity.items()) {
    if (!header.contains(key) || header[key] != value) return std::nullopt;
  }
  if (!header["count"].is_number_unsigned() || !header["offset"].is_number_unsigned() || !header["vocab"].is_string()) {
    return std::nullopt;
  }
  const auto count = header["count"].get<uint64_t>();
  const auto offset = header["offset"].get<uint64_t>();
  // Checked without overflow: a count near 2^64 / sizeof(Token) must not wrap into a size that matches.
  if (offset % alignof(Token) != 0 || offset < 16 + header_len || offset > b.size() ||
      count != (b.size() - offset) / sizeof(Token) || (b.size() - offset) % sizeof(Token) != 0) {
    return std::nullopt;
  }
  Corpus c;
  try {
    c.vocab = CharVocab::from_chars(decode_utf8(header["vocab"].get<std::string>()));
  } catch (const std::exception&) {  // a damaged cache is encoded again, never trusted
    return std::nullopt;
  }
  // Every id must name a character of the vocabulary (the embedding lookup trusts them).
  if (count > 0 && largest_id(cache_path, offset, count, sizeof(Token)) >= uint64_t(c.vocab.size()))
    return std::nullopt;
  c.tokens = TokenData(std::move(file), offset, count);
  c.from_cache = true;
  return c;
}

/// Writes the cache: the header (the source's identity, the vocabulary and the count), then the ids, encoded from the
/// text a chunk at a time.
void write_cache(const fs::path& cache_path, nlohmann::json header, const CharVocab& vocab, size_t count,
                 const MappedFile& text, const fs::path& text_path) {
  header["vocab"] = encode_utf8(vocab.chars());
  header["count"] = count;
  header["offset"] = 0;
  // The header's length depends on the offset's digits: fix the offset with room to spare, then pad.
  const size_t base = 16 + header.dump().size() + 32;
  const size_t offset = (base + alignof(Token) - 1) / alignof(Token) * alignof(Token);
  header["offset"] = offset;
  std::string head = header.dump();
  head.resize(offset - 16, ' ');
  const uint64_t header_len = head.size();

  detail::TempFile tmp{cache_path.string() + ".tmp"};
  {
    detail::Writer out(tmp.path);
    out.write(kMagic, 8);
    out.write(&header_len, 8);
    out.write(head.data(), head.size());
    size_t written = 0;
    encode_text(text, id_table(vocab), text_path, [&](const std::vector<Token>& ids) {
      out.write(ids.data(), ids.size() * sizeof(Token));
      written += ids.size();
    });
    if (written != count) throw Error(fmt::format("'{}' changed while it was read; run again", text_path.string()));
    out.close();
  }
  std::error_code ec;
  fs::rename(tmp.path, cache_path, ec);
  if (ec)
    throw Error(fmt::format("cannot move the token cache into place at '{}': {}", cache_path.string(), ec.message()));
  tmp.keep = true;
}

}  // namespace

MappedFile::MappedFile(const fs::path& path) {
  // O_NONBLOCK: a named pipe opens at once (and is refused below) instead of waiting for a writer forever.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw Error(fmt::format("cannot open '{}': {}", path.string(), std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(
        fmt::format("'{}' is not a regular file (a directory, pipe or device?): tinygpt reads files", path.string()));
  }
  size_ = size_t(st.st_size);
  if (size_ > 0) {
    data_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (data_ == MAP_FAILED) {
      data_ = nullptr;
      ::close(fd);
      throw Error(fmt::format("cannot map '{}' into memory: {}", path.string(), std::strerror(errno)));
    }
  }
  ::close(fd);
}

void MappedFile::release(size_t offset, size_t bytes) const {
  // Only whole pages inside the range: a page shared with the bytes around it stays.
  const auto page = size_t(::sysconf(_SC_PAGESIZE));
  const size_t begin = (offset + page - 1) / page * page, end = std::min(size_, offset + bytes) / page * page;
  if (data_ != nullptr && end > begin) ::madvise(static_cast<char*>(data_) + begin, end - begin, MADV_DONTNEED);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) ::munmap(data_, size_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

TokenData::TokenData(MappedFile file, size_t offset, size_t count, size_t id_bytes)
    : file_(std::move(file)), offset_(offset), count_(count), id_bytes_(id_bytes) {}

TokenSpan TokenData::ids() const {
  if (!owned_.empty()) return owned_;
  if (count_ == 0) return {};
  const char* p = file_.bytes().data() + offset_;
  if (id_bytes_ == 4) return std::span<const uint32_t>(reinterpret_cast<const uint32_t*>(p), count_);
  return std::span<const Token>(reinterpret_cast<const Token*>(p), count_);
}

uint32_t largest_id(const fs::path& path, uint64_t offset, uint64_t count, size_t id_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(fmt::format("cannot open '{}': {}", path.string(), std::strerror(errno)));
  std::vector<char> buf(size_t(1) << 20);
  uint32_t top = 0;
  for (uint64_t done = 0; done < count * id_bytes;) {
    const size_t want = size_t(std::min<uint64_t>(buf.size(), count * id_bytes - done));
    const ssize_t got = ::pread(fd, buf.data(), want, off_t(offset + done));
    if (got <= 0 || size_t(got) % id_bytes != 0) {
      ::close(fd);
      throw Error(fmt::format("cannot read '{}': {}", path.string(), got < 0 ? std::strerror(errno) : "cut short"));
    }
    for (size_t i = 0; i < size_t(got); i += id_bytes) {
      uint32_t id = 0;
      std::memcpy(&id, buf.data() + i, id_bytes);  // little-endian, as the caches are written
      top = std::max(top, id);
    }
    done += uint64_t(got);
  }
  ::close(fd);
  return top;
}

void TokenData::release(size_t first, size_t count) const {
  if (owned_.empty() && count_ > 0) file_.release(offset_ + first * id_bytes_, count * id_bytes_);
}

Corpus load_corpus(const fs::path& text_path, const fs::path& cache_dir) {
  const MappedFile text = map_text(text_path);
  const nlohmann::json identity = source_identity(text_path);
  const fs::path cache_path = cache_dir / "tokens.bin";
  if (auto cached = read_cache(cache_path, identity)) return std::move(*cached);

  // Pass 1: validate and collect the characters; pass 2 (write_cache): ids.
  std::vector<bool> seen(0x110000, false);
  size_t count = 0;
  for_each_code_point_of(text, [&](char32_t c, size_t) {
    seen[size_t(c)] = true;
    ++count;
  });
  std::u32string chars;
  for (char32_t c = 0; c < 0x110000; ++c) {
    if (seen[size_t(c)]) chars.push_back(c);
  }
  if (int64_t(chars.size()) > kMaxVocab) {
    throw Error(fmt::format("'{}' has {} distinct characters; token ids are 16-bit, so at most {} are supported",
                            text_path.string(), chars.size(), kMaxVocab));
  }
  CharVocab vocab = CharVocab::from_chars(std::move(chars));
  write_cache(cache_path, identity, vocab, count, text, text_path);
  auto cached = read_cache(cache_path, identity);
  if (!cached) throw Error(fmt::format("the token cache '{}' could not be read back", cache_path.string()));
  cached->from_cache = false;
  return std::move(*cached);
}

TokenData encode_file(const fs::path& text_path, const CharVocab& vocab) {
  const MappedFile text = map_text(text_path);
  std::vector<Token> all;
  encode_text(text, id_table(vocab), text_path,
              [&](const std::vector<Token>& ids) { all.insert(all.end(), ids.begin(), ids.end()); });
  return TokenData(std::move(all));
}

Split split_tokens(TokenSpan ids, double train_fraction) {
  if (!(train_fraction > 0.0 && train_fraction < 1.0)) {
    throw Error(fmt::format("the train fraction must be in (0, 1), got {}", train_fraction));
  }
  const auto n = size_t(double(ids.size()) * train_fraction);
  return {ids.first(n), ids.subspan(n)};
}

BatchSampler::BatchSampler(TokenSpan ids, int64_t batch_size, int64_t block_size, uint64_t seed, const char* what)
    : ids_(ids), batch_size_(batch_size), block_size_(block_size), gen_(seed) {
  if (int64_t(ids.size()) < block_size + 1) {
    throw Error(
        fmt::format("the {} has {} tokens, fewer than block_size + 1 = {}: use a longer text or a smaller "
                    "--block-size",
                    what, ids.size(), block_size + 1));
  }
}

BatchSampler::BatchSampler(Rows rows, int64_t batch_size, int64_t block_size, uint64_t seed, const char* what)
    : rows_(rows), batch_size_(batch_size), block_size_(block_size), gen_(seed) {
  if (rows.size() == 0) throw Error(fmt::format("the {} has no conversations", what));
}

namespace {

/// Row b of x and y: sequence `seq` from its start, its targets where the mask marks them, -1 elsewhere.
int64_t fill_row(const Rows& rows, size_t seq, int64_t b, int64_t T, std::vector<int32_t>& x, std::vector<int32_t>& y) {
  const size_t begin = rows.starts[seq], n = size_t(std::min<uint64_t>(rows.starts[seq + 1] - begin, uint64_t(T) + 1));
  int64_t targets = 0;
  for (size_t t = 0; t < size_t(T); ++t) {
    const size_t k = begin + t;
    x[size_t(b * T) + t] = t < n ? int32_t(rows.ids[k]) : 0;
    const bool target = t + 1 < n && rows.mask[k + 1] != 0;
    y[size_t(b * T) + t] = target ? int32_t(rows.ids[k + 1]) : -1;
    targets += target;
  }
  return targets;
}

}  // namespace

RowBatch row_batch(const Rows& rows, size_t first, int64_t batch_size, int64_t block_size) {
  const int64_t B = std::min<int64_t>(batch_size, int64_t(rows.size() - first)), T = block_size;
  std::vector<int32_t> x(size_t(B * T)), y(size_t(B * T));
  int64_t targets = 0;
  for (int64_t b = 0; b < B; ++b) targets += fill_row(rows, first + size_t(b), b, T, x, y);
  return {from_vector(x, {B, T}), from_vector(y, {B, T}), targets};
}

void BatchSampler::skip() {
  for (int64_t b = 0; b < batch_size_; ++b) gen_.next_u64();
}

BatchSampler::Batch BatchSampler::next() {
  const int64_t B = batch_size_, T = block_size_;
  std::vector<int32_t> x(size_t(B * T)), y(size_t(B * T));
  if (rows_.size() > 0) {
    for (int64_t b = 0; b < B; ++b) fill_row(rows_, size_t(gen_.next_u64() % rows_.size()), b, T, x, y);
    return {from_vector(x, {B, T}), from_vector(y, {B, T})};
  }
  const auto windows = uint64_t(int64_t(ids_.size()) - T);  // start positions 0 .. size - T - 1
  for (int64_t b = 0; b < B; ++b) {
    const auto start = size_t(gen_.next_u64() % windows);
    for (int64_t t = 0; t < T; ++t) {
      x[size_t(b * T + t)] = ids_[start + size_t(t)];
      y[size_t(b * T + t)] = ids_[start + size_t(t) + 1];
    }
  }
  return {from_vector(x, {B, T}), from_vector(y, {B, T})};
}

}  // namespace tinygpt::data

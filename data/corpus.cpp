#include "data/corpus.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

namespace tinygpt::data {

namespace fs = std::filesystem;

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

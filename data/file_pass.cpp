#include "data/file_pass.h"

#include <unistd.h>

#include "kernels/base.h"

namespace tinygpt::data {

namespace fs = std::filesystem;

namespace detail {

int64_t total_size(const FileList& files) {
  int64_t total = 0;
  for (const auto& f : files) {
    std::error_code ec;
    total += int64_t(fs::file_size(f, ec));
  }
  return total;
}

size_t piece_end_before(std::string_view text, size_t at) {
  const auto printable = [&](size_t i) { return uint8_t(text[i]) > 0x20 && uint8_t(text[i]) < 0x7f; };
  for (size_t p = at; p >= 2; --p) {
    if (text[p - 1] == '\n' && printable(p - 2) && printable(p)) return p;
  }
  return at;
}

Writer::Writer(fs::path path) : path_(std::move(path)), f_(std::fopen(path_.c_str(), "wb")) {
  if (f_ == nullptr) throw Error(fmt::format("cannot write '{}': {}", path_.string(), std::strerror(errno)));
}

Writer::~Writer() {
  if (f_ != nullptr) std::fclose(f_);
}

void Writer::write(const void* data, size_t bytes) {
  if (bytes > 0 && std::fwrite(data, 1, bytes, f_) != bytes) fail();
}

void Writer::write_at(uint64_t offset, const void* data, size_t bytes) {
  if (::fseeko(f_, off_t(offset), SEEK_SET) != 0) fail();
  write(data, bytes);
  if (::fseeko(f_, 0, SEEK_END) != 0) fail();
}

void Writer::append(const MappedFile& from, size_t offset, size_t bytes) {
  constexpr size_t kPart = size_t(8) << 20;
  for (size_t done = 0; done < bytes;) {
    const size_t n = std::min(kPart, bytes - done);
    write(from.bytes().data() + offset + done, n);
    from.release(offset + done, n);
    done += n;
  }
}

void Writer::flush() {
  if (std::fflush(f_) != 0) fail();
}

void Writer::close() {
  const int rc = std::fclose(f_);
  f_ = nullptr;
  if (rc != 0) fail();
}

void Writer::fail() {
  throw Error(fmt::format("cannot write '{}': {}", path_.string(), errno != 0 ? std::strerror(errno) : "write failed"));
}

// The temporary files being written, for a signal handler to remove (remove_cache_temp_files_now): fixed slots of
// plain bytes, so the handler reads them without allocating or locking.
constexpr size_t kTempSlots = 8, kTempPathMax = 4096;
char g_temp_paths[kTempSlots][kTempPathMax];
std::atomic<bool> g_temp_used[kTempSlots];

TempFile::TempFile(fs::path p) : path(std::move(p)), slot(kTempSlots) {
  const std::string& s = path.native();
  for (size_t k = 0; k < kTempSlots && slot == kTempSlots; ++k) {
    bool expected = false;
    if (s.size() < kTempPathMax && g_temp_used[k].compare_exchange_strong(expected, true)) {
      std::memcpy(g_temp_paths[k], s.c_str(), s.size() + 1);
      slot = k;
    }
  }
}

TempFile::~TempFile() {
  if (slot < kTempSlots) g_temp_used[slot] = false;
  std::error_code ec;
  if (!keep) fs::remove(path, ec);
}

}  // namespace detail

void remove_cache_temp_files_now() noexcept {
  for (size_t k = 0; k < detail::kTempSlots; ++k) {
    if (detail::g_temp_used[k].load()) ::unlink(detail::g_temp_paths[k]);
  }
}

}  // namespace tinygpt::data

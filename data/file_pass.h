// What the passes over --data's files share (data/documents.cpp, data/token_cache.cpp): a batch of files mapped at a
// time and cut into parts for the threads, a FILE that throws on any failed write, and temporary files that a signal
// handler can remove.
#pragma once

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "corpus.h"
#include "documents.h"
#include "pre_split.h"

namespace tinygpt::data::detail {

inline constexpr size_t kItemBytes = size_t(4) << 20;  // a part of a file one thread takes
/// What a pass maps at once: two parts a thread, 16 to 64 MB (the batch's ids are held until it is written).
inline size_t batch_bytes() {
  return std::clamp(size_t(omp_get_max_threads()) * 2 * kItemBytes, size_t(16) << 20, size_t(64) << 20);
}

struct Item {
  size_t file;
  std::string_view text;
  bool last;      // the file's last part
  bool first;     // the file's first part
  size_t offset;  // where the part starts in its file (error messages name byte offsets in the file)
};

int64_t total_size(const FileList& files);

/// Where a text cut at about `at` bytes ends a piece: after the last line break before `at` that lies between two
/// printable ASCII characters, else `at`.
size_t piece_end_before(std::string_view text, size_t at);

/// Calls work(item, thread) -> ids for every part of every file, in parallel over a batch of parts (batch_bytes(),
/// of one file or several), then done(item, ids) for the batch's parts in order and after_batch(), before the next
/// batch: the batch's ids are dropped and its pages released, so the resident set follows the batch, whatever the
/// files' sizes. With `limit` >= 0, only the files' first `limit` bytes (the files in order, the last one cut where a
/// piece ends). Exceptions from work are rethrown after the batch.
template <class Work, class Done>
void over_files(const FileList& files, Progress& progress, Work&& work, Done&& done,
                const std::function<void()>& after_batch = {}, int64_t limit = -1) {
  std::vector<std::shared_ptr<const MappedFile>> maps;  // items[i]'s file is maps[i]
  std::vector<Item> items;
  std::vector<std::vector<uint32_t>> results;
  size_t bytes = 0;
  const size_t batch = batch_bytes();
  const auto run = [&] {
    std::exception_ptr failed;
    results.assign(items.size(), {});
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = 0; i < items.size(); ++i) {
      try {
        results[i] = work(items[i], omp_get_thread_num());
      } catch (...) {
#pragma omp critical
        if (!failed) failed = std::current_exception();
      }
    }
    if (failed) std::rethrow_exception(failed);
    for (size_t i = 0; i < items.size(); ++i) {
      done(items[i], results[i]);
      std::vector<uint32_t>().swap(results[i]);
      progress.add(int64_t(items[i].text.size()));
      maps[i]->release(size_t(items[i].text.data() - maps[i]->bytes().data()), items[i].text.size());
    }
    items.clear();
    maps.clear();
    bytes = 0;
    if (after_batch) after_batch();
  };
  for (size_t f = 0; f < files.size() && limit != 0; ++f) {
    const auto map = std::make_shared<const MappedFile>(files[f]);
    std::string_view text = map->bytes();
    if (limit >= 0) {
      if (int64_t(text.size()) > limit) text = text.substr(0, piece_end_before(text, size_t(limit)));
      limit -= int64_t(text.size());
    }
    const std::vector<size_t> cuts = cut_points(text, kItemBytes);
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      items.push_back({f, text.substr(cuts[c], cuts[c + 1] - cuts[c]), c + 2 == cuts.size(), c == 0, cuts[c]});
      maps.push_back(map);
      bytes += items.back().text.size();
      if (bytes >= batch) run();
    }
  }
  if (!items.empty()) run();
}

/// A FILE that throws naming the path on any failed write.
class Writer {
 public:
  explicit Writer(std::filesystem::path path);
  ~Writer();
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;
  void write(const void* data, size_t bytes);
  /// Writes `bytes` at byte `offset` of the file (before what has been written), then goes back to its end.
  void write_at(uint64_t offset, const void* data, size_t bytes);
  /// Appends `bytes` bytes of a mapped file from `offset`, a few MB at a time, each part's pages released once written
  /// (the copy does not grow the resident set).
  void append(const MappedFile& from, size_t offset, size_t bytes);
  /// Hands what is buffered to the kernel (a map of the file then sees it).
  void flush();
  void close();
  const std::filesystem::path& path() const { return path_; }

 private:
  [[noreturn]] void fail();
  std::filesystem::path path_;
  std::FILE* f_;
};

/// Removes a temporary file when the scope is left while `keep` is false, or when a signal ends the program meanwhile
/// (remove_cache_temp_files_now).
struct TempFile {
  explicit TempFile(std::filesystem::path p);
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile();
  std::filesystem::path path;
  bool keep = false;
  size_t slot;  // its slot in the registry the signal handler reads (none: kTempSlots)
};

}  // namespace tinygpt::data::detail

#include "data/documents.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <glob.h>
#include <omp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <unordered_map>

#include "data/file_pass.h"
#include "kernels/base.h"

namespace tinygpt::data {

namespace fs = std::filesystem;

namespace {

/// Paths in the order of their bytes (as `LC_ALL=C sort` orders them), not component by component.
bool by_bytes(const std::string& a, const std::string& b) { return a < b; }

bool hidden(const fs::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name[0] == '.';
}

/// Whether a directory is a tinygpt run (its lock or a checkpoint in it; train/run_dir.h and train/checkpoint.h name
/// them): a walk never takes a run's own files (metrics, tokenizer, lock) as training text.
bool is_run_directory(const fs::path& dir) {
  std::error_code ec;
  for (const char* marker : {"train.lock", "ckpt_latest.safetensors", "ckpt_best.safetensors"}) {
    if (fs::exists(dir / marker, ec)) return true;
  }
  return false;
}

/// Why a file found in a directory is not text, or "" when it is.
std::string not_text(const fs::path& p, uintmax_t size) {
  if (size == 0) return "empty";
  char buf[8192];
  const int fd = ::open(p.c_str(), O_RDONLY | O_NONBLOCK);
  if (fd < 0) return fmt::format("unreadable ({})", std::strerror(errno));
  const ssize_t n = ::read(fd, buf, sizeof buf);
  ::close(fd);
  if (n < 0) return "unreadable";
  if (std::memchr(buf, 0, size_t(n)) != nullptr) return "binary (a NUL byte)";
  return "";
}

void require_regular(const fs::path& p, const std::string& arg) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) {
    throw Error(fmt::format("--data '{}': cannot read '{}': {}", arg, p.string(), std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    throw Error(
        fmt::format("--data '{}': '{}' is not a regular file (a pipe, socket or device); give text files or "
                    "directories",
                    arg, p.string()));
  }
}

}  // namespace

FileList list_text_files(const std::vector<std::string>& args, const Note& note) {
  FileList files;
  // Each file once: the hashes of the absolute paths taken, and on a hash met before, the paths compared (8 bytes a
  // file beside the list itself, which a corpus of a million files holds in about 100 MB).
  std::unordered_multimap<size_t, size_t> seen;  // hash of the absolute path -> index in files
  const auto take = [&](std::string p) {
    const std::string key = fs::absolute(p).lexically_normal().string();
    const size_t h = std::hash<std::string>{}(key);
    for (auto [it, end] = seen.equal_range(h); it != end; ++it) {
      if (fs::absolute(files[it->second]).lexically_normal().string() == key) return;
    }
    seen.emplace(h, files.size());
    files.push_back(std::move(p));
  };
  for (const std::string& arg : args) {
    std::error_code ec;
    const fs::path p(arg);
    if (fs::is_directory(p, ec)) {
      FileList found;
      size_t skipped = 0;
      for (auto it = fs::recursive_directory_iterator(p, fs::directory_options::skip_permission_denied, ec);
           !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (hidden(it->path())) {
          if (it->is_directory(ec)) it.disable_recursion_pending();
          continue;
        }
        if (it->is_directory(ec) && is_run_directory(it->path())) {
          note(fmt::format("skipping {}: a tinygpt run directory", it->path().string()));
          it.disable_recursion_pending();
          continue;
        }
        if (!it->is_regular_file(ec)) continue;
        const std::string why = not_text(it->path(), it->file_size(ec));
        if (!why.empty()) {
          if (++skipped <= 20) note(fmt::format("skipping {}: {}", it->path().string(), why));
          continue;
        }
        found.push_back(it->path().string());
      }
      if (ec) throw Error(fmt::format("--data '{}': cannot walk the directory: {}", arg, ec.message()));
      if (skipped > 20) note(fmt::format("skipped {} more files in {} that are not text", skipped - 20, arg));
      std::sort(found.begin(), found.end(), by_bytes);
      if (found.empty()) throw Error(fmt::format("--data '{}': the directory holds no text files", arg));
      for (auto& f : found) take(std::move(f));
    } else if (fs::exists(p, ec)) {
      require_regular(p, arg);
      if (fs::file_size(p, ec) == 0) throw Error(fmt::format("data file '{}' is empty", arg));
      take(arg);
    } else {
      glob_t g{};
      const int rc = ::glob(arg.c_str(), GLOB_ERR, nullptr, &g);
      FileList matched;
      for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) matched.emplace_back(g.gl_pathv[i]);
      ::globfree(&g);
      if (matched.empty()) {
        throw Error(
            fmt::format("--data '{}' does not exist (no file or directory, and no file matches it as a pattern)", arg));
      }
      std::sort(matched.begin(), matched.end(), by_bytes);
      for (auto& m : matched) {
        if (fs::is_directory(m, ec)) continue;
        require_regular(m, arg);
        take(m);
      }
    }
  }
  if (files.empty()) throw Error("--data names no text file");
  return files;
}

// --- progress ---

Progress::Progress(std::string label, int64_t total, bool quiet)
    : label_(std::move(label)),
      total_(total),
      quiet_(quiet),
      tty_(::isatty(2) != 0),
      start_(std::chrono::steady_clock::now()),
      drawn_(start_) {}

void Progress::add(int64_t bytes) {
  done_ += bytes;
  if (quiet_ || !tty_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - drawn_ < std::chrono::milliseconds(500)) return;
  drawn_ = now;
  draw(false);
}

void Progress::draw(bool last) {
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double rate = secs > 0 ? double(done_) / secs : 0;
  if (last) {
    fmt::print(stderr, "{}{}: {:.1f} MB in {:.1f}s ({:.1f} MB/s)", tty_ ? "\r\033[K" : "", label_, double(done_) / 1e6,
               secs, rate / 1e6);
    return;
  }
  const double frac = total_ > 0 ? double(done_) / double(total_) : 0;
  const int width = 24, full = int(frac * width);
  const double eta = rate > 0 ? double(total_ - done_) / rate : 0;
  fmt::print(stderr, "\r\033[K{}: [{}{}] {:3.0f}% {:.1f}/{:.1f} MB, {:.1f} MB/s, {:.0f}s left", label_,
             std::string(size_t(full), '#'), std::string(size_t(width - full), '.'), frac * 100, double(done_) / 1e6,
             double(total_) / 1e6, rate / 1e6, eta);
}

void Progress::finish(const std::string& detail) {
  if (quiet_) return;
  draw(true);
  fmt::print(stderr, "{}\n", detail);
}

PieceCounts count_pieces(const FileList& files, bool quiet, int64_t max_bytes) {
  // Each thread counts its parts of a batch of files; after the batch their counts join the total, which drops its
  // rarest pieces when it holds more than kMaxPieces (so memory follows the batch and the bound, not the corpus; the
  // batches are the same on every run, so the result is too).
  std::vector<PieceCounts> counts(static_cast<size_t>(omp_get_max_threads()));
  PieceCounts total;
  Progress progress("counting pieces", max_bytes >= 0 ? max_bytes : detail::total_size(files), quiet);
  detail::over_files(
      files, progress,
      [&](const detail::Item& it, int thread) {
        counts[size_t(thread)].add_text(it.text);
        return std::vector<uint32_t>();
      },
      [](const detail::Item&, std::vector<uint32_t>&) {},
      [&] {
        for (PieceCounts& c : counts) {
          total.merge(c);
          c = PieceCounts();
        }
        total.prune(kMaxPieces);
      },
      max_bytes);
  progress.finish(fmt::format(
      ", {} distinct pieces{}", total.unique(),
      total.pruned_below() > 0
          ? fmt::format(" (more than {} seen: {} of the rarest, seen at most {}, dropped)", kMaxPieces, total.dropped(),
                        total.pruned_below() == 1 ? std::string("once") : fmt::format("{} times", total.pruned_below()))
          : ""));
  return total;
}

CharVocab vocab_of_files(const FileList& files, const std::string& extra) {
  std::vector<bool> seen(0x110000, false);
  for (const auto& f : files) {
    const MappedFile map(f);
    if (const size_t nul = map.bytes().find('\0'); nul != std::string_view::npos) {
      throw Error(fmt::format(
          "'{}' looks like a binary file (a NUL byte at offset {}); a character model trains on UTF-8 text", f, nul));
    }
    try {
      for_each_code_point(map.bytes(), [&](char32_t c) { seen[size_t(c)] = true; });
    } catch (const Error& e) {
      throw Error(
          fmt::format("'{}': {}; a character model needs UTF-8 text (--tokenizer bpe takes any bytes)", f, e.what()));
    }
  }
  for_each_code_point(extra, [&](char32_t c) { seen[size_t(c)] = true; });
  std::u32string chars;
  for (char32_t c = 0; c < 0x110000; ++c) {
    if (seen[size_t(c)]) chars.push_back(c);
  }
  if (int64_t(chars.size()) > kMaxVocab) {
    throw Error(
        fmt::format("the data has {} distinct characters, more than {}: use --tokenizer bpe", chars.size(), kMaxVocab));
  }
  return CharVocab::from_chars(std::move(chars));
}

std::vector<bool> held_out_documents(size_t n, double train_fraction) {
  const double v = 1.0 - train_fraction;
  std::vector<bool> held_out(n, false);
  const double held = std::floor(double(n) * v + 0.5);
  if (held < 1 || held >= double(n)) return held_out;  // none to hold out, or none left to train: split by position
  // Evenly spread: document i is held out when round((i + 1) v) passes round(i v).
  for (size_t i = 0; i < n; ++i) held_out[i] = std::floor(double(i + 1) * v + 0.5) > std::floor(double(i) * v + 0.5);
  return held_out;
}

BpeTokenizer read_tokenizer_file(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    throw Error(fmt::format("tokenizer '{}' {}", path.string(),
                            fs::exists(path, ec)
                                ? "is not a regular file"
                                : "does not exist (--tokenizer takes char, bpe or a tokenizer.json file)"));
  }
  if (fs::file_size(path, ec) > (uintmax_t(1) << 30))
    throw Error(fmt::format("tokenizer '{}' is over 1 GiB", path.string()));
  const MappedFile map(path);
  return BpeTokenizer::from_json(map.bytes(), path.string());
}

using detail::TempFile;
using detail::Writer;

int64_t write_document_ids(const FileList& files, const Tokenizer& tok, const fs::path& out_path, bool quiet) {
  TempFile tmp{out_path.string() + ".tmp"};
  Writer out(tmp.path);
  Progress progress(fmt::format("encoding {} file{}", files.size(), files.size() == 1 ? "" : "s"),
                    detail::total_size(files), quiet);
  std::vector<BpeTokenizer::Cache> caches(static_cast<size_t>(omp_get_max_threads()));
  int64_t written = 0;
  const int32_t eot = tok.end_of_text();
  const std::vector<uint32_t> prefix = tok.document_prefix();
  static_assert(std::endian::native == std::endian::little, "ids are written little-endian");
  detail::over_files(
      files, progress,
      [&](const detail::Item& it, int thread) {
        std::vector<uint32_t> ids;
        tok.encode(it.text, ids, files[it.file], &caches[size_t(thread)], it.offset);
        return ids;
      },
      [&](const detail::Item& it, std::vector<uint32_t>& ids) {
        if (it.first) ids.insert(ids.begin(), prefix.begin(), prefix.end());
        if (it.last && eot >= 0) ids.push_back(uint32_t(eot));
        out.write(ids.data(), ids.size() * sizeof(uint32_t));
        written += int64_t(ids.size());
      });
  out.close();
  std::error_code ec;
  fs::rename(tmp.path, out_path, ec);
  if (ec) throw Error(fmt::format("cannot move '{}' into place: {}", out_path.string(), ec.message()));
  tmp.keep = true;
  progress.finish(fmt::format(", {} ids", written));
  return written;
}

}  // namespace tinygpt::data

#include "data/documents.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <glob.h>
#include <omp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <bit>
#include <map>
#include <optional>
#include <set>

#include "kernels/base.h"

namespace tinygpt::data {

namespace fs = std::filesystem;

namespace {

/// Paths in the order of their bytes (as `LC_ALL=C sort` orders them), not component by component.
bool by_bytes(const fs::path& a, const fs::path& b) { return a.native() < b.native(); }

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
  struct stat st{};
  if (::stat(p.c_str(), &st) != 0) {
    throw Error(fmt::format("--data '{}': cannot read '{}': {}", arg, p.string(), std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    throw Error(fmt::format("--data '{}': '{}' is not a regular file (a pipe, socket or device); give text files or "
                            "directories",
                            arg, p.string()));
  }
}

}  // namespace

std::vector<fs::path> list_text_files(const std::vector<std::string>& args, const Note& note) {
  std::vector<fs::path> files;
  std::set<fs::path> seen;
  const auto take = [&](const fs::path& p) {
    if (seen.insert(fs::absolute(p).lexically_normal()).second) files.push_back(p);
  };
  for (const std::string& arg : args) {
    std::error_code ec;
    const fs::path p(arg);
    if (fs::is_directory(p, ec)) {
      std::vector<fs::path> found;
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
        found.push_back(it->path());
      }
      if (ec) throw Error(fmt::format("--data '{}': cannot walk the directory: {}", arg, ec.message()));
      if (skipped > 20) note(fmt::format("skipped {} more files in {} that are not text", skipped - 20, arg));
      std::sort(found.begin(), found.end(), by_bytes);
      if (found.empty()) throw Error(fmt::format("--data '{}': the directory holds no text files", arg));
      for (const auto& f : found) take(f);
    } else if (fs::exists(p, ec)) {
      require_regular(p, arg);
      if (fs::file_size(p, ec) == 0) throw Error(fmt::format("data file '{}' is empty", arg));
      take(p);
    } else {
      glob_t g{};
      const int rc = ::glob(arg.c_str(), GLOB_ERR, nullptr, &g);
      std::vector<fs::path> matched;
      for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) matched.emplace_back(g.gl_pathv[i]);
      ::globfree(&g);
      if (matched.empty()) {
        throw Error(fmt::format("--data '{}' does not exist (no file or directory, and no file matches it as a pattern)", arg));
      }
      std::sort(matched.begin(), matched.end(), by_bytes);
      for (const auto& m : matched) {
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
    : label_(std::move(label)), total_(total), quiet_(quiet), tty_(::isatty(2) != 0),
      start_(std::chrono::steady_clock::now()), drawn_(start_) {}

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
    fmt::print(stderr, "{}{}: {:.1f} MB in {:.1f}s ({:.1f} MB/s)", tty_ ? "\r\033[K" : "", label_, double(done_) / 1e6, secs,
               rate / 1e6);
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

// --- passes over the files, a batch at a time ---

namespace {

constexpr size_t kItemBytes = size_t(4) << 20;    // a part of a file one thread takes
constexpr size_t kBatchBytes = size_t(64) << 20;  // what is mapped at once

struct Item {
  size_t file;
  std::string_view text;
  bool last;  // the file's last part
  bool first;  // the file's first part
};

int64_t total_size(const std::vector<fs::path>& files) {
  int64_t total = 0;
  for (const auto& f : files) {
    std::error_code ec;
    total += int64_t(fs::file_size(f, ec));
  }
  return total;
}

/// Calls work(item, thread) -> ids for every part of every file, in parallel over a batch of files, then
/// done(item, ids) for the batch's parts in order, before the next batch is mapped. Exceptions from work are rethrown
/// after the batch.
template <class Work, class Done>
void over_files(const std::vector<fs::path>& files, Progress& progress, Work&& work, Done&& done) {
  std::vector<std::shared_ptr<MappedFile>> maps;
  std::vector<Item> items;
  std::vector<std::vector<uint32_t>> results;
  size_t bytes = 0;
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
    }
    items.clear();
    maps.clear();
    bytes = 0;
  };
  for (size_t f = 0; f < files.size(); ++f) {
    auto map = std::make_shared<MappedFile>(files[f]);
    const std::string_view text = map->bytes();
    const std::vector<size_t> cuts = cut_points(text, kItemBytes);
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      items.push_back({f, text.substr(cuts[c], cuts[c + 1] - cuts[c]), c + 2 == cuts.size(), c == 0});
    }
    maps.push_back(std::move(map));
    bytes += text.size();
    if (bytes >= kBatchBytes) run();
  }
  if (!items.empty()) run();
}

}  // namespace

PieceCounts count_pieces(const std::vector<fs::path>& files, bool quiet, int64_t max_bytes) {
  std::vector<PieceCounts> counts(static_cast<size_t>(omp_get_max_threads()));
  if (max_bytes >= 0) {  // a prefix of the files: few of them (a split by position), mapped all at once
    Progress progress("counting pieces", max_bytes, quiet);
    std::vector<MappedFile> maps;
    std::vector<std::string_view> parts;
    int64_t left = max_bytes;
    for (const auto& f : files) {
      if (left <= 0) break;
      maps.emplace_back(f);
      std::string_view text = maps.back().bytes();
      if (int64_t(text.size()) > left) {  // cut at the last line break where a piece ends, else at `left`
        size_t end = size_t(left);
        const auto printable = [&](size_t i) { return uint8_t(text[i]) > 0x20 && uint8_t(text[i]) < 0x7f; };
        for (size_t p = end; p >= 2; --p) {
          if (text[p - 1] == '\n' && printable(p - 2) && printable(p)) {
            end = p;
            break;
          }
        }
        text = text.substr(0, end);
      }
      const std::vector<size_t> cuts = cut_points(text, kItemBytes);
      for (size_t c = 0; c + 1 < cuts.size(); ++c) parts.push_back(text.substr(cuts[c], cuts[c + 1] - cuts[c]));
      left -= int64_t(text.size());
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = 0; i < parts.size(); ++i) counts[size_t(omp_get_thread_num())].add_text(parts[i]);
    for (const auto& p : parts) progress.add(int64_t(p.size()));
    for (size_t t = 1; t < counts.size(); ++t) counts[0].merge(counts[t]);
    progress.finish(fmt::format(", {} distinct pieces", counts[0].unique()));
    return std::move(counts[0]);
  }
  Progress progress("counting pieces", total_size(files), quiet);
  over_files(
      files, progress,
      [&](const Item& it, int thread) {
        counts[size_t(thread)].add_text(it.text);
        return std::vector<uint32_t>();
      },
      [](const Item&, std::vector<uint32_t>&) {});
  for (size_t t = 1; t < counts.size(); ++t) {
    counts[0].merge(counts[t]);
    counts[t] = PieceCounts();
  }
  progress.finish(fmt::format(", {} distinct pieces", counts[0].unique()));
  return std::move(counts[0]);
}

CharVocab vocab_of_files(const std::vector<fs::path>& files, const std::string& extra) {
  std::vector<bool> seen(0x110000, false);
  for (const auto& f : files) {
    const MappedFile map(f);
    try {
      for_each_code_point(map.bytes(), [&](char32_t c) { seen[size_t(c)] = true; });
    } catch (const Error& e) {
      throw Error(fmt::format("'{}': {}; a character model needs UTF-8 text (--tokenizer bpe takes any bytes)", f.string(),
                              e.what()));
    }
  }
  for_each_code_point(extra, [&](char32_t c) { seen[size_t(c)] = true; });
  std::u32string chars;
  for (char32_t c = 0; c < 0x110000; ++c) {
    if (seen[size_t(c)]) chars.push_back(c);
  }
  if (int64_t(chars.size()) > kMaxVocab) {
    throw Error(fmt::format("the data has {} distinct characters, more than {}: use --tokenizer bpe", chars.size(), kMaxVocab));
  }
  return CharVocab::from_chars(std::move(chars));
}

std::vector<bool> held_out_documents(size_t n, double train_fraction) {
  const double v = 1.0 - train_fraction;
  std::vector<bool> held_out(n, false);
  if (std::floor(double(n) * v + 0.5) < 1) return held_out;
  // Evenly spread: document i is held out when round((i + 1) v) passes round(i v).
  for (size_t i = 0; i < n; ++i) held_out[i] = std::floor(double(i + 1) * v + 0.5) > std::floor(double(i) * v + 0.5);
  return held_out;
}

BpeTokenizer read_tokenizer_file(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    throw Error(fmt::format("tokenizer '{}' {}", path.string(),
                            fs::exists(path, ec) ? "is not a regular file" : "does not exist (--tokenizer takes char, bpe or a tokenizer.json file)"));
  }
  if (fs::file_size(path, ec) > (uintmax_t(1) << 30)) throw Error(fmt::format("tokenizer '{}' is over 1 GiB", path.string()));
  const MappedFile map(path);
  return BpeTokenizer::from_json(map.bytes(), path.string());
}

// --- the token cache ---

namespace {

constexpr char kMagic[8] = {'T', 'G', 'D', 'O', 'C', 'S', '0', '1'};
constexpr uint64_t kMaxHeader = uint64_t(1) << 28;

nlohmann::json identity(const fs::path& p) {
  struct stat st{};
  if (::stat(p.c_str(), &st) != 0) throw Error(fmt::format("cannot stat '{}': {}", p.string(), std::strerror(errno)));
  return {{"source", fs::absolute(p).lexically_normal().string()},
          {"size", int64_t(st.st_size)},
          {"mtime_ns", int64_t(st.st_mtim.tv_sec) * 1000000000 + int64_t(st.st_mtim.tv_nsec)}};
}

std::string fingerprint(const Tokenizer& tok, const std::vector<uint32_t>& separator) {
  std::string s = tok.is_bpe() ? tok.bpe().to_json() : encode_utf8(tok.chars().chars());
  for (const uint32_t id : separator) s += fmt::format(",{}", id);
  return fmt::format("{}:{:016x}", tok.kind(), std::hash<std::string>{}(s));
}

/// A previous cache: its header, and its mapped bytes, when the file is well formed.
struct OldCache {
  MappedFile file;
  nlohmann::json header;
  size_t data_offset = 0;
  size_t id_bytes = 2;  // the header's "id_bytes": 2, or 4 for a vocabulary over 65,536
};

/// The bytes an id of `tok` takes in the cache.
size_t id_bytes_of(const Tokenizer& tok) { return tok.vocab_size() > kMaxVocab ? 4 : 2; }

std::optional<OldCache> read_old(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return std::nullopt;
  OldCache c{MappedFile(path), {}, 0, 2};
  const std::string_view b = c.file.bytes();
  if (b.size() < 16 || std::memcmp(b.data(), kMagic, 8) != 0) return std::nullopt;
  uint64_t len = 0;
  std::memcpy(&len, b.data() + 8, 8);
  if (len > kMaxHeader || len > b.size() - 16) return std::nullopt;
  c.header = nlohmann::json::parse(b.substr(16, len), nullptr, false);
  const auto& h = c.header;
  if (!h.is_object() || !h.contains("documents") || !h["documents"].is_array() || !h.contains("count") ||
      !h["count"].is_number_unsigned() || !h.contains("train_count") || !h["train_count"].is_number_unsigned() ||
      !h.contains("tokenizer") || !h.contains("held_out")) {
    return std::nullopt;
  }
  c.data_offset = 16 + size_t(len);
  const nlohmann::json width = h.value("id_bytes", nlohmann::json(2));
  if (width != 2 && width != 4) return std::nullopt;
  c.id_bytes = width.get<size_t>();
  const uint64_t count = h["count"].get<uint64_t>();
  if (c.data_offset % c.id_bytes != 0 || count > (b.size() - c.data_offset) / c.id_bytes ||
      c.data_offset + count * c.id_bytes != b.size() || h["train_count"].get<uint64_t>() > count) {
    return std::nullopt;
  }
  uint64_t sum = 0;
  for (const auto& d : h["documents"]) {
    if (!d.is_object() || !d.contains("offset") || !d["offset"].is_number_unsigned() || !d.contains("count") ||
        !d["count"].is_number_unsigned()) {
      return std::nullopt;
    }
    const uint64_t off = d["offset"].get<uint64_t>(), n = d["count"].get<uint64_t>();
    if (off > count || n > count - off) return std::nullopt;
    sum += n;
  }
  if (sum != count) return std::nullopt;
  return c;
}

/// Whether every id of an old cache names a token of a vocabulary of `vocab` (the embedding lookup trusts them).
/// The ids an old cache holds.
TokenSpan ids_of(const OldCache& c) {
  const char* p = c.file.bytes().data() + c.data_offset;
  const size_t count = c.header["count"].get<size_t>();
  if (c.id_bytes == 4) return std::span<const uint32_t>(reinterpret_cast<const uint32_t*>(p), count);
  return std::span<const Token>(reinterpret_cast<const Token*>(p), count);
}

bool ids_in_vocabulary(const OldCache& c, size_t vocab) {
  uint32_t top = 0;
  for (const uint32_t id : ids_of(c)) top = std::max(top, id);
  return c.header["count"].get<size_t>() == 0 || size_t(top) < vocab;
}

/// A FILE that throws naming the path on any failed write.
class Writer {
 public:
  explicit Writer(fs::path path) : path_(std::move(path)), f_(std::fopen(path_.c_str(), "wb")) {
    if (f_ == nullptr) throw Error(fmt::format("cannot write '{}': {}", path_.string(), std::strerror(errno)));
  }
  ~Writer() {
    if (f_ != nullptr) std::fclose(f_);
  }
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;
  void write(const void* data, size_t bytes) {
    if (bytes > 0 && std::fwrite(data, 1, bytes, f_) != bytes) fail();
  }
  void close() {
    const int rc = std::fclose(f_);
    f_ = nullptr;
    if (rc != 0) fail();
  }
  const fs::path& path() const { return path_; }

 private:
  [[noreturn]] void fail() {
    throw Error(fmt::format("cannot write '{}': {}", path_.string(), errno != 0 ? std::strerror(errno) : "write failed"));
  }
  fs::path path_;
  std::FILE* f_;
};

// The temporary files being written, for a signal handler to remove (remove_cache_temp_files_now): fixed slots of
// plain bytes, so the handler reads them without allocating or locking.
constexpr size_t kTempSlots = 8, kTempPathMax = 4096;
char g_temp_paths[kTempSlots][kTempPathMax];
std::atomic<bool> g_temp_used[kTempSlots];

/// Removes a temporary file when the scope is left before release(), or when a signal ends the program meanwhile.
struct TempFile {
  explicit TempFile(fs::path p) : path(std::move(p)) {
    const std::string& s = path.native();
    for (size_t k = 0; k < kTempSlots && slot == kTempSlots; ++k) {
      bool expected = false;
      if (s.size() < kTempPathMax && g_temp_used[k].compare_exchange_strong(expected, true)) {
        std::memcpy(g_temp_paths[k], s.c_str(), s.size() + 1);
        slot = k;
      }
    }
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (slot < kTempSlots) g_temp_used[slot] = false;
    std::error_code ec;
    if (!keep) fs::remove(path, ec);
  }
  fs::path path;
  bool keep = false;
  size_t slot = kTempSlots;  // its slot in g_temp_paths (none: kTempSlots)
};

void copy_file_into(Writer& out, const fs::path& from) {
  const MappedFile m(from);
  out.write(m.bytes().data(), m.bytes().size());
}

/// Encodes files to_encode (the documents to_encode_index of `files`), each followed by the separator, into `path` in
/// list order, on the OpenMP threads: each document's count and offset there (count 0 before).
void encode_documents(const std::vector<fs::path>& files, const std::vector<fs::path>& to_encode,
                      const std::vector<size_t>& to_encode_index, const Tokenizer& tok,
                      const std::vector<uint32_t>& separator, const fs::path& path, std::vector<uint64_t>& doc_count,
                      std::vector<uint64_t>& new_offset, bool quiet) {
  std::vector<Token> buf;
  const bool wide = id_bytes_of(tok) == 4;
  const std::vector<uint32_t> prefix = tok.document_prefix();
  Writer new_out(path);
  Progress progress(fmt::format("tokenizing {} file{}", to_encode.size(), to_encode.size() == 1 ? "" : "s"),
                    total_size(to_encode), quiet || to_encode.empty());
  std::vector<BpeTokenizer::Cache> caches(static_cast<size_t>(omp_get_max_threads()));
  uint64_t written = 0;
  over_files(
      to_encode, progress,
      [&](const Item& it, int thread) {
        std::vector<uint32_t> ids;
        tok.encode(it.text, ids, files[to_encode_index[it.file]].string(), &caches[size_t(thread)]);
        return ids;
      },
      [&](const Item& it, std::vector<uint32_t>& ids) {
        const size_t doc = to_encode_index[it.file];
        if (doc_count[doc] == 0) {
          new_offset[doc] = written;
          ids.insert(ids.begin(), prefix.begin(), prefix.end());
        }
        if (it.last) ids.insert(ids.end(), separator.begin(), separator.end());
        if (wide) {
          new_out.write(ids.data(), ids.size() * sizeof(uint32_t));
        } else {
          buf.assign(ids.begin(), ids.end());
          new_out.write(buf.data(), buf.size() * sizeof(Token));
        }
        doc_count[doc] += ids.size();
        written += ids.size();
      });
  new_out.close();
  progress.finish(to_encode.empty() ? "" : fmt::format(", {} tokens", written));
}

/// What the old cache holds under this tokenizer: the whole corpus when no document changed (returned, the cache
/// handed over), else, in old_ids, the ids of each document it holds by its identity.
std::optional<DocumentCorpus> reuse_cache(std::optional<OldCache>& old, const nlohmann::json& docs,
                                          const std::vector<bool>& held_out, bool by_documents, double train_fraction,
                                          const std::string& print,
                                          std::map<std::string, std::pair<uint64_t, uint64_t>>& old_ids) {
  const size_t n = held_out.size();
  if (old && old->header["tokenizer"] == print) {
    const auto& h = old->header;
    bool same = h["held_out"] == by_documents && h["documents"].size() == n && h.value("train_fraction", -1.0) == train_fraction;
    for (size_t i = 0; same && i < n; ++i) {
      for (const char* key : {"source", "size", "mtime_ns"}) same = same && h["documents"][i].value(key, nlohmann::json()) == docs[i][key];
    }
    if (same) {
      DocumentCorpus c;
      c.documents = int64_t(n);
      c.held_out_documents = by_documents ? int64_t(std::count(held_out.begin(), held_out.end(), true)) : 0;
      c.train_count = h["train_count"].get<size_t>();
      c.reused = int64_t(n);
      const size_t count = h["count"].get<size_t>(), offset = old->data_offset;
      c.tokens = TokenData(std::move(old->file), offset, count, old->id_bytes);
      return c;
    }
    for (const auto& d : h["documents"]) {
      nlohmann::json key = {{"source", d.value("source", "")}, {"size", d.value("size", int64_t(-1))},
                            {"mtime_ns", d.value("mtime_ns", int64_t(-1))}};
      old_ids[key.dump()] = {d["offset"].get<uint64_t>(), d["count"].get<uint64_t>()};
    }
  }
  return std::nullopt;
}

/// The cache file: a header (the tokenizer's fingerprint, each document's place in the joined ids, train documents
/// first) and the train then the held-out ids, written beside cache_path and renamed into place. Returns the train
/// ids' count and the total.
std::pair<uint64_t, uint64_t> write_cache(const fs::path& cache_path, nlohmann::json& docs,
                                          const std::vector<uint64_t>& doc_count, const std::vector<bool>& held_out,
                                          bool by_documents, double train_fraction, const std::string& print,
                                          size_t id_bytes, const fs::path& train_ids, const fs::path& val_ids) {
  const size_t n = doc_count.size();
  uint64_t train_count = 0, total = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!held_out[i]) train_count += doc_count[i];
    total += doc_count[i];
  }
  uint64_t at_train = 0, at_val = train_count;
  for (size_t i = 0; i < n; ++i) {
    uint64_t& at = held_out[i] ? at_val : at_train;
    docs[i]["offset"] = at;
    docs[i]["count"] = doc_count[i];
    at += doc_count[i];
  }
  if (!by_documents) train_count = uint64_t(double(total) * train_fraction);
  nlohmann::json header = {{"tokenizer", print}, {"held_out", by_documents}, {"train_fraction", train_fraction},
                           {"count", total}, {"train_count", train_count}, {"documents", docs}};
  if (id_bytes != 2) header["id_bytes"] = id_bytes;
  std::string text = header.dump();
  text.resize((16 + text.size() + 3) / 4 * 4 - 16, ' ');  // the ids start 4-byte aligned
  const uint64_t len = text.size();
  TempFile out_tmp{cache_path.string() + ".tmp"};
  {
    Writer out(out_tmp.path);
    out.write(kMagic, 8);
    out.write(&len, 8);
    out.write(text.data(), text.size());
    copy_file_into(out, train_ids);
    copy_file_into(out, val_ids);
    out.close();
  }
  std::error_code ec;
  fs::rename(out_tmp.path, cache_path, ec);
  if (ec) throw Error(fmt::format("cannot move the token cache into place at '{}': {}", cache_path.string(), ec.message()));
  out_tmp.keep = true;

  return {train_count, total};
}

}  // namespace

DocumentCorpus load_documents(const std::vector<fs::path>& files, const Tokenizer& tok, const std::vector<uint32_t>& separator,
                              double train_fraction, const fs::path& cache_path, bool quiet) {
  if (!(train_fraction > 0 && train_fraction < 1)) {
    throw Error(fmt::format("the train fraction must be in (0, 1), got {}", train_fraction));
  }
  const size_t n = files.size();
  const std::vector<bool> held_out = held_out_documents(n, train_fraction);
  const bool by_documents = std::find(held_out.begin(), held_out.end(), true) != held_out.end();
  nlohmann::json docs = nlohmann::json::array();
  for (const auto& f : files) docs.push_back(identity(f));
  const std::string print = fingerprint(tok, separator);

  // Reuse what the old cache holds under this tokenizer: all of it, or the unchanged documents' ids.
  std::optional<OldCache> old = read_old(cache_path);
  if (old && (old->id_bytes != id_bytes_of(tok) || !ids_in_vocabulary(*old, size_t(tok.vocab_size())))) {
    old.reset();  // damaged, or of another width: encoded again
  }
  std::map<std::string, std::pair<uint64_t, uint64_t>> old_ids;  // identity -> (offset, count)
  if (std::optional<DocumentCorpus> whole = reuse_cache(old, docs, held_out, by_documents, train_fraction, print, old_ids)) {
    return std::move(*whole);
  }

  // Encode (or copy) each document into one of two temporary files, train and held out, then join them.
  TempFile train_tmp{cache_path.string() + ".train.tmp"}, val_tmp{cache_path.string() + ".val.tmp"};
  Writer train_out(train_tmp.path), val_out(val_tmp.path);
  std::vector<uint64_t> doc_count(n, 0);
  std::vector<bool> encoded(n, true);
  const size_t w = id_bytes_of(tok);
  const char* old_bytes = old ? old->file.bytes().data() + old->data_offset : nullptr;
  std::vector<fs::path> to_encode;
  std::vector<size_t> to_encode_index;
  for (size_t i = 0; i < n; ++i) {
    if (const auto it = old_ids.find(docs[i].dump()); it != old_ids.end()) {
      encoded[i] = false;
      continue;
    }
    to_encode.push_back(files[i]);
    to_encode_index.push_back(i);
  }
  // Pass 1: encode the changed and new documents into a scratch file of their own, in list order.
  TempFile new_tmp{cache_path.string() + ".new.tmp"};
  std::vector<uint64_t> new_offset(n, 0);
  encode_documents(files, to_encode, to_encode_index, tok, separator, new_tmp.path, doc_count, new_offset, quiet);
  // Pass 2: every document's ids, new or reused, to the train or held-out file.
  {
    const MappedFile fresh(new_tmp.path);
    const char* fresh_ids = fresh.bytes().data();
    for (size_t i = 0; i < n; ++i) {
      Writer& out = held_out[i] ? val_out : train_out;
      if (encoded[i]) {
        out.write(fresh_ids + new_offset[i] * w, doc_count[i] * w);
      } else {
        const auto [off, cnt] = old_ids.at(docs[i].dump());
        out.write(old_bytes + off * w, cnt * w);
        doc_count[i] = cnt;
      }
    }
  }
  train_out.close();
  val_out.close();
  old.reset();

  const auto [train_count, total] = write_cache(cache_path, docs, doc_count, held_out, by_documents, train_fraction,
                                                print, w, train_tmp.path, val_tmp.path);

  auto fresh = read_old(cache_path);
  if (!fresh) throw Error(fmt::format("the token cache '{}' could not be read back", cache_path.string()));
  DocumentCorpus c;
  c.documents = int64_t(n);
  c.held_out_documents = by_documents ? int64_t(std::count(held_out.begin(), held_out.end(), true)) : 0;
  c.train_count = size_t(train_count);
  c.encoded = int64_t(to_encode.size());
  c.reused = int64_t(n) - c.encoded;
  const size_t offset = fresh->data_offset;
  c.tokens = TokenData(std::move(fresh->file), offset, size_t(total), fresh->id_bytes);
  return c;
}

int64_t write_document_ids(const std::vector<fs::path>& files, const Tokenizer& tok, const fs::path& out_path, bool quiet) {
  TempFile tmp{out_path.string() + ".tmp"};
  Writer out(tmp.path);
  Progress progress(fmt::format("encoding {} file{}", files.size(), files.size() == 1 ? "" : "s"), total_size(files), quiet);
  std::vector<BpeTokenizer::Cache> caches(static_cast<size_t>(omp_get_max_threads()));
  int64_t written = 0;
  const int32_t eot = tok.end_of_text();
  const std::vector<uint32_t> prefix = tok.document_prefix();
  static_assert(std::endian::native == std::endian::little, "ids are written little-endian");
  over_files(
      files, progress,
      [&](const Item& it, int thread) {
        std::vector<uint32_t> ids;
        tok.encode(it.text, ids, files[it.file].string(), &caches[size_t(thread)]);
        return ids;
      },
      [&](const Item& it, std::vector<uint32_t>& ids) {
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

void remove_cache_temp_files_now() noexcept {
  for (size_t k = 0; k < kTempSlots; ++k) {
    if (g_temp_used[k].load()) ::unlink(g_temp_paths[k]);
  }
}

}  // namespace tinygpt::data

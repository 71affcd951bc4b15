// The token cache of a corpus of documents (load_documents): one file, tokens.bin, that later runs map without
// reading it through. Its layout, all little-endian:
//
//   "TGDOCS02" | u64 header bytes | JSON header, padded | N document records of 48 bytes | paths | pad to 8 | ids
//
// The JSON header is small whatever the corpus: the tokenizer's fingerprint, the split, the counts and the source
// bytes of each side (for bits per byte). Each record is a document's place in the ids, its identity (size,
// modification time, and the end of its absolute path in the paths) and its source bytes. The ids hold the train
// documents first, then the held-out ones, each followed by its separator. Opening a cache reads the header and the
// records (48 bytes a document, released after) and reads the ids once through a small buffer to check that each names
// a token (read(), not the map: the resident set does not grow); the map pages them in only as batches touch them.
#include <fcntl.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <unordered_map>

#include "data/documents.h"
#include "data/file_pass.h"
#include "kernels/base.h"

namespace tinygpt::data {

namespace fs = std::filesystem;
using detail::TempFile;
using detail::Writer;

namespace {

constexpr char kMagic[8] = {'T', 'G', 'D', 'O', 'C', 'S', '0', '2'};
constexpr uint64_t kHeaderBytes = 1024;  // the JSON header's room: it is written last, in place

struct Record {
  uint64_t offset, count;  // the document's ids: ids[offset, offset + count)
  int64_t size, mtime_ns;  // its file's size and modification time when it was encoded
  uint64_t path_end;       // its absolute path ends here in the paths
  uint64_t bytes;          // the source bytes its ids stand for (tok.source_bytes summed)
};
static_assert(sizeof(Record) == 48);

struct Identity {
  std::string source;  // absolute, normalized
  int64_t size, mtime_ns;
};

Identity identity(const fs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) throw Error(fmt::format("cannot stat '{}': {}", p.string(), std::strerror(errno)));
  return {fs::absolute(p).lexically_normal().string(), int64_t(st.st_size),
          int64_t(st.st_mtim.tv_sec) * 1000000000 + int64_t(st.st_mtim.tv_nsec)};
}

uint64_t hash_of(std::string_view source, int64_t size, int64_t mtime_ns) {
  return std::hash<std::string_view>{}(source) ^ (uint64_t(size) * 0x9E3779B97F4A7C15ull) ^
         (uint64_t(mtime_ns) * 0xC2B2AE3D27D4EB4Full);
}

std::string fingerprint(const Tokenizer& tok, const std::vector<uint32_t>& separator) {
  std::string s = tok.is_bpe() ? tok.bpe().to_json() : encode_utf8(tok.chars().chars());
  for (const uint32_t id : separator) s += fmt::format(",{}", id);
  return fmt::format("{}:{:016x}", tok.kind(), std::hash<std::string>{}(s));
}

/// The bytes an id of `tok` takes in the cache.
size_t id_bytes_of(const Tokenizer& tok) { return tok.vocab_size() > kMaxVocab ? 4 : 2; }

uint64_t align8(uint64_t n) { return (n + 7) / 8 * 8; }

/// A cache file, mapped, when it is well formed: its header, and where its records, paths and ids lie.
struct Cache {
  MappedFile file;
  nlohmann::json header;
  size_t documents = 0, count = 0, train_count = 0, id_bytes = 2;
  uint64_t records_at = 0, paths_at = 0, paths_bytes = 0, ids_at = 0;

  const Record* records() const { return reinterpret_cast<const Record*>(file.bytes().data() + records_at); }
  std::string_view path(size_t i) const {
    const uint64_t begin = i == 0 ? 0 : records()[i - 1].path_end;
    return file.bytes().substr(paths_at + begin, records()[i].path_end - begin);
  }
};

/// Whether the records are consistent: paths in order within the paths, each document within the ids, all of them
/// covering the ids exactly once (their counts add up). Their pages are released after.
bool records_hold(const Cache& c) {
  uint64_t sum = 0, path_at = 0;
  const Record* r = c.records();
  for (size_t i = 0; i < c.documents; ++i) {
    if (r[i].path_end < path_at || r[i].path_end > c.paths_bytes || r[i].offset > c.count ||
        r[i].count > c.count - r[i].offset) {
      return false;
    }
    path_at = r[i].path_end;
    sum += r[i].count;
  }
  c.file.release(c.records_at, c.documents * sizeof(Record));
  return sum == c.count;
}

std::optional<Cache> read_cache(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return std::nullopt;
  Cache c{MappedFile(path), {}};
  const std::string_view b = c.file.bytes();
  if (b.size() < 16 + kHeaderBytes || std::memcmp(b.data(), kMagic, 8) != 0) return std::nullopt;
  uint64_t len = 0;
  std::memcpy(&len, b.data() + 8, 8);
  if (len > kHeaderBytes) return std::nullopt;
  c.header = nlohmann::json::parse(b.substr(16, len), nullptr, false);
  const auto& h = c.header;
  const auto whole = [&](const char* key) { return h.contains(key) && h[key].is_number_unsigned(); };
  if (!h.is_object() || !whole("documents") || !whole("count") || !whole("train_count") || !whole("id_bytes") ||
      !whole("paths_bytes") || !whole("train_bytes") || !whole("val_bytes") || !h.contains("tokenizer") ||
      !h.contains("held_out")) {
    return std::nullopt;
  }
  c.documents = h["documents"].get<size_t>();
  c.count = h["count"].get<size_t>();
  c.train_count = h["train_count"].get<size_t>();
  c.id_bytes = h["id_bytes"].get<size_t>();
  c.paths_bytes = h["paths_bytes"].get<uint64_t>();
  if ((c.id_bytes != 2 && c.id_bytes != 4) || c.train_count > c.count) return std::nullopt;
  c.records_at = 16 + kHeaderBytes;
  const uint64_t room = b.size() - c.records_at;
  if (c.documents > room / sizeof(Record) || c.paths_bytes > room - c.documents * sizeof(Record)) return std::nullopt;
  c.paths_at = c.records_at + c.documents * sizeof(Record);
  c.ids_at = align8(c.paths_at + c.paths_bytes);
  if (c.ids_at > b.size() || c.count > (b.size() - c.ids_at) / c.id_bytes ||
      c.ids_at + c.count * c.id_bytes != b.size() || !records_hold(c)) {
    return std::nullopt;
  }
  return c;
}

/// The per-id source bytes of a tokenizer, for the records' byte counts.
std::vector<uint32_t> source_bytes_of(const Tokenizer& tok) {
  std::vector<uint32_t> bytes(size_t(tok.vocab_size()));
  for (size_t id = 0; id < bytes.size(); ++id) bytes[id] = uint32_t(tok.source_bytes(uint32_t(id)));
  return bytes;
}

/// Writes ids (each `w` bytes, narrowed where w is 2) to `out`.
void write_ids(Writer& out, const std::vector<uint32_t>& ids, size_t w, std::vector<Token>& narrow) {
  if (w == 4) {
    out.write(ids.data(), ids.size() * sizeof(uint32_t));
  } else {
    narrow.assign(ids.begin(), ids.end());
    out.write(narrow.data(), narrow.size() * sizeof(Token));
  }
}

/// The documents' ids in list order, each to `train_out` or `val_out` as it is held out: an unchanged one's copied from
/// the old cache (old_index names its record), the others encoded on every thread a batch of files at a time. Fills
/// each record's count and bytes.
void write_documents(std::vector<Record>& records, const FileList& files, const std::vector<bool>& held_out,
                     const Tokenizer& tok, const std::vector<uint32_t>& separator, const Cache* old,
                     const std::vector<int64_t>& old_index, Writer& train_out, Writer& val_out, bool quiet) {
  const size_t n = files.size(), w = id_bytes_of(tok);
  const std::vector<uint32_t> bytes_of = source_bytes_of(tok), prefix = tok.document_prefix();
  size_t copied = 0;  // the unchanged documents before this one are written
  const auto copy_unchanged_before = [&](size_t doc) {
    for (; copied < doc; ++copied) {
      if (old_index[copied] < 0) continue;
      const Record& from = old->records()[old_index[copied]];
      (held_out[copied] ? val_out : train_out).append(old->file, old->ids_at + from.offset * w, from.count * w);
      records[copied].count = from.count;
      records[copied].bytes = from.bytes;
    }
  };
  FileList to_encode;
  std::vector<size_t> index;  // to_encode[k] is document index[k]
  for (size_t i = 0; i < n; ++i) {
    if (old_index[i] < 0) {
      to_encode.push_back(files[i]);
      index.push_back(i);
    }
  }
  Progress progress(fmt::format("tokenizing {} file{}", to_encode.size(), to_encode.size() == 1 ? "" : "s"),
                    detail::total_size(to_encode), quiet || to_encode.empty());
  std::vector<BpeTokenizer::Cache> caches(static_cast<size_t>(omp_get_max_threads()));
  std::vector<Token> narrow;
  uint64_t written = 0;
  detail::over_files(
      to_encode, progress,
      [&](const detail::Item& it, int thread) {
        std::vector<uint32_t> ids;
        tok.encode(it.text, ids, files[index[it.file]], &caches[size_t(thread)], it.offset);
        return ids;
      },
      [&](const detail::Item& it, std::vector<uint32_t>& ids) {
        const size_t doc = index[it.file];
        if (it.first) {
          copy_unchanged_before(doc);
          ids.insert(ids.begin(), prefix.begin(), prefix.end());
        }
        if (it.last) ids.insert(ids.end(), separator.begin(), separator.end());
        uint64_t bytes = 0;
        for (const uint32_t id : ids) bytes += id < bytes_of.size() ? bytes_of[id] : 0;
        write_ids(held_out[doc] ? val_out : train_out, ids, w, narrow);
        records[doc].count += ids.size();
        records[doc].bytes += bytes;
        written += ids.size();
      });
  copy_unchanged_before(n);
  progress.finish(to_encode.empty() ? "" : fmt::format(", {} tokens", written));
}

/// The source bytes of ids[first, count) of a cache file being made, read a few MB at a time, each part released.
uint64_t bytes_of_ids(const fs::path& path, uint64_t ids_at, size_t w, uint64_t first, uint64_t count,
                      const Tokenizer& tok) {
  const MappedFile file(path);
  const std::vector<uint32_t> bytes_of = source_bytes_of(tok);
  const char* ids = file.bytes().data() + ids_at;
  uint64_t bytes = 0;
  const uint64_t step = uint64_t(4) << 20;
  for (uint64_t k = first; k < count; k += step) {
    const uint64_t end = std::min(count, k + step);
    for (uint64_t j = k; j < end; ++j) {
      uint32_t id = 0;
      std::memcpy(&id, ids + j * w, w);
      bytes += id < bytes_of.size() ? bytes_of[id] : 0;
    }
    file.release(ids_at + k * w, (end - k) * w);
  }
  return bytes;
}

DocumentCorpus corpus_of(Cache c, int64_t encoded) {
  DocumentCorpus d;
  d.documents = int64_t(c.documents);
  d.held_out_documents = c.header.value("held_out_documents", int64_t(0));
  d.train_count = c.train_count;
  d.encoded = encoded;
  d.reused = d.documents - encoded;
  d.train_bytes = c.header["train_bytes"].get<int64_t>();
  d.val_bytes = c.header["val_bytes"].get<int64_t>();
  d.tokens = TokenData(std::move(c.file), c.ids_at, c.count, c.id_bytes);
  return d;
}

/// Which documents of the old cache are unchanged (the same path, size and modification time): their old record, or
/// -1.
std::vector<int64_t> unchanged_in(const Cache& old, const std::vector<Record>& records, const std::string& paths) {
  std::vector<int64_t> old_index(records.size(), -1);
  const Record* r = old.records();
  std::unordered_map<uint64_t, size_t> by_identity;
  by_identity.reserve(old.documents);
  for (size_t i = 0; i < old.documents; ++i) by_identity.emplace(hash_of(old.path(i), r[i].size, r[i].mtime_ns), i);
  for (size_t i = 0; i < records.size(); ++i) {
    const uint64_t begin = i == 0 ? 0 : records[i - 1].path_end;
    const std::string_view source = std::string_view(paths).substr(begin, records[i].path_end - begin);
    const auto it = by_identity.find(hash_of(source, records[i].size, records[i].mtime_ns));
    if (it != by_identity.end() && old.path(it->second) == source && r[it->second].size == records[i].size &&
        r[it->second].mtime_ns == records[i].mtime_ns) {
      old_index[i] = int64_t(it->second);
    }
  }
  old.file.release(old.records_at, old.ids_at - old.records_at);
  return old_index;
}

/// Where each document's ids go (Record::offset): the train documents' first, in order, then the held-out ones.
struct Placement {
  uint64_t train_count = 0, total = 0, train_bytes = 0, val_bytes = 0;
};

Placement place_documents(std::vector<Record>& records, const std::vector<bool>& held_out) {
  Placement p;
  for (size_t i = 0; i < records.size(); ++i) p.train_count += held_out[i] ? 0 : records[i].count;
  uint64_t at_train = 0, at_val = p.train_count;
  for (size_t i = 0; i < records.size(); ++i) {
    Record& r = records[i];
    uint64_t& at = held_out[i] ? at_val : at_train;
    r.offset = at;
    at += r.count;
    (held_out[i] ? p.val_bytes : p.train_bytes) += r.bytes;
    p.total += r.count;
  }
  return p;
}

/// The header (its length, then the JSON padded to its room), then the magic: a file cut short before it is no cache.
void write_header(Writer& out, std::string header) {
  if (header.size() > kHeaderBytes) throw Error("the token cache's header does not fit its room (a bug)");
  const uint64_t len = header.size();
  header.resize(kHeaderBytes, ' ');
  out.write_at(8, &len, 8);
  out.write_at(16, header.data(), header.size());
  out.write_at(0, kMagic, 8);  // last: a file cut short before here is no cache
}

/// The cache at `path` if it was written under this tokenizer (its fingerprint and id width) and holds no id past its
/// vocabulary; else none (another tokenizer's, or damaged: the embedding lookup trusts the ids).
std::optional<Cache> cache_under(const fs::path& path, const std::string& print, size_t w, const Tokenizer& tok) {
  std::optional<Cache> c = read_cache(path);
  if (c && (c->header["tokenizer"] != print || c->id_bytes != w ||
            (c->count > 0 && largest_id(path, c->ids_at, c->count, w) >= uint64_t(tok.vocab_size())))) {
    c.reset();
  }
  return c;
}

/// A record per file (its size, time and where its path ends in `paths`, to which it is appended); ids to come.
std::vector<Record> records_of(const FileList& files, std::string& paths) {
  std::vector<Record> records(files.size(), Record{});
  for (size_t i = 0; i < files.size(); ++i) {
    const Identity id = identity(files[i]);
    paths += id.source;
    records[i] = {0, 0, id.size, id.mtime_ns, paths.size(), 0};
  }
  return records;
}

}  // namespace

DocumentCorpus load_documents(const FileList& files, const Tokenizer& tok, const std::vector<uint32_t>& separator,
                              double train_fraction, const fs::path& cache_path, bool quiet) {
  if (!(train_fraction > 0 && train_fraction < 1)) {
    throw Error(fmt::format("the train fraction must be in (0, 1), got {}", train_fraction));
  }
  const size_t n = files.size(), w = id_bytes_of(tok);
  const std::vector<bool> held_out = held_out_documents(n, train_fraction);
  const int64_t held_out_count = std::count(held_out.begin(), held_out.end(), true);
  const bool by_documents = held_out_count > 0;
  const std::string print = fingerprint(tok, separator);
  std::string paths;  // every document's absolute path, one after another
  std::vector<Record> records = records_of(files, paths);

  // An old cache under this tokenizer: used whole when no document changed, else its unchanged documents' ids copied.
  std::optional<Cache> old = cache_under(cache_path, print, w, tok);
  std::vector<int64_t> old_index(n, -1);
  if (old) {
    old_index = unchanged_in(*old, records, paths);
    const auto& h = old->header;
    bool same =
        h["held_out"] == by_documents && old->documents == n && h.value("train_fraction", -1.0) == train_fraction;
    for (size_t i = 0; same && i < n; ++i) same = old_index[i] == int64_t(i);
    if (same) return corpus_of(std::move(*old), 0);
  }

  // The train documents' ids go straight into the new cache file, the held-out ones into a scratch file appended after;
  // the header and the records, known last, are written in place at the start.
  TempFile out_tmp{cache_path.string() + ".tmp"}, val_tmp{cache_path.string() + ".val.tmp"};
  Writer out(out_tmp.path), val_out(val_tmp.path);
  const uint64_t records_at = 16 + kHeaderBytes, paths_at = records_at + n * sizeof(Record);
  const uint64_t ids_at = align8(paths_at + paths.size());
  {
    const std::vector<char> zeros(size_t(records_at + n * sizeof(Record)), 0);
    out.write(zeros.data(), zeros.size());
    out.write(paths.data(), paths.size());
    out.write(zeros.data(), ids_at - paths_at - paths.size());
  }
  write_documents(records, files, held_out, tok, separator, old ? &*old : nullptr, old_index, out, val_out, quiet);
  old.reset();
  val_out.close();
  {
    const MappedFile val(val_tmp.path);
    out.append(val, 0, val.bytes().size());
  }

  auto [train_count, total, train_bytes, val_bytes] = place_documents(records, held_out);
  out.write_at(records_at, records.data(), n * sizeof(Record));
  std::vector<Record>().swap(records);
  if (!by_documents) {  // too few documents to hold whole ones out: the last fraction of the ids validates
    train_count = uint64_t(double(total) * train_fraction);
    out.flush();
    val_bytes = bytes_of_ids(out_tmp.path, ids_at, w, train_count, total, tok);
    train_bytes -= val_bytes;
  }
  const std::string header = nlohmann::json({{"tokenizer", print},
                                             {"held_out", by_documents},
                                             {"held_out_documents", held_out_count},
                                             {"train_fraction", train_fraction},
                                             {"documents", n},
                                             {"count", total},
                                             {"train_count", train_count},
                                             {"id_bytes", w},
                                             {"paths_bytes", paths.size()},
                                             {"train_bytes", train_bytes},
                                             {"val_bytes", val_bytes}})
                                 .dump();
  write_header(out, header);
  out.close();

  std::error_code ec;
  fs::rename(out_tmp.path, cache_path, ec);
  if (ec)
    throw Error(fmt::format("cannot move the token cache into place at '{}': {}", cache_path.string(), ec.message()));
  out_tmp.keep = true;
  std::optional<Cache> fresh = read_cache(cache_path);
  if (!fresh) throw Error(fmt::format("the token cache '{}' could not be read back", cache_path.string()));
  return corpus_of(std::move(*fresh), int64_t(std::count(old_index.begin(), old_index.end(), -1)));
}

}  // namespace tinygpt::data

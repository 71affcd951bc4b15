// Corpora of many text files, larger than memory: --data's files, directories and globs listed in a fixed order, each
// file a document; its tokens written once, streaming, into a memory-mapped cache next to the run (train documents,
// then held-out ones) that later runs map, re-encoding only the files that changed. Passes over the text go a batch of
// files at a time on every thread, so memory follows the batch, not the corpus.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "corpus.h"
#include "tokenizer.h"

namespace tinygpt::data {

/// Where a pass says what it skipped or did (one line each, no newline).
using Note = std::function<void(const std::string&)>;

/// The text files --data's arguments name, each once, in order: a file as given (it must be a regular file:
/// a pipe or device is refused by name), a directory walked (entries starting with '.' skipped, and tinygpt run
/// directories inside it, marked by their lock or checkpoints, skipped with a note) in sorted order with
/// its empty and binary files (a NUL byte in the first 8 KiB) skipped with a note, a glob's matches sorted. Throws
/// naming an argument that matches nothing, or when no file is left.
FileList list_text_files(const std::vector<std::string>& args, const Note& note);

/// Removes the temporary files of the token caches and id files being written, for a SIGINT/SIGTERM handler that ends
/// the program during a pass: async-signal-safe (no allocation, no lock; unlink only). What they replace is kept.
void remove_cache_temp_files_now() noexcept;

/// A progress line on stderr for a pass over `total` bytes: done, rate and time left, redrawn at most twice a second
/// while stderr is a terminal; the last line stays.
class Progress {
 public:
  Progress(std::string label, int64_t total, bool quiet = false);
  void add(int64_t bytes);
  /// Prints the final line ("label: 98.1 MB in 3.2s (30.7 MB/s)").
  void finish(const std::string& detail = {});

 private:
  void draw(bool last);
  std::string label_;
  int64_t total_, done_ = 0;
  bool quiet_, tty_;
  std::chrono::steady_clock::time_point start_, drawn_;
};

/// The most distinct pieces count_pieces holds (about 100 bytes each, so some 200 MB): past it the rarest are dropped
/// (PieceCounts::prune), as sentencepiece and tokenizers bound theirs.
inline constexpr size_t kMaxPieces = size_t(1) << 21;

/// How often each pre-split piece occurs in the files (counted on every thread, a batch of files at a time); with
/// `max_bytes`, only in their first max_bytes bytes (the files in order, the last one cut where a piece ends). Holds
/// at most kMaxPieces distinct pieces after each batch, dropping the rarest past that (saying so in the progress line).
PieceCounts count_pieces(const FileList& files, bool quiet = false, int64_t max_bytes = -1);

/// A character vocabulary of every character of the files and `extra` (--doc-sep's text), in code point order; throws
/// naming the file and byte offset of invalid UTF-8 or of a NUL byte (a binary file), or more than kMaxVocab
/// characters.
CharVocab vocab_of_files(const FileList& files, const std::string& extra);

struct DocumentCorpus {
  TokenData tokens;                               // the train documents' ids, then the held-out documents'
  size_t train_count = 0;                         // how many of them train
  int64_t documents = 0, held_out_documents = 0;  // held_out_documents 0: the split is the last fraction of the ids
  int64_t reused = 0, encoded = 0;                // documents whose ids came from the cache, and those encoded
  int64_t train_bytes = 0, val_bytes = 0;  // the source bytes the train and held-out ids stand for (bits per byte)
  /// The ids that train (the first train_count) and those held out.
  Split split() const { return {tokens.ids().first(train_count), tokens.ids().subspan(train_count)}; }
};

/// Which of n documents are held out for validation: round(n (1 - train_fraction)) of them, evenly spread over the
/// list, when that is at least one and leaves one to train; else none (then the last fraction of all ids validates, as
/// a single file splits).
std::vector<bool> held_out_documents(size_t n, double train_fraction);

/// A tokenizer.json file's byte-level BPE; throws naming the file and what is wrong with it.
BpeTokenizer read_tokenizer_file(const std::filesystem::path& path);

/// The ids of the files, each document followed by `separator` (the end-of-text token of a BPE, the ids of --doc-sep's
/// text for characters), from the cache at `cache_path` where it holds them under the same tokenizer. The held-out
/// documents are spread evenly over the list, round(n (1 - train_fraction)) of them, when that is at least one; else
/// the last fraction of all ids validates (as a single file splits).
DocumentCorpus load_documents(const FileList& files, const Tokenizer& tok, const std::vector<uint32_t>& separator,
                              double train_fraction, const std::filesystem::path& cache_path, bool quiet = false);

/// Writes every file's ids, each followed by the end-of-text id, as little-endian uint32 (tokenizer encode --out);
/// returns the number of ids.
int64_t write_document_ids(const FileList& files, const Tokenizer& tok, const std::filesystem::path& out,
                           bool quiet = false);

}  // namespace tinygpt::data

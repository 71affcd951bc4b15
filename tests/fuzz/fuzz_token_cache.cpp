// libFuzzer target: the token caches' readers on arbitrary bytes placed beside a fixed source text: the first byte
// picks the cache (0: a character model's tokens.bin, read by load_corpus; else the documents' cache, read by
// load_documents), the rest is the file. A damaged cache must be encoded again or end in a tinygpt::Error, and what
// loads must hold only ids of its vocabulary (the embedding lookup trusts them). LLVMFuzzerInitialize writes a valid
// cache of each kind into the corpus directories it is given, so mutations start from headers that name the source.
#include <fcntl.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "data/corpus.h"
#include "data/documents.h"
#include "data/tokenizer.h"

namespace fs = std::filesystem;
using namespace tinygpt;

namespace {

// Fixed paths and times: the caches' headers name the source by path, size and modification time. So one fuzzing
// process at a time (scripts/fuzz.sh runs the targets one after another; not with -jobs or -workers).
const fs::path kDir = "/tmp/tinygpt_fuzz_token_cache";
const fs::path kText = kDir / "text.txt";

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void make_source() {
  fs::create_directories(kDir / "chars");
  fs::create_directories(kDir / "docs");
  write_file(kText, "To be, or not to be: that is the question.\nWhether 'tis nobler in the mind to suffer\n");
  const struct timespec times[2] = {{1000000000, 0}, {1000000000, 0}};
  ::utimensat(AT_FDCWD, kText.c_str(), times, 0);
}

data::Tokenizer tokenizer() { return data::Tokenizer(data::CharVocab(data::decode_utf8(read_file(kText)))); }

void load(bool chars) {
  if (chars) {
    const data::Corpus c = data::load_corpus(kText, kDir / "chars");
    for (const uint32_t id : c.tokens.ids()) {
      if (size_t(id) >= c.vocab.chars().size()) std::abort();
    }
  } else {
    const data::Tokenizer tok = tokenizer();
    const data::DocumentCorpus c = data::load_documents({kText}, tok, {}, 0.9, kDir / "docs" / "tokens.bin", true);
    for (const uint32_t id : c.tokens.ids()) {
      if (int64_t(id) >= tok.vocab_size()) std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  make_source();
  load(true);
  load(false);
  for (int i = 1; i < *argc; ++i) {  // the corpus directories: a seed of each kind
    const fs::path dir = (*argv)[i];
    std::error_code ec;
    if ((*argv)[i][0] == '-' || !fs::is_directory(dir, ec)) continue;
    write_file(dir / "valid_chars", std::string(1, '\0') + read_file(kDir / "chars" / "tokens.bin"));
    write_file(dir / "valid_docs", std::string(1, '\1') + read_file(kDir / "docs" / "tokens.bin"));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool chars = data[0] == 0;
  write_file(chars ? kDir / "chars" / "tokens.bin" : kDir / "docs" / "tokens.bin",
             std::string(reinterpret_cast<const char*>(data) + 1, size - 1));
  try {
    load(chars);
  } catch (const Error&) {}
  return 0;
}

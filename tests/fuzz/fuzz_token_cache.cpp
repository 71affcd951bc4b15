// libFuzzer target: the token cache's reader (load_documents) on arbitrary bytes placed as the tokens.bin of a fixed
// source text under its characters. A damaged cache must be encoded again or end in a tinygpt::Error, and what loads
// must hold only ids of its vocabulary (the embedding lookup trusts them). LLVMFuzzerInitialize writes a valid cache
// into the corpus directories it is given, so mutations start from a header that names the source.
#include <fcntl.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

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
  fs::create_directories(kDir);
  write_file(kText, "To be, or not to be: that is the question.\nWhether 'tis nobler in the mind to suffer\n");
  const struct timespec times[2] = {{1000000000, 0}, {1000000000, 0}};
  ::utimensat(AT_FDCWD, kText.c_str(), times, 0);
}

const fs::path kCache = kDir / "tokens.bin";

void load() {
  const data::Tokenizer tok(data::CharVocab(data::decode_utf8(read_file(kText))));
  const data::DocumentCorpus c = data::load_documents({kText}, tok, {}, 0.9, kCache, true);
  for (const uint32_t id : c.tokens.ids()) {
    if (int64_t(id) >= tok.vocab_size()) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  make_source();
  load();
  for (int i = 1; i < *argc; ++i) {  // the corpus directories: a valid cache as the seed
    const fs::path dir = (*argv)[i];
    std::error_code ec;
    if ((*argv)[i][0] == '-' || !fs::is_directory(dir, ec)) continue;
    write_file(dir / "valid_cache", read_file(kCache));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  write_file(kCache, std::string(reinterpret_cast<const char*>(data), size));
  try {
    load();
  } catch (const Error&) {}
  return 0;
}

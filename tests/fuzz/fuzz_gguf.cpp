// libFuzzer target: the GGUF reader (header, metadata, tensor descriptions, every tensor dequantized) and what the
// import makes of a file that reads (the model's config, the tokenizer from tokenizer.ggml.*) on arbitrary bytes.
// Every malformed input must end in a tinygpt::Error; anything else (a crash, a sanitizer report, another exception
// type, a hang) is a bug.
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "train/gguf_read.h"
#include "train/import_gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/tinygpt_fuzz_" + std::to_string(::getpid()) + ".gguf";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  }
  try {
    const tinygpt::gguf::File f(path);
    for (const auto& t : f.tensors()) (void)f.values(t);
    try {
      std::string arch;
      (void)tinygpt::gguf_config(f, arch);
    } catch (const tinygpt::Error&) {}
    (void)tinygpt::gguf_tokenizer(f);
  } catch (const tinygpt::Error&) {}
  return 0;
}

// libFuzzer target: the checkpoint reader (.safetensors parsing and checkpoint validation) on arbitrary bytes.
// Every malformed input must end in a tinygpt::Error; anything else (a crash, a sanitizer report, another
// exception type) is a bug.
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "train/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/tinygpt_fuzz_" + std::to_string(::getpid()) + ".safetensors";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  }
  try {
    tinygpt::load_checkpoint(path);
  } catch (const tinygpt::Error&) {}
  return 0;
}

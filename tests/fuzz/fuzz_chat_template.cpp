// libFuzzer target: a chat template (a checkpoint's, a GGUF file's or --chat-template's) on arbitrary bytes, parsed and
// rendered over a small conversation; the same bytes as a messages file and as an sft file of JSON lines. Every
// malformed input must end in a tinygpt::Error; anything else (a crash, a sanitizer report, another exception type, a
// hang or unbounded output) is a bug.
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "data/chat.h"
#include "data/conversations.h"
#include "kernels/base.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const tinygpt::data::TokenizerConfig tc{"<s>", "</s>", ""};
  const tinygpt::data::Messages m = {{{"role", "system"}, {"content", "be brief"}},
                                     {{"role", "user"}, {"content", " hi "}},
                                     {{"role", "assistant"}, {"content", "hello"}},
                                     {{"role", "user"}, {"content", "bye"}}};
  try {
    const tinygpt::data::ChatTemplate t("fuzzed", text);
    (void)t.render(m, true, tc);
    (void)t.end_of_turn(tc);
  } catch (const tinygpt::Error&) {}
  try {
    (void)tinygpt::data::parse_messages(text, "fuzzed");
  } catch (const tinygpt::Error&) {}
  // The same bytes as an sft file of JSON lines.
  static const std::string path = "/tmp/tinygpt_fuzz_" + std::to_string(::getpid()) + ".jsonl";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(text.data(), std::streamsize(text.size()));
  }
  try {
    (void)tinygpt::data::read_conversations(path);
  } catch (const tinygpt::Error&) {}
  return 0;
}

// libFuzzer target: the UTF-8 decoder and the character vocabulary. Invalid input must end in a
// tinygpt::Error; valid input must round-trip through decode/encode and through the vocabulary.
#include <cstdint>
#include <string_view>

#include "data/text.h"
#include "kernels/kernels.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  std::u32string text;
  try {
    text = tinygpt::data::decode_utf8(bytes);
  } catch (const tinygpt::Error&) {
    return 0;
  }
  if (tinygpt::data::encode_utf8(text) != bytes) __builtin_trap();
  const tinygpt::data::CharVocab vocab(text);
  if (vocab.decode(vocab.encode(text)) != text) __builtin_trap();
  const auto again = tinygpt::data::CharVocab::from_chars(vocab.chars());
  if (again.chars() != vocab.chars()) __builtin_trap();
  return 0;
}

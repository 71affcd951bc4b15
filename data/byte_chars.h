// GPT-2's map of bytes to printable characters (tokenizer.json spells byte-level tokens in it), shared by the BPE
// (data/bpe.cpp) and its tokenizer.json reader and writer (data/bpe_json.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>

namespace tinygpt::data {

/// GPT-2's map of bytes to printable characters, in which tokenizer.json spells tokens.
struct ByteChars {
  std::array<std::string, 256> of_byte;
  std::unordered_map<char32_t, uint8_t> to_byte;
  ByteChars() {
    std::array<bool, 256> direct{};
    for (int b = '!'; b <= '~'; ++b) direct[size_t(b)] = true;
    for (int b = 0xa1; b <= 0xac; ++b) direct[size_t(b)] = true;
    for (int b = 0xae; b <= 0xff; ++b) direct[size_t(b)] = true;
    char32_t extra = 256;
    for (int b = 0; b < 256; ++b) {
      const char32_t c = direct[size_t(b)] ? char32_t(b) : extra++;
      to_byte[c] = uint8_t(b);
      std::string& s = of_byte[size_t(b)];
      if (c < 0x80) {
        s = char(c);
      } else {
        s += char(0xc0 | (c >> 6));
        s += char(0x80 | (c & 0x3f));
      }
    }
  }
  std::string spell(std::string_view bytes) const {
    std::string s;
    for (const char b : bytes) s += of_byte[uint8_t(b)];
    return s;
  }
  /// The bytes a spelled token stands for; false when a character is not one of the 256.
  bool unspell(std::string_view spelled, std::string& bytes) const {
    bytes.clear();
    for (size_t i = 0; i < spelled.size();) {
      const auto b0 = uint8_t(spelled[i]);
      char32_t c = 0;
      if (b0 < 0x80) {
        c = b0, i += 1;
      } else if ((b0 & 0xe0) == 0xc0 && i + 1 < spelled.size()) {
        c = char32_t((b0 & 0x1f) << 6) | (uint8_t(spelled[i + 1]) & 0x3f), i += 2;
      } else {
        return false;
      }
      const auto it = to_byte.find(c);
      if (it == to_byte.end()) return false;
      bytes += char(it->second);
    }
    return true;
  }
};
inline const ByteChars kByteChars;

}  // namespace tinygpt::data

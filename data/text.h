// Text input: UTF-8 files decoded to Unicode code points, and the character vocabulary built from them.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace tinygpt::data {

/// Paths of text files, as strings: a std::filesystem::path also holds each of its components as a path of its own
/// (some 700 bytes for a 90-character path under libstdc++, against 140 for the string), which a corpus of 400,000
/// files would pay 300 MB for.
using FileList = std::vector<std::string>;

/// Throws naming the path when it does not exist or is a directory.
void check_text_path(const std::filesystem::path& path);

/// The bytes of a text file; throws naming the path when it is missing, a directory, unreadable or empty.
std::string read_text_file(const std::filesystem::path& path);
/// Writes text to a file by way of a temporary file beside it, renamed into place: a failed write (a full disk) leaves
/// the old file as it was and no temporary file; throws naming the path.
void write_text_file(const std::filesystem::path& path, const std::string& text);

/// Decodes UTF-8 (rejecting overlong forms, surrogates and values above U+10FFFF); throws naming the
/// byte offset of the first invalid sequence.
std::u32string decode_utf8(std::string_view bytes);
std::string encode_utf8(std::u32string_view text);

/// Throws Error("invalid UTF-8 at byte offset <offset>: <why> ...").
[[noreturn]] void utf8_error(std::string_view bytes, size_t offset, const char* why);

/// One UTF-8 character: its code point and length in bytes, or length 0 and why it is not valid (overlong forms,
/// surrogates and values above U+10FFFF are not).
struct Utf8Char {
  char32_t cp;
  int len;
  const char* why;
};

/// The character that starts at bytes[i] (i < bytes.size()).
inline Utf8Char decode_utf8_at(std::string_view bytes, size_t i) {
  const auto b0 = uint8_t(bytes[i]);
  if (b0 < 0x80) return {b0, 1, nullptr};
  int len = 0;
  char32_t cp = 0, min = 0;
  if ((b0 & 0xe0) == 0xc0) {
    len = 2, cp = b0 & 0x1f, min = 0x80;
  } else if ((b0 & 0xf0) == 0xe0) {
    len = 3, cp = b0 & 0x0f, min = 0x800;
  } else if ((b0 & 0xf8) == 0xf0) {
    len = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return {0, 0, "not a valid leading byte"};
  }
  if (i + size_t(len) > bytes.size()) return {0, 0, "sequence cut short by the end of the text"};
  for (int k = 1; k < len; ++k) {
    const auto b = uint8_t(bytes[i + size_t(k)]);
    if ((b & 0xc0) != 0x80) return {0, 0, "missing continuation byte"};
    cp = (cp << 6) | (b & 0x3f);
  }
  if (cp < min) return {0, 0, "overlong encoding"};
  if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return {0, 0, "not a Unicode scalar value"};
  return {cp, len, nullptr};
}

/// Whether bytes are valid UTF-8 (as decode_utf8_at judges each character).
inline bool valid_utf8(std::string_view bytes) {
  for (size_t i = 0; i < bytes.size();) {
    const Utf8Char c = decode_utf8_at(bytes, i);
    if (c.len == 0) return false;
    i += size_t(c.len);
  }
  return true;
}

/// Calls f(code point) for each character of UTF-8 text, without copying it; validates as decode_utf8.
template <class F>
void for_each_code_point(std::string_view bytes, F&& f) {
  for (size_t i = 0; i < bytes.size();) {
    const Utf8Char c = decode_utf8_at(bytes, i);
    if (c.len == 0) utf8_error(bytes, i, c.why);
    f(c.cp);
    i += size_t(c.len);
  }
}

/// Sorted unique code points of a text; token id = position in that list.
class CharVocab {
 public:
  CharVocab() = default;
  explicit CharVocab(std::u32string_view text);
  /// A vocabulary from its characters, which must be sorted and unique (as a checkpoint stores them).
  static CharVocab from_chars(std::u32string chars);

  /// The id of c, or -1 when c is not in the vocabulary.
  int32_t id(char32_t c) const;

  int64_t size() const { return int64_t(chars_.size()); }
  const std::u32string& chars() const { return chars_; }
  /// Token ids of `text`; throws naming the first character that is not in the vocabulary.
  std::vector<int32_t> encode(std::u32string_view text) const;
  std::u32string decode(const std::vector<int32_t>& ids) const;

 private:
  std::u32string chars_;
};

}  // namespace tinygpt::data

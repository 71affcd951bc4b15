// Text input: UTF-8 files decoded to Unicode code points, and the character vocabulary built from them.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace tinygpt::data {

/// The bytes of a text file; throws naming the path when it is missing, a directory, unreadable or empty.
std::string read_text_file(const std::filesystem::path& path);

/// Decodes UTF-8 (rejecting overlong forms, surrogates and values above U+10FFFF); throws naming the
/// byte offset of the first invalid sequence.
std::u32string decode_utf8(std::string_view bytes);
std::string encode_utf8(std::u32string_view text);

/// Sorted unique code points of a text; token id = position in that list.
class CharVocab {
 public:
  CharVocab() = default;
  explicit CharVocab(std::u32string_view text);

  int64_t size() const { return int64_t(chars_.size()); }
  const std::u32string& chars() const { return chars_; }
  /// Token ids of `text`; throws naming the first character that is not in the vocabulary.
  std::vector<int32_t> encode(std::u32string_view text) const;
  std::u32string decode(const std::vector<int32_t>& ids) const;

 private:
  std::u32string chars_;
};

}  // namespace tinygpt::data

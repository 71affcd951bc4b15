#include "data/text.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>

#include "kernels/kernels.h"

namespace tinygpt::data {

namespace fs = std::filesystem;

std::string read_text_file(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw Error(fmt::format("data file '{}' does not exist", path.string()));
  if (fs::is_directory(path, ec)) throw Error(fmt::format("'{}' is a directory, not a text file", path.string()));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("cannot open data file '{}' for reading", path.string()));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw Error(fmt::format("error while reading '{}'", path.string()));
  if (bytes.empty()) throw Error(fmt::format("data file '{}' is empty", path.string()));
  return bytes;
}

std::u32string decode_utf8(std::string_view bytes) {
  std::u32string out;
  out.reserve(bytes.size());
  size_t i = 0;
  auto fail = [&](const char* why) {
    throw Error(fmt::format("invalid UTF-8 at byte offset {}: {} (byte 0x{:02x})", i, why, uint8_t(bytes[i])));
  };
  while (i < bytes.size()) {
    const auto b0 = uint8_t(bytes[i]);
    if (b0 < 0x80) {
      out.push_back(b0);
      ++i;
      continue;
    }
    int len = 0;
    char32_t cp = 0, min = 0;
    if ((b0 & 0xe0) == 0xc0) {
      len = 2, cp = b0 & 0x1f, min = 0x80;
    } else if ((b0 & 0xf0) == 0xe0) {
      len = 3, cp = b0 & 0x0f, min = 0x800;
    } else if ((b0 & 0xf8) == 0xf0) {
      len = 4, cp = b0 & 0x07, min = 0x10000;
    } else {
      fail("not a valid leading byte");
    }
    if (i + size_t(len) > bytes.size()) fail("sequence cut short by the end of the text");
    for (int k = 1; k < len; ++k) {
      const auto b = uint8_t(bytes[i + size_t(k)]);
      if ((b & 0xc0) != 0x80) fail("missing continuation byte");
      cp = (cp << 6) | (b & 0x3f);
    }
    if (cp < min) fail("overlong encoding");
    if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) fail("not a Unicode scalar value");
    out.push_back(cp);
    i += size_t(len);
  }
  return out;
}

std::string encode_utf8(std::u32string_view text) {
  std::string out;
  for (char32_t c : text) {
    if (c < 0x80) {
      out += char(c);
    } else if (c < 0x800) {
      out += char(0xc0 | (c >> 6));
      out += char(0x80 | (c & 0x3f));
    } else if (c < 0x10000) {
      out += char(0xe0 | (c >> 12));
      out += char(0x80 | ((c >> 6) & 0x3f));
      out += char(0x80 | (c & 0x3f));
    } else {
      out += char(0xf0 | (c >> 18));
      out += char(0x80 | ((c >> 12) & 0x3f));
      out += char(0x80 | ((c >> 6) & 0x3f));
      out += char(0x80 | (c & 0x3f));
    }
  }
  return out;
}

CharVocab::CharVocab(std::u32string_view text) : chars_(text) {
  std::sort(chars_.begin(), chars_.end());
  chars_.erase(std::unique(chars_.begin(), chars_.end()), chars_.end());
}

std::vector<int32_t> CharVocab::encode(std::u32string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const auto it = std::lower_bound(chars_.begin(), chars_.end(), text[i]);
    if (it == chars_.end() || *it != text[i]) {
      throw Error(fmt::format("character '{}' (U+{:04X}) at position {} is not in the vocabulary",
                              encode_utf8(text.substr(i, 1)), uint32_t(text[i]), i));
    }
    ids.push_back(int32_t(it - chars_.begin()));
  }
  return ids;
}

std::u32string CharVocab::decode(const std::vector<int32_t>& ids) const {
  std::u32string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= size()) throw Error(fmt::format("token id {} is outside the vocabulary of {}", id, size()));
    out.push_back(chars_[size_t(id)]);
  }
  return out;
}

}  // namespace tinygpt::data

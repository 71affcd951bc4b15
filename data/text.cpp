#include "data/text.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>

#include "kernels/kernels.h"

namespace tinygpt::data {

namespace fs = std::filesystem;

void check_text_path(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw Error(fmt::format("data file '{}' does not exist", path.string()));
  if (fs::is_directory(path, ec)) throw Error(fmt::format("'{}' is a directory, not a text file", path.string()));
  if (!fs::is_regular_file(path, ec)) {
    throw Error(fmt::format("'{}' is not a regular file (a pipe or device?): tinygpt reads text files", path.string()));
  }
}

std::string read_text_file(const fs::path& path) {
  check_text_path(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("cannot open data file '{}' for reading", path.string()));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw Error(fmt::format("error while reading '{}'", path.string()));
  if (bytes.empty()) throw Error(fmt::format("data file '{}' is empty", path.string()));
  return bytes;
}

void utf8_error(std::string_view bytes, size_t offset, const char* why) {
  throw Error(fmt::format("invalid UTF-8 at byte offset {}: {} (byte 0x{:02x})", offset, why, uint8_t(bytes[offset])));
}

std::u32string decode_utf8(std::string_view bytes) {
  std::u32string out;
  out.reserve(bytes.size());
  for_each_code_point(bytes, [&](char32_t c) { out.push_back(c); });
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

CharVocab CharVocab::from_chars(std::u32string chars) {
  for (size_t i = 1; i < chars.size(); ++i) {
    if (chars[i - 1] >= chars[i]) throw Error("vocabulary: characters must be sorted and unique");
  }
  CharVocab v;
  v.chars_ = std::move(chars);
  return v;
}

int32_t CharVocab::id(char32_t c) const {
  const auto it = std::lower_bound(chars_.begin(), chars_.end(), c);
  return it == chars_.end() || *it != c ? -1 : int32_t(it - chars_.begin());
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

void write_text_file(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  bool written = false;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    written = out && (out << text) && out.flush();
    out.close();
    written = written && !out.fail();
  }
  std::error_code ec;
  if (written) fs::rename(tmp, path, ec);
  if (!written || ec) {
    fs::remove(tmp, ec);
    throw Error(fmt::format("cannot write '{}'{}", path.string(), written ? "" : " (disk full, or no permission?)"));
  }
}

}  // namespace tinygpt::data

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "data/text.h"
#include "kernels/kernels.h"

using namespace tinygpt;
using namespace tinygpt::data;

TEST_CASE("utf8: decodes one- to four-byte characters and encodes them back") {
  const std::string s = "a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";  // a é € 😀
  const std::u32string u = decode_utf8(s);
  CHECK(u == U"a\u00e9\u20ac\U0001F600");
  CHECK(encode_utf8(u) == s);
}

TEST_CASE("utf8: invalid input names the byte offset") {
  CHECK_THROWS_WITH_AS(decode_utf8("ab\xff"), doctest::Contains("byte offset 2"), Error);
  CHECK_THROWS_WITH_AS(decode_utf8("abc\xc3"), doctest::Contains("byte offset 3: sequence cut short"), Error);
  CHECK_THROWS_WITH_AS(decode_utf8("\xc3\x28"), doctest::Contains("missing continuation"), Error);
  CHECK_THROWS_WITH_AS(decode_utf8("\xc0\xaf"), doctest::Contains("overlong"), Error);
  CHECK_THROWS_WITH_AS(decode_utf8("\xed\xa0\x80"), doctest::Contains("not a Unicode scalar"), Error);
}

TEST_CASE("vocab: sorted unique characters, round trip, unknown characters named") {
  const CharVocab v(U"hello world");
  CHECK(v.chars() == U" dehlorw");
  CHECK(v.size() == 8);
  const auto ids = v.encode(U"world");
  CHECK(ids == std::vector<int32_t>{7, 5, 6, 4, 1});
  CHECK(v.decode(ids) == U"world");
  CHECK_THROWS_WITH_AS(v.encode(U"hex"), doctest::Contains("'x' (U+0078) at position 2"), Error);
}

TEST_CASE("read_text_file: missing, directory and empty files are errors naming the path") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "tinygpt_test_data";
  fs::create_directories(dir);
  CHECK_THROWS_WITH_AS(read_text_file(dir / "nope.txt"), doctest::Contains("does not exist"), Error);
  CHECK_THROWS_WITH_AS(read_text_file(dir), doctest::Contains("is a directory"), Error);
  { std::ofstream(dir / "empty.txt"); }
  CHECK_THROWS_WITH_AS(read_text_file(dir / "empty.txt"), doctest::Contains("is empty"), Error);
  { std::ofstream(dir / "ok.txt") << "to be"; }
  CHECK(read_text_file(dir / "ok.txt") == "to be");
  fs::remove_all(dir);
}

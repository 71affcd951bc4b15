#include <doctest/doctest.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "data/bpe.h"
#include "data/documents.h"
#include "data/text.h"
#include "data/tokenizer.h"
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

TEST_CASE("documents: a vocabulary over 65,536 tokens is cached in 32-bit ids, read back and reused") {
  // A BPE of 256 bytes, no merges and 70,000 added tokens (ordinary ones, so a document's text matches them).
  std::string added = R"({"id": 256, "content": "<|endoftext|>", "special": true})";
  for (int i = 257; i < 70000; ++i) added += fmt::format(R"(, {{"id": {}, "content": "<t{}>", "special": false}})", i, i);
  PieceCounts counts;
  counts.add_text("x");
  std::string json = BpeTokenizer::train(counts, {.vocab_size = 257, .progress = {}}).to_json();
  const size_t a = json.find("\"added_tokens\""), a_end = json.find("\"normalizer\"");
  json.replace(a, a_end - a, "\"added_tokens\": [" + added + "], ");
  const Tokenizer tok(BpeTokenizer::from_json(json, "wide.json"));
  REQUIRE(tok.vocab_size() == 70000);
  const auto dir = std::filesystem::temp_directory_path() / "tinygpt_test_wide_cache";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "a.txt") << "ab<t69999>c<t65536>";
  for (int pass = 0; pass < 2; ++pass) {
    const DocumentCorpus c = load_documents({dir / "a.txt"}, tok, {256}, 0.5, dir / "tokens.bin", true);
    CHECK(c.reused == pass);  // the second load maps the first's cache
    const TokenSpan ids = c.tokens.ids();
    CHECK(ids.id_bytes() == 4);
    CHECK(std::vector<uint32_t>(ids.begin(), ids.end()) == std::vector<uint32_t>{'a', 'b', 69999, 'c', 65536, 256});
  }
  std::filesystem::remove_all(dir);
}

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
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
  for (int i = 257; i < 70000; ++i)
    added += fmt::format(R"(, {{"id": {}, "content": "<t{}>", "special": false}})", i, i);
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

namespace {

std::vector<uint32_t> ids_of(const TokenSpan& s) { return {s.begin(), s.end()}; }

void write_text(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

}  // namespace

TEST_CASE("documents: the cache holds train documents then held-out ones, reuses unchanged ones, counts source bytes") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "tinygpt_test_doc_cache";
  fs::remove_all(dir);
  fs::create_directories(dir);
  FileList files;
  for (int i = 0; i < 10; ++i) {
    files.push_back(dir / fmt::format("d{}.txt", i));
    write_text(files.back(), fmt::format("document {} says {}\n", i, std::string(size_t(i + 1), char('a' + i))));
  }
  PieceCounts counts;
  for (const auto& f : files) counts.add_text(read_text_file(f));
  const Tokenizer tok(BpeTokenizer::train(counts, {.vocab_size = 300, .progress = {}}));
  const std::vector<uint32_t> eot{uint32_t(tok.end_of_text())};
  const std::vector<bool> held = held_out_documents(files.size(), 0.8);
  REQUIRE(std::count(held.begin(), held.end(), true) == 2);
  // What the cache must hold: each document's ids and separator, train documents first, in list order.
  std::vector<uint32_t> want_train, want;
  int64_t train_bytes = 0, val_bytes = 0;
  const auto expect_files = [&] {
    std::vector<uint32_t> want_val;
    want_train.clear();
    train_bytes = val_bytes = 0;
    for (size_t i = 0; i < files.size(); ++i) {
      std::vector<uint32_t> ids;
      tok.encode(read_text_file(files[i]), ids, files[i]);
      ids.push_back(eot[0]);
      (held[i] ? want_val : want_train).insert((held[i] ? want_val : want_train).end(), ids.begin(), ids.end());
      (held[i] ? val_bytes : train_bytes) += int64_t(fs::file_size(files[i]));
    }
    want = want_train;
    want.insert(want.end(), want_val.begin(), want_val.end());
  };
  expect_files();
  const fs::path cache = dir / "run" / "tokens.bin";
  fs::create_directories(cache.parent_path());
  const auto check = [&](int64_t reused, int64_t encoded) {
    const DocumentCorpus c = load_documents(files, tok, eot, 0.8, cache, true);
    CHECK(c.reused == reused);
    CHECK(c.encoded == encoded);
    CHECK(c.documents == 10);
    CHECK(c.held_out_documents == 2);
    CHECK(c.train_count == want_train.size());
    CHECK(ids_of(c.tokens.ids()) == want);
    CHECK(c.train_bytes == train_bytes);  // <|endoftext|> stands for no bytes
    CHECK(c.val_bytes == val_bytes);
  };
  check(0, 10);
  check(10, 0);  // mapped whole
  // One train and one held-out document change: only they are encoded, the others copied from the old cache.
  write_text(files[3], "document three is now longer than it was\n");
  write_text(files[9], "the last one changed too\n");
  expect_files();
  check(8, 2);
  // An id outside the vocabulary (the header intact): the cache is not trusted, everything is encoded again.
  {
    std::fstream f(cache, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-2, std::ios::end);
    const uint16_t bad = 0xffff;
    f.write(reinterpret_cast<const char*>(&bad), 2);
  }
  check(0, 10);
  // A cache cut short, or of an older format: encoded again.
  fs::resize_file(cache, fs::file_size(cache) - 2);
  check(0, 10);
  write_text(cache, std::string("TGDOCS01") + std::string(64, '\0'));
  check(0, 10);
  fs::remove_all(dir);
}

TEST_CASE("documents: with too few documents to hold one out, the last fraction of the ids validates") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "tinygpt_test_doc_fraction";
  fs::remove_all(dir);
  fs::create_directories(dir);
  write_text(dir / "a.txt", "h\xc3\xa9llo w\xc3\xb6rld, and more text after it\n");
  const Tokenizer tok(CharVocab(decode_utf8(read_text_file(dir / "a.txt"))));
  const DocumentCorpus c = load_documents({dir / "a.txt"}, tok, {}, 0.9, dir / "tokens.bin", true);
  CHECK(c.held_out_documents == 0);
  const TokenSpan ids = c.tokens.ids();
  CHECK(c.train_count == size_t(double(ids.size()) * 0.9));
  int64_t train = 0, val = 0;
  for (size_t i = 0; i < ids.size(); ++i) (i < c.train_count ? train : val) += tok.source_bytes(ids[i]);
  CHECK(c.train_bytes == train);
  CHECK(c.val_bytes == val);
  CHECK(train + val == int64_t(fs::file_size(dir / "a.txt")));
  fs::remove_all(dir);
}

TEST_CASE("pieces: pruning drops the rarest counts whole until half the bound is left") {
  PieceCounts counts;
  for (int i = 0; i < 6; ++i) counts.add(fmt::format("once{}", i), 1);
  for (int i = 0; i < 3; ++i) counts.add(fmt::format("twice{}", i), 2);
  counts.add("often", 9);
  CHECK(counts.prune(10) == 0);  // within the bound: nothing dropped
  CHECK(counts.unique() == 10);
  CHECK(counts.prune(8) == 1);  // at most 4 left: the six seen once go
  CHECK(counts.unique() == 4);
  CHECK(counts.dropped() == 6);
  CHECK(counts.pruned_below() == 1);
  CHECK(counts.prune(3) == 2);  // at most 1 left: those seen twice go too
  CHECK(counts.unique() == 1);
  CHECK(counts.dropped() == 9);
  CHECK(counts.pruned_below() == 2);
  CHECK(*counts.map().get("often") == 9);
}

TEST_CASE("mapped file: released pages read back the same bytes") {
  namespace fs = std::filesystem;
  const fs::path p = fs::temp_directory_path() / "tinygpt_test_release.bin";
  std::string bytes(size_t(3) << 16, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = char(i * 7 + i / 4096);
  write_text(p, bytes);
  const MappedFile m(p);
  m.release(0, bytes.size());
  m.release(5, 100);  // less than a page: nothing
  CHECK(m.bytes() == bytes);
  CHECK(largest_id(p, 2, 4, 2) == std::max({uint32_t(uint8_t(bytes[2])) | uint32_t(uint8_t(bytes[3])) << 8,
                                            uint32_t(uint8_t(bytes[4])) | uint32_t(uint8_t(bytes[5])) << 8,
                                            uint32_t(uint8_t(bytes[6])) | uint32_t(uint8_t(bytes[7])) << 8,
                                            uint32_t(uint8_t(bytes[8])) | uint32_t(uint8_t(bytes[9])) << 8}));
  CHECK_THROWS_WITH_AS(largest_id(p, bytes.size() - 2, 2, 2), doctest::Contains("cut short"), Error);
  fs::remove(p);
}

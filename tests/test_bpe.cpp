#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "data/bpe.h"
#include "data/nfc.h"
#include "kernels/base.h"

using namespace tinygpt;
using namespace tinygpt::data;

namespace {

std::vector<std::string> pieces(std::string_view text, bool individual_digits = false) {
  std::vector<std::string> out;
  for_each_piece(
      text, [&](std::string_view p) { out.emplace_back(p); }, individual_digits);
  return out;
}

using Ids = std::vector<uint32_t>;

Ids encode(const BpeTokenizer& tok, std::string_view text) {
  Ids ids;
  tok.encode(text, ids);
  return ids;
}

}  // namespace

TEST_CASE("bpe: Digits(individual_digits) before GPT-2's split, as tokenizers' pre_tokenize_str gives them") {
  // tokenizers 0.23: Sequence([Digits(individual_digits=True), ByteLevel(use_regex=True)]) on these texts; a digit
  // ends the text GPT-2's split sees, so "  " before it stays one piece ("a  12" splits as "a", "  ", "1", "2").
  CHECK(pieces("a  12 x3", true) == std::vector<std::string>{"a", "  ", "1", "2", " x", "3"});
  CHECK(pieces("year 2024!", true) == std::vector<std::string>{"year", " ", "2", "0", "2", "4", "!"});
  CHECK(pieces("\xd9\xa3"
               "4 x",
               true) == std::vector<std::string>{"\xd9\xa3", "4", " x"});  // U+0663, an Arabic-Indic digit
  CHECK(pieces("it's 3rd", true) == std::vector<std::string>{"it", "'s", " ", "3", "rd"});
  CHECK(pieces("a  12 x3") == std::vector<std::string>{"a", " ", " 12", " x", "3"});  // GPT-2's split alone
}

TEST_CASE("bpe: GPT-2's pre-split, worked by hand from the pattern's alternatives") {
  // contractions; ' ?\p{L}+'; ' ?\p{N}+'; ' ?[^\s\p{L}\p{N}]+'; '\s+(?!\S)' keeps the last space for the word after
  CHECK(pieces("Hello world's  test") == std::vector<std::string>{"Hello", " world", "'s", " ", " test"});
  CHECK(pieces("x\n\nok 123 !!?") == std::vector<std::string>{"x", "\n", "\n", "ok", " 123", " !!?"});
  CHECK(pieces("it'll 'LL") == std::vector<std::string>{"it", "'ll", " '", "LL"});  // case-sensitive, as GPT-2's
  CHECK(pieces("a  \nb") == std::vector<std::string>{"a", "  ", "\n", "b"});
  CHECK(pieces("end   ") == std::vector<std::string>{"end", "   "});
  CHECK(pieces("caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87") ==
        std::vector<std::string>{"caf\xc3\xa9", " \xe4\xb8\xad\xe6\x96\x87"});
  CHECK(pieces("\xc2\xbd+2") == std::vector<std::string>{"\xc2\xbd", "+", "2"});    // '½' is a number (No)
  CHECK(pieces("a\xff\xfe b") == std::vector<std::string>{"a", "\xff\xfe", " b"});  // invalid bytes: other characters
  CHECK(pieces("\xe3\x80\x80x") == std::vector<std::string>{"\xe3\x80\x80", "x"});  // U+3000 is whitespace
}

TEST_CASE("bpe: Llama 3's and Qwen2's pre-splits, as tokenizers' Split(pattern, isolated) gives them") {
  // tokenizers 0.23, pre_tokenize_str of Split(Regex(kLlama3Pattern or kQwen2Pattern), "isolated") on these texts.
  const auto split = [](std::string_view text, PreSplit s) {
    std::vector<std::string> out;
    for_each_piece(
        text, [&](std::string_view p) { out.emplace_back(p); }, false, s);
    return out;
  };
  using V = std::vector<std::string>;
  for (const PreSplit s : {PreSplit::Llama3, PreSplit::Qwen2}) {
    CHECK(split("IT'S they'RE '\xc5\xbfx", s) == V{"IT", "'S", " they", "'RE", " '", "\xc5\xbfx"});
    CHECK(split("x'\xc5\xbf y", s) == V{"x", "'\xc5\xbf", " y"});  // the long s folds to s
    CHECK(split("a.\n\nb", s) == V{"a", ".\n\n", "b"});
    CHECK(split(" \n x", s) == V{" \n", " x"});
    CHECK(split("x  \n\n  y", s) == V{"x", "  \n\n", " ", " y"});
    CHECK(split("end   ", s) == V{"end", "   "});
    CHECK(split("$5!!\r\n\tz", s) == V{"$", "5", "!!\r\n", "\tz"});
  }
  CHECK(split("12345 (hi", PreSplit::Llama3) == V{"123", "45", " (", "hi"});
  CHECK(split("12345 (hi", PreSplit::Qwen2) == V{"1", "2", "3", "4", "5", " (", "hi"});
}

TEST_CASE("bpe: added tokens matched whole (special ones only when asked), and a post-processor's bos") {
  PieceCounts counts;
  counts.add_text("user assistant hello world hello world\n");
  const BpeTokenizer base = BpeTokenizer::train(counts, {.vocab_size = 270, .progress = {}});
  std::string j = base.to_json();
  const int64_t n = base.vocab_size();
  const std::string added = fmt::format(R"("added_tokens": [{{"id": {0}, "content": "<|endoftext|>", "special": true}},
      {{"id": {1}, "content": "<|im_start|>", "special": true}}, {{"id": {2}, "content": "<|im", "special": true}},
      {{"id": {3}, "content": "[W]", "special": false}}],)",
                                        n - 1, n, n + 1, n + 2);
  const size_t a = j.find("\"added_tokens\""), a_end = j.find("\"normalizer\"");
  j.replace(a, a_end - a, added);
  const size_t p = j.find("\"post_processor\": null");
  j.replace(p, 22,
            R"("post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|im_start|>",
      "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}]})");
  const BpeTokenizer tok = BpeTokenizer::from_json(j, "chat.json");
  CHECK(tok.vocab_size() == n + 3);
  CHECK(tok.begin_of_text() == n);
  Ids ids;
  tok.encode("<|im_start|>user[W]<|im_x", ids, BpeTokenizer::Specials::Match);
  Ids want{uint32_t(n)};
  for (const uint32_t id : encode(base, "user")) want.push_back(id);
  want.push_back(uint32_t(n + 2));
  want.push_back(uint32_t(n + 1));  // "<|im" (the longest added token that matches here)
  for (const uint32_t id : encode(base, "_x")) want.push_back(id);
  CHECK(ids == want);
  ids.clear();
  tok.encode("<|im_start|>[W]", ids);  // a training document: the special tokens are text, [W] is not special
  CHECK(ids.size() > 2);
  CHECK(ids.back() == uint32_t(n + 2));
  CHECK(std::count(ids.begin(), ids.end(), uint32_t(n)) == 0);
  const BpeTokenizer back = BpeTokenizer::from_json(tok.to_json(), "again.json");
  CHECK(back.to_json() == tok.to_json());
  CHECK(back.begin_of_text() == n);
  CHECK(back.added().size() == 4);
  CHECK_THROWS_WITH_AS(
      BpeTokenizer::from_json(
          std::string(j).replace(j.find("\"<|im_start|>\",\n      \"type_id\""), 14, "\"<|nope|>\""), "t.json"),
      doctest::Contains("not an added token"), Error);
}

TEST_CASE("bpe: cut points fall where pieces end, so counting in parts counts the same") {
  std::string text;
  std::mt19937 rng(1);
  const char* words[] = {"the", " cat", "\n", "  ", "'s", "42", "!", "\n\n", "caf\xc3\xa9", "\t", " "};
  for (int i = 0; i < 4000; ++i) text += words[rng() % 11];
  const auto cuts = cut_points(text, 500);
  CHECK(cuts.size() > 10);
  CHECK(cuts.front() == 0);
  CHECK(cuts.back() == text.size());
  std::vector<std::string> parts;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    for (auto& p : pieces(std::string_view(text).substr(cuts[i], cuts[i + 1] - cuts[i]))) parts.push_back(p);
  }
  CHECK(parts == pieces(text));
}

TEST_CASE("bpe: merges on a hand-worked example") {
  // pairs: (a,b) 5 + 2 = 7, (b,c) 2 + 1 = 3: merge ab first; then (ab,c) 2 and (b,c) 1: merge abc; then nothing
  // occurs twice, so training stops with 256 bytes + 2 merges + <|endoftext|>.
  PieceCounts counts;
  counts.add("ab", 5);
  counts.add("abc", 2);
  counts.add("bc", 1);
  const BpeTokenizer tok = BpeTokenizer::train(counts, {.vocab_size = 300, .progress = {}});
  REQUIRE(tok.vocab_size() == 259);
  CHECK(tok.merges() == 2);
  CHECK(tok.token_bytes(256) == "ab");
  CHECK(tok.token_bytes(257) == "abc");
  CHECK(tok.end_of_text() == 258);
  CHECK(tok.token_bytes(258) == "<|endoftext|>");
  CHECK(encode(tok, "abc") == Ids{257});
  CHECK(encode(tok, "bc") == Ids{'b', 'c'});
  CHECK(encode(tok, "ab abc") == Ids{256, ' ', 257});  // " abc" is one piece: ' ', then a b c merged
  CHECK(encode(tok, "<|endoftext|>").size() > 1);      // the special token's text is ordinary text
  // Ranks decide, not order in the text: in "abab" both (a,b) merge.
  CHECK(encode(tok, "abab") == Ids{256, 256});
}

TEST_CASE("bpe: every byte string encodes and decodes back exactly") {
  std::mt19937 rng(7);
  PieceCounts counts;
  std::string corpus;
  for (int i = 0; i < 20000; ++i) corpus += "abcdefgh \n\xe2\x82\xac\xf0\x9f\x98\x80"[rng() % 17];
  counts.add_text(corpus);
  const BpeTokenizer tok = BpeTokenizer::train(counts, {.vocab_size = 300, .progress = {}});
  CHECK(tok.vocab_size() == 300);
  for (int trial = 0; trial < 200; ++trial) {
    std::string bytes(rng() % 64, '\0');
    for (char& b : bytes) b = char(rng() % 4 == 0 ? rng() % 256 : "the cat\n "[rng() % 9]);
    Ids ids;
    BpeTokenizer::Cache cache(8);  // a small cache: clearing it must not change anything
    tok.encode(bytes, ids, cache);
    for (uint32_t id : ids) CHECK(int64_t(id) < tok.vocab_size());
    CHECK(tok.decode(ids) == bytes);
  }
  CHECK(encode(tok, corpus).size() * 10 < corpus.size() * 9);  // the merges compress what they were learned on
  CHECK_THROWS_WITH_AS(tok.decode({300}), doctest::Contains("outside the vocabulary"), Error);
}

TEST_CASE("bpe: tokenizer.json round trip, and what is not a byte-level BPE is refused by name") {
  PieceCounts counts;
  counts.add_text("low lower lowest newer newest wider widest low low new new\n");
  const BpeTokenizer tok = BpeTokenizer::train(counts, {.vocab_size = 280, .progress = {}});
  const BpeTokenizer back = BpeTokenizer::from_json(tok.to_json(), "tok.json");
  CHECK(back.vocab_size() == tok.vocab_size());
  CHECK(back.end_of_text() == tok.end_of_text());
  CHECK(back.to_json() == tok.to_json());
  for (const char* text : {"lowest newest", "widest low\n\nnew!", "\xff\x00 x"})
    CHECK(encode(back, text) == encode(tok, text));

  const auto refused = [](const std::string& json, const char* why) {
    CHECK_THROWS_WITH_AS(BpeTokenizer::from_json(json, "t.json"), doctest::Contains(why), Error);
  };
  // SmolLM2's pre-tokenizer: Digits(individual_digits) then ByteLevel with its regex; kept through to_json.
  std::string digits = tok.to_json();
  const size_t pre = digits.find("\"pre_tokenizer\""), post = digits.find("\"post_processor\"");
  digits.replace(pre, post - pre, R"("pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Digits",
      "individual_digits": true}, {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}]}, )");
  const BpeTokenizer smol = BpeTokenizer::from_json(digits, "smol.json");
  CHECK(smol.individual_digits());
  CHECK(!tok.individual_digits());
  Ids expected;  // the pieces "low", " ", "1", "2", each encoded alone
  for (const char* piece : {"low", " ", "1", "2"}) {
    const Ids ids = encode(tok, piece);
    expected.insert(expected.end(), ids.begin(), ids.end());
  }
  CHECK(encode(smol, "low 12") == expected);
  CHECK(BpeTokenizer::from_json(smol.to_json(), "again.json").individual_digits());
  CHECK(BpeTokenizer::from_json(smol.to_json(), "again.json").to_json() == smol.to_json());
  refused(std::string(digits).replace(digits.find("\"individual_digits\": true"), 25, "\"individual_digits\": false"),
          "Digits pre-tokenizer without individual_digits");
  refused("{", "not valid JSON");
  refused(R"({"model": {"type": "WordPiece"}})", "not \"BPE\"");
  refused(R"({"model": {"type": "Unigram", "vocab": []}})", "a SentencePiece tokenizer (a Unigram model");
  refused(R"({"model": {"type": "BPE", "byte_fallback": true, "vocab": {}, "merges": []}})",
          "a SentencePiece tokenizer (a BPE with byte_fallback");
  refused(R"({"normalizer": {"type": "Lowercase"}, "model": {"type": "BPE", "vocab": {}, "merges": []}})",
          "it has a normalizer (\"Lowercase\"), which tinygpt does not apply (it applies NFC)");
  // Qwen2's normalizer, NFC: text is normalized before the pre-split, kept through to_json.
  std::string nfc_json = tok.to_json();
  nfc_json.replace(nfc_json.find("\"normalizer\": null"), 18, R"("normalizer": {"type": "NFC"})");
  const BpeTokenizer qwen = BpeTokenizer::from_json(nfc_json, "qwen.json");
  CHECK(qwen.nfc());
  CHECK(!tok.nfc());
  CHECK(encode(qwen, "caf\x65\xcc\x81 low") == encode(tok, "caf\xc3\xa9 low"));  // e + U+0301 is U+00E9
  CHECK(encode(tok, "caf\x65\xcc\x81 low") != encode(tok, "caf\xc3\xa9 low"));
  CHECK(BpeTokenizer::from_json(qwen.to_json(), "again.json").nfc());
  std::string j = tok.to_json();
  refused(std::string(j).replace(j.find("\"Isolated\""), 10, "\"Removed\""), "pre-tokenizer");
  refused(std::string(j).replace(j.find("\"!\": 33"), 7, "\"!\": 99999"), "ids must be 0 to");
  refused(std::string(j).replace(j.find("\"!\": 33"), 7, "\"!\": 34"), "given to two tokens");
}

TEST_CASE("nfc: Unicode's normalization form C, on the cases the standard's own examples work") {
  // UAX #15 and the Unicode Standard, chapter 3: composition, reordering, blocking, singletons, exclusions, Hangul.
  const std::pair<const char*, const char*> cases[] = {
      {"e\xcc\x81", "\xc3\xa9"},                                 // e + acute: U+00E9
      {"\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", "\xea\xb0\x81"},  // Hangul L V T: U+AC01
      {"\xea\xb0\x80\xe1\x86\xa8", "\xea\xb0\x81"},              // LV syllable + T
      {"a\xcc\x87\xcc\xa3", "\xe1\xba\xa1\xcc\x87"},             // a + dot above + dot below: U+1EA1 U+0307
      {"a\xcc\xa3\xcc\x87", "\xe1\xba\xa1\xcc\x87"},             // the same in canonical order
      {"a\xcc\x81\xcc\x81", "\xc3\xa1\xcc\x81"},                 // the second acute is blocked by the first
      {"\xe2\x84\xa6", "\xce\xa9"},                              // OHM SIGN, a singleton: U+03A9
      {"\xe2\x84\xab", "\xc3\x85"},                              // ANGSTROM SIGN: U+00C5
      {"\xe0\xa5\x98", "\xe0\xa4\x95\xe0\xa4\xbc"},              // DEVANAGARI QA, excluded from composition
      {"\xcd\x84", "\xcc\x88\xcc\x81"},                          // U+0344, a non-starter decomposition
      {"\xc3\x85\xcc\x81", "\xc7\xba"},                          // U+00C5 + acute: U+01FA
      {"e\xff\xcc\x81", "e\xff\xcc\x81"},                        // a byte that is not UTF-8 blocks composition
      {"plain text 123", "plain text 123"},
  };
  for (const auto& [in, out] : cases) {
    CAPTURE(in);
    CHECK(data::nfc(in) == out);
    CHECK(data::nfc(out) == out);  // NFC is idempotent
  }
  CHECK(!data::nfc_may_change("ASCII, Latin-1 \xc3\xa9 and no marks"));
  CHECK(data::nfc_may_change("e\xcc\x81"));
}

TEST_CASE("bpe: incremental training learns the merges a brute-force count of every pair at every step learns") {
  // The reference: recount all pairs each step, take the most frequent (ties: the smaller pair of ids), skip a pair
  // whose bytes are already a token, stop when none occurs twice.
  std::mt19937 rng(3);
  PieceCounts counts;
  std::string text;
  const char* syll[] = {"ab", "ba", "aa", "abc", " ", "c", "\n", "a", "bb", "\xc3\xa9"};
  for (int i = 0; i < 6000; ++i) text += syll[rng() % 10];
  counts.add_text(text);
  const BpeTokenizer tok = BpeTokenizer::train(counts, {.vocab_size = 340, .progress = {}});

  std::vector<std::pair<std::vector<uint32_t>, int64_t>> words;
  counts.map().for_each([&](std::string_view piece, int64_t n) {
    std::vector<uint32_t> ids;
    for (const char c : piece) ids.push_back(uint8_t(c));
    words.emplace_back(ids, n);
  });
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.emplace_back(1, char(b));
  std::vector<std::array<uint32_t, 2>> merges;
  while (tokens.size() < 339) {
    std::map<std::pair<uint32_t, uint32_t>, int64_t> pc;
    for (const auto& [ids, n] : words) {
      for (size_t i = 0; i + 1 < ids.size(); ++i) pc[{ids[i], ids[i + 1]}] += n;
    }
    std::pair<uint32_t, uint32_t> best{};
    int64_t best_n = 0;
    for (const auto& [p, n] : pc) {
      if (n <= best_n) continue;  // the map's order is by pair: the first of equal counts is the smaller pair
      if (std::find(tokens.begin(), tokens.end(), tokens[p.first] + tokens[p.second]) != tokens.end()) continue;
      best = p, best_n = n;
    }
    if (best_n < 2) break;
    const auto id = uint32_t(tokens.size());
    tokens.push_back(tokens[best.first] + tokens[best.second]);
    merges.push_back({best.first, best.second});
    for (auto& [ids, n] : words) {
      std::vector<uint32_t> out;
      for (size_t i = 0; i < ids.size(); ++i) {
        if (i + 1 < ids.size() && ids[i] == best.first && ids[i + 1] == best.second) {
          out.push_back(id);
          ++i;
        } else {
          out.push_back(ids[i]);
        }
      }
      ids = out;
    }
  }
  REQUIRE(tok.merges() == int64_t(merges.size()));
  for (size_t i = 0; i < merges.size(); ++i) CHECK(tok.token_bytes(int32_t(256 + i)) == tokens[256 + i]);
}

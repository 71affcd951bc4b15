// libFuzzer target: the tokenizer.json reader, and byte-level BPE encoding, on arbitrary bytes. The first byte picks
// what the rest is: a tokenizer.json to read (every malformed one must end in a tinygpt::Error; one that reads must
// encode and decode text back exactly, normalized to NFC where its normalizer says so), or text to split and encode
// with a small trained tokenizer (the pieces must concatenate to the text, the ids decode to it) and to normalize
// (NFC of NFC is NFC; text NFC leaves alone comes back as it was). Anything else (a crash, a sanitizer report, another
// exception type, a round trip that differs) is a bug.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "data/bpe.h"
#include "data/nfc.h"
#include "kernels/base.h"

namespace {

using tinygpt::data::BpeTokenizer;

const BpeTokenizer& small_tokenizer() {
  static const BpeTokenizer tok = [] {
    tinygpt::data::PieceCounts counts;
    counts.add_text(
        "the cat sat on the mat; the cats' hats\n\n  int main() { return 0; }\ncaf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 42 "
        "4242");
    return BpeTokenizer::train(counts, {.vocab_size = 300, .progress = {}});
  }();
  return tok;
}

void round_trip(const BpeTokenizer& tok, std::string_view text) {
  std::vector<uint32_t> ids;
  tok.encode(text, ids);
  if (tok.decode(ids) != (tok.nfc() ? tinygpt::data::nfc(text) : std::string(text))) std::abort();
  std::string joined;
  tinygpt::data::for_each_piece(text, [&](std::string_view piece) {
    if (piece.empty()) std::abort();
    joined += piece;
  });
  if (joined != text) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    round_trip(small_tokenizer(), rest);
    const std::string once = tinygpt::data::nfc(rest);
    if (tinygpt::data::nfc(once) != once) std::abort();
    if (!tinygpt::data::nfc_may_change(rest) && once != rest) std::abort();
    return 0;
  }
  try {
    const BpeTokenizer tok = BpeTokenizer::from_json(rest, "fuzz.json");
    round_trip(tok, "Hello, world's caf\xc3\xa9 \xf0\x9f\x98\x80 \xff\xfe  x\n\n");
  } catch (const tinygpt::Error&) {}
  return 0;
}

// Unicode normalization form C (UAX #15) of UTF-8 text: what `tokenizers`' NFC normalizer does before the pre-split
// (Qwen2's tokenizer has one). The data is Unicode 16.0's (data/unicode_nfc_tables.h, generated).
#pragma once

#include <string>
#include <string_view>

namespace tinygpt::data {

/// Whether nfc(text) may differ from text: false for text without a code point from U+0300 up (a byte 0xCC or above),
/// which NFC leaves as it is; most English and code.
bool nfc_may_change(std::string_view text);
/// The text in normalization form C: decomposed canonically, combining marks in canonical order, composed again.
/// Bytes that are not UTF-8 pass through as they are, and nothing composes across them.
std::string nfc(std::string_view text);

}  // namespace tinygpt::data

// The BPE's tokenizer.json: written as Hugging Face's tokenizers writes a byte-level BPE, and read from the files of
// the GPT-2, Llama 3, Qwen2 and SmolLM families (the pre-tokenizers, post-processors and added tokens they use).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <optional>
#include <unordered_set>

#include "data/bpe.h"
#include "data/byte_chars.h"
#include "data/nfc.h"
#include "data/text.h"
#include "kernels/base.h"

namespace tinygpt::data {

std::string BpeTokenizer::to_json() const {
  using ojson = nlohmann::ordered_json;
  std::vector<bool> is_added(tokens_.size(), false);
  for (const Added& a : added_) is_added[a.id] = true;
  ojson vocab = ojson::object();
  for (size_t id = 0; id < model_vocab_; ++id) vocab[is_added[id] ? tokens_[id] : kByteChars.spell(tokens_[id])] = id;
  ojson merges = ojson::array();
  for (const Merge& m : merges_)
    merges.push_back(kByteChars.spell(tokens_[m.left]) + " " + kByteChars.spell(tokens_[m.right]));
  ojson added = ojson::array();
  for (const Added& a : added_) {
    added.push_back({{"id", a.id},
                     {"content", a.content},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", a.special}});
  }
  const ojson byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}};
  const ojson split = {
      {"type", "Split"}, {"pattern", {{"Regex", pattern_of(pre_split_)}}}, {"behavior", "Isolated"}, {"invert", false}};
  ojson pre = individual_digits_
                  ? ojson{{"type", "Sequence"},
                          {"pretokenizers", ojson::array({{{"type", "Digits"}, {"individual_digits", true}},
                                                          {{"type", "ByteLevel"},
                                                           {"add_prefix_space", false},
                                                           {"trim_offsets", true},
                                                           {"use_regex", true}}})}}
                  : ojson{{"type", "Sequence"}, {"pretokenizers", ojson::array({split, byte_level})}};
  ojson post = nullptr;
  if (bos_ >= 0) {  // the bos before each text (and each of a pair), as Llama 3's TemplateProcessing
    const std::string& bos = tokens_[size_t(bos_)];
    const ojson b = {{"SpecialToken", {{"id", bos}, {"type_id", 0}}}};
    post = {{"type", "TemplateProcessing"},
            {"single", ojson::array({b, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
            {"pair",
             ojson::array(
                 {b, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, b, {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
            {"special_tokens", {{bos, {{"id", bos}, {"ids", {bos_}}, {"tokens", {bos}}}}}}};
  }
  ojson j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nfc_ ? ojson{{"type", "NFC"}} : ojson(nullptr)},
      {"pre_tokenizer", pre},
      {"post_processor", post},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merges}}},
  };
  return j.dump(1) + "\n";
}

namespace {

/// Whether a pre_tokenizer is a split tinygpt knows (GPT-2's, Llama 3's, Qwen2's: set in `split`) followed by the
/// byte-level mapping, or that after a Digits pre-tokenizer with individual_digits (then `digits` is set); `why` says
/// what is not.
bool read_pre_tokenizer(const nlohmann::json& p, std::string& why, bool& digits, PreSplit& split_kind) {
  const auto type = [](const nlohmann::json& j) {
    return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : "";
  };
  if (type(p) == "Sequence" && p.contains("pretokenizers") && p["pretokenizers"].is_array() &&
      !p["pretokenizers"].empty() && type(p["pretokenizers"][0]) == "Digits") {
    const nlohmann::json& d = p["pretokenizers"][0];
    if (!d.value("individual_digits", false)) return why = "a Digits pre-tokenizer without individual_digits", false;
    nlohmann::json rest = p;
    rest["pretokenizers"].erase(0);
    if (rest["pretokenizers"].size() == 1) rest = rest["pretokenizers"][0];
    bool again = false;
    if (!read_pre_tokenizer(rest, why, again, split_kind) || again) return false;
    return digits = true;
  }
  if (type(p) == "ByteLevel") {
    if (p.value("add_prefix_space", false)) return why = "a ByteLevel pre-tokenizer with add_prefix_space", false;
    if (!p.value("use_regex", true)) return why = "a ByteLevel pre-tokenizer without a split pattern", false;
    return true;
  }
  if (type(p) == "Sequence" && p.contains("pretokenizers") && p["pretokenizers"].is_array() &&
      p["pretokenizers"].size() == 2) {
    const auto& split = p["pretokenizers"][0];
    const auto& bl = p["pretokenizers"][1];
    if (type(split) == "Split" && split.contains("pattern") && split["pattern"].is_object() &&
        split["pattern"].contains("Regex") && split["pattern"]["Regex"].is_string() && type(bl) == "ByteLevel" &&
        !bl.value("use_regex", true) && !bl.value("add_prefix_space", false) &&
        split.value("behavior", "") == "Isolated" && !split.value("invert", false)) {
      for (const PreSplit known : {PreSplit::Gpt2, PreSplit::Llama3, PreSplit::Qwen2}) {
        if (split["pattern"]["Regex"].get<std::string>() == pattern_of(known)) return split_kind = known, true;
      }
      why = fmt::format("the split pattern {:.300} (tinygpt knows GPT-2's, Llama 3's and Qwen2's: {}, {}, {})",
                        split["pattern"]["Regex"].dump(), kGpt2Pattern, kLlama3Pattern, kQwen2Pattern);
      return false;
    }
  }
  why = fmt::format("the pre-tokenizer {:.200}", p.dump());
  return false;
}

/// The bos id a post_processor puts before a text (-1: none): null, ByteLevel, a TemplateProcessing whose single
/// template is [bos, A] or [A], or a Sequence of those. Throws bad(...) for any other.
template <class Bad>
int32_t read_post_processor(const nlohmann::json& p, const BpeTokenizer& tok, const Bad& bad) {
  if (p.is_null()) return -1;
  const std::string type = p.is_object() ? p.value("type", std::string()) : std::string();
  if (type == "ByteLevel") return -1;
  if (type == "Sequence" && p.contains("processors") && p["processors"].is_array()) {
    int32_t bos = -1;
    for (const auto& q : p["processors"]) bos = std::max(bos, read_post_processor(q, tok, bad));
    return bos;
  }
  if (type == "TemplateProcessing" && p.contains("single") && p["single"].is_array()) {
    const auto& single = p["single"];
    const auto is_sequence = [](const nlohmann::json& piece) {
      return piece.is_object() && piece.contains("Sequence");
    };
    if (single.size() == 1 && is_sequence(single[0])) return -1;
    if (single.size() == 2 && is_sequence(single[1]) && single[0].is_object() && single[0].contains("SpecialToken") &&
        single[0]["SpecialToken"].is_object() && single[0]["SpecialToken"].contains("id") &&
        single[0]["SpecialToken"]["id"].is_string()) {
      const std::string name = single[0]["SpecialToken"]["id"].get<std::string>();
      const int32_t id = tok.added_id(name);
      if (id < 0)
        throw bad(fmt::format("its post-processor adds {}, which is not an added token", nlohmann::json(name).dump()));
      return id;
    }
    throw bad(fmt::format("its post-processor's template {:.200} (tinygpt adds at most a bos before the text)",
                          single.dump()));
  }
  throw bad(fmt::format("the post-processor {:.200}", p.dump()));
}

/// A merge as tokenizer.json spells it ("a b", or ["a", "b"] as tokenizers 0.20 and later write it): its two tokens.
template <class Bad>
std::pair<std::string, std::string> merge_pair(const nlohmann::json& merge, const Bad& bad) {
  if (merge.is_string()) {
    const std::string s = merge.get<std::string>();
    const size_t space = s.find(' ');
    if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
      throw bad(fmt::format("merge {} is not two tokens separated by one space", merge.dump()));
    }
    return {s.substr(0, space), s.substr(space + 1)};
  }
  if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
    return {merge[0].get<std::string>(), merge[1].get<std::string>()};
  }
  throw bad(fmt::format("merge {:.100} is neither \"a b\" nor [\"a\", \"b\"]", merge.dump()));
}

/// What a tokenizer.json of another kind says, by name: SentencePiece's tokenizers as tokenizers writes them (a
/// Unigram model, as T5's; a BPE over SentencePiece pieces with byte fallback and U+2581 for spaces, as Llama 2's,
/// TinyLlama's, Mistral's, Gemma's), another model type, a normalizer other than NFC (Qwen2's, which tinygpt applies).
/// A normalizer that is Unicode's NFC: {"type": "NFC"}, or a Sequence of that one alone.
bool is_nfc(const nlohmann::json& n) {
  if (!n.is_object() || !n.contains("type")) return false;
  if (n["type"] == "NFC") return true;
  return n["type"] == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array() &&
         n["normalizers"].size() == 1 && is_nfc(n["normalizers"][0]);
}

template <class Bad>
void refuse_other_kinds(const nlohmann::json& j, const Bad& bad) {
  const auto& m = j["model"];
  const bool byte_fallback =
      m.contains("byte_fallback") && m["byte_fallback"].is_boolean() && m["byte_fallback"].get<bool>();
  if (m.value("type", std::string()) == "Unigram" || byte_fallback) {
    throw bad(
        fmt::format("it is a SentencePiece tokenizer ({}, as Llama 2's, TinyLlama's, Mistral's and Gemma's are); "
                    "tinygpt reads byte-level BPE tokenizers (GPT-2's, Llama 3's, Qwen2's, SmolLM2's)",
                    byte_fallback ? "a BPE with byte_fallback" : "a Unigram model"));
  }
  if (m.value("type", std::string()) != "BPE") throw bad("its model is not \"BPE\"");
  if (j.contains("normalizer") && !j["normalizer"].is_null() && !is_nfc(j["normalizer"])) {
    const auto& n = j["normalizer"];
    throw bad(fmt::format("it has a normalizer ({}), which tinygpt does not apply (it applies NFC)",
                          n.is_object() && n.contains("type") ? n["type"].dump() : n.dump().substr(0, 60)));
  }
}

/// The pre-split the file's pre_tokenizer asks for (`digits`: SmolLM's digits one by one); else throws bad(why).
template <class Bad>
PreSplit pre_split_of(const nlohmann::json& j, bool& digits, const Bad& bad) {
  std::string why;
  PreSplit split = PreSplit::Gpt2;
  if (!j.contains("pre_tokenizer") || !read_pre_tokenizer(j["pre_tokenizer"], why, digits, split)) {
    throw bad(why.empty() ? "no pre_tokenizer" : why);
  }
  return split;
}

/// The model's vocab, once the model is a plain BPE (no ignored merges, subword affixes or dropout) of at most
/// kMaxBpeVocab tokens; else throws bad(why).
template <class Bad>
const nlohmann::json& plain_bpe_vocab(const nlohmann::json& m, const Bad& bad) {
  if (m.contains("ignore_merges") && m["ignore_merges"].is_boolean() && m["ignore_merges"].get<bool>()) {
    throw bad("ignore_merges is set");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (m.contains(key) && !m[key].is_null() && !(m[key].is_string() && m[key].get<std::string>().empty())) {
      throw bad(fmt::format("its model has a {}", key));
    }
  }
  if (m.contains("dropout") && !m["dropout"].is_null()) throw bad("its model has BPE dropout");
  if (!m.contains("vocab") || !m["vocab"].is_object()) throw bad("no vocab object");
  const auto& vocab = m["vocab"];
  if (int64_t(vocab.size()) > kMaxBpeVocab)
    throw bad(fmt::format("{} tokens, more than {}", vocab.size(), kMaxBpeVocab));
  return vocab;
}

/// An added token's id and content, once it has both, none of the flags tinygpt does not apply and an id under
/// kMaxBpeVocab; else throws bad(why).
template <class Bad>
std::pair<uint64_t, std::string> added_token_of(const nlohmann::json& t, const Bad& bad) {
  if (!t.is_object() || !t.contains("id") || !t["id"].is_number_unsigned() || !t.contains("content") ||
      !t["content"].is_string()) {
    throw bad(fmt::format("added token {:.100} has no id or content", t.dump()));
  }
  const auto id = t["id"].get<uint64_t>();
  std::string content = t["content"].get<std::string>();
  for (const char* flag : {"single_word", "lstrip", "rstrip"}) {
    if (t.value(flag, false)) throw bad(fmt::format("added token {} has {} set", nlohmann::json(content).dump(), flag));
  }
  if (id >= uint64_t(kMaxBpeVocab)) {
    throw bad(fmt::format("added token {} has id {}: more than {} tokens", content, id, kMaxBpeVocab));
  }
  return {id, std::move(content)};
}

}  // namespace

BpeTokenizer BpeTokenizer::from_json(std::string_view text, const std::string& what) {
  const auto bad = [&](const std::string& why) {
    return Error(fmt::format("'{}' is not a byte-level BPE tokenizer tinygpt can read: {}", what, why));
  };
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw bad("it is not valid JSON");
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) throw bad("no \"model\" object");
  const auto& m = j["model"];
  refuse_other_kinds(j, bad);
  bool digits = false;
  const PreSplit split = pre_split_of(j, digits, bad);
  const auto& vocab = plain_bpe_vocab(m, bad);

  BpeTokenizer tok;
  tok.individual_digits_ = digits;
  tok.nfc_ = j.contains("normalizer") && !j["normalizer"].is_null();  // refuse_other_kinds let only NFC through
  tok.pre_split_ = split;
  tok.tokens_.assign(vocab.size(), std::string());
  std::vector<bool> seen(vocab.size(), false);
  std::unordered_map<std::string, uint32_t> id_of;  // spelled token -> id
  std::string bytes;
  for (const auto& [spelled, id_json] : vocab.items()) {
    if (!id_json.is_number_unsigned() || id_json.get<uint64_t>() >= vocab.size()) {
      throw bad(fmt::format("token {} has id {}; ids must be 0 to {}, each once", nlohmann::json(spelled).dump(),
                            id_json.dump(), vocab.size() - 1));
    }
    const auto id = id_json.get<uint32_t>();
    if (seen[id]) throw bad(fmt::format("id {} is given to two tokens", id));
    seen[id] = true;
    tok.tokens_[id] = kByteChars.unspell(spelled, bytes) ? bytes : spelled;  // special tokens are spelled as they are
    id_of.emplace(spelled, id);
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = id_of.find(kByteChars.of_byte[size_t(b)]);
    if (it == id_of.end()) throw bad(fmt::format("byte 0x{:02x} has no token", b));
    tok.byte_ids_[size_t(b)] = it->second;
  }
  if (!m.contains("merges") || !m["merges"].is_array()) throw bad("no merges array");
  for (const auto& merge : m["merges"]) {
    const auto [left, right] = merge_pair(merge, bad);
    const auto l = id_of.find(left), r = id_of.find(right), result = id_of.find(left + right);
    if (l == id_of.end() || r == id_of.end() || result == id_of.end()) {
      throw bad(fmt::format("merge {:.100} names a token that is not in the vocabulary", merge.dump()));
    }
    tok.merges_.push_back({l->second, r->second, result->second});
  }
  tok.model_vocab_ = tok.tokens_.size();
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    std::vector<bool> is_added;
    for (const auto& t : j["added_tokens"]) {
      const auto [id, content] = added_token_of(t, bad);
      if (id == tok.tokens_.size()) {
        tok.tokens_.push_back(content);
      } else if (id > tok.tokens_.size()) {
        throw bad(fmt::format("added token {} has id {}, past the vocabulary's {}", content, id, tok.tokens_.size()));
      } else {
        tok.tokens_[id] = content;
      }
      if (is_added.size() <= id) is_added.resize(id + 1, false);
      if (is_added[id]) throw bad(fmt::format("id {} is given to two added tokens", id));
      is_added[id] = true;
      tok.added_.push_back({uint32_t(id), content, t.value("special", false)});
      if (content == kEndOfText) tok.end_of_text_ = int32_t(id);
    }
  }
  if (j.contains("post_processor")) tok.bos_ = read_post_processor(j["post_processor"], tok, bad);
  tok.index();
  return tok;
}

}  // namespace tinygpt::data

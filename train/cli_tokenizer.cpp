#include "train/cli_tokenizer.h"

#include <fmt/core.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "data/bpe.h"
#include "data/documents.h"
#include "data/text.h"
#include "train/checkpoint.h"
#include "train/console.h"

namespace tinygpt {

namespace fs = std::filesystem;

namespace {

data::Tokenizer tokenizer_of(const TokenizerArgs& a) {
  if (!a.tokenizer.empty()) return data::Tokenizer(data::read_tokenizer_file(a.tokenizer));
  return load_checkpoint(a.ckpt).tokenizer;
}

/// Ids from "1 2 3" or "1,2,3"; throws naming one that is not an id of the tokenizer.
std::vector<uint32_t> parse_ids(const std::string& text, const data::Tokenizer& tok) {
  std::vector<uint32_t> ids;
  std::string word;
  const auto flush = [&] {
    if (word.empty()) return;
    size_t used = 0;
    unsigned long long v = 0;
    try {
      v = std::stoull(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size() || word[0] == '-' || v >= uint64_t(tok.vocab_size())) {
      throw Error(fmt::format("--ids: '{}' is not a token id of this tokenizer (0 to {})", word, tok.vocab_size() - 1));
    }
    ids.push_back(uint32_t(v));
    word.clear();
  };
  for (const char c : text) {
    if (c == ' ' || c == ',' || c == '\t' || c == '\n') {
      flush();
    } else {
      word += c;
    }
  }
  flush();
  return ids;
}

}  // namespace

void add_tokenizer_options(CLI::App& tokenizer, TokenizerArgs& a) {
  CLI::App* cmd = &tokenizer;
  cmd->require_subcommand(1);
  CLI::App* train = cmd->add_subcommand("train",
                                        "Learn a byte-level BPE (GPT-2's pre-split) from text files and write it as "
                                        "a Hugging Face tokenizer.json");
  train->add_option("--data", a.data, "Files, directories (walked; text files only) and globs, repeatable")
      ->required()
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  train->add_option("--vocab-size", a.vocab_size, "Tokens: the 256 bytes, the merges and <|endoftext|> (257 to 65536)")
      ->capture_default_str();
  train->add_option("--out", a.out, "tokenizer.json to write")->required();
  const auto source = [&a](CLI::App* sub) {
    sub->add_option("--tokenizer", a.tokenizer, "A tokenizer.json file");
    sub->add_option("--ckpt", a.ckpt, "A checkpoint or run directory: its tokenizer (a BPE, or its characters)");
  };
  CLI::App* encode = cmd->add_subcommand("encode",
                                         "Print the ids of --text on one line, or write every --data document's "
                                         "ids, each followed by <|endoftext|>, to --out as little-endian uint32");
  source(encode);
  encode->add_option("--text", a.text, "Text to encode");
  encode->add_option("--data", a.data, "Files, directories and globs to encode, repeatable")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  encode->add_option("--out", a.out, "With --data: the file of ids to write");
  CLI::App* decode = cmd->add_subcommand("decode", "Print the text of ids, exactly (no newline is added)");
  source(decode);
  decode->add_option("--ids", a.ids, "Ids separated by spaces or commas")->required();
}

void validate_tokenizer(const CLI::App& app, const TokenizerArgs& a) {
  if (app.got_subcommand("train")) {
    if (a.vocab_size < data::kMinBpeVocab || a.vocab_size > data::kMaxTrainedBpeVocab) {
      throw Error(fmt::format("--vocab-size must be in [{}, {}] (256 bytes, the merges and <|endoftext|>), got {}",
                              data::kMinBpeVocab, data::kMaxTrainedBpeVocab, a.vocab_size));
    }
    return;
  }
  if (a.tokenizer.empty() == a.ckpt.empty()) throw Error("give the tokenizer as one of --tokenizer FILE or --ckpt RUN");
  if (app.got_subcommand("encode")) {
    if (a.text.has_value() == !a.data.empty()) throw Error("give one of --text TEXT or --data PATH... --out FILE");
    if (!a.data.empty() && a.out.empty()) throw Error("--data needs --out FILE: the ids are written there");
  }
}

void run_tokenizer(const CLI::App& app, const TokenizerArgs& a) {
  const auto note = [](const std::string& line) { fmt::print(stderr, "{}\n", line); };
  if (app.got_subcommand("train")) {
    const data::FileList files = data::list_text_files(a.data, note);
    const data::PieceCounts counts = data::count_pieces(files);
    const auto t0 = std::chrono::steady_clock::now();
    const data::BpeTokenizer bpe = data::BpeTokenizer::train(counts, {.vocab_size = a.vocab_size, .progress = {}});
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    data::write_text_file(a.out, bpe.to_json());
    fmt::print(stderr, "learned {} merges in {:.1f}s{}; wrote {} ({} tokens, <|endoftext|> is id {})\n", bpe.merges(),
               secs, bpe.vocab_size() < a.vocab_size ? " (no pair occurs twice any more: a smaller vocabulary)" : "",
               a.out, bpe.vocab_size(), bpe.end_of_text());
    return;
  }
  const data::Tokenizer tok = tokenizer_of(a);
  if (app.got_subcommand("encode")) {
    if (a.text) {
      const std::vector<uint32_t> ids = tok.encode_prompt(*a.text, "--text");
      std::string line;
      for (size_t i = 0; i < ids.size(); ++i) line += fmt::format("{}{}", i ? " " : "", ids[i]);
      fmt::print("{}\n", line);
      return;
    }
    const SignalsEndPass signals;  // Ctrl-C while the ids are written: the temporary file goes
    const int64_t n = data::write_document_ids(data::list_text_files(a.data, note), tok, a.out);
    fmt::print(stderr, "wrote {} ids to {}\n", n, a.out);
    return;
  }
  const std::string text = tok.decode(parse_ids(a.ids, tok));
  std::fwrite(text.data(), 1, text.size(), stdout);
}

}  // namespace tinygpt

#include "train/training_data.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>

#include "data/documents.h"
#include "data/text.h"
#include "train/checkpoint.h"
#include "train/console.h"

namespace tinygpt {

namespace fs = std::filesystem;

double bits_per_byte(double loss, size_t tokens, int64_t bytes) {
  return bytes > 0 ? loss * double(tokens) / (double(bytes) * std::log(2.0)) : NAN;
}

int64_t source_bytes(data::TokenSpan ids, const data::Tokenizer& tok) {
  std::vector<int64_t> bytes_of(size_t(tok.vocab_size()));
  for (size_t id = 0; id < bytes_of.size(); ++id) bytes_of[id] = tok.source_bytes(uint32_t(id));
  int64_t total = 0;
  for (const uint32_t id : ids) total += id < bytes_of.size() ? bytes_of[id] : 0;
  return total;
}

data::Tokenizer tokenizer_from_flag(const std::string& flag, int64_t vocab_size, const data::FileList& files,
                                    double train_fraction, bool quiet) {
  if (flag == "char") return data::Tokenizer(data::CharVocab());
  if (flag == "bpe") {
    const std::vector<bool> held_out = data::held_out_documents(files.size(), train_fraction);
    data::FileList train_files;
    for (size_t i = 0; i < files.size(); ++i) {
      if (!held_out[i]) train_files.push_back(files[i]);
    }
    // Too few documents to hold whole ones out: the last fraction of the ids validates, so the tokenizer learns from
    // the leading fraction of the bytes.
    int64_t max_bytes = -1;
    if (train_files.size() == files.size()) {
      int64_t total = 0;
      for (const auto& f : files) total += int64_t(fs::file_size(f));
      max_bytes = int64_t(double(total) * train_fraction);
    }
    const data::PieceCounts counts = data::count_pieces(train_files, quiet, max_bytes);
    const auto t0 = std::chrono::steady_clock::now();
    data::BpeTokenizer bpe = data::BpeTokenizer::train(counts, {.vocab_size = vocab_size, .progress = {}});
    if (!quiet) {
      fmt::print(stderr, "trained a byte-level BPE of {} tokens ({} merges) in {:.1f}s\n", bpe.vocab_size(),
                 bpe.merges(), std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return data::Tokenizer(std::move(bpe));
  }
  return data::Tokenizer(data::read_tokenizer_file(flag));
}

std::vector<uint32_t> document_separator(const data::Tokenizer& tok, const std::string& doc_separator, size_t files,
                                         const std::string& what) {
  if (!tok.is_bpe() && files == 1) return {};
  return tok.document_suffix(doc_separator, what);
}

std::string fine_tuned_from(const Checkpoint& ckpt) {
  const nlohmann::json& c = ckpt.state.train_config;
  return c.is_object() && c.contains("init_from") && c["init_from"].is_string() ? c["init_from"].get<std::string>()
                                                                                : "";
}

double run_train_fraction(const Checkpoint& ckpt) {
  const nlohmann::json& c = ckpt.state.train_config;
  const double f = c.is_object() && c.contains("train_fraction") && c["train_fraction"].is_number()
                       ? c["train_fraction"].get<double>()
                       : 0.9;
  return f > 0 && f < 1 ? f : 0.9;
}

TrainingData load_training_data(const TrainConfig& cfg, const fs::path& out, const data::Tokenizer* given, bool quiet,
                                bool lead) {
  const SignalsEndPass signals;  // Ctrl-C while the token cache is written: its temporary files go, exit 130
  const auto note = [&](const std::string& line) {
    if (!quiet) fmt::print(stderr, "{}\n", line);
  };
  const data::FileList files = data::list_text_files(cfg.data, note);
  const auto t0 = std::chrono::steady_clock::now();
  TrainingData d;
  if (cfg.sft) {  // the train config's check: a checkpoint is given
    d.tokenizer = *given;
    const data::ChatTemplate tpl = data::chat_template_for(given->config(), cfg.chat_template);
    d.chat = data::load_conversations(files, tpl, d.tokenizer, cfg.model.block_size, cfg.train_fraction);
    d.summary = fmt::format("{} ({:.2f}s)", d.chat->summary,
                            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return d;
  }
  const bool trained_by_lead = given == nullptr && cfg.tokenizer == "bpe" && !lead;
  d.tokenizer = given != nullptr ? *given
                : trained_by_lead
                    ? data::Tokenizer(data::read_tokenizer_file(out / "tokenizer.json"))
                    : tokenizer_from_flag(cfg.tokenizer, cfg.vocab_size, files, cfg.train_fraction, quiet);
  // A character model's --doc-sep goes between its files; in one text it ends documents where it occurs, so its
  // characters must be the text's (use_document_separator says so) and nothing is put after the text.
  if (!d.tokenizer.is_bpe() && d.tokenizer.vocab_size() == 0) {
    d.tokenizer = data::Tokenizer(data::vocab_of_files(files, files.size() == 1 ? "" : cfg.model.doc_separator));
  }
  if (given == nullptr && cfg.tokenizer == "bpe" && lead)
    data::write_text_file(out / "tokenizer.json", d.tokenizer.bpe().to_json());
  const std::vector<uint32_t> separator =
      document_separator(d.tokenizer, cfg.model.doc_separator, files.size(), "--doc-sep");
  data::DocumentCorpus dc =
      data::load_documents(files, d.tokenizer, separator, cfg.train_fraction, out / "tokens.bin", quiet);
  d.tokens = std::move(dc.tokens);
  const auto ids = d.tokens.ids();
  d.split = {ids.first(dc.train_count), ids.subspan(dc.train_count)};  // d.tokens holds them now
  d.train_bytes = dc.train_bytes;
  d.val_bytes = dc.val_bytes;
  d.summary = fmt::format(
      "data: {} file{}, {} tokens, {} of {} ({}; {} file{} encoded, {} mapped from {}, {:.2f}s); train {} / val {} "
      "tokens{}",
      files.size(), files.size() == 1 ? "" : "s", ids.size(), d.tokenizer.kind(), d.tokenizer.vocab_size(),
      given != nullptr          ? "the checkpoint's"
      : cfg.tokenizer == "char" ? "the data's characters"
      : cfg.tokenizer == "bpe"  ? "trained here, saved as tokenizer.json"
                                : cfg.tokenizer,
      dc.encoded, dc.encoded == 1 ? "" : "s", dc.reused, (out / "tokens.bin").string(),
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), d.split.train.size(),
      d.split.val.size(),
      dc.held_out_documents > 0 ? fmt::format(" ({} whole documents held out)", dc.held_out_documents) : "");
  return d;
}

}  // namespace tinygpt

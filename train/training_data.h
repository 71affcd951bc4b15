// What `train` reads: --data's files as token ids under the run's tokenizer (its characters, a tokenizer.json, a BPE
// trained here on the training documents, or the checkpoint's when resuming or fine-tuning), split into train and
// held-out ids, with the UTF-8 bytes each split stands for (bits per byte).
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "../data/conversations.h"
#include "../data/corpus.h"
#include "../data/tokenizer.h"
#include "console.h"
#include "trainer.h"

namespace tinygpt {

struct TrainingData {
  data::Tokenizer tokenizer;
  data::TokenData tokens;
  data::Split split;
  int64_t train_bytes = 0, val_bytes = 0;     // source bytes of each split's ids
  std::string summary;                        // the "data: ..." line
  std::optional<data::ConversationSet> chat;  // sft: the conversations, in rows (tokens and split are then empty)
};

/// What follows each document of `files` documents in the token cache: a BPE's end-of-text token; a character
/// model's --doc-sep ids between several files, nothing after one text (its separators are in it).
std::vector<uint32_t> document_separator(const data::Tokenizer& tok, const std::string& doc_separator, size_t files,
                                         const std::string& what);

/// The checkpoint a run's weights came from (its --init-from, kept in the checkpoint's training config), or "".
std::string fine_tuned_from(const Checkpoint& ckpt);

/// The train fraction the checkpoint's run trained with (its training config), else the default 0.9.
double run_train_fraction(const Checkpoint& ckpt);

/// Loads --data into `out`'s token cache. `given` is the tokenizer of a checkpoint the run starts from (--resume,
/// --init-from), or null. The lead rank trains a BPE (--tokenizer bpe) and writes it to out/tokenizer.json; the other
/// ranks, which call this after it, read it from there. With cfg.sft, --data's JSON lines of conversations under the
/// checkpoint's tokenizer and chat template (--chat-template's where given) instead.
TrainingData load_training_data(const TrainConfig& cfg, const std::filesystem::path& out, const data::Tokenizer* given,
                                bool quiet, bool lead = true);

/// The tokenizer --tokenizer names: "char" (an empty CharVocab: the data's characters decide), "bpe" (trained on
/// `files`' training documents with --vocab-size), or a tokenizer.json file.
data::Tokenizer tokenizer_from_flag(const std::string& flag, int64_t vocab_size, const data::FileList& files,
                                    double train_fraction, bool quiet);

/// Bits per byte of a mean loss in nats per token over `tokens` ids that stand for `bytes` bytes.
double bits_per_byte(double loss, size_t tokens, int64_t bytes);

/// UTF-8 bytes the ids stand for under the tokenizer.
int64_t source_bytes(data::TokenSpan ids, const data::Tokenizer& tok);

}  // namespace tinygpt

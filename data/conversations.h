// Conversations for fine-tuning (sft) and their loss (eval --chat-data): JSON lines of OpenAI's {"messages": [...]} or
// ShareGPT's {"conversations": [{"from", "value"}]}, rendered with the model's chat template and tokenized, each token
// marked where it is the assistant's (a reply's content and its end of turn): the loss is on those only.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "chat.h"
#include "corpus.h"

namespace tinygpt::data {

/// Conversations as token rows: conversation i is ids[starts[i], starts[i + 1]); mask[k] is 1 where ids[k] is the
/// assistant's.
struct ConversationTokens {
  std::vector<uint32_t> ids;
  std::vector<uint8_t> mask;
  std::vector<uint64_t> starts{0};
  int64_t assistant_tokens = 0;
  size_t size() const { return starts.size() - 1; }
  Rows rows() const { return {ids, mask, starts}; }
  /// Appends one conversation.
  void add(const std::vector<uint32_t>& conv_ids, const std::vector<uint8_t>& conv_mask);
};

/// The conversations of a JSON-lines file, in order; a line that is not one (bad JSON, no messages, a message without
/// a string role and content, an unknown ShareGPT "from") throws naming the file and line. Blank lines are skipped.
std::vector<Messages> read_conversations(const std::filesystem::path& path);

/// A conversation rendered (no generation prompt) and tokenized as one text, and which of its tokens are the
/// assistant's: each reply's span is what rendering the conversation up to it adds after the assistant's opening
/// (`render(..., add_generation_prompt=True)` of the messages before it), up to and including the end of turn. Throws
/// for a template that does not render a conversation's start the same way once more follows.
void tokenize_conversation(const Messages& conversation, const ChatTemplate& chat_template, const Tokenizer& tokenizer,
                           std::vector<uint32_t>& ids, std::vector<uint8_t>& mask);

struct ConversationSet {
  ConversationTokens train, val;
  int64_t cut = 0;      // longer than the context: cut to it
  int64_t skipped = 0;  // no assistant token within the context
  std::string summary;  // the "data: ..." line
};

/// The conversations tokenized, each cut to `context` + 1 tokens (counted) and dropped where no assistant's token is
/// left after its first (counted): those `held_out` marks into val, the others into train.
ConversationSet encode_conversations(const std::vector<Messages>& conversations, const std::vector<bool>& held_out,
                                     const ChatTemplate& chat_template, const Tokenizer& tokenizer, int64_t context);

/// The conversations of the files, held out whole (every k-th, as documents are), each cut to `context` + 1 tokens.
ConversationSet load_conversations(const FileList& files, const ChatTemplate& chat_template, const Tokenizer& tokenizer,
                                   int64_t context, double train_fraction);

}  // namespace tinygpt::data

// Conversations and the chat templates that render them: a model's template travels in its checkpoint (from its
// tokenizer_config.json or GGUF file) and is rendered by data/jinja.h exactly as transformers' apply_chat_template
// renders it; ChatML and Llama 3's templates are built in for models that have none.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "jinja.h"
#include "tokenizer.h"

namespace tinygpt::data {

/// OpenAI's messages: a JSON array of objects, each with a string "role" and a string "content".
using Messages = nlohmann::ordered_json;

class ChatTemplate {
 public:
  /// `name` says where `source` came from ("the model's", "chatml", a file's path) in messages. Throws Error naming it,
  /// the line and the construct for a template outside what tinygpt reads.
  ChatTemplate(std::string name, const std::string& source);
  const std::string& name() const { return name_; }
  /// The conversation as the model reads it: apply_chat_template(messages, tokenize=False, add_generation_prompt=...),
  /// with the tokenizer's bos and eos tokens and no tools. Throws Error naming the template for one it cannot render.
  std::string render(const Messages& messages, bool add_generation_prompt, const TokenizerConfig& tc) const;
  /// What closes an assistant's turn in this template ("<|im_end|>" for ChatML, "<|eot_id|>" for Llama 3): the text
  /// the template writes right after a reply, up to the end of that line; empty where it writes none.
  std::string end_of_turn(const TokenizerConfig& tc) const;

 private:
  std::string name_;
  std::shared_ptr<const jinja::Template> template_;
};

/// The built-in templates' names, for flags and messages.
inline constexpr const char* kBuiltinChatTemplates = "chatml, llama3";
/// The source of a built-in template ("chatml" or "llama3"); throws Error for another name.
std::string builtin_chat_template(const std::string& name);
/// A byte-level BPE without a chat template made ready for ChatML (what sft gives a model trained here): ChatML as
/// its template, and <|im_start|> and <|im_end|> added as special tokens where it lacks them, with the ids after its
/// own. Returns the tokens added.
std::vector<std::string> add_chatml_tokens(Tokenizer& tokenizer);

/// The template `choice` names: empty for the model's own (ChatML where it has none), "chatml", "llama3", or the path
/// of a file holding a Jinja template. Throws Error for a file that cannot be read or a template outside the subset.
ChatTemplate chat_template_for(const TokenizerConfig& tc, const std::string& choice);
/// Reads a JSON array of messages (`what` names its source in errors): each an object with a string "role" and a
/// string "content" (other keys are kept for the template). Throws Error naming the message at fault.
Messages parse_messages(const std::string& text, const std::string& what);

}  // namespace tinygpt::data

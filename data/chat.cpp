#include "data/chat.h"

#include <fmt/format.h>

#include <filesystem>

#include "data/text.h"
#include "kernels/base.h"

namespace tinygpt::data {
namespace {

// The ChatML template transformers long used as its default, and Meta Llama 3 Instruct's.
constexpr const char* kChatml =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + "
    "'\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
constexpr const char* kLlama3 =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

}  // namespace

ChatTemplate::ChatTemplate(std::string name, const std::string& source) : name_(std::move(name)) {
  if (!valid_utf8(source)) throw Error(fmt::format("the chat template {} is not valid UTF-8", name_));
  try {
    template_ = std::make_shared<const jinja::Template>(source);
  } catch (const Error& e) {
    throw Error(fmt::format("the chat template {} cannot be read: {}; give another with --chat-template {} or FILE",
                            name_, e.what(), kBuiltinChatTemplates));
  }
}

std::string ChatTemplate::render(const Messages& messages, bool add_generation_prompt,
                                 const TokenizerConfig& tc) const {
  nlohmann::ordered_json context = {{"messages", messages},
                                    {"add_generation_prompt", add_generation_prompt},
                                    {"tools", nullptr},
                                    {"documents", nullptr}};
  if (!tc.bos_token.empty()) context["bos_token"] = tc.bos_token;
  if (!tc.eos_token.empty()) context["eos_token"] = tc.eos_token;
  try {
    return template_->render(context);
  } catch (const Error& e) {
    throw Error(fmt::format("the chat template {} cannot render this conversation: {}", name_, e.what()));
  }
}

std::string ChatTemplate::end_of_turn(const TokenizerConfig& tc) const {
  static const std::string marker = "tinygpt-reply-marker-5e1f";
  const Messages probe = {{{"role", "user"}, {"content", "hello"}}, {{"role", "assistant"}, {"content", marker}}};
  std::string text;
  try {
    text = render(probe, false, tc);
  } catch (const Error&) {
    return "";  // a template that refuses the probe: replies end at the end-of-text token only
  }
  const size_t at = text.rfind(marker);
  if (at == std::string::npos) return "";
  std::string after = text.substr(at + marker.size());
  after = after.substr(0, after.find('\n'));
  while (!after.empty() && (after.back() == ' ' || after.back() == '\t')) after.pop_back();
  return after;
}

std::string builtin_chat_template(const std::string& name) {
  if (name == "chatml") return kChatml;
  if (name == "llama3") return kLlama3;
  throw Error(fmt::format("no built-in chat template '{}' ({})", name, kBuiltinChatTemplates));
}

std::vector<std::string> add_chatml_tokens(Tokenizer& tokenizer) {
  if (!tokenizer.is_bpe()) throw Error("ChatML's tokens are added to a byte-level BPE only");
  std::vector<std::string> added;
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(tokenizer.bpe().to_json());
  auto next = uint64_t(tokenizer.vocab_size());  // ids are unsigned in tokenizer.json
  for (const char* token : {"<|im_start|>", "<|im_end|>"}) {
    if (tokenizer.bpe().added_id(token) >= 0) continue;
    j["added_tokens"].push_back({{"id", next++},
                                 {"content", token},
                                 {"single_word", false},
                                 {"lstrip", false},
                                 {"rstrip", false},
                                 {"normalized", false},
                                 {"special", true}});
    added.emplace_back(token);
  }
  TokenizerConfig config = tokenizer.config();
  config.chat_template = kChatml;
  tokenizer = Tokenizer(added.empty() ? tokenizer.bpe()
                                      : BpeTokenizer::from_json(j.dump(),
                                                                "the tokenizer with ChatML's "
                                                                "tokens"),
                        config);
  return added;
}

ChatTemplate chat_template_for(const TokenizerConfig& tc, const std::string& choice) {
  if (choice.empty()) {
    if (!tc.chat_template.empty()) return ChatTemplate("of the model", tc.chat_template);
    return ChatTemplate("chatml", kChatml);
  }
  if (choice == "chatml") return ChatTemplate("chatml", kChatml);
  if (choice == "llama3") return ChatTemplate("llama3", kLlama3);
  if (std::error_code ec; !std::filesystem::exists(choice, ec)) {
    throw Error(fmt::format("--chat-template {}: no such file, and not a built-in template ({})", choice,
                            kBuiltinChatTemplates));
  }
  return ChatTemplate(choice, read_text_file(choice));
}

Messages parse_messages(const std::string& text, const std::string& what) {
  Messages m;
  try {
    m = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{} is not JSON: {}", what, e.what()));
  }
  if (!m.is_array()) throw Error(fmt::format("{} must be a JSON array of messages ({{\"role\", \"content\"}})", what));
  for (size_t k = 0; k < m.size(); ++k) {
    const auto& x = m[k];
    if (!x.is_object() || !x.contains("role") || !x["role"].is_string() || !x.contains("content") ||
        !x["content"].is_string()) {
      throw Error(
          fmt::format("{}: message {} must be an object with a string \"role\" and a string \"content\"", what, k));
    }
  }
  return m;
}

}  // namespace tinygpt::data

#include "data/conversations.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>

#include "data/documents.h"
#include "data/text.h"
#include "kernels/base.h"

namespace tinygpt::data {

namespace fs = std::filesystem;

void ConversationTokens::add(const std::vector<uint32_t>& conv_ids, const std::vector<uint8_t>& conv_mask) {
  ids.insert(ids.end(), conv_ids.begin(), conv_ids.end());
  mask.insert(mask.end(), conv_mask.begin(), conv_mask.end());
  starts.push_back(ids.size());
  for (const uint8_t m : conv_mask) assistant_tokens += m;
}

namespace {

/// One line's conversation: OpenAI's messages, or ShareGPT's conversations with from human/gpt/system.
Messages conversation_of(const nlohmann::ordered_json& j, const std::string& where) {
  if (!j.is_object()) throw Error(fmt::format("{}: not a JSON object", where));
  if (j.contains("messages")) return parse_messages(j["messages"].dump(), where + ": \"messages\"");
  if (!j.contains("conversations") || !j["conversations"].is_array()) {
    throw Error(fmt::format("{}: neither \"messages\" (OpenAI's) nor \"conversations\" (ShareGPT's) is there", where));
  }
  Messages m = Messages::array();
  for (size_t k = 0; k < j["conversations"].size(); ++k) {
    const auto& turn = j["conversations"][k];
    if (!turn.is_object() || !turn.contains("from") || !turn["from"].is_string() || !turn.contains("value") ||
        !turn["value"].is_string()) {
      throw Error(fmt::format("{}: turn {} must be an object with a string \"from\" and a string \"value\"", where, k));
    }
    const std::string from = turn["from"].get<std::string>();
    const char* role = from == "human" || from == "user"      ? "user"
                       : from == "gpt" || from == "assistant" ? "assistant"
                       : from == "system"                     ? "system"
                                                              : nullptr;
    if (role == nullptr) {
      throw Error(
          fmt::format("{}: turn {} is from \"{}\"; ShareGPT's turns are from human, gpt or system", where, k, from));
    }
    m.push_back({{"role", role}, {"content", turn["value"]}});
  }
  return m;
}

/// Appends the ids of `text` and its mask value.
void append(const Tokenizer& tok, std::string_view text, uint8_t is_assistant, std::vector<uint32_t>& ids,
            std::vector<uint8_t>& mask) {
  const std::vector<uint32_t> piece = tok.encode_rendered(text, "a conversation");
  ids.insert(ids.end(), piece.begin(), piece.end());
  mask.insert(mask.end(), piece.size(), is_assistant);
}

}  // namespace

std::vector<Messages> read_conversations(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("'{}' cannot be opened", path.string()));
  std::vector<Messages> out;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    const std::string where = fmt::format("{}:{}", path.string(), n);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (!valid_utf8(line)) throw Error(fmt::format("{}: not valid UTF-8", where));
    nlohmann::ordered_json j;
    try {
      j = nlohmann::ordered_json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("{}: not JSON ({})", where, e.what()));
    }
    out.push_back(conversation_of(j, where));
  }
  if (in.bad()) throw Error(fmt::format("'{}' cannot be read", path.string()));
  return out;
}

void tokenize_conversation(const Messages& conversation, const ChatTemplate& chat_template, const Tokenizer& tokenizer,
                           std::vector<uint32_t>& ids, std::vector<uint8_t>& mask) {
  const TokenizerConfig& tc = tokenizer.config();
  const std::string whole = chat_template.render(conversation, false, tc);
  const std::string end_of_turn = chat_template.end_of_turn(tc);
  size_t done = 0;  // bytes of `whole` tokenized so far
  for (size_t k = 0; k < conversation.size(); ++k) {
    if (conversation[k]["role"] != "assistant") continue;
    const Messages before(conversation.begin(), conversation.begin() + int64_t(k));
    const Messages through(conversation.begin(), conversation.begin() + int64_t(k) + 1);
    const std::string opening = chat_template.render(before, true, tc),
                      closed = chat_template.render(through, false, tc);
    if (closed.compare(0, opening.size(), opening) != 0 || whole.compare(0, closed.size(), closed) != 0 ||
        opening.size() < done) {
      throw Error(
          fmt::format("the chat template {} renders a conversation's start otherwise once more messages follow, "
                      "so the assistant's tokens of message {} cannot be told apart",
                      chat_template.name(), k));
    }
    // The reply: from the assistant's opening to its end of turn, the end of turn included.
    size_t end = closed.size();
    if (!end_of_turn.empty()) {
      const size_t at = closed.find(end_of_turn, opening.size());
      if (at != std::string::npos) end = at + end_of_turn.size();
    }
    append(tokenizer, std::string_view(whole).substr(done, opening.size() - done), 0, ids, mask);
    append(tokenizer, std::string_view(whole).substr(opening.size(), end - opening.size()), 1, ids, mask);
    done = end;
  }
  append(tokenizer, std::string_view(whole).substr(done), 0, ids, mask);
}

ConversationSet encode_conversations(const std::vector<Messages>& conversations, const std::vector<bool>& held_out,
                                     const ChatTemplate& chat_template, const Tokenizer& tokenizer, int64_t context) {
  ConversationSet set;
  std::vector<uint32_t> ids;
  std::vector<uint8_t> mask;
  for (size_t i = 0; i < conversations.size(); ++i) {
    ids.clear();
    mask.clear();
    tokenize_conversation(conversations[i], chat_template, tokenizer, ids, mask);
    if (int64_t(ids.size()) > context + 1) {
      ids.resize(size_t(context + 1));
      mask.resize(size_t(context + 1));
      ++set.cut;
    }
    // A row's targets are its tokens after the first: one of them must be the assistant's.
    if (mask.size() < 2 || std::find(mask.begin() + 1, mask.end(), uint8_t(1)) == mask.end()) {
      ++set.skipped;
      continue;
    }
    (held_out[i] ? set.val : set.train).add(ids, mask);
  }
  return set;
}

ConversationSet load_conversations(const FileList& files, const ChatTemplate& chat_template, const Tokenizer& tokenizer,
                                   int64_t context, double train_fraction) {
  std::vector<Messages> all;
  for (const std::string& f : files) {
    for (Messages& m : read_conversations(f)) all.push_back(std::move(m));
  }
  if (all.empty()) throw Error("the --data files hold no conversations (JSON lines of {\"messages\": [...]})");
  ConversationSet set =
      encode_conversations(all, held_out_documents(all.size(), train_fraction), chat_template, tokenizer, context);
  if (set.train.size() == 0) throw Error("no conversation with an assistant's reply is left to train on");
  if (set.val.size() == 0) {
    throw Error(
        fmt::format("no conversation is held out for validation ({} in all, --train-fraction {}): give more "
                    "conversations or a smaller --train-fraction",
                    all.size(), train_fraction));
  }
  set.summary = fmt::format(
      "data: {} conversations ({} train, {} held out), {} assistant tokens to train on ({} held "
      "out), template {}",
      all.size(), set.train.size(), set.val.size(), set.train.assistant_tokens, set.val.assistant_tokens,
      chat_template.name());
  // A batch row is one conversation padded to the context: the share of positions that are padding (the rows are
  // drawn uniformly, so a batch's share is this on average).
  int64_t filled = 0;
  for (size_t i = 0; i < set.train.size(); ++i) {
    filled += std::min<int64_t>(int64_t(set.train.starts[i + 1] - set.train.starts[i]), context);
  }
  set.summary += fmt::format("; rows of {} positions, {:.0f}% of them padding", context,
                             100.0 * (1.0 - double(filled) / (double(set.train.size()) * double(context))));
  if (set.cut > 0) set.summary += fmt::format("; {} longer than the context of {} tokens, cut", set.cut, context);
  if (set.skipped > 0) set.summary += fmt::format("; {} with no reply within the context, skipped", set.skipped);
  return set;
}

}  // namespace tinygpt::data

#include "train/serve_api.h"

#include <fmt/format.h>

#include <cmath>

namespace tinygpt {
namespace {

using json = nlohmann::json;

std::string type_name(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

ApiError wrong_type(const std::string& param, const std::string& wanted, const json& v) {
  return bad_request(param, fmt::format("'{}' must be {}, got {}", param, wanted, type_name(v)), "invalid_type");
}

double number(const json& body, const std::string& key, double lo, double hi) {
  const json& v = body[key];
  if (!v.is_number()) throw wrong_type(key, "a number", v);
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi)) throw bad_request(key, fmt::format("'{}' must lie in [{}, {}], got {}", key, lo, hi, x));
  return x;
}

int64_t integer(const json& body, const std::string& key, int64_t lo, int64_t hi) {
  const json& v = body[key];
  if (!v.is_number_integer()) throw wrong_type(key, "an integer", v);
  // An unsigned above INT64_MAX reads as out of range, not as a wrapped negative number.
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(hi)) {
    throw bad_request(key, fmt::format("'{}' must lie in [{}, {}], got {}", key, lo, hi, v.get<uint64_t>()));
  }
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) throw bad_request(key, fmt::format("'{}' must lie in [{}, {}], got {}", key, lo, hi, x));
  return x;
}

bool boolean(const json& body, const std::string& key) {
  const json& v = body[key];
  if (!v.is_boolean()) throw wrong_type(key, "a boolean", v);
  return v.get<bool>();
}

/// A message's content: a string, or OpenAI's array of parts of which only text parts are read.
std::string content_text(const json& content, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw wrong_type(param, "a string or an array of text parts", content);
  std::string text;
  for (size_t k = 0; k < content.size(); ++k) {
    const json& part = content[k];
    const std::string where = fmt::format("{}[{}]", param, k);
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
      throw bad_request(where, fmt::format("'{}' must be a text part ({{\"type\": \"text\", \"text\": ...}}): tinygpt "
                                           "models read text only",
                                           where));
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

data::Messages read_messages(const json& body, const ApiLimits& limits, size_t& text_bytes) {
  if (!body.contains("messages")) throw bad_request("messages", "'messages' is required", "missing_required_parameter");
  const json& m = body["messages"];
  if (!m.is_array()) throw wrong_type("messages", "an array of messages", m);
  if (m.empty()) throw bad_request("messages", "'messages' must hold at least one message");
  if (m.size() > limits.max_messages) {
    throw bad_request("messages", fmt::format("'messages' holds {} messages, more than the {} this server takes",
                                              m.size(), limits.max_messages));
  }
  data::Messages out = data::Messages::array();
  for (size_t k = 0; k < m.size(); ++k) {
    const std::string where = fmt::format("messages[{}]", k);
    const json& x = m[k];
    if (!x.is_object()) throw wrong_type(where, "an object with a role and a content", x);
    if (!x.contains("role") || !x["role"].is_string()) {
      throw bad_request(where + ".role", fmt::format("'{}.role' must be a string", where), "invalid_type");
    }
    std::string role = x["role"].get<std::string>();
    if (role == "developer") role = "system";  // OpenAI's newer name for the system prompt
    if (role != "system" && role != "user" && role != "assistant") {
      throw bad_request(where + ".role", fmt::format("'{}.role' must be system, user or assistant, got '{}'", where,
                                                     role.substr(0, 64)));
    }
    if (!x.contains("content")) {
      throw bad_request(where + ".content", fmt::format("'{}.content' is required", where),
                        "missing_required_parameter");
    }
    std::string content = content_text(x["content"], where + ".content");
    text_bytes += content.size();
    out.push_back({{"role", role}, {"content", std::move(content)}});
  }
  return out;
}

std::string read_prompt(const json& body) {
  if (!body.contains("prompt")) throw bad_request("prompt", "'prompt' is required", "missing_required_parameter");
  const json& p = body["prompt"];
  if (p.is_string()) return p.get<std::string>();
  if (p.is_array() && p.size() == 1 && p[0].is_string()) return p[0].get<std::string>();
  throw bad_request("prompt",
                    fmt::format("'prompt' must be a string (or an array of one string), got {}{}", type_name(p),
                                p.is_array() ? " of other than one string" : ""),
                    "invalid_type");
}

std::vector<std::string> read_stops(const json& body, const ApiLimits& limits) {
  std::vector<std::string> stops;
  if (!body.contains("stop") || body["stop"].is_null()) return stops;
  const json& s = body["stop"];
  if (s.is_string()) {
    stops.push_back(s.get<std::string>());
  } else if (s.is_array()) {
    for (const json& x : s) {
      if (!x.is_string()) throw wrong_type("stop", "a string or an array of strings", s);
      stops.push_back(x.get<std::string>());
    }
  } else {
    throw wrong_type("stop", "a string or an array of strings", s);
  }
  if (stops.size() > limits.max_stops) {
    throw bad_request("stop", fmt::format("'stop' holds {} strings, at most {}", stops.size(), limits.max_stops));
  }
  for (const std::string& x : stops) {
    if (x.empty()) throw bad_request("stop", "'stop' strings must not be empty");
    if (x.size() > limits.max_stop_bytes) {
      throw bad_request("stop",
                        fmt::format("a 'stop' string is {} bytes, at most {}", x.size(), limits.max_stop_bytes));
    }
  }
  return stops;
}

/// Fields of the API whose non-default values tinygpt does not honour: refused rather than ignored.
void refuse_unsupported(const json& body) {
  for (const char* key : {"presence_penalty", "frequency_penalty"}) {
    if (body.contains(key) && !body[key].is_null() && !(body[key].is_number() && body[key].get<double>() == 0)) {
      throw bad_request(key, fmt::format("'{}' is not supported by this server (0 or absent only)", key),
                        "unsupported_parameter");
    }
  }
  if (body.contains("logprobs") && !body["logprobs"].is_null() && body["logprobs"] != false) {
    throw bad_request("logprobs", "'logprobs' is not supported by this server", "unsupported_parameter");
  }
  for (const char* key : {"tools", "functions", "logit_bias"}) {
    if (body.contains(key) && !body[key].is_null() && !body[key].empty()) {
      throw bad_request(key, fmt::format("'{}' is not supported by this server", key), "unsupported_parameter");
    }
  }
  if (body.contains("response_format") && !body["response_format"].is_null()) {
    const json& f = body["response_format"];
    if (!f.is_object() || !f.contains("type") || f["type"] != "text") {
      throw bad_request("response_format", "'response_format' may only be {\"type\": \"text\"} on this server",
                        "unsupported_parameter");
    }
  }
}

}  // namespace

json ApiError::body() const {
  return {{"error",
           {{"message", what()},
            {"type", type},
            {"param", param.empty() ? json() : json(param)},
            {"code", code.empty() ? json() : json(code)}}}};
}

ApiError bad_request(const std::string& param, const std::string& message, const std::string& code) {
  return ApiError(400, "invalid_request_error", code, param, message);
}

CompletionRequest parse_completion_request(std::string_view text, bool chat, const ApiLimits& limits) {
  json body;
  try {
    body = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    throw bad_request("", fmt::format("the body is not JSON: {}", e.what()), "invalid_json");
  }
  if (!body.is_object()) throw bad_request("", fmt::format("the body must be a JSON object, got {}", type_name(body)));
  CompletionRequest r;
  r.chat = chat;
  if (body.contains("model") && !body["model"].is_null()) {
    if (!body["model"].is_string()) throw wrong_type("model", "a string", body["model"]);
    const std::string model = body["model"].get<std::string>();
    if (model != limits.model) {
      throw ApiError(
          404, "invalid_request_error", "model_not_found", "model",
          fmt::format("the model '{}' does not exist: this server serves '{}'", model.substr(0, 200), limits.model));
    }
  }
  size_t text_bytes = 0;
  if (chat) {
    r.messages = read_messages(body, limits, text_bytes);
  } else {
    r.prompt = read_prompt(body);
    text_bytes = r.prompt.size();
  }
  if (text_bytes > limits.max_text) {
    throw ApiError(413, "invalid_request_error", "request_too_large", chat ? "messages" : "prompt",
                   fmt::format("the request holds {} bytes of text, more than the {} this server takes", text_bytes,
                               limits.max_text));
  }
  // OpenAI's defaults where the request says nothing: temperature 1, top_p 1, no top-k, no limit but the window.
  r.gen.temperature = 1.0;
  r.gen.top_k = 0;
  r.gen.max_new_tokens = 0;
  const auto given = [&](const char* key) { return body.contains(key) && !body[key].is_null(); };
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    if (given(key)) r.gen.max_new_tokens = integer(body, key, 1, int64_t(1) << 30);
  }
  if (given("temperature")) r.gen.temperature = number(body, "temperature", 0, 2);
  if (given("top_p")) r.gen.top_p = number(body, "top_p", 0, 1);
  if (given("top_k")) {
    r.gen.top_k = integer(body, "top_k", 0, int64_t(1) << 30);
    if (limits.vocab > 0 && r.gen.top_k >= limits.vocab) r.gen.top_k = 0;
  }
  if (given("n") && integer(body, "n", 1, 1000) != 1) {
    throw bad_request("n", "'n' must be 1: this server draws one choice a request", "unsupported_parameter");
  }
  if (given("seed")) r.seed = uint64_t(integer(body, "seed", INT64_MIN, INT64_MAX));
  if (given("stream")) r.stream = boolean(body, "stream");
  if (given("stream_options")) {
    const json& o = body["stream_options"];
    if (!o.is_object()) throw wrong_type("stream_options", "an object", o);
    if (o.contains("include_usage") && !o["include_usage"].is_null()) {
      if (!o["include_usage"].is_boolean())
        throw wrong_type("stream_options.include_usage", "a boolean", o["include_usage"]);
      r.include_usage = o["include_usage"].get<bool>();
    }
  }
  r.stop = read_stops(body, limits);
  refuse_unsupported(body);
  return r;
}

json completion_body(const Completion& c, bool chat) {
  json choice = {{"index", 0}, {"finish_reason", c.finish_reason}, {"logprobs", nullptr}};
  if (chat)
    choice["message"] = {{"role", "assistant"}, {"content", c.text}};
  else
    choice["text"] = c.text;
  return {{"id", c.id},
          {"object", chat ? "chat.completion" : "text_completion"},
          {"created", c.created},
          {"model", c.model},
          {"choices", json::array({choice})},
          {"usage",
           {{"prompt_tokens", c.prompt_tokens},
            {"completion_tokens", c.completion_tokens},
            {"total_tokens", c.prompt_tokens + c.completion_tokens}}}};
}

json completion_chunk(const Completion& c, bool chat, std::string_view piece, bool first,
                      const std::string& finish_reason) {
  json choice = {
      {"index", 0}, {"finish_reason", finish_reason.empty() ? json() : json(finish_reason)}, {"logprobs", nullptr}};
  if (chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (finish_reason.empty()) delta["content"] = std::string(piece);
    choice["delta"] = delta;
  } else {
    choice["text"] = std::string(piece);
  }
  return {{"id", c.id},
          {"object", chat ? "chat.completion.chunk" : "text_completion"},
          {"created", c.created},
          {"model", c.model},
          {"choices", json::array({choice})}};
}

json usage_chunk(const Completion& c, bool chat) {
  json j = completion_chunk(c, chat, "", false);
  j["choices"] = json::array();
  j["usage"] = completion_body(c, chat)["usage"];
  return j;
}

json models_body(const std::string& model, int64_t created) {
  return {{"object", "list"},
          {"data", json::array({{{"id", model}, {"object", "model"}, {"created", created}, {"owned_by", "tinygpt"}}})}};
}

std::string to_line(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace tinygpt

// The OpenAI API as `tinygpt serve` speaks it, without the HTTP: a request body read into a CompletionRequest with
// every field checked (an ApiError names the field, with the status and the OpenAI error object to answer), and the
// response bodies and stream chunks built. Pure functions of their inputs, so the fuzzer drives the parser alone.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "../data/chat.h"
#include "generate.h"

namespace tinygpt {

/// A request refused: the HTTP status and OpenAI's error object {"error": {message, type, param, code}}.
struct ApiError : std::runtime_error {
  ApiError(int status, std::string type, std::string code, std::string param, const std::string& message)
      : std::runtime_error(message),
        status(status),
        type(std::move(type)),
        code(std::move(code)),
        param(std::move(param)) {}
  int status;
  std::string type, code, param;
  nlohmann::json body() const;
};
/// 400 invalid_request_error naming `param`.
ApiError bad_request(const std::string& param, const std::string& message, const std::string& code = "invalid_value");

struct ApiLimits {
  std::string model;            // the one model served: a request naming another gets 404
  size_t max_messages = 1024;   // a conversation's messages
  size_t max_text = 1 << 20;    // bytes of text in a request's messages or prompt, all told
  size_t max_stops = 4;         // stop strings, as OpenAI's
  size_t max_stop_bytes = 256;  // each
  int64_t vocab = 0;            // top_k above it means all
};

struct CompletionRequest {
  bool chat = true;         // /v1/chat/completions (messages), else /v1/completions (prompt)
  data::Messages messages;  // chat: [{"role", "content"}], content as text
  std::string prompt;       // completions: the text to continue
  GenerateOptions gen;      // max_new_tokens 0: until the window is full
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool stream = false, include_usage = false;
};

/// Reads a request body; throws ApiError for anything the API does not allow or tinygpt does not do.
CompletionRequest parse_completion_request(std::string_view body, bool chat, const ApiLimits& limits);

/// What a request came to, for its response.
struct Completion {
  std::string id, model, text;
  int64_t created = 0;        // Unix seconds
  std::string finish_reason;  // "stop" (an end of turn, an end of text or a stop string) or "length"
  int64_t prompt_tokens = 0, completion_tokens = 0;
};

nlohmann::json completion_body(const Completion& c, bool chat);
/// A stream's chunk: a piece of text (the first chat chunk also says the role), or with finish_reason the last.
nlohmann::json completion_chunk(const Completion& c, bool chat, std::string_view piece, bool first,
                                const std::string& finish_reason = "");
/// The chunk with the usage and no choices (stream_options.include_usage).
nlohmann::json usage_chunk(const Completion& c, bool chat);
nlohmann::json models_body(const std::string& model, int64_t created);
/// A JSON value as one line, any invalid UTF-8 in its strings replaced (a reply cut inside a character).
std::string to_line(const nlohmann::json& j);

}  // namespace tinygpt

// libFuzzer target: serve's request parser on arbitrary bytes (the first byte picks the chat or the completions
// endpoint), and the response bodies built from what it accepted, printed as the server prints them. Anything but an
// ApiError (a crash, a sanitizer report, another exception, a body that cannot be printed) is a bug.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "train/serve_api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool chat = (data[0] & 1) != 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  tinygpt::ApiLimits limits;
  limits.model = "fuzz";
  limits.vocab = 300;
  limits.max_text = 4096;
  try {
    const tinygpt::CompletionRequest r = tinygpt::parse_completion_request(body, chat, limits);
    if (r.chat != chat || (chat && r.messages.empty()) || r.stop.size() > limits.max_stops) std::abort();
    if (r.gen.temperature < 0 || r.gen.temperature > 2 || r.gen.top_p < 0 || r.gen.top_p > 1 || r.gen.top_k < 0 ||
        r.gen.max_new_tokens < 0) {
      std::abort();
    }
    tinygpt::Completion c{.id = "id", .model = "fuzz", .finish_reason = "stop"};
    // The text of the request as a reply: bytes of any kind, as a reply cut inside a character would be.
    c.text = chat ? r.messages.back()["content"].get<std::string>() : r.prompt;
    (void)tinygpt::to_line(tinygpt::completion_body(c, chat));
    (void)tinygpt::to_line(tinygpt::completion_chunk(c, chat, c.text, true));
    (void)tinygpt::to_line(tinygpt::usage_chunk(c, chat));
  } catch (const tinygpt::ApiError& e) {
    if (e.status < 400 || e.status >= 500) std::abort();
    (void)tinygpt::to_line(e.body());
  }
  return 0;
}

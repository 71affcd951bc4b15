#include "train/cli_serve.h"

#include <fmt/core.h>

#include "train/serve_engine.h"

namespace tinygpt {
namespace {
HttpServer g_http_server = nullptr;
}

void set_http_server(HttpServer server) { g_http_server = server; }

void add_serve_options(CLI::App& c, ServeArgs& a) {
  c.add_option("--ckpt", a.ckpt,
               "Checkpoint file, or a run directory (its best checkpoint, else its latest; a LoRA "
               "run served merged)")
      ->required();
  c.add_option("--host", a.host,
               "Address to listen on (another than loopback makes the model reachable from other "
               "machines)")
      ->capture_default_str();
  c.add_option("--port", a.port, "Port to listen on (0: any free one, printed)")->capture_default_str();
  c.add_option("--api-key", a.api_key, "Require `Authorization: Bearer KEY` on every /v1 request (default: none)");
  c.add_option("--model-name", a.model_name, "The model's id in the API (default: the run directory's name)");
  c.add_option("--chat-template", a.chat_template,
               "chatml, llama3, or a Jinja file (default: the model's own, else chatml)");
  c.add_option("--context", a.context,
               "Tokens a request's prompt and reply share (default: the block size, at most "
               "4096); a longer prompt is refused");
  c.add_option("--max-queue", a.max_queue,
               "Requests waiting their turn beyond which the server answers 503 (one "
               "request draws at a time)")
      ->capture_default_str();
  c.add_option("--max-body", a.max_body, "Bytes of a request body beyond which the server answers 413")
      ->capture_default_str();
  c.add_option("--device", a.device, "cpu or cuda")->capture_default_str();
  add_numerics_flags(&c, a.numerics);
}

void validate_serve(const ServeArgs& a) {
  validate_numerics(a.numerics, a.device);
  if (a.port < 0 || a.port > 65535) throw Error(fmt::format("--port must lie in [0, 65535], got {}", a.port));
  if (a.context < 0) throw Error(fmt::format("--context must not be negative, got {}", a.context));
  if (a.max_queue < 1 || a.max_queue > 100000) {
    throw Error(fmt::format("--max-queue must lie in [1, 100000], got {}", a.max_queue));
  }
  if (a.max_body < 1024 || a.max_body > (int64_t(1) << 30)) {
    throw Error(fmt::format("--max-body must lie in [1024, 1073741824] bytes, got {}", a.max_body));
  }
  if (a.host.empty()) throw Error("--host is empty: give an address such as 127.0.0.1");
}

void run_serve(const ServeArgs& a) {
  if (g_http_server == nullptr) {
    throw Error("this program has no HTTP server to serve with (the tinygpt program sets one: set_http_server)");
  }
  ServeEngine engine(a);
  g_http_server(engine, a);
}

}  // namespace tinygpt

#include "serve/http.h"

#include <fmt/format.h>
#include <httplib.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <memory>
#include <thread>

#include "serve/chat_page.h"
#include "train/serve_engine.h"

namespace tinygpt {
namespace {

using json = nlohmann::json;

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(to_line(body), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) { send_json(res, e.status, e.body()); }

/// Equal keys compared in a time that does not depend on where they first differ.
bool same_key(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

/// OpenAI's answer to a missing or wrong key: 401 invalid_api_key.
bool authorized(const httplib::Request& req, httplib::Response& res, const std::string& key) {
  if (key.empty()) return true;
  const std::string given = req.get_header_value("Authorization");
  if (given.rfind("Bearer ", 0) == 0 && same_key(given.substr(7), key)) return true;
  send_error(res, ApiError(401, "invalid_request_error", "invalid_api_key", "",
                           given.empty() ? "no API key: send the header `Authorization: Bearer KEY`"
                                         : "the API key is wrong"));
  return false;
}

std::string sse(const json& j) { return "data: " + to_line(j) + "\n\n"; }

class Server {
 public:
  Server(ServeEngine& engine, const ServeArgs& a) : engine_(engine), args_(a) {}

  void routes() {
    svr_.Get("/", [](const httplib::Request&, httplib::Response& res) { res.set_content(kChatPage, "text/html"); });
    svr_.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      send_json(res, 200, {{"status", "ok"}});
    });
    svr_.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
      if (authorized(req, res, args_.api_key))
        send_json(res, 200, models_body(engine_.limits().model, engine_.created()));
    });
    svr_.Get("/v1/models/(.+)", [this](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(req, res, args_.api_key)) return;
      const json list = models_body(engine_.limits().model, engine_.created());
      if (req.matches[1] == engine_.limits().model) return send_json(res, 200, list["data"][0]);
      send_error(res, ApiError(404, "invalid_request_error", "model_not_found", "model",
                               fmt::format("the model '{}' does not exist: this server serves '{}'",
                                           std::string(req.matches[1]).substr(0, 200), engine_.limits().model)));
    });
    for (const bool chat : {true, false}) {
      svr_.Post(chat ? "/v1/chat/completions" : "/v1/completions",
                [this, chat](const httplib::Request& req, httplib::Response& res) { complete(req, res, chat); });
    }
    // Every answer of 400 or above has an OpenAI error object: the library's own (an unknown path, a body over
    // --max-body, a malformed request line) get one here.
    svr_.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req,
                                                                   httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      const std::string what = res.status == 404
                                   ? fmt::format(
                                         "no route {} {} (the API is GET /v1/models, POST /v1/chat/completions and "
                                         "POST /v1/completions)",
                                         req.method, req.path.substr(0, 200))
                               : res.status == 413 ? "the request body is larger than this server takes (--max-body)"
                                                   : fmt::format("the request could not be read (HTTP {})", res.status);
      send_json(res, res.status,
                ApiError(res.status, "invalid_request_error", res.status == 404 ? "unknown_url" : "", "", what).body());
      return httplib::Server::HandlerResponse::Handled;
    }));
    svr_.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {}
      send_json(res, 500, ApiError(500, "server_error", "", "", what).body());
    });
  }

  void complete(const httplib::Request& req, httplib::Response& res, bool chat) {
    if (!authorized(req, res, args_.api_key)) return;
    // Everything that can be refused is refused before the first byte, as a plain 4xx or 503.
    std::shared_ptr<Pending> p;
    try {
      CompletionRequest r = parse_completion_request(req.body, chat, engine_.limits());
      ServeEngine::Prompt prompt = engine_.prompt_of(r);
      p = std::make_shared<Pending>(Pending{std::move(r), std::move(prompt), engine_.admit(), engine_.head(chat), {}});
    } catch (const ApiError& e) {
      return send_error(res, e);
    }
    const std::string path = req.path;
    if (!p->request.stream) {
      try {
        engine_.answer(*p->place, p->request, p->prompt, p->completion, {}, {}, &p->timing);
      } catch (const ApiError& e) {
        return send_error(res, e);
      }
      say(path, *p);
      return send_json(res, 200, completion_body(p->completion, chat));
    }
    // A stream: one chunk a piece, a comment each second while it waits its turn (so a client gone is seen), the
    // last chunk with the finish reason, the usage if asked, and [DONE].
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider("text/event-stream", [this, p, chat, path](size_t, httplib::DataSink& sink) {
      bool gone = false;
      auto write = [&](const std::string& s) {
        if (!gone && !sink.write(s.data(), s.size())) gone = true;
      };
      bool first = true;
      auto beat = std::chrono::steady_clock::now();
      try {
        engine_.answer(
            *p->place, p->request, p->prompt, p->completion,
            [&](std::string_view piece) {
              write(sse(completion_chunk(p->completion, chat, piece, first)));
              first = false;
            },
            [&] {
              if (std::chrono::steady_clock::now() - beat > std::chrono::seconds(1)) {
                beat = std::chrono::steady_clock::now();
                write(": waiting\n\n");
              }
              return gone;
            },
            &p->timing);
        if (first) write(sse(completion_chunk(p->completion, chat, "", true)));  // an empty reply still has its role
        write(sse(completion_chunk(p->completion, chat, "", false, p->completion.finish_reason)));
        if (p->request.include_usage) write(sse(usage_chunk(p->completion, chat)));
        if (!gone) say(path, *p);  // a client gone gets its own line below
      } catch (const ApiError& e) {
        write(sse(e.body()));
        if (e.status != 499) fmt::print(stderr, "{}: {}\n", path, e.what());
      }
      write("data: [DONE]\n\n");
      if (gone) {
        fmt::print(stderr, "{}: the client went away after {} tokens\n", path, p->completion.completion_tokens);
        return false;
      }
      sink.done();
      return true;
    });
  }

  /// A request admitted: what it asks, its prompt, its place in the queue, and what it came to.
  struct Pending {
    CompletionRequest request;
    ServeEngine::Prompt prompt;
    std::unique_ptr<ServeEngine::Place> place;
    Completion completion;
    ServeEngine::Timing timing;
  };
  /// The request's line on stderr: tokens, time to the first, rate.
  void say(const std::string& path, const Pending& p) {
    const Completion& c = p.completion;
    const ServeEngine::Timing& t = p.timing;
    const double secs = (t.total_ms - t.first_ms) / 1000;
    fmt::print(stderr,
               "{}: {} prompt tokens ({} read), {} tokens, waited {:.0f} ms, first after {:.0f} ms, "
               "{:.1f} tokens/s, {}\n",
               path, c.prompt_tokens, t.read, c.completion_tokens, t.queued_ms, t.first_ms,
               secs > 0 ? double(c.completion_tokens - 1) / secs : 0.0, c.finish_reason);
  }

  httplib::Server svr_;

 private:
  ServeEngine& engine_;
  const ServeArgs& args_;
};

// SIGINT and SIGTERM, whichever thread they reach (the OpenMP workers too), write a byte to a pipe that one thread
// of the server reads: the handler does nothing else.
int g_signal_pipe[2] = {-1, -1};
extern "C" void on_serve_stop_signal(int) {
  const char byte = 's';
  [[maybe_unused]] const ssize_t n = ::write(g_signal_pipe[1], &byte, 1);
}

/// Installs the handler for SIGINT and SIGTERM. It stays to the end of the program: a signal while the server winds
/// down (the model freed, the threads joined) asks for what is already happening, not for the process to die.
class StopSignals {
 public:
  StopSignals() {
    if (::pipe(g_signal_pipe) != 0) throw Error(fmt::format("cannot make a pipe: {}", std::strerror(errno)));
    struct sigaction sa {};
    sa.sa_handler = on_serve_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  /// Waits for a signal (or wake()); false when woken.
  static bool wait() {
    char byte = 0;
    while (::read(g_signal_pipe[0], &byte, 1) < 0 && errno == EINTR) {}
    return byte == 's';
  }
  static void wake() {
    const char byte = 'w';
    [[maybe_unused]] const ssize_t n = ::write(g_signal_pipe[1], &byte, 1);
  }
};

}  // namespace

void serve_http(ServeEngine& engine, const ServeArgs& a) {
  Server server(engine, a);
  server.routes();
  httplib::Server& svr = server.svr_;
  const size_t threads = size_t(std::min<int64_t>(a.max_queue + 4, 512));
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_payload_max_length(size_t(a.max_body));
  svr.set_keep_alive_timeout(2);
  svr.set_read_timeout(30);
  svr.set_write_timeout(30);
  const int port = a.port == 0 ? svr.bind_to_any_port(a.host) : (svr.bind_to_port(a.host, a.port) ? a.port : -1);
  if (port < 0) {
    throw Error(
        fmt::format("cannot listen on {}:{}: the port is taken or the address is not this machine's (another "
                    "--port, or --port 0 for any free one)",
                    a.host, a.port));
  }
  fmt::print(stderr, "serving {}\n", engine.describe());
  fmt::print(stderr, "listening on http://{}:{} (the API under /v1, a chat page at /); Ctrl-C or SIGTERM stops{}\n",
             a.host.find(':') != std::string::npos ? "[" + a.host + "]" : a.host, port,
             a.api_key.empty() ? "" : "; /v1 requires the API key");
  StopSignals signals;
  std::thread watcher([&] {
    for (int seen = 0; StopSignals::wait();) {
      if (++seen == 1) {
        fmt::print(stderr, "stopping: no new requests; the one drawing finishes (a second signal ends it now)\n");
        engine.shut_down();
        svr.stop();
      } else {
        engine.shut_down(true);
      }
    }
  });
  const bool ok = svr.listen_after_bind();
  StopSignals::wake();
  watcher.join();
  if (!ok && !engine.closing()) throw Error("the server stopped listening: the socket failed");
  fmt::print(stderr, "stopped\n");
}

}  // namespace tinygpt

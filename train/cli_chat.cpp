#include "train/cli_chat.h"

#include <fmt/core.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <optional>

#include "data/text.h"
#include "train/chat.h"

namespace tinygpt {
namespace {

std::atomic<bool> g_interrupted{false};
extern "C" void on_chat_interrupt(int) { g_interrupted = true; }

/// While alive, Ctrl-C (SIGINT) raises g_interrupted instead of ending the program: it ends a reply, or the line
/// being typed.
class InterruptToStop {
 public:
  InterruptToStop() {
    struct sigaction sa {};
    sa.sa_handler = on_chat_interrupt;
    sigemptyset(&sa.sa_mask);  // no SA_RESTART: a read waiting for a line returns at once
    sigaction(SIGINT, &sa, &old_);
  }
  ~InterruptToStop() { sigaction(SIGINT, &old_, nullptr); }
  InterruptToStop(const InterruptToStop&) = delete;
  InterruptToStop& operator=(const InterruptToStop&) = delete;

 private:
  struct sigaction old_ {};
};

/// A line from standard input without its newline; nullopt at the end of the input. An interrupt while waiting
/// gives an empty line (and leaves g_interrupted raised for the caller to see).
std::optional<std::string> read_line() {
  std::string line;
  while (true) {
    if (g_interrupted) return std::string();  // since the last reply, or while waiting
    char c;
    const ssize_t n = ::read(STDIN_FILENO, &c, 1);
    if (n == 1) {
      if (c == '\n') return line;
      line += c;
    } else if (n == 0) {
      if (line.empty()) return std::nullopt;
      return line;
    } else if (errno != EINTR) {
      throw Error(fmt::format("cannot read standard input: {}", std::strerror(errno)));
    }
  }
}

void print_piece(std::string_view piece) {
  std::fwrite(piece.data(), 1, piece.size(), stdout);
  std::fflush(stdout);
}

data::Messages messages_of(const ChatArgs& a) {
  data::Messages m = data::Messages::array();
  if (!a.system.empty()) m.push_back({{"role", "system"}, {"content", a.system}});
  if (!a.messages_file.empty()) {
    for (const auto& x : data::parse_messages(data::read_text_file(a.messages_file), "--messages " + a.messages_file)) {
      m.push_back(x);
    }
  }
  return m;
}

/// Notes on stderr that a turn read the conversation again or dropped its oldest turns.
void say_turn(const ChatSession::Reply& r, int64_t window) {
  if (r.dropped > 0) {
    fmt::print(stderr, "[dropped the {} oldest message{} to fit the window of {} tokens]\n", r.dropped,
               r.dropped == 1 ? "" : "s", window);
  }
  if (r.stopped)
    fmt::print(stderr, "[reply stopped]\n");
  else if (r.full)
    fmt::print(stderr, "[reply cut at {} tokens: the window of {} tokens is full]\n", r.tokens, window);
  else if (!r.ended)
    fmt::print(stderr, "[reply cut at {} tokens (--max-new-tokens)]\n", r.tokens);
}

}  // namespace

void add_chat_options(CLI::App& c, ChatArgs& a) {
  c.add_option("--ckpt", a.ckpt, "Checkpoint file, or a run directory (its best checkpoint, else its latest)")
      ->required();
  c.add_option("--system", a.system, "System prompt (default: none, or what the model's template says)");
  c.add_option("--message", a.messages,
               "A user's turn, repeatable: each reply is printed on stdout (no terminal needed)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  c.add_option("--messages", a.messages_file,
               "JSON file of OpenAI messages ([{\"role\", \"content\"}...]): the "
               "conversation so far (a reply is drawn to its last user message, or with --render-only it is rendered)");
  c.add_flag("--render-only", a.render_only, "Print the rendered prompt (with the assistant's opening) and exit");
  c.add_option("--chat-template", a.chat_template,
               "chatml, llama3, or a Jinja file (default: the model's own, else chatml)");
  c.add_option("--max-new-tokens", a.gen.max_new_tokens, "Most tokens of a reply")->capture_default_str();
  c.add_option("--temperature", a.gen.temperature, "Softmax temperature (0: greedy)")->capture_default_str();
  c.add_option("--top-k", a.gen.top_k, "Sample among the k most likely tokens (0: all)")->capture_default_str();
  c.add_option("--seed", a.seed, "Random seed (the same seed gives the same replies)")->capture_default_str();
  c.add_option("--context", a.context,
               "The conversation's window in tokens, its reply included (default: the block "
               "size, at most 4096); the oldest turns are dropped beyond it");
  c.add_option("--device", a.device, "cpu or cuda")->capture_default_str();
  add_numerics_flags(&c, a.numerics);
}

void validate_chat(const ChatArgs& a) {
  validate_numerics(a.numerics, a.device);
  if (a.gen.max_new_tokens <= 0)
    throw Error(fmt::format("--max-new-tokens must be positive, got {}", a.gen.max_new_tokens));
  if (!(a.gen.temperature >= 0))
    throw Error(fmt::format("--temperature must not be negative, got {}", a.gen.temperature));
  if (a.gen.top_k < 0) throw Error(fmt::format("--top-k must not be negative, got {}", a.gen.top_k));
  if (a.context < 0) throw Error(fmt::format("--context must not be negative, got {}", a.context));
}

void run_chat(const ChatArgs& a) {
  const Checkpoint ckpt = load_checkpoint(a.ckpt);
  const data::ChatTemplate tpl = data::chat_template_for(ckpt.tokenizer.config(), a.chat_template);
  data::Messages history = messages_of(a);
  if (a.render_only) {
    for (const std::string& m : a.messages) history.push_back({{"role", "user"}, {"content", m}});
    const std::string text = tpl.render(history, true, ckpt.tokenizer.config());
    std::fwrite(text.data(), 1, text.size(), stdout);
    return;
  }
  const Device device = parse_device(a.device);
  check_numerics_over(a.numerics, ckpt, device);
  const int64_t window =
      a.context > 0 ? std::min(a.context, ckpt.config.block_size) : std::min<int64_t>(ckpt.config.block_size, 4096);
  const auto model = model_from(ckpt, device, 1, a.numerics, window);
  ChatSession chat(*model, ckpt.tokenizer, tpl, window, a.gen, a.seed);
  for (const auto& m : history) chat.add(m["role"].get<std::string>(), m["content"].get<std::string>());
  const bool tty = ::isatty(STDIN_FILENO) == 1;
  fmt::print(stderr, "chatting with {} (iteration {}): template {}, window {} tokens{}\n", ckpt.path.string(),
             ckpt.state.iter, tpl.name(), window,
             a.messages.empty() && tty ? "; /reset, /system TEXT, /exit; Ctrl-C ends a reply, Ctrl-D the chat" : "");
  if (!a.messages.empty() || (!history.empty() && history.back()["role"] == "user")) {
    if (!history.empty() && history.back()["role"] == "user") {  // --messages ends with the user's turn: answer it
      const ChatSession::Reply r = chat.respond(print_piece);
      fmt::print("\n");
      say_turn(r, window);
    }
    for (const std::string& m : a.messages) {
      const ChatSession::Reply r = chat.reply(m, print_piece);
      fmt::print("\n");
      say_turn(r, window);
    }
    return;
  }
  InterruptToStop interrupts;
  std::string system = a.system;
  while (true) {
    if (tty) print_piece("> ");
    const std::optional<std::string> line = read_line();
    if (g_interrupted.exchange(false)) {  // Ctrl-C while typing: a fresh line
      print_piece("\n");
      continue;
    }
    if (!line) break;
    if (line->empty()) continue;
    if (*line == "/exit" || *line == "/quit") break;
    if (*line == "/reset" || line->rfind("/system", 0) == 0) {
      if (*line != "/reset") system = line->size() > 8 ? line->substr(8) : "";
      chat.reset(system);
      fmt::print(stderr, "[a new conversation{}]\n", system.empty() ? "" : ", system prompt: " + system);
      continue;
    }
    try {
      const ChatSession::Reply r = chat.reply(*line, print_piece, &g_interrupted);
      g_interrupted = false;  // the Ctrl-C that ended the reply is spent
      print_piece("\n");
      say_turn(r, window);
    } catch (const Error& e) {
      fmt::print(stderr, "error: {}\n", e.what());
    }
  }
  if (tty) print_piece("\n");
}

}  // namespace tinygpt

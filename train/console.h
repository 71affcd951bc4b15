// What a training run shows on stderr (a live status line on a terminal, log lines, or only the summary), and the
// stop signals it finishes an iteration for.
#pragma once

#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <string>

namespace tinygpt {

/// SIGINT/SIGTERM received while a StopSignals lives (train/console.cpp): the first asks for a stop after the current
/// iteration, a second exits at once.
extern std::atomic<int> g_stop_signals;
extern "C" void on_stop_signal(int sig);

/// While alive, `handler` answers SIGINT and SIGTERM; the previous handlers come back after.
class SignalHandlers {
 public:
  explicit SignalHandlers(void (*handler)(int)) {
    struct sigaction sa {};
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~SignalHandlers() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  SignalHandlers(const SignalHandlers&) = delete;
  SignalHandlers& operator=(const SignalHandlers&) = delete;

 private:
  struct sigaction old_int_ {
  }, old_term_{};
};

/// While alive, SIGINT and SIGTERM ask the training loop to stop after the current iteration.
class StopSignals : SignalHandlers {
 public:
  StopSignals() : SignalHandlers((g_stop_signals = 0, on_stop_signal)) {}  // the count reset before it is installed
  bool requested() const { return g_stop_signals.load() > 0; }
};

/// While alive (a pass over the data before training, `tokenizer encode --data`), SIGINT and SIGTERM remove the
/// temporary files of the token cache or id file being written, say so on one error line and exit 130: the previous
/// cache is kept, and nothing half-written is left (data::remove_cache_temp_files_now).
extern "C" void on_signal_during_pass(int sig);
/// For SIGBUS, installed for the whole program (train/main.cpp): a file read through a map (a data file, a token cache)
/// that another process cuts short faults on the pages past its new end. The temporary files go, one error line,
/// exit 1.
extern "C" void on_bus_error(int sig);
class SignalsEndPass : SignalHandlers {
 public:
  SignalsEndPass() : SignalHandlers(on_signal_during_pass) {}
};

/// Progress on stderr: a live status line on a terminal (redrawn in place, at most 10 times a second) besides
/// the log lines, plain log lines when stderr is not a terminal, and only the final summary when quiet.
class Console {
 public:
  explicit Console(bool quiet) : quiet_(quiet), tty_(::isatty(STDERR_FILENO) == 1) {}
  ~Console() { clear(); }

  template <class... Args>
  void line(fmt::format_string<Args...> format, Args&&... args) {
    if (quiet_) return;
    clear();
    fmt::print(stderr, format, std::forward<Args>(args)...);
  }
  void status(int64_t iter, int64_t max_iters, double loss, double tok_per_s, double ms_per_iter) {
    if (quiet_ || !tty_) return;
    show(fmt::format("{}/{} ({:.0f}%)", iter + 1, max_iters,
                     100.0 * double(iter + 1) / double(std::max<int64_t>(max_iters, 1))),
         loss, tok_per_s, double(max_iters - iter - 1) * ms_per_iter / 1e3);
  }
  /// The status line of a run with a time budget: progress and ETA by the budget's seconds.
  void status_budget(int64_t iter, double spent, double budget, double loss, double tok_per_s) {
    if (quiet_ || !tty_) return;
    show(fmt::format("iter {} ({:.0f}% of {:g} s)", iter + 1, 100.0 * std::min(spent / budget, 1.0), budget), loss,
         tok_per_s, std::max(budget - spent, 0.0));
  }
  void clear() {
    if (live_) fmt::print(stderr, "\r\x1b[K");
    live_ = false;
  }

 private:
  /// Rewrites the status line (a terminal only, at most every 100 ms): progress, loss, speed and ETA.
  void show(const std::string& progress, double loss, double tok_per_s, double eta_s) {
    if (quiet_ || !tty_) return;
    const auto now = std::chrono::steady_clock::now();
    if (live_ && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    const auto eta = int64_t(eta_s);
    fmt::print(stderr, "\r{}  loss {:.4f}  {:.0f} tok/s  ETA {}:{:02d}:{:02d}\x1b[K", progress, loss, tok_per_s,
               eta / 3600, eta / 60 % 60, eta % 60);
    live_ = true;
  }

  bool quiet_, tty_;
  bool live_ = false;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace tinygpt

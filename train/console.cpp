#include "train/console.h"

#include <atomic>

#include "data/documents.h"

namespace tinygpt {

std::atomic<int> g_stop_signals{0};

extern "C" void on_stop_signal(int sig) {
  if (g_stop_signals.fetch_add(1) > 0) _exit(128 + sig);  // a second signal: leave at once
  constexpr char kMsg[] = "\nsignal received: finishing this iteration and saving a checkpoint (again to quit now)\n";
  [[maybe_unused]] const auto n = ::write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
}

extern "C" void on_signal_during_pass(int) {
  tinygpt::data::remove_cache_temp_files_now();
  constexpr char kMsg[] =
      "\nerror: stopped by a signal while reading the data; the files being written were removed "
      "(a previous token cache is kept)\n";
  [[maybe_unused]] const auto n = ::write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
  _exit(130);
}

extern "C" void on_bus_error(int) {
  // Several threads can fault on the same cut file at once: the first says so and exits, the others wait for it.
  static std::atomic_flag said = ATOMIC_FLAG_INIT;
  if (said.test_and_set()) {
    for (;;) ::pause();
  }
  tinygpt::data::remove_cache_temp_files_now();
  constexpr char kMsg[] =
      "\nerror: a mapped file was cut short while it was read (SIGBUS): a data file or the token "
      "cache changed under this run; the files being written were removed (a previous token cache "
      "is kept); run again once the files stay as they are\n";
  [[maybe_unused]] const auto n = ::write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
  _exit(1);
}

}  // namespace tinygpt

#include "kernels/profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/env.h"

namespace tinygpt::profile {
namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Table {
  struct Entry {
    double ms = 0, kernel_ms = 0;
    int64_t calls = 0;
    bool nested = false;  // ran inside another phase (the step's forward, backward, ...)
  };
  std::mutex mutex;
  std::map<std::string, Entry> kernels, phases;
  std::map<std::string, int64_t> choices;  // "what: choice" -> times taken
  std::vector<std::string> phase_order;    // as first seen
  double kernel_total = 0;

  ~Table() {
    if (kernels.empty() && phases.empty() && choices.empty()) return;
    const int64_t steps = phases.contains("step") ? phases["step"].calls : 0;
    const double per = double(std::max<int64_t>(steps, 1));
    std::vector<std::pair<std::string, Entry>> rows(kernels.begin(), kernels.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    fmt::print(stderr, "TINYGPT_PROFILE: CPU kernels over {} training steps (evaluation included)\n", steps);
    fmt::print(stderr, "{:<28} {:>10} {:>9} {:>10} {:>7}\n", "kernel", "total ms", "calls", "ms/step", "share");
    for (const auto& [name, e] : rows) {
      fmt::print(stderr, "{:<28} {:>10.1f} {:>9} {:>10.2f} {:>6.1f}%\n", name, e.ms, e.calls, e.ms / per,
                 100.0 * e.ms / std::max(kernel_total, 1e-9));
    }
    for (const auto& [choice, n] : choices) fmt::print(stderr, "{} ({} calls)\n", choice, n);
    if (phases.empty()) return;
    fmt::print(stderr,
               "{:<28} {:>10} {:>10} {:>10}   (ms per step; left over: allocation, graph bookkeeping, copies)\n",
               "phase", "wall", "kernels", "left over");
    double nested = 0;
    for (const std::string& name : phase_order) {
      const Entry& e = phases[name];
      if (e.nested) nested += e.ms;
      fmt::print(stderr, "{:<28} {:>10.2f} {:>10.2f} {:>10.2f}\n", (e.nested ? "  " : "") + name, e.ms / per,
                 e.kernel_ms / per, (e.ms - e.kernel_ms) / per);
    }
    if (steps > 0) {
      fmt::print(stderr, "{:<28} {:>10.2f}   (batches, the loss read back)\n", "  the step's rest",
                 (phases["step"].ms - nested) / per);
    }
  }
};

Table& table() {
  static Table t;
  return t;
}

thread_local int g_depth = 0;  // phases open on this thread

}  // namespace

bool enabled() {
  static const bool on = [] { return TINYGPT_ENV_IS("TINYGPT_PROFILE", "1"); }();
  return on;
}

void add_kernel(const char* name, double ms) {
  Table& t = table();
  std::lock_guard lock(t.mutex);
  Table::Entry& e = t.kernels[name];
  e.ms += ms;
  ++e.calls;
  t.kernel_total += ms;
}

void add_choice(const char* what, const char* choice) {
  Table& t = table();
  std::lock_guard lock(t.mutex);
  ++t.choices[fmt::format("{}: {}", what, choice)];
}

Phase::Phase(const char* name) : name_(name) {
  if (!enabled()) return;
  nested_ = g_depth++ > 0;
  Table& t = table();
  std::lock_guard lock(t.mutex);
  if (!t.phases.contains(name_)) {  // listed in the order phases first start
    t.phase_order.emplace_back(name_);
    t.phases[name_];
  }
  kernel_ms_at_start_ = t.kernel_total;
  start_ms_ = now_ms();
}

Phase::~Phase() {
  if (!enabled()) return;
  --g_depth;
  const double end = now_ms();
  Table& t = table();
  std::lock_guard lock(t.mutex);
  Table::Entry& e = t.phases[name_];
  e.nested = nested_;
  e.ms += end - start_ms_;
  e.kernel_ms += t.kernel_total - kernel_ms_at_start_;
  ++e.calls;
}

}  // namespace tinygpt::profile

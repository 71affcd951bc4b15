// A run directory (--out): one writer at a time, and metrics.jsonl.
#pragma once

#include <fcntl.h>
#include <fmt/core.h>
#include <nlohmann/json.hpp>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "../kernels/kernels.h"

namespace tinygpt {

/// The run's output directory, created when missing.
std::filesystem::path make_output_dir(const std::string& dir);

/// A line of metrics.jsonl: an iteration's row (its loss) or an evaluation's (train and val loss, bits per byte).
struct MetricsRow {
  int64_t iter = 0;
  bool evaluation = false;                                    // the line has a "val_loss"
  std::optional<double> loss, train_loss, val_loss, val_bpb;  // where the line holds them as numbers
  std::string line;                                           // as the file holds it
};

/// The one reader of a run's metrics.jsonl: its lines that are JSON objects with an integer "iter", in order; lines
/// that are not (damaged, or cut by a full disk) are passed over, and a missing file has none.
std::vector<MetricsRow> read_metrics(const std::filesystem::path& path);

/// On resume: drops the lines a stopped run wrote after its checkpoint (iterations from `iter` on, evaluations
/// after it), so the resumed run's lines follow without repeats.
void truncate_metrics(const std::filesystem::path& path, int64_t iter);

/// One writer per run directory: an exclusive flock on OUT/train.lock, held until the run ends. The kernel drops
/// the lock when the process dies however it dies, so a crashed run never leaves the directory locked. Readers
/// (sample, eval, info, plot) take no lock: checkpoints are replaced by rename and metrics lines are whole.
class RunLock {
 public:
  explicit RunLock(const std::filesystem::path& dir) : path_(dir / "train.lock") {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error(fmt::format("cannot create '{}': {}", path_.string(), std::strerror(errno)));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      char pid[32] = {};
      [[maybe_unused]] const auto n = ::pread(fd_, pid, sizeof(pid) - 1, 0);
      ::close(fd_);
      throw Error(
          fmt::format("'{}' is being trained into by another tinygpt train (pid {}): one run directory takes one "
                      "writer. Wait for it, stop it (Ctrl-C saves), or choose another --out; sample, eval and "
                      "info can read it meanwhile",
                      dir.string(), std::string(pid).empty() ? "unknown" : std::string(pid)));
    }
    const std::string pid = std::to_string(::getpid());
    if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != ssize_t(pid.size())) {
      ::close(fd_);
      throw Error(fmt::format("cannot write '{}': {}", path_.string(), std::strerror(errno)));
    }
  }
  ~RunLock() { ::close(fd_); }
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

/// Appends one JSON object per line, each with one write(2), so a crash keeps every line written before it. A failed
/// write (a full disk) takes back what it wrote of its line and throws an Error naming the file: the run stops rather
/// than train on without its log, and no half line is ever left. Opening for append first drops a half line an
/// earlier writer left (one killed mid-write by a filesystem that splits writes). Disabled (it writes nothing) on
/// every rank but the first.
class MetricsLog {
 public:
  MetricsLog(const std::filesystem::path& path, bool append, bool enabled);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  void write(const nlohmann::json& j);

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

}  // namespace tinygpt

#include "train/run_dir.h"

#include <sys/stat.h>

#include <fstream>

#include "data/text.h"

namespace tinygpt {

namespace fs = std::filesystem;

/// The run's output directory, created when missing.
fs::path make_output_dir(const std::string& dir) {
  const fs::path out = dir;
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec || !fs::is_directory(out, ec)) {
    throw Error(fmt::format("cannot create the output directory '{}': {}", out.string(),
                            ec ? ec.message() : "not a directory"));
  }
  return out;
}

/// On resume: drops the lines a stopped run wrote after its checkpoint (iterations from `iter` on, evaluations
/// after it), so the resumed run's lines follow without repeats.
std::vector<MetricsRow> read_metrics(const fs::path& path) {
  std::error_code ec;
  std::ifstream in;
  if (fs::is_regular_file(path, ec)) in.open(path);
  std::vector<MetricsRow> rows;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("iter") || !j["iter"].is_number_integer()) continue;
    const auto number = [&j](const char* key) {
      return j.contains(key) && j[key].is_number() ? std::optional<double>(j[key].get<double>()) : std::nullopt;
    };
    rows.push_back({.iter = j["iter"].get<int64_t>(),
                    .evaluation = j.contains("val_loss"),
                    .loss = number("loss"),
                    .train_loss = number("train_loss"),
                    .val_loss = number("val_loss"),
                    .val_bpb = number("val_bpb"),
                    .line = std::move(line)});
  }
  return rows;
}

void truncate_metrics(const fs::path& path, int64_t iter) {
  if (!fs::exists(path)) return;
  std::string kept;
  for (const MetricsRow& r : read_metrics(path)) {
    if (r.evaluation ? r.iter <= iter : r.iter < iter) kept += r.line + '\n';
  }
  data::write_text_file(path, kept);  // by rename: a failed write leaves the old file as it was, and no temporary file
}

MetricsLog::MetricsLog(const fs::path& path, bool append, bool enabled) : path_(path) {
  if (!enabled) return;
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
  if (fd_ < 0) throw Error(fmt::format("cannot write '{}': {}", path.string(), std::strerror(errno)));
  struct stat st {};
  if (append && ::fstat(fd_, &st) == 0 && st.st_size > 0) {
    // A half line at the end (its writer killed mid-write): cut back to the last whole line.
    off_t end = st.st_size;
    char c = 0;
    while (end > 0 && ::pread(fd_, &c, 1, end - 1) == 1 && c != '\n') --end;
    if (end != st.st_size && ::ftruncate(fd_, end) != 0) {
      const int err = errno;
      ::close(fd_);
      throw Error(fmt::format("cannot write '{}': {}", path.string(), std::strerror(err)));
    }
  }
}

MetricsLog::~MetricsLog() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsLog::write(const nlohmann::json& j) {
  if (fd_ < 0) return;
  const std::string line = j.dump() + '\n';
  struct stat st {};
  const off_t before = ::fstat(fd_, &st) == 0 ? st.st_size : -1;
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      if (before >= 0 && ::ftruncate(fd_, before) != 0) {
      }  // no half line left (where even that fails, a resumed run drops it: truncate_metrics)
      throw Error(
          fmt::format("cannot write '{}': {}; the checkpoints saved so far are intact (--resume continues "
                      "from the latest)",
                      path_.string(), std::strerror(err)));
    }
    done += size_t(n);
  }
}

}  // namespace tinygpt

#include "train/run_dir.h"

namespace tinygpt {

namespace fs = std::filesystem;

/// The run's output directory, created when missing.
fs::path make_output_dir(const std::string& dir) {
  const fs::path out = dir;
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec || !fs::is_directory(out, ec)) {
    throw Error(fmt::format("cannot create the output directory '{}': {}", out.string(), ec ? ec.message() : "not a directory"));
  }
  return out;
}

/// On resume: drops the lines a stopped run wrote after its checkpoint (iterations from `iter` on, evaluations
/// after it), so the resumed run's lines follow without repeats.
void truncate_metrics(const fs::path& path, int64_t iter) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("iter") || !j["iter"].is_number_integer()) continue;
    const int64_t it = j["iter"].get<int64_t>();
    if (j.contains("val_loss") ? it <= iter : it < iter) kept += line + '\n';
  }
  in.close();
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out || !(out << kept) || !out.flush()) throw Error(fmt::format("cannot rewrite '{}'", path.string()));
  }
  fs::rename(tmp, path);
}

}  // namespace tinygpt

// libFuzzer target: the readers and the writer of metrics.jsonl on arbitrary bytes: --resume's truncation, `plot`'s
// reader, and the log reopened for append, which must leave only whole lines. Anything but a tinygpt::Error (a crash,
// a sanitizer report, another exception, a half line left) is a bug.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "train/plots.h"
#include "train/run_dir.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/tinygpt_fuzz_metrics_" + std::to_string(::getpid()) + ".jsonl";
  const int64_t iter = size > 0 ? int64_t(data[0]) : 0;
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  }
  try {
    (void)tinygpt::loss_curves_svg(path);
  } catch (const tinygpt::Error&) {}
  try {
    {
      tinygpt::MetricsLog log(path, /*append=*/true, /*enabled=*/true);
      log.write({{"iter", iter}, {"loss", 1.5}});
    }
    std::ifstream in(path, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (text.empty() || text.back() != '\n') std::abort();  // the appended line is whole, and nothing half before it
    tinygpt::truncate_metrics(path, iter);
  } catch (const tinygpt::Error&) {}
  return 0;
}

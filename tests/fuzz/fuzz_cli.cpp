// libFuzzer target: the command line's parsing and validation of flag values. The input is split at NUL
// bytes into arguments; parsing may reject them (CLI::ParseError) and validation may refuse them
// (tinygpt::Error), but nothing may crash. Nothing is run.
#include <cstdint>
#include <string>
#include <vector>

#include "train/cli.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args(1);
  for (size_t i = 0; i < size && args.size() <= 32; ++i) {
    if (data[i] == 0) {
      args.emplace_back();
    } else {
      args.back() += char(data[i]);
    }
  }
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them last first
  tinygpt::Cli cli;
  try {
    cli.app.parse(reversed);
  } catch (const CLI::ParseError&) {
    return 0;
  }
  try {
    cli.validate();
  } catch (const tinygpt::Error&) {}
  return 0;
}

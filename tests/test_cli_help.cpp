// The command line's help: every default it shows is the default used. Each subcommand's help is read as a user
// reads it, every shown default (`--flag TYPE=VALUE`, and `(default: --x)` for a negatable flag) is given back on
// a command line, and the parsed settings must equal those of a command line that gives none of them.
#include <doctest/doctest.h>

#include <algorithm>
#include <regex>
#include <sstream>

#include "train/cli.h"

using namespace tinygpt;

namespace {

/// The help's shown defaults as arguments: {"--lr", "0.001", "--tf32", ...}. Escapes the help applies (\n) undone.
std::vector<std::string> shown_defaults(const std::string& help, int* negatable) {
  static const std::regex option(R"(^\s+(--[a-z0-9-]+)(?:,[^ ]+)? [A-Z]+=(\S*))");
  static const std::regex flag(R"(\(default: (--[a-z0-9-]+)\))");
  std::vector<std::string> args;
  std::istringstream lines(help);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_search(line, m, option)) {
      std::string value = m[2];
      for (size_t at; (at = value.find("\\n")) != std::string::npos;) value.replace(at, 2, "\n");
      args.insert(args.end(), {m[1], value});
    } else if (std::regex_search(line, m, flag)) {
      args.push_back(m[1]);
      ++*negatable;
    }
  }
  return args;
}

/// Parses `tinygpt <sub> <required...> <extra...>` into `cli`.
void parse(Cli& cli, const std::string& sub, const std::vector<std::string>& required,
           const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"tinygpt", sub};
  args.insert(args.end(), required.begin(), required.end());
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  cli.app.parse(int(argv.size()), argv.data());
}

}  // namespace

TEST_CASE("cli: the defaults --help shows are the defaults used") {
  const std::vector<std::pair<std::string, std::vector<std::string>>> subcommands = {
      {"train", {"--data", "x.txt"}},
      {"sample", {"--ckpt", "run"}},
      {"eval", {"--ckpt", "run", "--data", "x.txt"}},
      {"attention", {"--ckpt", "run", "--text", "abc"}},
  };
  int negatable = 0;
  for (const auto& [sub, required] : subcommands) {
    CAPTURE(sub);
    Cli reference, given;
    const std::string help = reference.app.get_subcommand(sub)->help();
    CHECK(help.find("{false}") == std::string::npos);
    CHECK(help.find("{true}") == std::string::npos);
    const std::vector<std::string> defaults = shown_defaults(help, &negatable);
    CHECK(defaults.size() >= 4);
    INFO("given back: " << [&] {
      std::string s;
      for (const auto& a : defaults) s += a + " ";
      return s;
    }());
    parse(reference, sub, required, {});
    parse(given, sub, required, defaults);
    // Which flags were given is recorded at parse time (with --init-from or --resume they must agree with the
    // checkpoint): every model flag given back is listed, none where none was given.
    TrainConfig& g = given.train_config;
    const TrainConfig& r = reference.train_config;
    CHECK(r.model_flags_given.empty());
    if (sub == "train") {
      for (const char* key : {"n_layer", "n_kv_head", "block_size", "bias", "window", "attn_softcap", "ffn_hidden",
                              "norm_eps", "rope_theta", "qkv_bias", "logit_softcap"}) {
        CHECK_MESSAGE(std::ranges::count(g.model_flags_given, key) == 1, key);
      }
      CHECK(std::ranges::count(g.model_flags_given, "dropout") == 0);  // a fine-tune may change it
    }
    g.model_flags_given = r.model_flags_given;
    g.numerics_flags_given = r.numerics_flags_given;
    CHECK(given.train_config == reference.train_config);
    CHECK(given.sample_args == reference.sample_args);
    CHECK(given.eval_args == reference.eval_args);
    CHECK(given.attention_args == reference.attention_args);
  }
  CHECK(negatable == 5);  // --bias, --qkv-bias, --tf32, --cuda-graphs, --kv-cache
}

TEST_CASE("cli: usage errors exit with 2 and one error line, help and --version with 0") {
  auto run = [](std::vector<const char*> argv) {
    Cli cli;
    return cli.main(int(argv.size()), argv.data());
  };
  CHECK(run({"tinygpt", "train", "--data", "x.txt", "--max-iters", "ten"}) == Cli::kUsageError);
  CHECK(run({"tinygpt", "train", "--data", "x.txt", "--no-such-flag"}) == Cli::kUsageError);
  CHECK(run({"tinygpt", "train"}) == Cli::kUsageError);                                   // --data is required
  CHECK(run({"tinygpt", "train", "--data", "x.txt", "--lr", "-1"}) == Cli::kUsageError);  // parses, out of range
  CHECK(run({"tinygpt", "--version"}) == 0);
  CHECK(run({"tinygpt", "sample", "--help"}) == 0);
}

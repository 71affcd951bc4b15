// The tinygpt command line (CLI11): a table of subcommands (train, sft, sample, chat, serve, eval, tokenizer, plot,
// attention, export, import, info). main() parses into a Cli and runs it; the fuzzer parses arbitrary arguments into
// one and validates them without running anything.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "generate.h"
#include "trainer.h"

namespace tinygpt {

struct SampleArgs {
  std::string ckpt;
  std::string prompt = "\n";
  GenerateOptions gen;
  uint64_t seed = 1337;
  int64_t num_samples = 1;
  std::string device = "cpu";
  NumericsFlags numerics;
  bool operator==(const SampleArgs&) const = default;
};

/// `tinygpt chat`: a conversation on a terminal, the replies to --message turns, or a rendered prompt.
struct ChatArgs {
  std::string ckpt, system, messages_file, chat_template;
  std::vector<std::string> messages;  // --message: the user's turns, in order
  bool render_only = false;
  GenerateOptions gen{.max_new_tokens = 512};
  int64_t context = 0;  // the conversation's window in tokens (0: the block size, at most 4096)
  uint64_t seed = 1337;
  std::string device = "cpu";
  NumericsFlags numerics;
  bool operator==(const ChatArgs&) const = default;
};

/// `tinygpt serve`: the OpenAI API over HTTP (train/cli_serve.h).
struct ServeArgs {
  std::string ckpt, host = "127.0.0.1", api_key, chat_template, model_name;
  int port = 8080;             // 0: any free port (the one taken is printed)
  int64_t context = 0;         // the window a request and its reply share (0: the block size, at most 4096)
  int64_t max_queue = 64;      // requests waiting their turn beyond which a request gets 503
  int64_t max_body = 1 << 20;  // bytes of a request body beyond which it gets 413
  std::string device = "cpu";
  NumericsFlags numerics;
  bool operator==(const ServeArgs&) const = default;
};

struct EvalArgs {
  std::string ckpt;
  std::vector<std::string> data;
  std::vector<std::string> chat_data;  // JSON lines of conversations: the assistants' tokens' loss instead
  std::string chat_template;
  int64_t batch_size = 64, eval_iters = 200;
  double train_fraction = 0;  // 0: the run's (its checkpoint's training config), else 0.9
  uint64_t seed = 1337;
  std::string device = "cpu";
  NumericsFlags numerics;
  bool operator==(const EvalArgs&) const = default;
};

struct AttentionArgs {
  std::string ckpt, text, out = "attention.svg";
  int64_t layer = 0;
  std::vector<int64_t> heads;
  bool operator==(const AttentionArgs&) const = default;
};

struct PlotArgs {
  std::string run, out = "loss.svg";
  bool operator==(const PlotArgs&) const = default;
};

struct ExportArgs {
  std::string ckpt, format = "hf", out, type;  // type: gguf's weight type (f32 where not given)
  bool operator==(const ExportArgs&) const = default;
};

struct ImportArgs {
  std::string format = "hf", from, out;
  bool operator==(const ImportArgs&) const = default;
};

/// `tinygpt tokenizer train|encode|decode`.
struct TokenizerArgs {
  std::vector<std::string> data;
  int64_t vocab_size = 4096;
  std::string out, tokenizer, ckpt, ids;
  std::optional<std::string> text;
  bool operator==(const TokenizerArgs&) const = default;
};

/// A negatable flag --name / --no-name bound to `value`; its help names the form in effect by default.
CLI::Option* add_switch(CLI::App* cmd, const std::string& name, bool& value, const std::string& help);

/// What the command files share (train/cli.cpp): eval's and sample's numerics flags and their checks, and the
/// checkpoint's model on a device in eval mode, after checking that it fits with `batch_size` sequences of `context`
/// tokens (0: the block size).
void add_numerics_flags(CLI::App* cmd, NumericsFlags& n);
/// The ids of a flag's text; throws naming the flag and the first character outside a character vocabulary.
std::vector<int32_t> encode_flag_text(const data::Tokenizer& tok, const std::string& text, const char* flag);
void validate_numerics(const NumericsFlags& n, const std::string& device);
void check_numerics_over(const NumericsFlags& n, const Checkpoint& ckpt, Device device);
std::unique_ptr<nn::GPT> model_from(const Checkpoint& ckpt, Device device = Device::CPU, int64_t batch_size = 1,
                                    const NumericsFlags& numerics = {}, int64_t context = 0);

/// A row of the command table: a subcommand's name and help, the options it adds to its CLI::App, the checks made
/// after parsing without touching a file (an Error thrown is a usage error), and its run (the exit status; an Error
/// thrown is exit 1, a UsageError exit 2). The parser, validate() and main() are driven by the table: a new command is
/// one more row.
struct Command {
  std::string name, help;
  std::function<void(CLI::App&)> options;
  std::function<void()> validate;
  std::function<int()> run;
};

/// sft's defaults: a fine-tuning's (a low rate, no dropout, short), not train's from-scratch ones.
inline TrainConfig sft_defaults() {
  TrainConfig c;
  c.sft = true;
  c.model.dropout = 0;
  c.lr = 5e-5;
  c.min_lr = 5e-6;
  c.warmup_iters = 20;
  c.max_iters = c.lr_decay_iters = 500;
  c.batch_size = 8;
  c.eval_interval = 100;
  c.eval_iters = 20;
  return c;
}

struct Cli {
  Cli();
  Cli(const Cli&) = delete;
  Cli& operator=(const Cli&) = delete;

  /// After parsing: checks the chosen subcommand's values (ranges, contradictions) without touching any
  /// file; throws Error naming the flag.
  void validate() const;
  /// Parses argv, validates the chosen subcommand and runs it; returns the process exit code (errors print one
  /// line). Help and --version print and return 0; a parse error (unknown flag, a value that does not convert, a
  /// missing required flag) or an invalid value prints one `error:` line and returns kUsageError.
  int main(int argc, const char* const* argv);

  static constexpr int kUsageError = 2;  // also for values that parse but are out of range or contradictory

  CLI::App app{"tinygpt: train small GPT language models from text files, sample from them and talk to them"};
  int threads = 0;
  TrainConfig train_config;
  TrainConfig sft_config = sft_defaults();
  SampleArgs sample_args;
  ChatArgs chat_args;
  ServeArgs serve_args;
  EvalArgs eval_args;
  AttentionArgs attention_args;
  ExportArgs export_args;
  TokenizerArgs tokenizer_args;
  ImportArgs import_args;
  PlotArgs plot_args;
  std::string info_ckpt;
  std::vector<Command> commands;  // filled by the constructor, one row per subcommand

 private:
  const Command* chosen() const;  // the subcommand parsed, or null
};

}  // namespace tinygpt

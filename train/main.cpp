// The tinygpt command line.
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <omp.h>

#include "kernels/kernels.h"
#include "train/demo.h"

int main(int argc, char** argv) {
  CLI::App app{"tinygpt: train small GPT language models from text files, and sample from them"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tinygpt 0.1.0");

  tinygpt::DemoConfig demo;
  int threads = 0;
  CLI::App* demo_cmd = app.add_subcommand(
      "demo", "Train a small character-level MLP language model on a text file through the autograd API, then sample");
  demo_cmd->add_option("--data", demo.data_path, "UTF-8 text file to train on")->required();
  demo_cmd->add_option("--steps", demo.steps, "Training steps")->capture_default_str()->check(CLI::PositiveNumber);
  demo_cmd->add_option("--batch-size", demo.batch_size, "Examples per step")->capture_default_str()->check(CLI::PositiveNumber);
  demo_cmd->add_option("--context", demo.context, "Characters of context")->capture_default_str()->check(CLI::PositiveNumber);
  demo_cmd->add_option("--hidden", demo.hidden, "Hidden layer width")->capture_default_str()->check(CLI::PositiveNumber);
  demo_cmd->add_option("--lr", demo.lr, "Peak learning rate (cosine decay to 0)")->capture_default_str()->check(CLI::PositiveNumber);
  demo_cmd->add_option("--eval-interval", demo.eval_interval, "Steps between evaluations")->capture_default_str()->check(CLI::PositiveNumber);
  demo_cmd->add_option("--sample-chars", demo.sample_chars, "Characters to sample at the end")->capture_default_str()->check(CLI::NonNegativeNumber);
  demo_cmd->add_option("--seed", demo.seed, "Random seed")->capture_default_str();
  demo_cmd->add_option("--threads", threads, "OpenMP threads (0: all cores)")->capture_default_str()->check(CLI::NonNegativeNumber);

  CLI11_PARSE(app, argc, argv);
  if (threads > 0) omp_set_num_threads(threads);
  try {
    if (*demo_cmd) tinygpt::run_demo(demo);
  } catch (const tinygpt::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}

// The command line's train subcommand: its options (the model's, the schedule's, the numerics') and its run; the
// rest of the command line is train/cli.cpp.
#pragma once

#include <CLI/CLI.hpp>

#include "cli.h"

namespace tinygpt {

/// train's options, filling `c`; after parsing, `c` also knows which model, numerics and optimizer flags were given.
void add_train_options(CLI::App& cmd, TrainConfig& c);

}  // namespace tinygpt

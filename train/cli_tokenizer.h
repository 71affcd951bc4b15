// The command line's tokenizer subcommand (train, encode, decode): its options, their checks and the run; the rest of
// the command line is train/cli.cpp.
#pragma once

#include <CLI/CLI.hpp>

#include "cli.h"

namespace tinygpt {

/// `tokenizer`'s subcommands train, encode and decode and their options, filling `a`.
void add_tokenizer_options(CLI::App& tokenizer, TokenizerArgs& a);
/// The checks CLI11 cannot make (which sources and outputs go together); throws Error.
void validate_tokenizer(const CLI::App& app, const TokenizerArgs& a);
/// Runs the subcommand `app` parsed.
void run_tokenizer(const CLI::App& app, const TokenizerArgs& a);

}  // namespace tinygpt

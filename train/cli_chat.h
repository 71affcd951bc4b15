// `tinygpt chat`: its options, their checks and the run (a conversation on a terminal, the replies to --message turns,
// or the rendered prompt with --render-only); the conversation itself is a ChatSession (train/chat.h).
#pragma once

#include <CLI/CLI.hpp>

#include "cli.h"

namespace tinygpt {

void add_chat_options(CLI::App& cmd, ChatArgs& a);
/// The checks CLI11 cannot make; throws Error.
void validate_chat(const ChatArgs& a);
void run_chat(const ChatArgs& a);

}  // namespace tinygpt

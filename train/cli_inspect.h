// `tinygpt info`, `attention` and `plot`: what a checkpoint or a run holds, printed or drawn.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "cli.h"

namespace tinygpt {

/// The position scheme and attention options of a model, for `info`: "relative positions (m = 16), window 64".
std::string describe_attention(const nn::GPTConfig& c);

void add_info_options(CLI::App& cmd, std::string& ckpt);
/// The checkpoint's model, parameters, numerics, memory, optimizer, last evaluation and flags, on stdout.
void run_info(const std::string& path);

void add_attention_options(CLI::App& cmd, AttentionArgs& a);
void validate_attention(const AttentionArgs& a);
/// A layer's attention weights over --text, one heatmap per head, written as an SVG.
void run_attention(const AttentionArgs& a);

void add_plot_options(CLI::App& cmd, PlotArgs& a);
/// The run's loss curves (its metrics.jsonl) written as an SVG.
void run_plot(const PlotArgs& a);

}  // namespace tinygpt

// Pictures as self-contained SVG documents (any browser shows them): a run's loss curves, and attention
// heatmaps with the characters on the axes.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "../autograd/tensor.h"

namespace tinygpt {

/// Training loss per iteration (faint, with a moving average) and the evaluated train and val losses, from
/// a run's metrics.jsonl. Throws when the file is missing or holds no iteration.
std::string loss_curves_svg(const std::filesystem::path& metrics_jsonl);

/// One heatmap per head of weights (NH, T, T) (row t: how much query character t attends to each key
/// character), the characters of `text` (T of them) along both axes; `heads` selects which to draw.
std::string attention_svg(const Tensor& weights, const std::vector<std::string>& tokens, int64_t layer,
                          const std::vector<int64_t>& heads);

}  // namespace tinygpt

// How fast a step is against what the machine can do: nanoGPT's FLOP count and the measured matmul peak (MFU).
#pragma once

#include <cstdint>
#include <utility>

#include "../nn/gpt.h"

namespace tinygpt {

/// FLOPs of one training step as nanoGPT's estimate_mfu counts them: per token, 6 per weight (the position table
/// left out; forward and backward) plus 12 L T C for attention's two products, forward and backward.
double step_flops(const nn::GPT& model, int64_t tokens_per_step);

/// The machine's practical peak for this run: square f32 matmuls (bf16 with --dtype bf16) on the run's device and
/// threads, with the run's TF32 setting, growing from 128 while one takes under 100 ms (up to 1536 on the CPU, 4096 on
/// a GPU), then the best of runs at the last size repeated for at least 0.3 s and 5 runs (one run when that took over
/// 100 ms, as under a sanitizer): cold caches, a core still ramping up its clock or a page-faulting first touch made three short runs
/// read low (112 GFLOP/s where training then reached 141 on a 2-core Zen 4). Model FLOPs utilization (MFU) is
/// measured against it, and the trainer raises it to any step that runs faster, so MFU never reads above 100%.
/// Returns GFLOP/s and the size used.
std::pair<double, int64_t> measure_peak_gflops(Device device, const Numerics& numerics);

}  // namespace tinygpt

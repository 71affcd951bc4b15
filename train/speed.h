// How fast a step is against what the machine can do: the step's FLOPs and a fixed, stated peak (MFU).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>

#include "../nn/gpt.h"

namespace tinygpt {

/// FLOPs of one training step as computed: per token, 6 per weight (the position table left out; forward and
/// backward, as nanoGPT's estimate_mfu) plus 6 L T C for attention's two products, forward and backward: nanoGPT
/// counts 12 L T C, the whole T x T, where the causal flash kernels compute about half of it.
double step_flops(const nn::GPT& model, int64_t tokens_per_step);

/// The peak MFU is measured against, fixed for a machine and the run's numerics, never raised by a step (a step above
/// it means the FLOP count or the peak is wrong). CPU: threads x the clock the cores run at x the FLOPs a cycle of
/// the unit the products run on, both measured (kernels/device.h) and cached per CPU (cpu_rates_cache_path),
/// so every run on a machine states the same peak. GPU: NVIDIA's dense figure for the card (H100, H200, A100) in the
/// run's matmul format. Where neither is known, a matmul measured at start-up (measure_peak_gflops), said so in `how`.
struct Peak {
  double gflops;    // per rank
  std::string how;  // for the log: where the figure comes from
};
Peak stated_peak(Device device, const Numerics& numerics);

/// Where the CPU's measured clock and unit rates are kept between runs: $TINYGPT_CACHE_DIR/cpu-rates.txt, else
/// $XDG_CACHE_HOME/tinygpt/, else ~/.cache/tinygpt/; empty with TINYGPT_CACHE_DIR=off (the tests: no writes outside
/// their temporary directories).
std::filesystem::path cpu_rates_cache_path();
/// Hands the cached rates to the kernels (cpu::set_unit_rates) when the cache is this CPU's, thread count's and
/// build's; a missing, damaged or foreign cache is ignored (measured again). Before the first product.
void use_cpu_rates_cache();
/// Writes the rates measured by this run to the cache (by rename, never half a file); nothing when they came from
/// it. Returns why it could not, or "" (a cache: the run goes on either way).
std::string save_cpu_rates_cache();

/// The machine's practical peak for this run: square f32 matmuls (bf16 with --dtype bf16) on the run's device and
/// threads, with the run's TF32 setting, growing from 128 while one takes under 100 ms (up to 1536 on the CPU, 4096 on
/// a GPU), then the best of runs at the last size repeated for at least 0.3 s and 5 runs (one run when that took over
/// 100 ms, as under a sanitizer): cold caches, a core still ramping up its clock or a page-faulting first touch make a
/// few short runs read low. It moves between runs and between machines of one kind, so MFU uses it only where
/// stated_peak knows no figure (docs/RESULTS.md, "Measurements behind design decisions"). Returns GFLOP/s and the size
/// used.
std::pair<double, int64_t> measure_peak_gflops(Device device, const Numerics& numerics);

}  // namespace tinygpt

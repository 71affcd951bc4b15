// How fast a step is against what the machine can do: the step's FLOPs and a fixed, stated peak (MFU).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "../nn/gpt.h"

namespace tinygpt {

/// FLOPs of one training step as computed: per token, 6 per weight (the position table left out; forward and
/// backward, as nanoGPT's estimate_mfu) plus 6 L T C for attention's two products, forward and backward (C the heads'
/// width, NH E): nanoGPT counts 12 L T C, the whole T x T, where the causal flash kernels compute about half of it.
double step_flops(const nn::GPT& model, int64_t tokens_per_step);

/// The peak MFU is measured against: a ceiling no step can pass, fixed for a machine and the run's numerics, never
/// raised by a step (a step above it means the FLOP count or the peak is wrong). CPU: threads x the clock the cores
/// run at x the FLOPs a cycle of the unit the products run on, both measured (kernels/device.h) and cached per CPU
/// (cpu_rates_cache_path), so every run on a machine states the same peak. GPU: NVIDIA's dense figure for the card
/// (H100, H200, A100) in the run's matmul format. Where neither is known (a CPU without the probe, not x86-64; another
/// GPU), `gflops` is 0 and no MFU is reported: a product timed at start-up is a rate the steps can pass, not a ceiling
/// (under qemu one read 0.17 GFLOP/s and the steps ran 3-11% above it), so it is not taken for one.
struct Peak {
  double gflops;    // per rank; 0: none known
  std::string how;  // for the log: where the figure comes from, or why there is none
};
Peak stated_peak(Device device, const Numerics& numerics);
/// The peak after a step ran at `gflops` (per rank), above `peak`. On the CPU the probe read the unit low (a core
/// shared with other work while it ran: seen at a half and a quarter of the unit's rate): the unit's FLOPs a cycle is
/// raised to the power of two the step needs (cpu::raise_unit_rate), for this run and, cached, the next. A GPU's
/// figure is NVIDIA's: passing it means the FLOP count is wrong, and the peak becomes the step's rate. Either way no
/// logged MFU is above 1; `how` says what happened.
Peak peak_passed(Device device, const Numerics& numerics, const Peak& peak, double gflops);

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

}  // namespace tinygpt

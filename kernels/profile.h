// TINYGPT_PROFILE=1: a coarse profiler of CPU runs (the CPU twin of TINYGPT_CUDA_PROFILE). launch() times every CPU
// kernel (they run synchronously, so a kernel's wall time is its time), the trainer marks the phases of a step
// (forward, backward, reduction, optimizer) with Phase, and at exit a table on stderr gives each kernel's time and
// each phase's, split into time in kernels and what is left over (allocation, graph bookkeeping, copies), and how
// often each choice an op made was taken (the attention op's path, on either device).
#pragma once

#include <cstdint>

namespace tinygpt::profile {

/// True when the environment sets TINYGPT_PROFILE=1.
bool enabled();
/// Adds one call of a CPU kernel that took `ms`.
void add_kernel(const char* name, double ms);
/// Counts one decision of `what` (a string literal: "attention path") that took `choice`.
void add_choice(const char* what, const char* choice);

/// Times its scope as one occurrence of the phase `name` (a string literal), and the kernel time inside it.
/// Does nothing unless enabled().
class Phase {
 public:
  explicit Phase(const char* name);
  ~Phase();
  Phase(const Phase&) = delete;
  Phase& operator=(const Phase&) = delete;

 private:
  const char* name_;
  bool nested_ = false;
  double start_ms_ = 0, kernel_ms_at_start_ = 0;
};

}  // namespace tinygpt::profile

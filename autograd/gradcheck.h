// Central-difference gradient checks in float64.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tensor.h"

namespace tinygpt {

struct GradcheckOptions {
  double eps = 1e-6;   // finite-difference step
  double atol = 1e-6;  // an element passes when |analytic - numeric| <= atol + rtol * |numeric|
  double rtol = 1e-4;
  uint64_t seed = 0;  // seeds the random projection of the output
};

struct GradcheckResult {
  bool ok = true;
  /// The worst element: which input, its flat index, both derivatives, and err / (atol + rtol*|numeric|).
  int input = -1;
  int64_t index = -1;
  double analytic = 0, numeric = 0, ratio = 0;
  std::string report;  // one line naming the worst element
};

/// Checks the backward pass of f at `inputs` (f64 CPU tensors; those with requires_grad are checked).
/// f may return any shape: the check differentiates sum(f(inputs) * R) for a fixed random R, which
/// exercises every output element. Each input element is perturbed by +-eps in place and restored.
GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f, std::vector<Tensor> inputs,
                          const GradcheckOptions& options = {});

}  // namespace tinygpt

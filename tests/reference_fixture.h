// Reading the PyTorch reference fixtures (tests/reference/make_*_fixture.py) in the suites that check against them:
// where the fixture is, a case's tensors, leaves made from them, and the comparison with torch's values.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "autograd/tensor.h"
#include "train/safetensors.h"

namespace tinygpt::test {

/// A reference fixture's path: $env when set (tests/torch_reference_test.sh points it at a fixture it just made with
/// the PyTorch present, from other random numbers), else the committed tests/reference/<file>.
inline std::string reference_fixture(const char* env, const char* file) {
  const char* fresh = std::getenv(env);
  if (fresh && *fresh) {
    MESSAGE("checking " << fresh << " (from $" << env << ")");
    return fresh;
  }
  return std::string(TINYGPT_SOURCE_DIR) + "/tests/reference/" + file;
}

/// A fixture's tensors, read through the current case's name prefix ("<case>.").
struct Fixture {
  safetensors::Contents contents;
  std::string prefix;

  /// The case's tensor `name`; fails the test when it is missing.
  Tensor at(const std::string& name) const {
    const Tensor t = contents.find(prefix + name);
    INFO("fixture tensor " << prefix + name);
    REQUIRE(t.defined());
    return t;
  }
  Tensor maybe(const std::string& name) const { return contents.find(prefix + name); }
};

/// A fresh float32 leaf requiring grad with the fixture's values (a copy: each run has its own gradients).
inline Tensor input_leaf(const Fixture& f, const std::string& name) {
  Tensor t = f.at(name).to(DType::F32).clone();
  t.requires_grad_();
  return t;
}

/// Every element within atol + rtol * |ref|, where atol is `floor` times the largest |ref| of the tensor, or times 1
/// when that is smaller (elements near zero carry the float32 rounding of the larger terms that cancelled there: the
/// key bias's gradient is zero in exact arithmetic, as softmax ignores a constant added to a row). A NaN fails.
inline void check_against(const Tensor& got, const Tensor& ref, double rtol, double floor, const std::string& what) {
  INFO(what);
  REQUIRE(got.defined());
  REQUIRE(got.shape() == ref.shape());
  const auto g = got.to(DType::F64).to_vector<double>(), r = ref.to(DType::F64).to_vector<double>();
  double largest = 1;
  for (double x : r) largest = std::max(largest, std::abs(x));
  const double atol = floor * largest;
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    const double ratio = std::abs(g[i] - r[i]) / (atol + rtol * std::abs(r[i]) + 1e-300);
    if (std::isnan(ratio)) {  // a NaN fails the check, wherever it is
      worst = ratio, worst_i = i;
      break;
    }
    if (ratio > worst) worst = ratio, worst_i = i;
  }
  INFO("worst element " << worst_i << ": got " << g[worst_i] << ", torch " << r[worst_i] << " (" << worst
                        << " x the tolerance)");
  CHECK(worst <= 1.0);
}

}  // namespace tinygpt::test

// Helpers shared by the test suites.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/ops.h"

namespace tinygpt::test {

/// A fresh empty directory under the system temp dir ("tinygpt_test_<name>"), removed at scope exit.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& name) : path(std::filesystem::temp_directory_path() / ("tinygpt_test_" + name)) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

/// Every element within atol + rtol*|expected|; reports the first mismatch.
template <class T>
void check_close(const std::vector<T>& actual, const std::vector<double>& expected, double atol = 1e-5,
                 double rtol = 1e-5) {
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    INFO("element " << i << ": got " << double(actual[i]) << ", expected " << expected[i]);
    CHECK(std::abs(double(actual[i]) - expected[i]) <= atol + rtol * std::abs(expected[i]));
  }
}

inline void check_close(const Tensor& actual, const std::vector<double>& expected, double atol = 1e-5,
                        double rtol = 1e-5) {
  if (actual.dtype() == DType::F64) {
    check_close(actual.to_vector<double>(), expected, atol, rtol);
  } else {
    check_close(actual.to(DType::F32).to_vector<float>(), expected, atol, rtol);
  }
}

/// Both tensors elementwise within tolerance.
inline void check_close(const Tensor& actual, const Tensor& expected, double atol = 1e-5, double rtol = 1e-5) {
  REQUIRE(actual.shape() == expected.shape());
  check_close(actual, expected.to(DType::F64).to_vector<double>(), atol, rtol);
}

/// f64 random leaf requiring grad.
inline Tensor leaf(const Shape& shape, Generator& gen, double stddev = 1.0) {
  Tensor t = randn(shape, gen, DType::F64, Device::CPU, stddev);
  t.requires_grad_();
  return t;
}

/// Runs gradcheck on f, and again on f(x) + f(x): there every backward kernel accumulates into a gradient
/// another call already wrote, so a kernel that assigns (=) where it must add (+=) fails too.
inline void expect_gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f, std::vector<Tensor> inputs,
                             const GradcheckOptions& options = {}) {
  const GradcheckResult once = gradcheck(f, inputs, options);
  INFO(once.report);
  CHECK(once.ok);
  const GradcheckResult twice =
      gradcheck([&f](const std::vector<Tensor>& in) { return f(in) + f(in); }, inputs, options);
  INFO("f(x) + f(x): " << twice.report);
  CHECK(twice.ok);
}

}  // namespace tinygpt::test

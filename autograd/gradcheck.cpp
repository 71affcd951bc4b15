#include "autograd/gradcheck.h"

#include <cmath>

#include "autograd/ops.h"

namespace tinygpt {

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f, std::vector<Tensor> inputs,
                          const GradcheckOptions& options) {
  for (const Tensor& x : inputs) {
    if (x.requires_grad() && (x.dtype() != DType::F64 || x.device() != Device::CPU)) {
      throw Error("gradcheck: inputs that require grad must be f64 tensors on the CPU");
    }
  }
  // Analytic: backward of sum(out * R) is backward(R).
  for (Tensor& x : inputs) x.zero_grad();
  const Tensor out = f(inputs);
  Generator gen(options.seed);
  const Tensor projection = randn(out.shape(), gen, DType::F64);
  out.backward(projection);

  const std::vector<double> r = projection.to_vector<double>();
  auto objective = [&]() {
    NoGradGuard no_grad;
    const std::vector<double> y = f(inputs).to_vector<double>();
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * r[i];
    return s;
  };

  GradcheckResult result;
  for (size_t k = 0; k < inputs.size(); ++k) {
    Tensor& x = inputs[k];
    if (!x.requires_grad()) continue;
    const Tensor g = x.grad();
    const std::vector<double> analytic =
        g.defined() ? g.to_vector<double>() : std::vector<double>(size_t(x.numel()), 0.0);
    double* p = x.data<double>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double saved = p[i];
      p[i] = saved + options.eps;
      const double plus = objective();
      p[i] = saved - options.eps;
      const double minus = objective();
      p[i] = saved;
      const double numeric = (plus - minus) / (2 * options.eps);
      const double a = analytic[size_t(i)];
      const double ratio = std::abs(a - numeric) / (options.atol + options.rtol * std::abs(numeric));
      if (!(ratio <= result.ratio) || result.index < 0) {
        result.input = int(k);
        result.index = i;
        result.analytic = a;
        result.numeric = numeric;
        result.ratio = std::isnan(ratio) ? INFINITY : ratio;
      }
    }
  }
  result.ok = result.ratio <= 1.0;
  result.report = fmt::format(
      "gradcheck {}: worst element is input {} index {}: analytic {:.10g}, numeric {:.10g} "
      "({:.3g}x the tolerance)",
      result.ok ? "passed" : "FAILED", result.input, result.index, result.analytic, result.numeric, result.ratio);
  return result;
}

}  // namespace tinygpt

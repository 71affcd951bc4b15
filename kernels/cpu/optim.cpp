// Optimizer kernels.
#include <cmath>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"

namespace tinygpt::cpu {

template <class T>
void adamw_update(T* param, const T* grad, T* m, T* v, int64_t n, float lr, float beta1, float beta2, float eps,
                  float weight_decay, int64_t step) {
  const T c1 = T(1) / (T(1) - std::pow(T(beta1), T(step)));
  const T c2 = T(1) / (T(1) - std::pow(T(beta2), T(step)));
#pragma omp parallel for simd if (n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i) {
    m[i] = T(beta1) * m[i] + T(1 - beta1) * grad[i];
    v[i] = T(beta2) * v[i] + T(1 - beta2) * grad[i] * grad[i];
    const T update = (m[i] * c1) / (std::sqrt(v[i] * c2) + T(eps));
    param[i] -= T(lr) * (update + T(weight_decay) * param[i]);
  }
}

template void adamw_update<float>(float*, const float*, float*, float*, int64_t, float, float, float, float, float, int64_t);
template void adamw_update<double>(double*, const double*, double*, double*, int64_t, float, float, float, float, float,
                                   int64_t);

}  // namespace tinygpt::cpu

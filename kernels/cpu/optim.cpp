// Optimizer kernels.
#include <cmath>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/scalar_math.h"

namespace tinygpt::cpu {

template <class T>
void adamw_update(T* param, const T* grad, T* m, T* v, int64_t n, float lr, float beta1, float beta2, float eps,
                  float weight_decay, int64_t step, double grad_scale) {
  const T c1 = T(adamw_correction(beta1, step)), c2 = T(adamw_correction(beta2, step)), gs = T(grad_scale);
#pragma omp parallel for simd if (n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i) adamw_element(param[i], gs * grad[i], m[i], v[i], lr, beta1, beta2, eps, weight_decay, c1, c2);
}

template void adamw_update<float>(float*, const float*, float*, float*, int64_t, float, float, float, float, float, int64_t,
                                  double);
template void adamw_update<double>(double*, const double*, double*, double*, int64_t, float, float, float, float, float,
                                   int64_t, double);

}  // namespace tinygpt::cpu

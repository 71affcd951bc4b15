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

template <class T>
void adamw_update_indirect(T* param, const T* grad, T* m, T* v, int64_t n, const float* sched, const T* stats,
                           double max_norm, float beta1, float beta2, float eps, float weight_decay) {
  if (!is_finite(double(stats[0])) || !is_finite(double(stats[1]))) return;  // the step is refused: nothing moves
  const T gs = T(clip_scale(double(stats[1]), max_norm)), c1 = T(sched[1]), c2 = T(sched[2]);
  const float lr = sched[0];
#pragma omp parallel for simd if (n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i) adamw_element(param[i], gs * grad[i], m[i], v[i], lr, beta1, beta2, eps, weight_decay, c1, c2);
}

template void adamw_update_indirect<float>(float*, const float*, float*, float*, int64_t, const float*, const float*,
                                           double, float, float, float, float);
template void adamw_update_indirect<double>(double*, const double*, double*, double*, int64_t, const float*,
                                            const double*, double, float, float, float, float);
template void adamw_update<float>(float*, const float*, float*, float*, int64_t, float, float, float, float, float, int64_t,
                                  double);
template void adamw_update<double>(double*, const double*, double*, double*, int64_t, float, float, float, float, float,
                                   int64_t, double);

}  // namespace tinygpt::cpu

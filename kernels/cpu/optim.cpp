// Optimizer kernels.
#include <cmath>
#include <type_traits>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/scalar_math.h"

namespace tinygpt::cpu {

namespace {

/// One AdamW update of every element of the runs, each run with its weight decay, the gradient taken as gs * grad.
template <class T>
void update_runs(T* param, const T* grad, T* m, T* v, const AdamWRuns& runs, float lr, float beta1, float beta2,
                 float eps, T gs, T c1, T c2) {
  for (int r = 0; r < runs.count; ++r) {
    const int64_t first = runs.begin[r], n = runs.length(r);
    const float wd = runs.weight_decay[r];
    if constexpr (std::is_same_v<T, float>) {
      if (bf16* copy = runs.copy) {  // bf16 storage: the working copy written in the same pass
#pragma omp parallel for simd if (n >= kParallelGrain)
        for (int64_t i = first; i < first + n; ++i) {
          adamw_element(param[i], gs * grad[i], m[i], v[i], lr, beta1, beta2, eps, wd, c1, c2);
          copy[i] = bf16(param[i]);
        }
        continue;
      }
    }
#pragma omp parallel for simd if (n >= kParallelGrain)
    for (int64_t i = first; i < first + n; ++i)
      adamw_element(param[i], gs * grad[i], m[i], v[i], lr, beta1, beta2, eps, wd, c1, c2);
  }
}

}  // namespace

template <class T>
void adamw_update(T* param, const T* grad, T* m, T* v, const AdamWRuns& runs, const float* sched, const T* stats,
                  double max_norm, float beta1, float beta2, float eps) {
  if (!is_finite(double(stats[0])) || !is_finite(double(stats[1]))) return;  // the step is refused: nothing moves
  update_runs(param, grad, m, v, runs, sched[0], beta1, beta2, eps, T(clip_scale(double(stats[1]), max_norm)),
              T(sched[1]), T(sched[2]));
}

// The storage types kernels/kernel_list.h lists for each kernel.
TINYGPT_INSTANTIATE_F32_F64(adamw_update)

}  // namespace tinygpt::cpu

// The fused kernels of a GPT: layernorm, embedding lookup, cross-entropy from logits, dropout.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/scalar_math.h"

namespace tinygpt::cpu {
namespace {

/// [first, last) of `n` items owned by thread `tid` of `nth`.
inline std::pair<int64_t, int64_t> thread_range(int64_t n, int tid, int nth) {
  return {n * tid / nth, n * (tid + 1) / nth};
}

}  // namespace

/// One row of layer norm: y = (x - mean) * rstd * weight + bias, with its mean and rstd.
template <class T>
inline void layernorm_row(T* y, T& mean, T& rstd, const T* x, const T* weight, const T* bias, int64_t C, T eps) {
  // Vector reductions (lanes summed in their own order): a plain loop is one dependent add per element.
  T m = 0;
#pragma omp simd reduction(+ : m)
  for (int64_t c = 0; c < C; ++c) m += x[c];
  m /= T(C);
  T v = 0;
#pragma omp simd reduction(+ : v)
  for (int64_t c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
  v /= T(C);
  const T s = T(1) / std::sqrt(v + eps);
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) y[c] = (x[c] - m) * s * weight[c] + (bias ? bias[c] : T(0));
  mean = m;
  rstd = s;
}

template <class T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C, T eps) {
#pragma omp parallel for if (N * C >= kParallelGrain)
  for (int64_t n = 0; n < N; ++n) layernorm_row(out + n * C, mean[n], rstd[n], inp + n * C, weight, bias, C, eps);
}

template <class T>
void add_layernorm_forward(T* sum, T* out, T* mean, T* rstd, const T* a, const T* b, const T* weight, const T* bias,
                           int64_t N, int64_t C, T eps, float p, uint64_t seed) {
  const T scale = dropout_scale<T>(p);
  const DropoutStream stream(seed);
#pragma omp parallel for if (N * C >= kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    T* s = sum + n * C;
    const T *x = a + n * C, *y = b + n * C;
    if (p == 0.0f) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) s[c] = x[c] + y[c];
    } else if (uint64_t((n + 1) * C) <= uint64_t(1) << 32) {  // the row's elements all on the first key: vectorizes
      const uint32_t i0 = uint32_t(n * C);
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const T kept = dropout_uniform(stream.key0, i0 + uint32_t(c)) >= p ? y[c] * scale : T(0);
        s[c] = x[c] + kept;
      }
    } else {
      for (int64_t c = 0; c < C; ++c) s[c] = x[c] + (stream.keep(n * C + c, p) ? y[c] * scale : T(0));
    }
    layernorm_row(out + n * C, mean[n], rstd[n], s, weight, bias, C, eps);  // s is still in L1
  }
}

template <class T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, const T* mean,
                        const T* rstd, int64_t N, int64_t C, bool overwrite_dinp) {
  // dweight/dbias: each thread sums its rows into a private row, then the rows are added in thread order.
  const int nth = N * C >= kParallelGrain ? omp_get_max_threads() : 1;
  std::vector<T> partial(size_t(2 * nth * C), T(0));
#pragma omp parallel num_threads(nth)
  {
    const int tid = omp_get_thread_num();
    T* pw = partial.data() + 2 * tid * C;
    T* pb = pw + C;
    const auto [n0, n1] = thread_range(N, tid, omp_get_num_threads());
    for (int64_t n = n0; n < n1; ++n) {
      const T* g = dout + n * C;
      const T* x = inp + n * C;
      const T m = mean[n], s = rstd[n];
      T dnorm_mean = 0, dnorm_norm_mean = 0;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
      for (int64_t c = 0; c < C; ++c) {
        const T norm = (x[c] - m) * s;
        const T dnorm = g[c] * weight[c];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
        pw[c] += norm * g[c];
        pb[c] += g[c];
      }
      dnorm_mean /= T(C);
      dnorm_norm_mean /= T(C);
      if (dinp) {
        T* dx = dinp + n * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) {
          const T norm = (x[c] - m) * s;
          const T d = (g[c] * weight[c] - dnorm_mean - norm * dnorm_norm_mean) * s;
          dx[c] = overwrite_dinp ? d : dx[c] + d;  // overwrite: whatever dx held (uninitialized) is not used
        }
      }
    }
  }
  for (int t = 0; t < nth; ++t) {
    const T* pw = partial.data() + 2 * t * C;
    for (int64_t c = 0; c < C; ++c) {
      if (dweight) dweight[c] += pw[c];
      if (dbias) dbias[c] += pw[C + c];
    }
  }
}

template <class T>
void embedding_forward(T* out, const int32_t* ids, const T* weight, int64_t N, int64_t C) {
#pragma omp parallel for if (N * C >= kParallelGrain)
  for (int64_t n = 0; n < N; ++n) std::copy_n(weight + int64_t(ids[n]) * C, C, out + n * C);
}

template <class T>
void embedding_backward(T* dweight, const T* dout, const int32_t* ids, const int32_t*, int64_t N, int64_t, int64_t C) {
  // Threads own disjoint channel ranges and walk all rows in order: race-free and deterministic.
#pragma omp parallel if (N * C >= kParallelGrain)
  {
    const auto [c0, c1] = thread_range(C, omp_get_thread_num(), omp_get_num_threads());
    for (int64_t n = 0; n < N; ++n) {
      T* dw = dweight + int64_t(ids[n]) * C;
      const T* g = dout + n * C;
      for (int64_t c = c0; c < c1; ++c) dw[c] += g[c];
    }
  }
}

template <class T>
void crossentropy_forward(T* losses, T* lse, const T* logits, const int32_t* targets, int64_t N, int64_t V, int32_t ignore_index) {
#pragma omp parallel for if (N * V >= kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = logits + n * V;
    const T maxval = *std::max_element(x, x + V);
    T sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(x[v] - maxval);
    lse[n] = maxval + std::log(sum);
    losses[n] = targets[n] == ignore_index ? T(0) : lse[n] - x[targets[n]];
  }
}

template <class T>
void crossentropy_backward(T* dlogits, const T* dloss_in, T scale, const T* logits, const T* lse, const int32_t* targets, int64_t N, int64_t V, int32_t ignore_index) {
  const T dloss = *dloss_in * scale;
#pragma omp parallel for if (N * V >= kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] == ignore_index) continue;
    const T* x = logits + n * V;
    T* dx = dlogits + n * V;
    for (int64_t v = 0; v < V; ++v) dx[v] += dloss * std::exp(x[v] - lse[n]);
    dx[targets[n]] -= dloss;
  }
}

template <class T>
void dropout_forward(T* out, const T* inp, int64_t n, float p, uint64_t seed) {
  const T scale = dropout_scale<T>(p);
  const uint32_t key = dropout_key(seed, 0);
  const int64_t low = std::min(n, int64_t(1) << 32);  // the elements of the first key: a loop that vectorizes
#pragma omp parallel for if (n >= kParallelGrain)
  for (int64_t i = 0; i < low; ++i) out[i] = dropout_uniform(key, uint32_t(i)) >= p ? inp[i] * scale : T(0);
  for (int64_t i = low; i < n; ++i) out[i] = dropout_keep(seed, i, p) ? inp[i] * scale : T(0);
}

template <class T>
void dropout_backward(T* dinp, const T* dout, int64_t n, float p, uint64_t seed) {
  const T scale = dropout_scale<T>(p);
  const uint32_t key = dropout_key(seed, 0);
  const int64_t low = std::min(n, int64_t(1) << 32);  // as in the forward
#pragma omp parallel for if (n >= kParallelGrain)
  for (int64_t i = 0; i < low; ++i) {
    if (dropout_uniform(key, uint32_t(i)) >= p) dinp[i] += dout[i] * scale;
  }
  for (int64_t i = low; i < n; ++i) {
    if (dropout_keep(seed, i, p)) dinp[i] += dout[i] * scale;
  }
}

#define TINYGPT_INSTANTIATE(T)                                                                                          \
  template void layernorm_forward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, int64_t, T);                    \
  template void add_layernorm_forward<T>(T*, T*, T*, T*, const T*, const T*, const T*, const T*, int64_t, int64_t, T,     \
                                         float, uint64_t);                                                              \
  template void layernorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, int64_t, int64_t, bool);  \
  template void embedding_forward<T>(T*, const int32_t*, const T*, int64_t, int64_t);                                   \
  template void embedding_backward<T>(T*, const T*, const int32_t*, const int32_t*, int64_t, int64_t, int64_t);                         \
  template void crossentropy_forward<T>(T*, T*, const T*, const int32_t*, int64_t, int64_t, int32_t);                   \
  template void crossentropy_backward<T>(T*, const T*, T, const T*, const T*, const int32_t*, int64_t, int64_t, int32_t);         \
  template void dropout_forward<T>(T*, const T*, int64_t, float, uint64_t);                                             \
  template void dropout_backward<T>(T*, const T*, int64_t, float, uint64_t);
TINYGPT_INSTANTIATE(float)
TINYGPT_INSTANTIATE(double)
#undef TINYGPT_INSTANTIATE

}  // namespace tinygpt::cpu

// The fused kernels of a GPT: layernorm and RMSNorm, SwiGLU's gate, embedding lookup, cross-entropy from logits,
// dropout.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/cpu/bf16_rows.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/scalar_math.h"

namespace tinygpt::cpu {
namespace {

/// [first, last) of `n` items owned by thread `tid` of `nth`.
inline std::pair<int64_t, int64_t> thread_range(int64_t n, int tid, int nth) {
  return {n * tid / nth, n * (tid + 1) / nth};
}

}  // namespace

// Each kernel reads T (f32, f64, or bf16 storage) and computes in F = compute_t<T> (f32 for bf16): the statistics
// (mean, rstd), the log-sum-exp and the losses are F whatever the storage.

// RMSNorm is the layer norm without the mean (taken as 0) and without a bias: y = x * rstd * weight with rstd =
// 1 / sqrt(mean(x^2) + eps). Its kernels are the layer norm's loops with Rms set, so the two cannot drift apart.

/// One row of layer norm: y = (x - mean) * rstd * weight + bias, with its mean and rstd (RMSNorm's with Rms).
template <bool Rms, class T, class F = compute_t<T>>
inline void layernorm_row(T* y, F& mean, F& rstd, const T* x, const T* weight, const T* bias, int64_t C, F eps) {
  // Vector reductions (lanes summed in their own order): a plain loop is one dependent add per element.
  F m = 0;
  if constexpr (!Rms) {
#pragma omp simd reduction(+ : m)
    for (int64_t c = 0; c < C; ++c) m += F(x[c]);
    m /= F(C);
  }
  F v = 0;
#pragma omp simd reduction(+ : v)
  for (int64_t c = 0; c < C; ++c) v += (F(x[c]) - m) * (F(x[c]) - m);
  v /= F(C);
  const F s = F(1) / std::sqrt(v + eps);
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) y[c] = T((F(x[c]) - m) * s * F(weight[c]) + (bias ? F(bias[c]) : F(0)));
  mean = m;
  rstd = s;
}

namespace {

/// mean[n] for a layer norm; for RMSNorm (no mean saved) a scratch slot.
template <class F>
inline F& mean_slot(F* mean, int64_t n, F& scratch) {
  return mean ? mean[n] : scratch;
}

template <bool Rms, class T>
void norm_forward(T* out, compute_t<T>* mean, compute_t<T>* rstd, const T* inp, const T* weight, const T* bias,
                  int64_t N, int64_t C, compute_t<T> eps) {
#pragma omp parallel for if (N * C >= kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    compute_t<T> unused;
    layernorm_row<Rms>(out + n * C, mean_slot(mean, n, unused), rstd[n], inp + n * C, weight, bias, C, eps);
  }
}

template <bool Rms, class T>
void add_norm_forward(T* sum, T* out, compute_t<T>* mean, compute_t<T>* rstd, const T* a, const T* b, const T* weight,
                      const T* bias, int64_t N, int64_t C, compute_t<T> eps, float p, DropoutSeed seed) {
  using F = compute_t<T>;
  const F scale = dropout_scale<F>(p);
  const DropoutStream stream(seed.value());
#pragma omp parallel for if (N * C >= kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    T* s = sum + n * C;
    const T *x = a + n * C, *y = b + n * C;
    if (p == 0.0f) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) s[c] = T(F(x[c]) + F(y[c]));
    } else if (uint64_t((n + 1) * C) <= uint64_t(1) << 32) {  // the row's elements all on the first key: vectorizes
      const uint32_t i0 = uint32_t(n * C);
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const F kept = dropout_uniform(stream.key0, i0 + uint32_t(c)) >= p ? F(y[c]) * scale : F(0);
        s[c] = T(F(x[c]) + kept);
      }
    } else {
      for (int64_t c = 0; c < C; ++c) s[c] = T(F(x[c]) + (stream.keep(n * C + c, p) ? F(y[c]) * scale : F(0)));
    }
    F unused;
    layernorm_row<Rms>(out + n * C, mean_slot(mean, n, unused), rstd[n], s, weight, bias, C, eps);  // s is still in L1
  }
}

template <bool Rms, class T>
void norm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                   const compute_t<T>* mean, const compute_t<T>* rstd, int64_t N, int64_t C, bool overwrite_dinp) {
  using F = compute_t<T>;
  // dweight/dbias: each thread sums its rows into a private row, then the rows are added in thread order.
  const int nth = N * C >= kParallelGrain ? omp_get_max_threads() : 1;
  std::vector<F> partial(size_t(2 * nth * C), F(0));
#pragma omp parallel num_threads(nth)
  {
    const int tid = omp_get_thread_num();
    F* pw = partial.data() + 2 * tid * C;
    F* pb = pw + C;
    const auto [n0, n1] = thread_range(N, tid, omp_get_num_threads());
    for (int64_t n = n0; n < n1; ++n) {
      const T* g = dout + n * C;
      const T* x = inp + n * C;
      const F m = Rms ? F(0) : mean[n], s = rstd[n];
      F dnorm_mean = 0, dnorm_norm_mean = 0;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
      for (int64_t c = 0; c < C; ++c) {
        const F norm = (F(x[c]) - m) * s;
        const F dnorm = F(g[c]) * F(weight[c]);
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
        pw[c] += norm * F(g[c]);
        pb[c] += F(g[c]);
      }
      dnorm_mean = Rms ? F(0) : dnorm_mean / F(C);  // RMSNorm: no mean, so no gradient through it
      dnorm_norm_mean /= F(C);
      if (dinp) {
        T* dx = dinp + n * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) {
          const F norm = (F(x[c]) - m) * s;
          const F d = (F(g[c]) * F(weight[c]) - dnorm_mean - norm * dnorm_norm_mean) * s;
          dx[c] = T(overwrite_dinp ? d : F(dx[c]) + d);  // overwrite: whatever dx held (uninitialized) is not used
        }
      }
    }
  }
  for (int t = 0; t < nth; ++t) {
    const F* pw = partial.data() + 2 * t * C;
    for (int64_t c = 0; c < C; ++c) {
      if (dweight) dweight[c] = T(F(dweight[c]) + pw[c]);
      if (dbias) dbias[c] = T(F(dbias[c]) + pw[C + c]);
    }
  }
}

}  // namespace

// bf16 rows: widened into f32 rows (in registers, bf16_rows.h), normalized by the f32 code above, rounded on the way
// out; the weight and bias widened once a call. The same values as the generic loops, which do not vectorize on bf16.

namespace {

/// An f32 copy of n bf16 values (none for a null pointer).
std::vector<float> widened(const bf16* x, int64_t n) {
  std::vector<float> w(x ? size_t(n) : 0);
  if (x) widen_range(w.data(), x, n);
  return w;
}

template <bool Rms>
void norm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* weight, const bf16* bias, int64_t N,
                  int64_t C, float eps) {
  const std::vector<float> w = widened(weight, C), b = widened(bias, C);
#pragma omp parallel if (N * C >= kParallelGrain)
  {
    std::vector<float> x(static_cast<size_t>(C)), y(static_cast<size_t>(C));
#pragma omp for
    for (int64_t n = 0; n < N; ++n) {
      widen_range(x.data(), inp + n * C, C);
      float unused;
      layernorm_row<Rms>(y.data(), mean_slot(mean, n, unused), rstd[n], x.data(), w.data(), bias ? b.data() : nullptr,
                         C, eps);
      round_range(out + n * C, y.data(), C);
    }
  }
}

template <bool Rms>
void add_norm_forward(bf16* sum, bf16* out, float* mean, float* rstd, const bf16* a, const bf16* b, const bf16* weight,
                      const bf16* bias, int64_t N, int64_t C, float eps, float p, DropoutSeed seed) {
  const std::vector<float> w = widened(weight, C), bb = widened(bias, C);
  const float scale = dropout_scale<float>(p);
  const DropoutStream stream(seed.value());
#pragma omp parallel if (N * C >= kParallelGrain)
  {
    std::vector<float> x(static_cast<size_t>(C)), r(static_cast<size_t>(C)), y(static_cast<size_t>(C));
#pragma omp for
    for (int64_t n = 0; n < N; ++n) {
      widen_range(x.data(), a + n * C, C);
      widen_range(r.data(), b + n * C, C);
      float* xs = x.data();
      const float* rs = r.data();
      if (p == 0.0f) {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) xs[c] += rs[c];
      } else if (uint64_t((n + 1) * C) <= uint64_t(1) << 32) {  // the row's elements all on the first key: vectorizes
        const uint32_t i0 = uint32_t(n * C);
#pragma omp simd
        for (int64_t c = 0; c < C; ++c)
          xs[c] += dropout_uniform(stream.key0, i0 + uint32_t(c)) >= p ? rs[c] * scale : 0.0f;
      } else {
        for (int64_t c = 0; c < C; ++c) xs[c] += stream.keep(n * C + c, p) ? rs[c] * scale : 0.0f;
      }
      // The norm reads the sum as stored (rounded), as its backward will.
      round_range(sum + n * C, x.data(), C);
      widen_range(x.data(), sum + n * C, C);
      float unused;
      layernorm_row<Rms>(y.data(), mean_slot(mean, n, unused), rstd[n], x.data(), w.data(), bias ? bb.data() : nullptr,
                         C, eps);
      round_range(out + n * C, y.data(), C);
    }
  }
}

template <bool Rms>
void norm_backward(bf16* dinp, bf16* dweight, bf16* dbias, const bf16* dout, const bf16* inp, const bf16* weight,
                   const float* mean, const float* rstd, int64_t N, int64_t C, bool overwrite_dinp) {
  const std::vector<float> w = widened(weight, C);
  const int nth = N * C >= kParallelGrain ? omp_get_max_threads() : 1;
  std::vector<float> partial(size_t(2 * nth * C), 0.0f);
#pragma omp parallel num_threads(nth)
  {
    const int tid = omp_get_thread_num();
    float* pw = partial.data() + 2 * tid * C;
    float* pb = pw + C;
    std::vector<float> g(static_cast<size_t>(C)), x(static_cast<size_t>(C)), dx(static_cast<size_t>(C));
    const auto [n0, n1] = thread_range(N, tid, omp_get_num_threads());
    for (int64_t n = n0; n < n1; ++n) {
      widen_range(g.data(), dout + n * C, C);
      widen_range(x.data(), inp + n * C, C);
      const float m = Rms ? 0.0f : mean[n], s = rstd[n];
      float dnorm_mean = 0, dnorm_norm_mean = 0;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
      for (int64_t c = 0; c < C; ++c) {
        const float norm = (x[size_t(c)] - m) * s;
        const float dnorm = g[size_t(c)] * w[size_t(c)];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
        pw[c] += norm * g[size_t(c)];
        pb[c] += g[size_t(c)];
      }
      dnorm_mean = Rms ? 0.0f : dnorm_mean / float(C);
      dnorm_norm_mean /= float(C);
      if (dinp) {
        if (!overwrite_dinp) widen_range(dx.data(), dinp + n * C, C);
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) {
          const float norm = (x[size_t(c)] - m) * s;
          const float d = (g[size_t(c)] * w[size_t(c)] - dnorm_mean - norm * dnorm_norm_mean) * s;
          dx[size_t(c)] = overwrite_dinp ? d : dx[size_t(c)] + d;
        }
        round_range(dinp + n * C, dx.data(), C);
      }
    }
  }
  // The threads' sums added in f32 in thread order, then to what the gradients held, each rounded once (not once per
  // thread: the rounding would then depend on the thread count).
  for (int t = 1; t < nth; ++t) {
    const float* pt = partial.data() + 2 * t * C;
    for (int64_t c = 0; c < 2 * C; ++c) partial[size_t(c)] += pt[c];
  }
  for (int64_t c = 0; c < C; ++c) {
    if (dweight) dweight[c] = bf16(float(dweight[c]) + partial[size_t(c)]);
    if (dbias) dbias[c] = bf16(float(dbias[c]) + partial[size_t(C + c)]);
  }
}

}  // namespace

template <class T>
void layernorm_forward(T* out, compute_t<T>* mean, compute_t<T>* rstd, const T* inp, const T* weight, const T* bias,
                       int64_t N, int64_t C, compute_t<T> eps) {
  norm_forward<false>(out, mean, rstd, inp, weight, bias, N, C, eps);
}

template <class T>
void add_layernorm_forward(const AddNormForward<T>& c) {
  add_norm_forward<false>(c.sum, c.out, c.mean, c.rstd, c.a, c.b, c.weight, c.bias, c.N, c.C, c.eps, c.p, c.seed);
}

template <class T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                        const compute_t<T>* mean, const compute_t<T>* rstd, int64_t N, int64_t C, bool overwrite_dinp) {
  norm_backward<false>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, overwrite_dinp);
}

template <class T>
void rmsnorm_forward(T* out, compute_t<T>* rstd, const T* inp, const T* weight, int64_t N, int64_t C,
                     compute_t<T> eps) {
  norm_forward<true>(out, static_cast<compute_t<T>*>(nullptr), rstd, inp, weight, static_cast<const T*>(nullptr), N, C,
                     eps);
}

template <class T>
void add_rmsnorm_forward(const AddNormForward<T>& c) {
  add_norm_forward<true>(c.sum, c.out, static_cast<compute_t<T>*>(nullptr), c.rstd, c.a, c.b, c.weight,
                         static_cast<const T*>(nullptr), c.N, c.C, c.eps, c.p, c.seed);
}

template <class T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const compute_t<T>* rstd,
                      int64_t N, int64_t C, bool overwrite_dinp) {
  norm_backward<true>(dinp, dweight, static_cast<T*>(nullptr), dout, inp, weight,
                      static_cast<const compute_t<T>*>(nullptr), rstd, N, C, overwrite_dinp);
}

// SwiGLU: float rows with the exp that vectorizes (vec_math.h), double with libm's (the gradient checks); bf16 rows
// widened into float rows, computed as float and rounded once on the way out.

namespace {

struct ExpOf {
  float operator()(float x) const { return exp_vec(x); }
  double operator()(double x) const { return std::exp(x); }
};

template <class F>
void swiglu_row(F* y, const F* g, const F* u, int64_t H) {
#pragma omp simd
  for (int64_t h = 0; h < H; ++h) y[h] = swiglu(g[h], u[h], ExpOf{});
}

/// dg, du (=, or += with accumulate) of one row.
template <bool Accumulate, class F>
void swiglu_grad_row(F* __restrict dg, F* __restrict du, const F* g, const F* u, const F* d, int64_t H) {
#pragma omp simd
  for (int64_t h = 0; h < H; ++h) {
    F a, b;
    swiglu_grad(g[h], u[h], d[h], a, b, ExpOf{});
    if constexpr (Accumulate) {
      dg[h] += a, du[h] += b;
    } else {
      dg[h] = a, du[h] = b;
    }
  }
}

template <class F>
void swiglu_grad_row(F* dg, F* du, const F* g, const F* u, const F* d, int64_t H, bool accumulate) {
  accumulate ? swiglu_grad_row<true>(dg, du, g, u, d, H) : swiglu_grad_row<false>(dg, du, g, u, d, H);
}

}  // namespace

template <class T>
void swiglu_forward(T* out, const T* inp, int64_t N, int64_t H) {
  if constexpr (std::is_same_v<T, bf16>) {
#pragma omp parallel if (N * H >= kParallelGrain)
    {
      std::vector<float> gu(size_t(2 * H)), y(static_cast<size_t>(H));
#pragma omp for
      for (int64_t n = 0; n < N; ++n) {
        widen_range(gu.data(), inp + 2 * n * H, 2 * H);
        swiglu_row(y.data(), gu.data(), gu.data() + H, H);
        round_range(out + n * H, y.data(), H);
      }
    }
  } else {
#pragma omp parallel for if (N * H >= kParallelGrain)
    for (int64_t n = 0; n < N; ++n) swiglu_row(out + n * H, inp + 2 * n * H, inp + 2 * n * H + H, H);
  }
}

template <class T>
void swiglu_backward(T* dinp, const T* dout, const T* inp, int64_t N, int64_t H, bool overwrite) {
  if constexpr (std::is_same_v<T, bf16>) {
#pragma omp parallel if (N * H >= kParallelGrain)
    {
      std::vector<float> gu(size_t(2 * H)), d(static_cast<size_t>(H)), grad(size_t(2 * H));
#pragma omp for
      for (int64_t n = 0; n < N; ++n) {
        widen_range(gu.data(), inp + 2 * n * H, 2 * H);
        widen_range(d.data(), dout + n * H, H);
        if (!overwrite) widen_range(grad.data(), dinp + 2 * n * H, 2 * H);
        swiglu_grad_row(grad.data(), grad.data() + H, gu.data(), gu.data() + H, d.data(), H, !overwrite);
        round_range(dinp + 2 * n * H, grad.data(), 2 * H);
      }
    }
  } else {
#pragma omp parallel for if (N * H >= kParallelGrain)
    for (int64_t n = 0; n < N; ++n) {
      T* dg = dinp + 2 * n * H;
      swiglu_grad_row(dg, dg + H, inp + 2 * n * H, inp + 2 * n * H + H, dout + n * H, H, !overwrite);
    }
  }
}

template <class T>
void embedding_forward(T* out, const int32_t* ids, const T* weight, int64_t N, int64_t C) {
#pragma omp parallel for if (N * C >= kParallelGrain)
  for (int64_t n = 0; n < N; ++n) std::copy_n(weight + int64_t(ids[n]) * C, C, out + n * C);
}

template <class T>
void embedding_backward(T* dweight, const T* dout, const int32_t* ids, const int32_t*, int64_t N, int64_t V,
                        int64_t C) {
  using F = compute_t<T>;
  if constexpr (std::is_same_v<T, F>) {
    // Threads own disjoint channel ranges and walk all rows in order: race-free and deterministic.
#pragma omp parallel if (N * C >= kParallelGrain)
    {
      const auto [c0, c1] = thread_range(C, omp_get_thread_num(), omp_get_num_threads());
      for (int64_t n = 0; n < N; ++n) {
        F* dw = dweight + int64_t(ids[n]) * C;
        const T* g = dout + n * C;
        for (int64_t c = c0; c < c1; ++c) dw[c] += g[c];
      }
    }
  } else {
    // bf16: each row's sum in f32, rounded once at the end (a row may gather thousands of rows), for the rows the ids
    // name only: an f32 copy of all of dweight (a 49,152-token vocabulary: 113 MB, zero-filled and faulted in every
    // step) cost 100 ms a step where the sums take 1. Rows the ids do not name are left as they are, which is what
    // widening and rounding them gave.
    std::vector<int32_t> slot(size_t(V), -1);
    std::vector<int64_t> named;  // the rows named, in order of first use
    for (int64_t n = 0; n < N; ++n) {
      int32_t& k = slot[size_t(ids[n])];
      if (k < 0) k = int32_t(named.size()), named.push_back(ids[n]);
    }
    const int64_t R = int64_t(named.size());
    std::vector<F> wide(size_t(R * C));
#pragma omp parallel if (N * C >= kParallelGrain)
    {
      const auto [c0, c1] = thread_range(C, omp_get_thread_num(), omp_get_num_threads());
      for (int64_t r = 0; r < R; ++r) {
        for (int64_t c = c0; c < c1; ++c) wide[size_t(r * C + c)] = F(dweight[named[size_t(r)] * C + c]);
      }
      for (int64_t n = 0; n < N; ++n) {
        F* dw = wide.data() + int64_t(slot[size_t(ids[n])]) * C;
        const T* g = dout + n * C;
        for (int64_t c = c0; c < c1; ++c) dw[c] += F(g[c]);
      }
      for (int64_t r = 0; r < R; ++r) {
        for (int64_t c = c0; c < c1; ++c) dweight[named[size_t(r)] * C + c] = T(wide[size_t(r * C + c)]);
      }
    }
  }
}

namespace {

/// e^x over a row of logits: exp_vec in float (a loop over it vectorizes; libm's expf was a third of the classifier's
/// time), libm's in double (the gradient checks).
template <class F>
inline F row_exp(F x) {
  if constexpr (std::is_same_v<F, float>) {
    return exp_vec(x);
  } else {
    return std::exp(x);
  }
}

/// Row n's lse, written with its loss (0 where the target is ignored).
template <class T>
compute_t<T> crossentropy_row(compute_t<T>* losses, compute_t<T>* lse, const T* x, int32_t target, int64_t n, int64_t V,
                              int32_t ignore_index) {
  using F = compute_t<T>;
  F maxval = F(x[0]);
#pragma omp simd reduction(max : maxval)
  for (int64_t v = 0; v < V; ++v) maxval = std::max(maxval, F(x[v]));
  F sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t v = 0; v < V; ++v) sum += row_exp(F(x[v]) - maxval);
  const F l = maxval + std::log(sum);
  lse[n] = l;
  losses[n] = target == ignore_index ? F(0) : l - F(x[target]);
  return l;
}

/// dx (= when `overwrite`, else +=) dloss * (softmax(x) - onehot(target)) for one row whose lse is l.
template <class T>
void crossentropy_grad_row(T* dx, const T* x, compute_t<T> l, int32_t target, compute_t<T> dloss, int64_t V,
                           bool overwrite) {
  using F = compute_t<T>;
  if constexpr (std::is_same_v<T, F>) {
    if (overwrite) {
#pragma omp simd
      for (int64_t v = 0; v < V; ++v) dx[v] = dloss * row_exp(x[v] - l);
    } else {
#pragma omp simd
      for (int64_t v = 0; v < V; ++v) dx[v] += dloss * row_exp(x[v] - l);
    }
    dx[target] -= dloss;
  } else {  // bf16: the target's term inside, so each element is rounded once; in f32 a run at a time, then rounded
    constexpr int64_t kRun = 256;
    F g[kRun];
    for (int64_t v0 = 0; v0 < V; v0 += kRun) {
      const int64_t n = std::min(kRun, V - v0);
      const T* xr = x + v0;
      const T* held = dx + v0;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) {
        const F onehot = v0 + i == target ? F(1) : F(0);
        g[i] = (overwrite ? F(0) : F(held[i])) + dloss * (row_exp(F(xr[i]) - l) - onehot);
      }
      round_range(dx + v0, g, n);
    }
  }
}

}  // namespace

template <class T>
void crossentropy_forward(compute_t<T>* losses, compute_t<T>* lse, const T* logits, const int32_t* targets, int64_t N,
                          int64_t V, int32_t ignore_index) {
#pragma omp parallel for if (N * V >= kParallelGrain)
  for (int64_t n = 0; n < N; ++n) crossentropy_row(losses, lse, logits + n * V, targets[n], n, V, ignore_index);
}

template <class T>
void crossentropy_backward(T* dlogits, const compute_t<T>* dloss_in, compute_t<T> scale, const T* logits,
                           const compute_t<T>* lse, const int32_t* targets, int64_t N, int64_t V, int32_t ignore_index,
                           bool fused) {
  using F = compute_t<T>;
  if (fused && *dloss_in == F(1)) return;  // crossentropy_fused's gradient is this one
  const F dloss = *dloss_in * scale;
#pragma omp parallel for if (N * V >= kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] == ignore_index) continue;  // fused: its row is zero already
    crossentropy_grad_row(dlogits + n * V, logits + n * V, lse[n], targets[n], dloss, V, fused);
  }
}

template <class T>
void crossentropy_fused(compute_t<T>* losses, compute_t<T>* lse, T* dlogits, const T* logits, const int32_t* targets,
                        compute_t<T> scale, int64_t N, int64_t V, int32_t ignore_index) {
  using F = compute_t<T>;
  // dloss as crossentropy_backward computes it for an upstream gradient of 1, so both give the same bits.
  const F dloss = F(1) * scale;
#pragma omp parallel for if (N * V >= kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = logits + n * V;
    const F l = crossentropy_row(losses, lse, x, targets[n], n, V, ignore_index);
    T* dx = dlogits + n * V;
    if (targets[n] == ignore_index) {
      std::fill(dx, dx + V, T(0.0f));
    } else {
      crossentropy_grad_row(dx, x, l, targets[n], dloss, V, true);
    }
  }
}

template <class T>
void dropout_forward(T* out, const T* inp, int64_t n, float p, DropoutSeed from) {
  const uint64_t seed = from.value();
  using F = compute_t<T>;
  const F scale = dropout_scale<F>(p);
  const uint32_t key = dropout_key(seed, 0);
  const int64_t low = std::min(n, int64_t(1) << 32);  // the elements of the first key: a loop that vectorizes
#pragma omp parallel for if (n >= kParallelGrain)
  for (int64_t i = 0; i < low; ++i) out[i] = T(dropout_uniform(key, uint32_t(i)) >= p ? F(inp[i]) * scale : F(0));
  for (int64_t i = low; i < n; ++i) out[i] = T(dropout_keep(seed, i, p) ? F(inp[i]) * scale : F(0));
}

template <class T>
void dropout_backward(T* dinp, const T* dout, int64_t n, float p, DropoutSeed from) {
  const uint64_t seed = from.value();
  using F = compute_t<T>;
  const F scale = dropout_scale<F>(p);
  const uint32_t key = dropout_key(seed, 0);
  const int64_t low = std::min(n, int64_t(1) << 32);  // as in the forward
#pragma omp parallel for if (n >= kParallelGrain)
  for (int64_t i = 0; i < low; ++i) {
    if (dropout_uniform(key, uint32_t(i)) >= p) dinp[i] = T(F(dinp[i]) + F(dout[i]) * scale);
  }
  for (int64_t i = low; i < n; ++i) {
    if (dropout_keep(seed, i, p)) dinp[i] = T(F(dinp[i]) + F(dout[i]) * scale);
  }
}

// The storage types kernels/kernel_list.h lists for each kernel.
// bf16's layer norms are the specializations above.
TINYGPT_INSTANTIATE_F32_F64_BF16(layernorm_forward)
TINYGPT_INSTANTIATE_F32_F64_BF16(add_layernorm_forward)
TINYGPT_INSTANTIATE_F32_F64_BF16(layernorm_backward)
TINYGPT_INSTANTIATE_F32_F64_BF16(rmsnorm_forward)
TINYGPT_INSTANTIATE_F32_F64_BF16(add_rmsnorm_forward)
TINYGPT_INSTANTIATE_F32_F64_BF16(rmsnorm_backward)
TINYGPT_INSTANTIATE_F32_F64_BF16(swiglu_forward)
TINYGPT_INSTANTIATE_F32_F64_BF16(swiglu_backward)
TINYGPT_INSTANTIATE_F32_F64_BF16(embedding_forward)
TINYGPT_INSTANTIATE_F32_F64_BF16(embedding_backward)
TINYGPT_INSTANTIATE_F32_F64_BF16(crossentropy_forward)
TINYGPT_INSTANTIATE_F32_F64_BF16(crossentropy_backward)
TINYGPT_INSTANTIATE_F32_F64_BF16(crossentropy_fused)
TINYGPT_INSTANTIATE_F32_F64_BF16(dropout_forward)
TINYGPT_INSTANTIATE_F32_F64_BF16(dropout_backward)

}  // namespace tinygpt::cpu

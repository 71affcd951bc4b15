// Reductions over one dimension and row-wise softmax / log-softmax, with their backward passes.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"

namespace tinygpt::cpu {

namespace {

/// The sum over i < n of term(x[i]) in double: fixed chunks, each summed in 8 lanes (so the loop vectorizes; a
/// single double accumulator is a chain of dependent adds, 4 cycles an element), the lanes and then the chunks' sums
/// added in a fixed order. The result does not depend on the thread count.
template <class T, class Term>
double chunked_sum(const T* x, int64_t n, Term term) {
  constexpr int64_t kChunk = 4096, kLanes = 8;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(size_t(std::max<int64_t>(chunks, 1)), 0.0);
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
  for (int64_t c = 0; c < chunks; ++c) {
    const T* xc = x + c * kChunk;
    const int64_t len = std::min(kChunk, n - c * kChunk);
    double lane[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= len; i += kLanes) {
      for (int64_t j = 0; j < kLanes; ++j) lane[j] += term(double(xc[i + j]));
    }
    for (; i < len; ++i) lane[i % kLanes] += term(double(xc[i]));
    partial[size_t(c)] = ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
  }
  double acc = 0;
  for (const double p : partial) acc += p;
  return acc;
}

}  // namespace

template <class T>
void sum_forward(T* out, const T* inp, int64_t outer, int64_t D, int64_t inner, T alpha) {
  if (outer * inner == 1) {
    // One output: the same sum whatever the thread count.
    out[0] = T(alpha * chunked_sum(inp, D, [](double v) { return v; }));
    return;
  }
#pragma omp parallel for if (outer * D * inner >= kParallelGrain)
  for (int64_t j = 0; j < outer * inner; ++j) {
    const int64_t o = j / inner, i = j % inner;
    const T* x = inp + o * D * inner + i;
    double acc = 0;
    for (int64_t d = 0; d < D; ++d) acc += x[d * inner];
    out[j] = T(alpha * acc);
  }
}

template <class T>
void sum_squares(T* out, const T* inp, int64_t n) {
  out[0] = T(chunked_sum(inp, n, [](double v) { return v * v; }));
}

template <class T>
void sum_backward(T* dinp, const T* dout, int64_t outer, int64_t D, int64_t inner, T alpha) {
#pragma omp parallel for if (outer * D * inner >= kParallelGrain)
  for (int64_t od = 0; od < outer * D; ++od) {
    const T* g = dout + (od / D) * inner;
    T* dx = dinp + od * inner;
    for (int64_t i = 0; i < inner; ++i) dx[i] += alpha * g[i];
  }
}

template <class T>
void softmax_forward(T* out, const T* inp, int64_t N, int64_t C) {
#pragma omp parallel for if (N * C >= kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    T* y = out + n * C;
    const T maxval = *std::max_element(x, x + C);
    if (maxval == -std::numeric_limits<T>::infinity()) {  // every entry masked out: zeros, as attention does
      std::fill_n(y, C, T(0));
      continue;
    }
    T sum = 0;
    for (int64_t c = 0; c < C; ++c) {
      y[c] = std::exp(x[c] - maxval);
      sum += y[c];
    }
    const T inv = T(1) / sum;
    for (int64_t c = 0; c < C; ++c) y[c] *= inv;
  }
}

template <class T>
void softmax_backward(T* dinp, const T* dout, const T* out, int64_t N, int64_t C) {
#pragma omp parallel for if (N * C >= kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    const T* g = dout + n * C;
    const T* y = out + n * C;
    T dot = 0;
    for (int64_t c = 0; c < C; ++c) dot += g[c] * y[c];
    T* dx = dinp + n * C;
    for (int64_t c = 0; c < C; ++c) dx[c] += y[c] * (g[c] - dot);
  }
}

template <class T>
void log_softmax_forward(T* out, const T* inp, int64_t N, int64_t C) {
#pragma omp parallel for if (N * C >= kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    T* y = out + n * C;
    const T maxval = *std::max_element(x, x + C);
    T sum = 0;
    for (int64_t c = 0; c < C; ++c) sum += std::exp(x[c] - maxval);
    const T lse = maxval + std::log(sum);
    for (int64_t c = 0; c < C; ++c) y[c] = x[c] - lse;
  }
}

template <class T>
void log_softmax_backward(T* dinp, const T* dout, const T* out, int64_t N, int64_t C) {
#pragma omp parallel for if (N * C >= kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    const T* g = dout + n * C;
    const T* y = out + n * C;
    T gsum = 0;
    for (int64_t c = 0; c < C; ++c) gsum += g[c];
    T* dx = dinp + n * C;
    for (int64_t c = 0; c < C; ++c) dx[c] += g[c] - std::exp(y[c]) * gsum;
  }
}

// The storage types kernels/kernel_list.h lists for each kernel.
TINYGPT_INSTANTIATE_F32_F64(sum_forward)
TINYGPT_INSTANTIATE_F32_F64(sum_backward)
TINYGPT_INSTANTIATE_F32_F64(sum_squares)
TINYGPT_INSTANTIATE_F32_F64(softmax_forward)
TINYGPT_INSTANTIATE_F32_F64(softmax_backward)
TINYGPT_INSTANTIATE_F32_F64(log_softmax_forward)
TINYGPT_INSTANTIATE_F32_F64(log_softmax_backward)

}  // namespace tinygpt::cpu

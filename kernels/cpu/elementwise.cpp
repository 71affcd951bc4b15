// Elementwise kernels: fill, axpy, unary maps and broadcast binary maps, with their backward passes.
#include <algorithm>
#include <bit>
#include <cmath>

#include "kernels/cpu/bf16_rows.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/scalar_math.h"

namespace tinygpt::cpu {
namespace {

// The maps read each element as compute_t<T> (f32 for bf16 storage), compute there, and store T.

template <class T, class F>
void map(T* out, const T* inp, int64_t n, F f) {
  using C = compute_t<T>;
#pragma omp parallel for simd if (n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i) out[i] = T(f(C(inp[i])));
}

/// dinp (+)= dout * dfdx(x): written when overwrite (dinp is then never read), else added.
template <class T, class F>
void accumulate_map(T* dinp, const T* dout, const T* x, int64_t n, F dfdx, bool overwrite) {
  using C = compute_t<T>;
  if (overwrite) {
#pragma omp parallel for simd if (n >= kParallelGrain)
    for (int64_t i = 0; i < n; ++i) dinp[i] = T(C(dout[i]) * dfdx(C(x[i])));
    return;
  }
#pragma omp parallel for simd if (n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i) dinp[i] = T(C(dinp[i]) + C(dout[i]) * dfdx(C(x[i])));
}

/// Offsets of output coordinate c into out, a and b.
struct Offsets {
  int64_t out, a, b;
};

inline Offsets offsets_of(const int64_t* c, const int64_t* out_stride, const BroadcastGeom& g) {
  Offsets o{0, 0, 0};
  for (int d = 0; d < kMaxDims; ++d) {
    o.out += c[d] * out_stride[d];
    o.a += c[d] * g.a_stride[d];
    o.b += c[d] * g.b_stride[d];
  }
  return o;
}

template <class T, class F>
void broadcast_map(T* out, const T* a, const T* b, const BroadcastGeom& g, F f) {
  using C = compute_t<T>;
  if (g.same_shape) {
    const int64_t n = g.out[0] * g.out[1] * g.out[2] * g.out[3] * g.out[4];
#pragma omp parallel for simd if (n >= kParallelGrain)
    for (int64_t i = 0; i < n; ++i) out[i] = T(f(C(a[i]), C(b[i])));
    return;
  }
  int64_t out_stride[kMaxDims];
  contiguous_strides(g.out, out_stride, kMaxDims);
  const int64_t inner = g.out[kMaxDims - 1];
  const int64_t outer = g.out[0] * g.out[1] * g.out[2] * g.out[3];
  const int64_t sa = g.a_stride[kMaxDims - 1], sb = g.b_stride[kMaxDims - 1];
#pragma omp parallel for if (outer * inner >= kParallelGrain)
  for (int64_t o = 0; o < outer; ++o) {
    int64_t c[kMaxDims] = {0, 0, 0, 0, 0};
    for (int64_t d = kMaxDims - 2, rem = o; d >= 0; --d) {
      c[d] = rem % g.out[d];
      rem /= g.out[d];
    }
    const Offsets off = offsets_of(c, out_stride, g);
    T* y = out + off.out;
    const T* pa = a + off.a;
    const T* pb = b + off.b;
    for (int64_t i = 0; i < inner; ++i) y[i] = T(f(C(pa[i * sa]), C(pb[i * sb])));
  }
}

/// dx[t] += sum over the output positions that read x[t] of contrib(offsets). Parallel over the elements
/// of x, each summing its own broadcast positions: no two threads write the same element.
template <class T, class F>
void accumulate_broadcast(T* dx, const int64_t* x_stride, const BroadcastGeom& g, F contrib) {
  int64_t out_stride[kMaxDims], extent[kMaxDims];
  int reduced[kMaxDims];
  int n_reduced = 0;
  int64_t xn = 1, rn = 1;
  contiguous_strides(g.out, out_stride, kMaxDims);
  for (int d = 0; d < kMaxDims; ++d) {
    extent[d] = x_stride[d] != 0 ? g.out[d] : 1;
    xn *= extent[d];
    if (extent[d] == 1 && g.out[d] > 1) {
      reduced[n_reduced++] = d;
      rn *= g.out[d];
    }
  }
  if (xn == 0 || g.out[0] * g.out[1] * g.out[2] * g.out[3] * g.out[4] == 0) return;  // nothing reads x: adds 0
  // Pieces of rows of x's innermost dimension at a time, so the inner loop walks memory in order; each element
  // still sums its broadcast positions in the same order, in double.
  constexpr int64_t kPiece = 256;
  const int64_t inner = extent[kMaxDims - 1], rows = xn / inner, pieces = (inner + kPiece - 1) / kPiece;
  const int64_t so = out_stride[kMaxDims - 1], sa = g.a_stride[kMaxDims - 1], sb = g.b_stride[kMaxDims - 1];
#pragma omp parallel if (xn * rn >= kParallelGrain)
  {
    double acc[kPiece];
#pragma omp for
    for (int64_t task = 0; task < rows * pieces; ++task) {
      const int64_t row = task / pieces, i0 = task % pieces * kPiece, n = std::min(kPiece, inner - i0);
      int64_t c[kMaxDims];
      c[kMaxDims - 1] = i0;
      for (int64_t d = kMaxDims - 2, rem = row; d >= 0; --d) {
        c[d] = rem % extent[d];
        rem /= extent[d];
      }
      std::fill_n(acc, n, 0.0);
      for (int64_t r = 0; r < rn; ++r) {
        for (int64_t k = n_reduced - 1, rem = r; k >= 0; --k) {
          c[reduced[k]] = rem % g.out[reduced[k]];
          rem /= g.out[reduced[k]];
        }
        const Offsets o = offsets_of(c, out_stride, g);
        for (int64_t i = 0; i < n; ++i) acc[i] += contrib(Offsets{o.out + i * so, o.a + i * sa, o.b + i * sb});
      }
      T* dxr = dx + row * inner + i0;
      for (int64_t i = 0; i < n; ++i) dxr[i] = T(compute_t<T>(dxr[i]) + compute_t<T>(acc[i]));
    }
  }
}

}  // namespace

template <class T>
void fill(T* out, T value, int64_t n) {
#pragma omp parallel for simd if (n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i) out[i] = value;
}

namespace {

constexpr int64_t kChunk = 2048;

/// f(offset, count) over [0, n) in chunks of kChunk elements, the chunks spread over the threads (each runs the
/// vector loops of bf16_rows.h over whole chunks).
template <class F>
void for_chunks(int64_t n, F f) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for if (n >= kParallelGrain)
  for (int64_t c = 0; c < chunks; ++c) f(c * kChunk, std::min(kChunk, n - c * kChunk));
}

}  // namespace

void round_to_bf16(bf16* out, const float* inp, int64_t n) {
  for_chunks(n, [&](int64_t i, int64_t m) { round_range(out + i, inp + i, m); });
}

void widen_bf16(float* out, const bf16* inp, int64_t n) {
  for_chunks(n, [&](int64_t i, int64_t m) { widen_range(out + i, inp + i, m); });
}

void accumulate_bf16(float* y, const bf16* x, int64_t n) {
  for_chunks(n, [&](int64_t i, int64_t m) {
    float wide[kChunk];
    widen_range(wide, x + i, m);
#pragma omp simd
    for (int64_t j = 0; j < m; ++j) y[i + j] += wide[j];
  });
}

template <class T>
void axpy(T* y, const T* x, compute_t<T> alpha, int64_t n) {
  using C = compute_t<T>;
#pragma omp parallel for simd if (n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i) y[i] = T(C(y[i]) + alpha * C(x[i]));
}

/// bf16: chunks widened into f32 (bf16_rows.h), added there, rounded back: the loop over the struct does not vectorize.
template <>
void axpy<bf16>(bf16* y, const bf16* x, float alpha, int64_t n) {
  for_chunks(n, [&](int64_t i, int64_t m) {
    float a[kChunk], b[kChunk];
    widen_range(a, y + i, m);
    widen_range(b, x + i, m);
#pragma omp simd
    for (int64_t j = 0; j < m; ++j) a[j] += alpha * b[j];
    round_range(y + i, a, m);
  });
}

template <class T>
void axpby(T* y, const T* x, int64_t n, double alpha, double beta, const float* coef, const T* stats, double max_norm) {
  if (stats && (!is_finite(double(stats[0])) || !is_finite(double(stats[1])))) return;  // the step is refused
  const T a = coef ? T(coef[0]) : T(stats ? alpha * clip_scale(double(stats[1]), max_norm) : alpha);
  const T b = coef ? T(coef[1]) : T(beta);
  if (b == T(0)) {
#pragma omp parallel for simd if (n >= kParallelGrain)
    for (int64_t i = 0; i < n; ++i) y[i] = a * x[i];
    return;
  }
#pragma omp parallel for simd if (n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i) y[i] = b * y[i] + a * x[i];
}

template <class T>
void unary_forward(T* out, const T* inp, int64_t n, UnaryOp op, compute_t<T> alpha) {
  using C = compute_t<T>;
  switch (op) {
    case UnaryOp::Neg:
      return map(out, inp, n, [](C x) { return -x; });
    case UnaryOp::Scale:
      return map(out, inp, n, [alpha](C x) { return alpha * x; });
    case UnaryOp::Exp:
      return map(out, inp, n, [](C x) { return std::exp(x); });
    case UnaryOp::Log:
      return map(out, inp, n, [](C x) { return std::log(x); });
    case UnaryOp::Tanh:
      return map(out, inp, n, [](C x) { return std::tanh(x); });
    case UnaryOp::Relu:
      return map(out, inp, n, [](C x) { return x > C(0) ? x : C(0); });
    case UnaryOp::Gelu:
      return map(out, inp, n, [](C x) { return gelu(x, [](C u) { return gelu_tanh(u); }); });
    case UnaryOp::Sqrt:
      return map(out, inp, n, [](C x) { return std::sqrt(x); });
  }
}

template <class T>
void unary_backward(T* dinp, const T* dout, const T* inp, const T* out, int64_t n, UnaryOp op, compute_t<T> alpha,
                    bool overwrite) {
  using C = compute_t<T>;
  switch (op) {
    case UnaryOp::Neg:
      return accumulate_map(
          dinp, dout, inp, n, [](C) { return C(-1); }, overwrite);
    case UnaryOp::Scale:
      return accumulate_map(
          dinp, dout, inp, n, [alpha](T) { return alpha; }, overwrite);
    case UnaryOp::Exp:
      return accumulate_map(
          dinp, dout, out, n, [](C y) { return y; }, overwrite);
    case UnaryOp::Log:
      return accumulate_map(
          dinp, dout, inp, n, [](C x) { return C(1) / x; }, overwrite);
    case UnaryOp::Tanh:
      return accumulate_map(
          dinp, dout, out, n, [](C y) { return C(1) - y * y; }, overwrite);
    case UnaryOp::Relu:
      return accumulate_map(
          dinp, dout, inp, n, [](C x) { return x > C(0) ? C(1) : C(0); }, overwrite);
    case UnaryOp::Gelu:
      return accumulate_map(
          dinp, dout, inp, n, [](C x) { return gelu_grad(x, [](C u) { return gelu_tanh(u); }); }, overwrite);
    case UnaryOp::Sqrt:
      return accumulate_map(
          dinp, dout, out, n, [](C y) { return C(0.5) / y; }, overwrite);
  }
}

template <class T>
void binary_forward(T* out, const T* a, const T* b, const BroadcastGeom& g, BinaryOp op) {
  using C = compute_t<T>;
  switch (op) {
    case BinaryOp::Add:
      return broadcast_map(out, a, b, g, [](C x, T y) { return x + y; });
    case BinaryOp::Sub:
      return broadcast_map(out, a, b, g, [](C x, T y) { return x - y; });
    case BinaryOp::Mul:
      return broadcast_map(out, a, b, g, [](C x, T y) { return x * y; });
    case BinaryOp::Div:
      return broadcast_map(out, a, b, g, [](C x, T y) { return x / y; });
  }
}

namespace {

/// binary_backward with the op's partial derivatives as lambdas, so each loop is compiled for one op.
template <class T, class FA, class FB>
void binary_backward_with(T* da, T* db, const T* dout, const T* a, const T* b, const BroadcastGeom& g, FA dfda,
                          FB dfdb) {
  using C = compute_t<T>;
  if (g.same_shape) {
    const int64_t n = g.out[0] * g.out[1] * g.out[2] * g.out[3] * g.out[4];
    if (da) {
#pragma omp parallel for simd if (n >= kParallelGrain)
      for (int64_t i = 0; i < n; ++i) da[i] = T(C(da[i]) + C(dout[i]) * dfda(C(a[i]), C(b[i])));
    }
    if (db) {
#pragma omp parallel for simd if (n >= kParallelGrain)
      for (int64_t i = 0; i < n; ++i) db[i] = T(C(db[i]) + C(dout[i]) * dfdb(C(a[i]), C(b[i])));
    }
    return;
  }
  auto at = [&](Offsets o, auto df) { return double(C(dout[o.out]) * df(C(a[o.a]), C(b[o.b]))); };
  if (da) accumulate_broadcast(da, g.a_stride, g, [&](Offsets o) { return at(o, dfda); });
  if (db) accumulate_broadcast(db, g.b_stride, g, [&](Offsets o) { return at(o, dfdb); });
}

}  // namespace

template <class T>
void binary_backward(T* da, T* db, const T* dout, const T* a, const T* b, const BroadcastGeom& g, BinaryOp op) {
  using C = compute_t<T>;
  auto one = [](C, C) { return C(1); };
  switch (op) {
    case BinaryOp::Add:
      return binary_backward_with(da, db, dout, a, b, g, one, one);
    case BinaryOp::Sub:
      return binary_backward_with(da, db, dout, a, b, g, one, [](C, C) { return C(-1); });
    case BinaryOp::Mul:
      return binary_backward_with(
          da, db, dout, a, b, g, [](C, C y) { return y; }, [](C x, T) { return x; });
    case BinaryOp::Div:
      return binary_backward_with(
          da, db, dout, a, b, g, [](C, C y) { return C(1) / y; }, [](C x, T y) { return -x / (y * y); });
  }
}

// The storage types kernels/kernel_list.h lists for each kernel.
TINYGPT_INSTANTIATE_F32_F64(fill)
TINYGPT_INSTANTIATE_F32_F64(axpby)
TINYGPT_INSTANTIATE_F32_F64(axpy)  // axpy's bf16 is the specialization above
TINYGPT_INSTANTIATE_F32_F64_BF16(unary_forward)
TINYGPT_INSTANTIATE_F32_F64_BF16(unary_backward)
TINYGPT_INSTANTIATE_F32_F64_BF16(binary_forward)
TINYGPT_INSTANTIATE_F32_F64_BF16(binary_backward)

}  // namespace tinygpt::cpu

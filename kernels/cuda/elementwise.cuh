// Elementwise, broadcast, layout, dropout, optimizer and RoPE kernels on the GPU: the twins of
// kernels/cpu/{elementwise,layout,optim,rope}.cpp and the dropout half of nn.cpp (sums and softmax: reduce.cuh).
// Compiled by nvcc in elementwise.cu and by the host compiler under tests/emulated_cuda.h (see launch.cuh).
#pragma once

#include <algorithm>
#include <cmath>

#include "kernels/bf16.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/rope_freqs.h"
#include "kernels/scalar_math.h"

TINYGPT_CUDA_BEGIN
namespace {

/// tanhf for the shared GELU math.
struct Tanh {
  __host__ __device__ float operator()(float u) const { return tanhf(u); }
};

__device__ float unary(UnaryOp op, float x, float alpha) {
  switch (op) {
    case UnaryOp::Neg:
      return -x;
    case UnaryOp::Scale:
      return alpha * x;
    case UnaryOp::Exp:
      return expf(x);
    case UnaryOp::Log:
      return logf(x);
    case UnaryOp::Tanh:
      return tanhf(x);
    case UnaryOp::Relu:
      return x > 0.0f ? x : 0.0f;
    case UnaryOp::Gelu:
      return gelu(x, Tanh{});
    case UnaryOp::Sqrt:
      return sqrtf(x);
  }
  return 0.0f;
}

/// d op(x) / dx from the input x and the saved output y.
__device__ float unary_grad(UnaryOp op, float x, float y, float alpha) {
  switch (op) {
    case UnaryOp::Neg:
      return -1.0f;
    case UnaryOp::Scale:
      return alpha;
    case UnaryOp::Exp:
      return y;
    case UnaryOp::Log:
      return 1.0f / x;
    case UnaryOp::Tanh:
      return 1.0f - y * y;
    case UnaryOp::Relu:
      return x > 0.0f ? 1.0f : 0.0f;
    case UnaryOp::Gelu:
      return gelu_grad(x, Tanh{});
    case UnaryOp::Sqrt:
      return 0.5f / y;
  }
  return 0.0f;
}

__device__ float binary(BinaryOp op, float a, float b) {
  switch (op) {
    case BinaryOp::Add:
      return a + b;
    case BinaryOp::Sub:
      return a - b;
    case BinaryOp::Mul:
      return a * b;
    case BinaryOp::Div:
      return a / b;
  }
  return 0.0f;
}

__device__ float binary_grad_a(BinaryOp op, float a, float b) {
  switch (op) {
    case BinaryOp::Add:
    case BinaryOp::Sub:
      return 1.0f;
    case BinaryOp::Mul:
      return b;
    case BinaryOp::Div:
      return 1.0f / b;
  }
  return 0.0f;
}

__device__ float binary_grad_b(BinaryOp op, float a, float b) {
  switch (op) {
    case BinaryOp::Add:
      return 1.0f;
    case BinaryOp::Sub:
      return -1.0f;
    case BinaryOp::Mul:
      return a;
    case BinaryOp::Div:
      return -a / (b * b);
  }
  return 0.0f;
}

/// Eight elements a thread: two float4 loads and one 16-byte store when vec (both pointers 16-byte aligned), the
/// last partial group (and every group otherwise) an element at a time.
__global__ void round_to_bf16_kernel(bf16* out, const float* inp, int64_t n, bool vec) {
  TINYGPT_CUDA_LOOP(g, (n + 7) / 8) {
    const int64_t e = 8 * g;
    if (vec && e + 8 <= n) {
      const float4 a = reinterpret_cast<const float4*>(inp)[2 * g], b = reinterpret_cast<const float4*>(inp)[2 * g + 1];
      Bf16x8 o;
      o.v[0] = bf16(a.x), o.v[1] = bf16(a.y), o.v[2] = bf16(a.z), o.v[3] = bf16(a.w);
      o.v[4] = bf16(b.x), o.v[5] = bf16(b.y), o.v[6] = bf16(b.z), o.v[7] = bf16(b.w);
      reinterpret_cast<Bf16x8*>(out)[g] = o;
    } else {
      for (int64_t i = e; i < e + 8 && i < n; ++i) out[i] = bf16(inp[i]);
    }
  }
}

__global__ void widen_bf16_kernel(float* out, const bf16* inp, int64_t n, bool vec) {
  TINYGPT_CUDA_LOOP(g, (n + 7) / 8) {
    const int64_t e = 8 * g;
    if (vec && e + 8 <= n) {
      const Bf16x8 x = reinterpret_cast<const Bf16x8*>(inp)[g];
      reinterpret_cast<float4*>(out)[2 * g] = float4{float(x.v[0]), float(x.v[1]), float(x.v[2]), float(x.v[3])};
      reinterpret_cast<float4*>(out)[2 * g + 1] = float4{float(x.v[4]), float(x.v[5]), float(x.v[6]), float(x.v[7])};
    } else {
      for (int64_t i = e; i < e + 8 && i < n; ++i) out[i] = float(inp[i]);
    }
  }
}

__global__ void accumulate_bf16_kernel(float* y, const bf16* x, int64_t n, bool vec) {
  TINYGPT_CUDA_LOOP(g, (n + 7) / 8) {
    const int64_t e = 8 * g;
    if (vec && e + 8 <= n) {
      const Bf16x8 v = reinterpret_cast<const Bf16x8*>(x)[g];
      float4* y4 = reinterpret_cast<float4*>(y) + 2 * g;
      const float4 a = y4[0], b = y4[1];
      y4[0] = float4{a.x + float(v.v[0]), a.y + float(v.v[1]), a.z + float(v.v[2]), a.w + float(v.v[3])};
      y4[1] = float4{b.x + float(v.v[4]), b.y + float(v.v[5]), b.z + float(v.v[6]), b.w + float(v.v[7])};
    } else {
      for (int64_t i = e; i < e + 8 && i < n; ++i) y[i] += float(x[i]);
    }
  }
}

__global__ void fill_kernel(float* out, float value, int64_t n) { TINYGPT_CUDA_LOOP(i, n) out[i] = value; }

template <class T>
__global__ void axpy_kernel(T* y, const T* x, float alpha, int64_t n, bool vec) {
  map_elements(
      n, vec,
      [&](int64_t e) {
        float a[8], b[8];
        load8(a, y + e);
        load8(b, x + e);
        for (int j = 0; j < 8; ++j) a[j] += alpha * b[j];
        store8(y + e, a);
      },
      [&](int64_t i) { y[i] = float(y[i]) + alpha * float(x[i]); });
}

/// y = b y + a x, with a and b from coef, or alpha times the gradient's clipping factor from stats (see axpby).
__global__ void axpby_kernel(float* y, const float* x, int64_t n, double alpha, double beta, const float* coef,
                             const float* stats, double max_norm) {
  if (stats && (!is_finite(double(stats[0])) || !is_finite(double(stats[1])))) return;
  const float a = coef ? coef[0] : float(stats ? alpha * clip_scale(double(stats[1]), max_norm) : alpha);
  const float b = coef ? coef[1] : float(beta);
  TINYGPT_CUDA_LOOP(i, n) y[i] = b == 0.0f ? a * x[i] : b * y[i] + a * x[i];
}

template <class T>
__global__ void unary_forward_kernel(T* out, const T* inp, int64_t n, UnaryOp op, float alpha, bool vec) {
  map_elements(
      n, vec,
      [&](int64_t e) {
        float x[8];
        load8(x, inp + e);
        for (int j = 0; j < 8; ++j) x[j] = unary(op, x[j], alpha);
        store8(out + e, x);
      },
      [&](int64_t i) { out[i] = unary(op, float(inp[i]), alpha); });
}

template <class T>
__global__ void unary_backward_kernel(T* dinp, const T* dout, const T* inp, const T* out, int64_t n, UnaryOp op,
                                      float alpha, bool overwrite, bool vec) {
  map_elements(
      n, vec,
      [&](int64_t e) {
        float g[8], x[8], y[8] = {}, d[8] = {};
        load8(g, dout + e);
        load8(x, inp + e);
        if (out) load8(y, out + e);
        if (!overwrite) load8(d, dinp + e);
        for (int j = 0; j < 8; ++j) d[j] += g[j] * unary_grad(op, x[j], y[j], alpha);
        store8(dinp + e, d);
      },
      [&](int64_t i) {
        const float d = float(dout[i]) * unary_grad(op, float(inp[i]), out ? float(out[i]) : 0.0f, alpha);
        dinp[i] = overwrite ? d : float(dinp[i]) + d;
      });
}

/// Offsets in a and b of the output element with linear index i.
__device__ void broadcast_offsets(const BroadcastGeom& g, int64_t i, int64_t& oa, int64_t& ob) {
  oa = ob = 0;
  for (int d = kMaxDims - 1; d >= 0; --d) {
    const int64_t c = i % g.out[d];
    i /= g.out[d];
    oa += c * g.a_stride[d];
    ob += c * g.b_stride[d];
  }
}

template <class T>
__global__ void binary_same_kernel(T* out, const T* a, const T* b, BinaryOp op, int64_t n, bool vec) {
  map_elements(
      n, vec,
      [&](int64_t e) {
        float x[8], y[8];
        load8(x, a + e);
        load8(y, b + e);
        for (int j = 0; j < 8; ++j) x[j] = binary(op, x[j], y[j]);
        store8(out + e, x);
      },
      [&](int64_t i) { out[i] = binary(op, float(a[i]), float(b[i])); });
}

template <class T>
__global__ void binary_forward_kernel(T* out, const T* a, const T* b, BroadcastGeom g, BinaryOp op, int64_t n) {
  TINYGPT_CUDA_LOOP(i, n) {
    int64_t oa, ob;
    broadcast_offsets(g, i, oa, ob);
    out[i] = binary(op, float(a[oa]), float(b[ob]));
  }
}

template <class T>
__global__ void binary_backward_same_kernel(T* da, T* db, const T* dout, const T* a, const T* b, BinaryOp op, int64_t n,
                                            bool vec) {
  map_elements(
      n, vec,
      [&](int64_t e) {
        float g[8], x[8], y[8], d[8];
        load8(g, dout + e);
        load8(x, a + e);
        load8(y, b + e);
        if (da) {
          load8(d, da + e);
          for (int j = 0; j < 8; ++j) d[j] += g[j] * binary_grad_a(op, x[j], y[j]);
          store8(da + e, d);
        }
        if (db) {
          load8(d, db + e);
          for (int j = 0; j < 8; ++j) d[j] += g[j] * binary_grad_b(op, x[j], y[j]);
          store8(db + e, d);
        }
      },
      [&](int64_t i) {
        const float g = float(dout[i]), x = float(a[i]), y = float(b[i]);
        if (da) da[i] = float(da[i]) + g * binary_grad_a(op, x, y);
        if (db) db[i] = float(db[i]) + g * binary_grad_b(op, x, y);
      });
}

/// The gradient of one broadcast operand x (strides x_stride): one warp per element of x sums the output
/// positions that read it, in a fixed order (no atomics).
struct ReduceGeom {
  int64_t extent[kMaxDims];   // x's own extent per dim (1 along broadcast dims)
  int64_t reduced[kMaxDims];  // dims summed over
  int n_reduced;
  int64_t xn, rn;  // elements of x; positions summed per element
};

template <class T>
__global__ void binary_backward_broadcast_kernel(T* dx, bool is_a, const T* dout, const T* a, const T* b,
                                                 BroadcastGeom g, ReduceGeom r, BinaryOp op) {
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= r.xn) return;
  int64_t c[kMaxDims];
  int64_t rem = warp;
  for (int d = kMaxDims - 1; d >= 0; --d) {
    c[d] = rem % r.extent[d];
    rem /= r.extent[d];
  }
  float acc = 0.0f;
  for (int64_t j = lane; j < r.rn; j += 32) {
    int64_t cc[kMaxDims];
    for (int d = 0; d < kMaxDims; ++d) cc[d] = c[d];
    int64_t rr = j;
    for (int k = r.n_reduced - 1; k >= 0; --k) {
      const int d = int(r.reduced[k]);
      cc[d] = rr % g.out[d];
      rr /= g.out[d];
    }
    int64_t o = 0, oa = 0, ob = 0;
    for (int d = 0; d < kMaxDims; ++d) {
      o = o * g.out[d] + cc[d];
      oa += cc[d] * g.a_stride[d];
      ob += cc[d] * g.b_stride[d];
    }
    const float x = float(a[oa]), y = float(b[ob]);
    acc += float(dout[o]) * (is_a ? binary_grad_a(op, x, y) : binary_grad_b(op, x, y));
  }
  acc = warp_sum(acc);
  if (lane == 0) dx[warp] = float(dx[warp]) + acc;
}

/// The gradient of an operand x broadcast over the output's leading dims only (a bias, a position embedding added to
/// every batch): the output is (rows, cols) and x its last cols elements. Block (i, j) sums output rows
/// [i * per, (i + 1) * per) for columns j * blockDim.x + threadIdx.x (coalesced) into partial row i; add_partial_rows
/// adds the partial rows in order. The warp-per-element kernel above read each output row with a stride of cols.
template <class T>
__global__ void binary_backward_rows_kernel(float* partial, bool is_a, const T* dout, const T* a, const T* b,
                                            BroadcastGeom g, BinaryOp op, int64_t rows, int64_t cols, int64_t per) {
  const int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const int64_t r0 = int64_t(blockIdx.x) * per, r1 = min(rows, r0 + per);
  const bool constant = op == BinaryOp::Add || op == BinaryOp::Sub;  // a derivative that reads neither operand
  const float unit = is_a ? binary_grad_a(op, 0.0f, 1.0f) : binary_grad_b(op, 0.0f, 1.0f);
  float acc = 0.0f;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t i = r * cols + c;
    float grad = unit;
    if (!constant) {
      int64_t oa, ob;
      broadcast_offsets(g, i, oa, ob);
      const float x = float(a[oa]), y = float(b[ob]);
      grad = is_a ? binary_grad_a(op, x, y) : binary_grad_b(op, x, y);
    }
    acc += float(dout[i]) * grad;
  }
  partial[int64_t(blockIdx.x) * cols + c] = acc;
}

/// True when x (strides x_stride) broadcasts over the output's leading dims only and its other dims are the output's
/// trailing dims, contiguous: the output is then (rows, cols) with x its last cols elements.
bool broadcast_over_leading_dims(const int64_t* x_stride, const BroadcastGeom& g, int64_t& rows, int64_t& cols) {
  int d = kMaxDims - 1;
  rows = cols = 1;
  for (; d >= 0; --d) {
    if (g.out[d] == 1) continue;
    if (x_stride[d] == 0) break;
    if (x_stride[d] != cols) return false;
    cols *= g.out[d];
  }
  for (; d >= 0; --d) {
    if (g.out[d] == 1) continue;
    if (x_stride[d] != 0) return false;
    rows *= g.out[d];
  }
  return rows > 1;
}

/// The gradient of an operand with the output's own shape (nothing to sum) while the other one broadcasts.
template <class T>
__global__ void binary_backward_full_kernel(T* dx, bool is_a, const T* dout, const T* a, const T* b, BroadcastGeom g,
                                            BinaryOp op, int64_t n) {
  TINYGPT_CUDA_LOOP(i, n) {
    int64_t oa, ob;
    broadcast_offsets(g, i, oa, ob);
    const float x = float(a[oa]), y = float(b[ob]);
    dx[i] = float(dx[i]) + float(dout[i]) * (is_a ? binary_grad_a(op, x, y) : binary_grad_b(op, x, y));
  }
}

ReduceGeom reduce_geom(const int64_t* x_stride, const BroadcastGeom& g) {
  ReduceGeom r{};
  r.xn = r.rn = 1;
  for (int d = 0; d < kMaxDims; ++d) {
    r.extent[d] = x_stride[d] != 0 ? g.out[d] : 1;
    r.xn *= r.extent[d];
    if (r.extent[d] == 1 && g.out[d] > 1) {
      r.reduced[r.n_reduced++] = d;
      r.rn *= g.out[d];
    }
  }
  return r;
}

template <class T>
__global__ void dropout_forward_kernel(T* out, const T* inp, int64_t n, float p, DropoutSeed seed, float scale,
                                       bool vec) {
  const DropoutStream stream(seed.value());
  map_elements(
      n, vec,
      [&](int64_t e) {
        float x[8];
        load8(x, inp + e);
        for (int j = 0; j < 8; ++j) x[j] = stream.keep(e + j, p) ? x[j] * scale : 0.0f;
        store8(out + e, x);
      },
      [&](int64_t i) { out[i] = stream.keep(i, p) ? float(inp[i]) * scale : 0.0f; });
}

template <class T>
__global__ void dropout_backward_kernel(T* dinp, const T* dout, int64_t n, float p, DropoutSeed seed, float scale,
                                        bool vec) {
  const DropoutStream stream(seed.value());
  map_elements(
      n, vec,
      [&](int64_t e) {
        float g[8], d[8];
        load8(g, dout + e);
        load8(d, dinp + e);
        for (int j = 0; j < 8; ++j) {
          if (stream.keep(e + j, p)) d[j] += g[j] * scale;  // the shape of the scalar step below and the CPU twin
        }
        store8(dinp + e, d);
      },
      [&](int64_t i) {
        if (stream.keep(i, p)) dinp[i] = float(dinp[i]) + float(dout[i]) * scale;
      });
}

template <class T>
__global__ void permute_kernel(T* out, const T* inp, PermuteGeom g, bool accumulate, int64_t n) {
  TINYGPT_CUDA_LOOP(i, n) {
    int64_t off = 0, rem = i;
    for (int d = kMaxDims - 1; d >= 0; --d) {
      off += (rem % g.out[d]) * g.inp_stride[d];
      rem /= g.out[d];
    }
    const float x = float(inp[off]);
    out[i] = accumulate ? float(out[i]) + x : x;
  }
}

template <class T>
__global__ void copy_slice_kernel(T* dst, const T* src, int64_t outer, int64_t inner, int64_t dst_D, int64_t dst_start,
                                  int64_t src_D, int64_t src_start, int64_t len, bool accumulate) {
  TINYGPT_CUDA_LOOP(idx, outer * len * inner) {
    const int64_t i = idx % inner, j = idx / inner % len, o = idx / (inner * len);
    const T x = src[(o * src_D + src_start + j) * inner + i];
    T& y = dst[(o * dst_D + dst_start + j) * inner + i];
    y = accumulate ? T(float(y) + float(x)) : x;  // a copy moves the stored bits
  }
}

/// One AdamW update of every element of the runs (AdamWRuns: taken as one index space of n elements, each run with
/// its weight decay), the gradient taken as gs * grad. A thread's grid-stride loop only moves forward, and so does
/// its run r.
__device__ __forceinline__ void adamw_runs(float* param, const float* grad, float* m, float* v, const AdamWRuns& runs,
                                           int64_t n, float lr, float beta1, float beta2, float eps, float gs, float c1,
                                           float c2) {
  int r = 0;
  TINYGPT_CUDA_LOOP(i, n) {
    while (i >= runs.upto[r]) ++r;
    const int64_t j = runs.begin[r] + i - (r > 0 ? runs.upto[r - 1] : 0);
    adamw_element(param[j], gs * grad[j], m[j], v[j], lr, beta1, beta2, eps, runs.weight_decay[r], c1, c2);
    if (runs.copy != nullptr) runs.copy[j] = bf16(param[j]);  // bf16 storage's working copy, in the same pass
  }
}

/// adamw_runs with lr, c1, c2 from sched and the gradient's clip factor from stats (see adamw_update).
__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v, const AdamWRuns runs, int64_t n,
                             const float* sched, const float* stats, double max_norm, float beta1, float beta2,
                             float eps) {
  if (!is_finite(double(stats[0])) || !is_finite(double(stats[1]))) return;
  adamw_runs(param, grad, m, v, runs, n, sched[0], beta1, beta2, eps, float(clip_scale(double(stats[1]), max_norm)),
             sched[1], sched[2]);
}

/// out[e] = parts[0][e] + parts[1][e] + ... + parts[rows - 1][e], added left to right.
__global__ void sum_rows_in_order_kernel(float* out, const float* parts, int64_t rows, int64_t n) {
  TINYGPT_CUDA_LOOP(e, n) {
    float acc = parts[e];
    for (int64_t r = 1; r < rows; ++r) acc += parts[r * n + e];
    out[e] = acc;
  }
}

/// One thread per rotated pair (or per copied element of an unrotated head).
/// bf16 storage: read widened, rotated in f32, stored rounded once (the sum with what y held, backward, in f32).
template <class T>
__global__ void rope_kernel(T* out, const T* inp, int64_t B, int64_t L, int64_t NH, int64_t E, int64_t n_rot,
                            int64_t pos0, RopeFreqs freqs, double sign, bool accumulate) {
  const int64_t half = E / 2;
  TINYGPT_CUDA_LOOP(idx, B * L * NH * half) {
    const int64_t i = idx % half, h = idx / half % NH, bl = idx / (half * NH);
    const T* x = inp + (bl * NH + h) * E;
    T* y = out + (bl * NH + h) * E;
    float ra = float(x[i]), rb = float(x[i + half]);
    if (h < n_rot) {
      const double angle = sign * double(pos0 + bl % L) * rope_inv_freq(freqs, i, E);
      const float c = float(cos(angle)), s = float(sin(angle));
      const float a = ra, b = rb;
      ra = a * c - b * s;
      rb = a * s + b * c;
    }
    y[i] = T(accumulate ? float(y[i]) + ra : ra);
    y[i + half] = T(accumulate ? float(y[i + half]) + rb : rb);
  }
}

int64_t numel(const BroadcastGeom& g) { return g.out[0] * g.out[1] * g.out[2] * g.out[3] * g.out[4]; }

}  // namespace

void fill(float* out, float value, int64_t n) {
  if (n == 0) return;
  launch_kernel("fill", fill_kernel, blocks_for(n), kThreads, 0, out, value, n);
}

void round_to_bf16(bf16* out, const float* inp, int64_t n) {
  if (n == 0) return;
  launch_kernel("round_to_bf16", round_to_bf16_kernel, blocks_for((n + 7) / 8), kThreads, 0, out, inp, n,
                aligned16(out) && aligned16(inp));
}

void widen_bf16(float* out, const bf16* inp, int64_t n) {
  if (n == 0) return;
  launch_kernel("widen_bf16", widen_bf16_kernel, blocks_for((n + 7) / 8), kThreads, 0, out, inp, n,
                aligned16(out) && aligned16(inp));
}

void accumulate_bf16(float* y, const bf16* x, int64_t n) {
  if (n == 0) return;
  launch_kernel("accumulate_bf16", accumulate_bf16_kernel, blocks_for((n + 7) / 8), kThreads, 0, y, x, n,
                aligned16(y) && aligned16(x));
}

template <class T>
void axpy(T* y, const T* x, compute_t<T> alpha, int64_t n) {
  if (n == 0) return;
  const bool vec = vectors_fit(y, x);
  launch_kernel("axpy", axpy_kernel<T>, map_blocks(n, vec), kThreads, 0, y, x, alpha, n, vec);
}

void axpby(float* y, const float* x, int64_t n, double alpha, double beta, const float* coef, const float* stats,
           double max_norm) {
  if (n == 0) return;
  launch_kernel("axpby", axpby_kernel, blocks_for(n), kThreads, 0, y, x, n, alpha, beta, coef, stats, max_norm);
}

template <class T>
void unary_forward(T* out, const T* inp, int64_t n, UnaryOp op, compute_t<T> alpha) {
  if (n == 0) return;
  const bool vec = vectors_fit(out, inp);
  launch_kernel("unary_forward", unary_forward_kernel<T>, map_blocks(n, vec), kThreads, 0, out, inp, n, op, alpha, vec);
}

template <class T>
void unary_backward(T* dinp, const T* dout, const T* inp, const T* out, int64_t n, UnaryOp op, compute_t<T> alpha,
                    bool overwrite) {
  if (n == 0) return;
  const bool vec = vectors_fit(dinp, dout, inp, out);
  launch_kernel("unary_backward", unary_backward_kernel<T>, map_blocks(n, vec), kThreads, 0, dinp, dout, inp, out, n,
                op, alpha, overwrite, vec);
}

template <class T>
void binary_forward(T* out, const T* a, const T* b, const BroadcastGeom& g, BinaryOp op) {
  const int64_t n = numel(g);
  if (n == 0) return;
  if (g.same_shape) {
    const bool vec = vectors_fit(out, a, b);
    launch_kernel("binary_forward", binary_same_kernel<T>, map_blocks(n, vec), kThreads, 0, out, a, b, op, n, vec);
    return;
  }
  launch_kernel("binary_forward (broadcast)", binary_forward_kernel<T>, blocks_for(n), kThreads, 0, out, a, b, g, op,
                n);
}

template <class T>
void binary_backward(T* da, T* db, const T* dout, const T* a, const T* b, const BroadcastGeom& g, BinaryOp op) {
  const int64_t n = numel(g);
  if (n == 0) return;
  if (g.same_shape) {
    const bool vec = vectors_fit(da, db, dout, a, b);
    launch_kernel("binary_backward", binary_backward_same_kernel<T>, map_blocks(n, vec), kThreads, 0, da, db, dout, a,
                  b, op, n, vec);
    return;
  }
  for (const bool is_a : {true, false}) {
    T* dx = is_a ? da : db;
    if (!dx) continue;
    const ReduceGeom r = reduce_geom(is_a ? g.a_stride : g.b_stride, g);
    if (r.rn == 1) {
      launch_kernel("binary_backward", binary_backward_full_kernel<T>, blocks_for(n), kThreads, 0, dx, is_a, dout, a, b,
                    g, op, n);
      continue;
    }
    int64_t rows = 0, cols = 0;
    if (broadcast_over_leading_dims(is_a ? g.a_stride : g.b_stride, g, rows, cols) &&
        cols <= 65535 * int64_t(kThreads)) {
      const int64_t per = rows_per_partial(rows), row_blocks = (rows + per - 1) / per;
      Scratch partial(size_t(row_blocks * cols) * sizeof(float));
      launch_kernel("binary_backward (broadcast rows)", binary_backward_rows_kernel<T>,
                    dim3(unsigned(row_blocks), unsigned((cols + kThreads - 1) / kThreads)), kThreads, 0,
                    partial.as<float>(), is_a, dout, a, b, g, op, rows, cols, per);
      add_partial_rows("binary_backward (broadcast sum)", dx, partial.as<float>(), row_blocks, cols, cols);
      continue;
    }
    launch_kernel("binary_backward (broadcast)", binary_backward_broadcast_kernel<T>, blocks_for(r.xn * 32), kThreads,
                  0, dx, is_a, dout, a, b, g, r, op);
  }
}

template <class T>
void dropout_forward(T* out, const T* inp, int64_t n, float p, DropoutSeed seed) {
  if (n == 0) return;
  const bool vec = vectors_fit(out, inp);
  launch_kernel("dropout_forward", dropout_forward_kernel<T>, map_blocks(n, vec), kThreads, 0, out, inp, n, p, seed,
                dropout_scale<float>(p), vec);
}

template <class T>
void dropout_backward(T* dinp, const T* dout, int64_t n, float p, DropoutSeed seed) {
  if (n == 0) return;
  const bool vec = vectors_fit(dinp, dout);
  launch_kernel("dropout_backward", dropout_backward_kernel<T>, map_blocks(n, vec), kThreads, 0, dinp, dout, n, p, seed,
                dropout_scale<float>(p), vec);
}

template <class T>
void permute(T* out, const T* inp, const PermuteGeom& g, bool accumulate) {
  const int64_t n = g.out[0] * g.out[1] * g.out[2] * g.out[3] * g.out[4];
  if (n == 0) return;
  launch_kernel("permute", permute_kernel<T>, blocks_for(n), kThreads, 0, out, inp, g, accumulate, n);
}

template <class T>
void copy_slice(T* dst, const T* src, int64_t outer, int64_t inner, int64_t dst_D, int64_t dst_start, int64_t src_D,
                int64_t src_start, int64_t len, bool accumulate) {
  const int64_t n = outer * len * inner;
  if (n == 0) return;
  launch_kernel("copy_slice", copy_slice_kernel<T>, blocks_for(n), kThreads, 0, dst, src, outer, inner, dst_D,
                dst_start, src_D, src_start, len, accumulate);
}

void adamw_update(float* param, const float* grad, float* m, float* v, const AdamWRuns& runs, const float* sched,
                  const float* stats, double max_norm, float beta1, float beta2, float eps) {
  const int64_t n = runs.total();
  if (n == 0) return;
  launch_kernel("adamw_update", adamw_kernel, blocks_for(n), kThreads, 0, param, grad, m, v, runs, n, sched, stats,
                max_norm, beta1, beta2, eps);
}

void sum_rows_in_order(float* out, const float* parts, int64_t rows, int64_t n) {
  if (n == 0) return;
  launch_kernel("sum_rows_in_order", sum_rows_in_order_kernel, blocks_for(n), kThreads, 0, out, parts, rows, n);
}

template <class T>
void rope_forward(T* out, const T* inp, int64_t B, int64_t L, int64_t NH, int64_t E, int64_t n_rot, int64_t pos0,
                  RopeFreqs freqs) {
  const int64_t n = B * L * NH * (E / 2);
  if (n == 0) return;
  launch_kernel("rope_forward", rope_kernel<T>, blocks_for(n), kThreads, 0, out, inp, B, L, NH, E, n_rot, pos0, freqs,
                1.0, false);
}

template <class T>
void rope_backward(T* dinp, const T* dout, int64_t B, int64_t L, int64_t NH, int64_t E, int64_t n_rot, int64_t pos0,
                   RopeFreqs freqs) {
  const int64_t n = B * L * NH * (E / 2);
  if (n == 0) return;
  launch_kernel("rope_backward", rope_kernel<T>, blocks_for(n), kThreads, 0, dinp, dout, B, L, NH, E, n_rot, pos0,
                freqs, -1.0, true);
}

TINYGPT_CUDA_END

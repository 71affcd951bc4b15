// The CPU twins of the flash forward and backward on bf16 storage (kernels/cuda/flash_bf16.cuh): the f32 flash
// kernels with bf16 operands on widened, dense copies of the operands, each result rounded once into its strided
// bf16 place.
#include <vector>

#include "kernels/cpu/attention_kernels.h"
#include "kernels/cpu/parallel.h"

namespace tinygpt::cpu {
namespace {

/// f(b, h, t, r) for every row (b, h, t) of a (B, H, L, dim) array, r its dense index, on the OpenMP threads.
template <class F>
void for_each_row(int64_t B, int64_t H, int64_t L, int64_t dim, F f) {
  const int64_t rows = B * H * L;
#pragma omp parallel for if (rows * dim >= kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) f(r / (H * L), r / L % H, r % L, r);
}

/// Rows (B, H, L) of `dim` elements of a strided bf16 operand, widened into a dense f32 (B, H, L, dim) array.
std::vector<float> widened(const bf16* x, const int64_t* stride, int64_t B, int64_t H, int64_t L, int64_t dim) {
  std::vector<float> out(size_t(B * H * L * dim));
  for_each_row(B, H, L, dim, [&](int64_t b, int64_t h, int64_t t, int64_t r) {
    const bf16* src = x + b * stride[0] + h * stride[1] + t * stride[2];
    float* o = out.data() + r * dim;
    for (int64_t e = 0; e < dim; ++e) o[e] = src[e];
  });
  return out;
}

void set_dense(int64_t (&stride)[3], int64_t H, int64_t L, int64_t dim) {
  stride[0] = H * L * dim, stride[1] = L * dim, stride[2] = dim;
}

/// g over the dense copies (widened), with bf16 operands.
AttentionGeom dense_bf16(const AttentionGeom& g) {
  AttentionGeom f = g;
  set_dense(f.q_stride, g.NH, g.T, g.E);
  set_dense(f.k_stride, g.NKV, g.S, g.E);
  set_dense(f.v_stride, g.NKV, g.S, g.Ev);
  set_dense(f.o_stride, g.NH, g.T, g.Ev);
  f.math = AttentionMath::BF16;
  return f;
}

}  // namespace

void attention_flash_forward_bf16(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                                  const AttentionGeom& g) {
  const std::vector<float> qf = widened(q, g.q_stride, g.B, g.NH, g.T, g.E);
  const std::vector<float> kf = widened(k, g.k_stride, g.B, g.NKV, g.S, g.E);
  const std::vector<float> vf = widened(v, g.v_stride, g.B, g.NKV, g.S, g.Ev);
  std::vector<float> of(size_t(g.B * g.NH * g.T * g.Ev));
  attention_flash_forward<float>(of.data(), lse, qf.data(), kf.data(), vf.data(), nullptr, nullptr, dense_bf16(g));
  for_each_row(g.B, g.NH, g.T, g.Ev, [&](int64_t b, int64_t h, int64_t t, int64_t r) {
    bf16* row = out + b * g.o_stride[0] + h * g.o_stride[1] + t * g.o_stride[2];
    for (int64_t e = 0; e < g.Ev; ++e) row[e] = of[size_t(r * g.Ev + e)];
  });
}

void attention_flash_backward_bf16(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k,
                                   const bf16* v, const bf16* out, const float* lse, const AttentionGeom& g) {
  const std::vector<float> qf = widened(q, g.q_stride, g.B, g.NH, g.T, g.E);
  const std::vector<float> kf = widened(k, g.k_stride, g.B, g.NKV, g.S, g.E);
  const std::vector<float> vf = widened(v, g.v_stride, g.B, g.NKV, g.S, g.Ev);
  const std::vector<float> of = widened(out, g.o_stride, g.B, g.NH, g.T, g.Ev);
  const std::vector<float> df = widened(dout, g.o_stride, g.B, g.NH, g.T, g.Ev);
  std::vector<float> dqf(qf.size()), dkf(kf.size()), dvf(vf.size());
  AttentionGeom f = dense_bf16(g);
  f.grads_unwritten = false;  // into the zeroed f32 buffers
  attention_flash_backward<float>(dq ? dqf.data() : nullptr, dk ? dkf.data() : nullptr, dv ? dvf.data() : nullptr,
                                  df.data(), qf.data(), kf.data(), vf.data(), of.data(), lse, nullptr, nullptr, f);
  // Each gradient row stored (or added, one rounding) into its strided bf16 place.
  const auto put = [&](bf16* x, const std::vector<float>& d, const int64_t* stride, int64_t H, int64_t L, int64_t dim) {
    if (x == nullptr) return;
    for_each_row(g.B, H, L, dim, [&](int64_t b, int64_t h, int64_t t, int64_t r) {
      bf16* row = x + b * stride[0] + h * stride[1] + t * stride[2];
      const float* src = d.data() + r * dim;
      for (int64_t e = 0; e < dim; ++e) row[e] = g.grads_unwritten ? src[e] : float(row[e]) + src[e];
    });
  };
  put(dq, dqf, g.q_stride, g.NH, g.T, g.E);
  put(dk, dkf, g.k_stride, g.NKV, g.S, g.E);
  put(dv, dvf, g.v_stride, g.NKV, g.S, g.Ev);
}

}  // namespace tinygpt::cpu

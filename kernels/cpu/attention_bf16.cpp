// The CPU twins of the flash forward and backward on bf16 storage (kernels/cuda/flash_bf16.cuh): the f32 flash
// kernels with bf16 operands on widened, dense copies of the operands, each result rounded once into its strided
// bf16 place.
#include <vector>

#include "kernels/cpu/attention_kernels.h"

namespace tinygpt::cpu {
namespace {

/// Rows (B, H, L) of `dim` elements of a strided bf16 operand, widened into a dense f32 (B, H, L, dim) array.
std::vector<float> widened(const bf16* x, const int64_t* stride, int64_t B, int64_t H, int64_t L, int64_t dim) {
  std::vector<float> out(size_t(B * H * L * dim));
  float* o = out.data();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < L; ++t, o += dim)
        for (int64_t e = 0; e < dim; ++e) o[e] = x[b * stride[0] + h * stride[1] + t * stride[2] + e];
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
  const float* o = of.data();
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t h = 0; h < g.NH; ++h)
      for (int64_t t = 0; t < g.T; ++t, o += g.Ev)
        for (int64_t e = 0; e < g.Ev; ++e) out[b * g.o_stride[0] + h * g.o_stride[1] + t * g.o_stride[2] + e] = o[e];
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
    const float* src = d.data();
    for (int64_t b = 0; b < g.B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < L; ++t, src += dim) {
          bf16* row = x + b * stride[0] + h * stride[1] + t * stride[2];
          for (int64_t e = 0; e < dim; ++e) row[e] = g.grads_unwritten ? src[e] : float(row[e]) + src[e];
        }
  };
  put(dq, dqf, g.q_stride, g.NH, g.T, g.E);
  put(dk, dkf, g.k_stride, g.NKV, g.S, g.E);
  put(dv, dvf, g.v_stride, g.NKV, g.S, g.Ev);
}

}  // namespace tinygpt::cpu

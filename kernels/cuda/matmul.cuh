// Matmuls: batched matmul and the linear layer, forward and backward, as cuBLAS products (gemm and gemm_bf16 in
// kernels/cuda/cublas.cu) plus the small kernels around them (bf16 rounding of the operands, bias, fixed-order bias
// gradient). Twins of kernels/cpu/matmul.cpp; on f32 storage the products' operands are f32, TF32 or bf16 as the call
// asks (MatmulMath); on bf16 storage they are the stored values, the results stored in bf16. Compiled by nvcc in
// matmul.cu and under tests/emulated_cuda.h, where a loop stands in for cuBLAS.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "kernels/cuda/launch.cuh"
#include "kernels/scalar_math.h"
#if !defined(TINYGPT_EMULATED_CUDA)
#include "kernels/cuda/mma.cuh"  // pack_bf16
#endif

TINYGPT_CUDA_BEGIN

namespace {

/// Pairs of x (n floats) rounded to bf16, two to a word (element 2i in the low half, as a bf16 array lays them out).
__global__ void round_bf16_kernel(uint32_t* out, const float* x, int64_t pairs, int64_t n) {
  TINYGPT_CUDA_LOOP(i, pairs) out[i] = pack_bf16(x[2 * i], 2 * i + 1 < n ? x[2 * i + 1] : 0.0f);
}

/// Elements from an operand's first to its last read: `rows` rows of `cols` at stride ld, `batch` times at `stride`.
int64_t operand_span(int64_t rows, int64_t cols, int64_t ld, int64_t stride, int64_t batch) {
  return (batch - 1) * stride + (rows - 1) * ld + cols;
}

/// The first n elements of x rounded to bf16 into dst (n bf16 bit patterns, 4-byte aligned); returns dst.
const uint16_t* round_to_bf16(uint16_t* dst, const float* x, int64_t n, const char* what) {
  const int64_t pairs = (n + 1) / 2;
  launch_kernel(what, round_bf16_kernel, blocks_for(pairs), kThreads, 0, reinterpret_cast<uint32_t*>(dst), x, pairs, n);
  return dst;
}

/// The first n elements of x rounded to bf16 into `copy` (an array of n bf16 bit patterns).
const uint16_t* rounded_bf16(Scratch& copy, const float* x, int64_t n, const char* what) {
  return round_to_bf16(copy.as<uint16_t>(), x, n, what);
}

/// Bytes of n bf16 values rounded up to whole 4-byte words (round_bf16_kernel writes pairs).
size_t bf16_bytes(int64_t n) { return size_t((n + 1) / 2) * 4; }

}  // namespace

/// gemm (runtime.cuh) computed as `math` says: F32 or TF32 by cuBLAS from the f32 operands; BF16 from copies of the
/// operands rounded to bf16 (nearest even), f32 accumulation (on tensor cores).
inline void product(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                    int64_t lda, int64_t stride_a, const float* B, int64_t ldb, int64_t stride_b, float beta, float* C,
                    int64_t ldc, int64_t stride_c, int64_t batch, MatmulMath math, const char* what) {
  if (math != MatmulMath::BF16 || K == 0 || M == 0 || N == 0 || batch == 0) {
    gemm(trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc, stride_c, batch,
         math == MatmulMath::TF32, what);
    return;
  }
  const int64_t na = operand_span(trans_a ? K : M, trans_a ? M : K, lda, stride_a, batch);
  const int64_t nb = operand_span(trans_b ? N : K, trans_b ? K : N, ldb, stride_b, batch);
  Scratch a16(size_t((na + 1) / 2) * 4), b16(size_t((nb + 1) / 2) * 4);
  gemm_bf16(trans_a, trans_b, M, N, K, alpha, rounded_bf16(a16, A, na, what), lda, stride_a,
            rounded_bf16(b16, B, nb, what), ldb, stride_b, beta, C, ldc, stride_c, batch, what);
}

/// The product over bf16 storage: the operands as stored, f32 sums on tensor cores, C stored in bf16 (beta 1 adds what
/// it held in f32 before the one rounding). Every MatmulMath computes it so: bf16 storage comes with bf16 products.
inline void product(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A,
                    int64_t lda, int64_t stride_a, const bf16* B, int64_t ldb, int64_t stride_b, float beta, bf16* C,
                    int64_t ldc, int64_t stride_c, int64_t batch, MatmulMath, const char* what) {
  gemm_bf16(trans_a, trans_b, M, N, K, alpha, reinterpret_cast<const uint16_t*>(A), lda, stride_a,
            reinterpret_cast<const uint16_t*>(B), ldb, stride_b, beta, C, ldc, stride_c, batch, what);
}

/// The unbatched product.
template <class T>
inline void product(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda,
                    const T* B, int64_t ldb, float beta, T* C, int64_t ldc, MatmulMath math, const char* what) {
  product(trans_a, trans_b, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1, math, what);
}

/// bf16 bit patterns, as the cuBLAS calls take them.
inline const uint16_t* bits(const bf16* x) { return reinterpret_cast<const uint16_t*>(x); }

namespace {

/// Block b sums rows [b * rows, (b + 1) * rows) of x (N, C) into partial[b] (C floats).
template <class T>
__global__ void column_partials_kernel(float* partial, const T* x, int64_t N, int64_t C, int64_t rows) {
  const int64_t n0 = int64_t(blockIdx.x) * rows, n1 = min(N, n0 + rows);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = 0.0f;
#pragma unroll 4
    for (int64_t n = n0; n < n1; ++n) acc += float(x[n * C + c]);
    partial[C * blockIdx.x + c] = acc;
  }
}

/// column_partials_kernel for an even C that also writes x rounded to bf16 into x16 (pairs packed as
/// round_bf16_kernel packs them): one pass over x for a product's bf16 operand and the bias gradient. Each column is
/// summed in the same order as column_partials_kernel sums it.
__global__ void column_partials_bf16_kernel(float* partial, uint32_t* x16, const float* x, int64_t N, int64_t C,
                                            int64_t rows) {
  const int64_t n0 = int64_t(blockIdx.x) * rows, n1 = min(N, n0 + rows), pairs = C / 2;
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
    float acc0 = 0.0f, acc1 = 0.0f;
#pragma unroll 4
    for (int64_t n = n0; n < n1; ++n) {
      const float2 v = reinterpret_cast<const float2*>(x + n * C)[p];
      x16[n * pairs + p] = pack_bf16(v.x, v.y);
      acc0 += v.x;
      acc1 += v.y;
    }
    partial[C * blockIdx.x + 2 * p] = acc0;
    partial[C * blockIdx.x + 2 * p + 1] = acc1;
  }
}

/// out (C) += column sums of x (N, C), in a fixed order (bf16 storage: summed in f32, added and rounded once). With
/// x16 (f32 x, C even), x rounded to bf16 is written there in the same pass.
template <class T>
void add_column_sums(T* out, const T* x, int64_t N, int64_t C, uint32_t* x16 = nullptr) {
  const int64_t rows = rows_per_partial(N);
  const int64_t blocks = (N + rows - 1) / rows;
  Scratch partial(size_t(C * blocks) * sizeof(float));
  if constexpr (std::is_same_v<T, float>) {
    if (x16) {
      launch_kernel("linear_backward (dout to bf16, bias partial sums)", column_partials_bf16_kernel, unsigned(blocks),
                    256, 0, partial.as<float>(), x16, x, N, C, rows);
    }
  }
  if (!x16) {
    launch_kernel("linear_backward (bias partial sums)", column_partials_kernel<T>, unsigned(blocks), 256, 0,
                  partial.as<float>(), x, N, C, rows);
  }
  add_partial_rows("linear_backward (bias sum)", out, partial.as<float>(), blocks, C, C);
}

/// tanhf for the activations' shared math (kernels/scalar_math.h).
struct ActivationTanh {
  __host__ __device__ float operator()(float u) const { return tanhf(u); }
};

/// Element i of out (rows of OC) plus its bias (when given), written back; returns act of it.
__device__ __forceinline__ float add_bias_activate(float* out, const float* bias, int64_t i, int64_t OC,
                                                   Activation act) {
  float x = out[i];
  if (bias) out[i] = x += bias[i % OC];
  return activation(act, x, ActivationTanh{});
}

/// out += bias (when given) and act_out = act(out) (when act is not None), in one pass over out (N, OC).
__global__ void bias_activation_kernel(float* out, float* act_out, const float* bias, int64_t N, int64_t OC,
                                       Activation act) {
  TINYGPT_CUDA_LOOP(i, N * OC) {
    const float y = add_bias_activate(out, bias, i, OC, act);
    if (act != Activation::None) act_out[i] = y;
  }
}

/// out += bias (when given), and act(out) rounded to bf16 into act16, two to a word as round_bf16_kernel writes them
/// (n elements of out, in pairs): the next product's operand, with no f32 copy of the activation.
__global__ void bias_activation_bf16_kernel(float* out, uint32_t* act16, const float* bias, int64_t pairs, int64_t n,
                                            int64_t OC, Activation act) {
  TINYGPT_CUDA_LOOP(p, pairs) {
    const float lo = add_bias_activate(out, bias, 2 * p, OC, act);
    act16[p] = pack_bf16(lo, 2 * p + 1 < n ? add_bias_activate(out, bias, 2 * p + 1, OC, act) : 0.0f);
  }
}

/// d *= act'(of), n elements: a gradient taken through the activation.
__global__ void activation_grad_kernel(float* d, const float* of, int64_t n, Activation act) {
  TINYGPT_CUDA_LOOP(i, n) d[i] *= activation_grad(act, of[i], ActivationTanh{});
}

/// bf16 storage, forward: out = acc + bias (when given) and act_out = act of it (when act is not None), from the
/// product's f32 sums acc (N, OC), each stored once. Groups of eight with vec (OC a multiple of 8, all aligned).
__global__ void bias_activation_bf16_out_kernel(bf16* out, bf16* act_out, const float* acc, const bf16* bias, int64_t N,
                                                int64_t OC, Activation act, bool vec) {
  map_elements(
      N * OC, vec,
      [&](int64_t e) {
        float x[8], b[8] = {};
        load8(x, acc + e);
        if (bias) load8(b, bias + e % OC);
        for (int j = 0; j < 8; ++j) x[j] += b[j];
        store8(out + e, x);
        if (act == Activation::None) return;
        for (int j = 0; j < 8; ++j) x[j] = activation(act, x[j], ActivationTanh{});
        store8(act_out + e, x);
      },
      [&](int64_t i) {
        const float x = acc[i] + (bias ? float(bias[i % OC]) : 0.0f);
        out[i] = x;
        if (act != Activation::None) act_out[i] = activation(act, x, ActivationTanh{});
      });
}

/// bf16 storage, backward through the activation: dinp = acc * act'(act_of), plus what dinp held unless overwrite, in
/// f32, stored once.
__global__ void activation_grad_bf16_out_kernel(bf16* dinp, const float* acc, const bf16* act_of, int64_t n,
                                                Activation act, bool overwrite, bool vec) {
  map_elements(
      n, vec,
      [&](int64_t e) {
        float x[8], of[8], d[8] = {};
        load8(x, acc + e);
        load8(of, act_of + e);
        if (!overwrite) load8(d, dinp + e);
        for (int j = 0; j < 8; ++j) d[j] += x[j] * activation_grad(act, of[j], ActivationTanh{});
        store8(dinp + e, d);
      },
      [&](int64_t i) {
        const float d = acc[i] * activation_grad(act, float(act_of[i]), ActivationTanh{});
        dinp[i] = overwrite ? d : float(dinp[i]) + d;
      });
}

}  // namespace

// The batched products take f32 or bf16 storage: product() above computes either.
template <class T>
void matmul_forward(T* out, const T* a, const T* b, const MatmulGeom& g) {
  const int64_t batch_a = g.batch_a, batch_b = g.batch_b, M = g.M, K = g.K, N = g.N;
  const bool trans_a = g.trans_a, trans_b = g.trans_b;
  const MatmulMath math = g.math;
  const int64_t lda = trans_a ? M : K, ldb = trans_b ? K : N;
  if (batch_b == 1 && !trans_a) {
    product(false, trans_b, batch_a * M, N, K, 1.0f, a, lda, b, ldb, 0.0f, out, N, math, "matmul_forward");
    return;
  }
  product(trans_a, trans_b, M, N, K, 1.0f, a, lda, batch_a == 1 ? 0 : M * K, b, ldb, batch_b == 1 ? 0 : K * N, 0.0f,
          out, N, M * N, std::max(batch_a, batch_b), math, "matmul_forward");
}

template <class T>
void matmul_backward(T* da, T* db, const T* dout, const T* a, const T* b, const MatmulGeom& g) {
  const int64_t batch_a = g.batch_a, batch_b = g.batch_b, M = g.M, K = g.K, N = g.N;
  const bool trans_a = g.trans_a, trans_b = g.trans_b;
  const MatmulMath math = g.math;
  const int64_t lda = trans_a ? M : K, ldb = trans_b ? K : N;
  const int64_t batch = std::max(batch_a, batch_b);
  if (batch_b == 1 && !trans_a) {
    if (da)
      product(false, !trans_b, batch_a * M, K, N, 1.0f, dout, N, b, ldb, 1.0f, da, K, math, "matmul_backward (da)");
    if (db) {
      if (trans_b) {
        product(true, false, N, K, batch_a * M, 1.0f, dout, N, a, lda, 1.0f, db, K, math, "matmul_backward (db)");
      } else {
        product(true, false, K, N, batch_a * M, 1.0f, a, lda, dout, N, 1.0f, db, N, math, "matmul_backward (db)");
      }
    }
    return;
  }
  // A gradient shared by every batch (batch 1 against a batched operand) is summed one batch after another.
  if (da) {
    const int64_t sb = batch_b == 1 ? 0 : K * N;
    auto grad_a = [&](int64_t first, int64_t count, int64_t sda) {
      const T* bi = b + first * sb;
      const T* gi = dout + first * M * N;
      T* dai = da + (sda == 0 ? 0 : first * M * K);
      if (trans_a) {
        product(trans_b, true, K, M, N, 1.0f, bi, ldb, sb, gi, N, M * N, 1.0f, dai, M, sda, count, math,
                "matmul_backward (da)");
      } else {
        product(false, !trans_b, M, K, N, 1.0f, gi, N, M * N, bi, ldb, sb, 1.0f, dai, K, sda, count, math,
                "matmul_backward (da)");
      }
    };
    if (batch_a == 1) {
      for (int64_t i = 0; i < batch; ++i) grad_a(i, 1, 0);
    } else {
      grad_a(0, batch, M * K);
    }
  }
  if (db) {
    const int64_t sa = batch_a == 1 ? 0 : M * K;
    auto grad_b = [&](int64_t first, int64_t count, int64_t sdb) {
      const T* ai = a + first * sa;
      const T* gi = dout + first * M * N;
      T* dbi = db + (sdb == 0 ? 0 : first * K * N);
      if (trans_b) {
        product(true, trans_a, N, K, M, 1.0f, gi, N, M * N, ai, lda, sa, 1.0f, dbi, K, sdb, count, math,
                "matmul_backward (db)");
      } else {
        product(!trans_a, false, K, N, M, 1.0f, ai, lda, sa, gi, N, M * N, 1.0f, dbi, N, sdb, count, math,
                "matmul_backward (db)");
      }
    };
    if (batch_b == 1) {
      for (int64_t i = 0; i < batch; ++i) grad_b(i, 1, 0);
    } else {
      grad_b(0, batch, K * N);
    }
  }
}

namespace {

/// cublasLt's aux matrix (GELU's input) needs a row stride of a multiple of 8 elements.
bool aux_ok(int64_t ld) { return ld % 8 == 0; }

/// Whether a product may take its bias, GELU or GELU's derivative in cublasLt's epilogue: only when the call asks for
/// it (Numerics::lt_epilogues) and never with bf16 products. Otherwise our kernels do that work after the product.
/// The bf16 training step ran faster without the epilogues, and their GELU derivative, with the GPU's approximate
/// tanh, then rounded to bf16, flipped roundings the CPU's does not (docs/RESULTS.md, "One GPU").
bool lt_epilogues(bool asked, MatmulMath math) { return asked && math != MatmulMath::BF16; }

}  // namespace

// The linear layers: f32 storage (the operands f32, TF32 or rounded to bf16 as math says) and bf16 storage (below).
// Declared from kernels/kernel_list.h's parameters (again here for the emulated build's namespace); each storage type
// is an explicit specialization below.
template <class T>
void linear_forward TINYGPT_PARAMS_linear_forward(T);
template <class T>
void linear_backward TINYGPT_PARAMS_linear_backward(T);

template <>
void linear_forward<float>(const LinearForward<float>& c) {
  float* out = c.out;
  const float *inp = c.inp, *weight = c.weight, *bias = c.bias;
  const int64_t N = c.N, C = c.C, OC = c.OC;
  const MatmulMath math = c.math;
  const Activation act = c.act;
  float* act_out = c.act_out;
  uint16_t *inp16 = c.inp16, *act16 = c.act16;
  if (N == 0 || OC == 0) return;
  // bf16: each operand rounded once, inp into inp16 when the caller keeps it for linear_backward (or already there,
  // without inp).
  const bool bf16 = math == MatmulMath::BF16 && C > 0;
  Scratch inp16_copy(bf16 && !inp16 ? bf16_bytes(N * C) : 0), w16_copy(bf16 ? bf16_bytes(OC * C) : 0);
  const uint16_t* a16 =
      !bf16  ? nullptr
      : !inp ? inp16
             : round_to_bf16(inp16 ? inp16 : inp16_copy.as<uint16_t>(), inp, N * C, "linear_forward (inp to bf16)");
  const uint16_t* w16 = bf16 ? rounded_bf16(w16_copy, weight, OC * C, "linear_forward (weight to bf16)") : nullptr;
  // With act16 the activation goes straight to bf16, by our kernel after the product.
  const bool to16 = bf16 && act16 && act != Activation::None;
  // When asked for (f32 products only), the bias, and GELU with out as its aux (the pre-activation), in cublasLt's
  // epilogue where it has an algorithm.
  const bool lt = C > 0 && (bias || act == Activation::Gelu) && lt_epilogues(c.lt_epilogues, math);
  const bool gelu = lt && act == Activation::Gelu && aux_ok(OC);
  bool fused = false;
  if (lt && (bias || gelu)) {
    const Epilogue e = !gelu ? Epilogue::Bias : bias ? Epilogue::GeluBias : Epilogue::Gelu;
    fused = fused_gemm(false, true, N, OC, C, inp, C, weight, C, gelu ? act_out : out, OC, math, e, bias,
                       gelu ? out : nullptr, OC, "linear_forward (cublasLt)");
  }
  if (!fused && bf16) {
    gemm_bf16(false, true, N, OC, C, 1.0f, a16, C, 0, w16, C, 0, 0.0f, out, OC, 0, 1, "linear_forward");
  } else if (!fused) {
    product(false, true, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC, math, "linear_forward");
  }
  const float* pending_bias = fused ? nullptr : bias;
  const Activation pending_act = fused && gelu ? Activation::None : act;
  if (to16) {  // the bias (unless the epilogue added it) and the activation, to bf16, in one pass
    const int64_t pairs = (N * OC + 1) / 2;
    launch_kernel("linear_forward (bias, activation to bf16)", bias_activation_bf16_kernel, blocks_for(pairs), kThreads,
                  0, out, reinterpret_cast<uint32_t*>(act16), pending_bias, pairs, N * OC, OC, act);
  } else if (pending_bias || pending_act != Activation::None) {  // the bias and the activation in one pass
    launch_kernel("linear_forward (bias, activation)", bias_activation_kernel, blocks_for(N * OC), kThreads, 0, out,
                  act_out, pending_bias, N, OC, pending_act);
  }
}

template <>
void linear_backward<float>(const LinearBackward<float>& c) {
  float *dinp = c.dinp, *dweight = c.dweight, *dbias = c.dbias;
  const float *dout = c.dout, *inp = c.inp, *weight = c.weight, *act_of = c.act_of;
  const int64_t N = c.N, C = c.C, OC = c.OC;
  const MatmulMath math = c.math;
  const bool overwrite_dinp = c.overwrite_dinp;
  const Activation act = c.act;
  const uint16_t* inp16 = c.inp16;
  // In bf16 both products read dout: it is rounded once for the two, in the bias gradient's pass over dout when
  // there is one (and OC is even, so that rows start on whole pairs).
  const bool bf16 = math == MatmulMath::BF16 && (dinp || dweight) && N * OC * C > 0;
  Scratch dout16_copy(bf16 ? bf16_bytes(N * OC) : 0);
  const bool bias_pass = bf16 && dbias && OC % 2 == 0;
  if (bias_pass) add_column_sums(dbias, dout, N, OC, dout16_copy.as<uint32_t>());
  const uint16_t* dout16 = bias_pass ? dout16_copy.as<uint16_t>()
                           : bf16    ? rounded_bf16(dout16_copy, dout, N * OC, "linear_backward (dout to bf16)")
                                     : nullptr;
  if (dinp) {
    Scratch w16_copy(bf16 ? bf16_bytes(OC * C) : 0);
    const uint16_t* w16 = bf16 ? rounded_bf16(w16_copy, weight, OC * C, "linear_backward (weight to bf16)") : nullptr;
    // When asked for (f32 products only), GELU's derivative at act_of (cublasLt's aux, read) in the epilogue of an
    // overwriting product.
    const bool fused = act == Activation::Gelu && overwrite_dinp && aux_ok(C) && N * OC * C > 0 &&
                       lt_epilogues(c.lt_epilogues, math) &&
                       fused_gemm(false, false, N, C, OC, dout, OC, weight, C, dinp, C, math, Epilogue::DGelu, nullptr,
                                  const_cast<float*>(act_of), C, "linear_backward (dinp, cublasLt)");
    if (!fused) {
      const float beta = overwrite_dinp ? 0.0f : 1.0f;
      if (bf16) {
        gemm_bf16(false, false, N, C, OC, 1.0f, dout16, OC, 0, w16, C, 0, beta, dinp, C, 0, 1,
                  "linear_backward (dinp)");
      } else {
        product(false, false, N, C, OC, 1.0f, dout, OC, weight, C, beta, dinp, C, math, "linear_backward (dinp)");
      }
      if (act != Activation::None) {
        launch_kernel("linear_backward (activation)", activation_grad_kernel, blocks_for(N * C), kThreads, 0, dinp,
                      act_of, N * C, act);
      }
    }
  }
  if (dweight && bf16) {  // inp as linear_forward rounded it, when the caller kept that
    Scratch inp16_copy(inp16 ? 0 : bf16_bytes(N * C));
    const uint16_t* a16 = inp16 ? inp16 : rounded_bf16(inp16_copy, inp, N * C, "linear_backward (inp to bf16)");
    gemm_bf16(true, false, OC, C, N, 1.0f, dout16, OC, 0, a16, C, 0, 1.0f, dweight, C, 0, 1,
              "linear_backward (dweight)");
  } else if (dweight) {
    product(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C, math, "linear_backward (dweight)");
  }
  if (dbias && N > 0 && !bias_pass) add_column_sums(dbias, dout, N, OC);
}

// bf16 storage: the products of the operands as stored (cuBLAS with bf16 in and out, f32 sums). Where a bias or an
// activation follows, the product's f32 sums go to scratch and one pass adds, activates and stores each output once,
// as the CPU's GEMM epilogue does (Bf16Out); otherwise cuBLAS stores the bf16 result itself. inp16 and act16 are not
// used (the operands are bf16 already).
template <>
void linear_forward<bf16>(const LinearForward<bf16>& c) {
  bf16* out = c.out;
  const bf16 *inp = c.inp, *weight = c.weight, *bias = c.bias;
  const int64_t N = c.N, C = c.C, OC = c.OC;
  const Activation act = c.act;
  bf16* act_out = c.act_out;
  if (N == 0 || OC == 0) return;
  if (!bias && act == Activation::None) {
    gemm_bf16(false, true, N, OC, C, 1.0f, bits(inp), C, 0, bits(weight), C, 0, 0.0f, out, OC, 0, 1, "linear_forward");
    return;
  }
  Scratch acc(size_t(N * OC) * sizeof(float));
  gemm_bf16(false, true, N, OC, C, 1.0f, bits(inp), C, 0, bits(weight), C, 0, 0.0f, acc.as<float>(), OC, 0, 1,
            "linear_forward");
  const bool vec = OC % 8 == 0 && vectors_fit(out, act_out, bias);
  launch_kernel("linear_forward (bias, activation)", bias_activation_bf16_out_kernel, map_blocks(N * OC, vec), kThreads,
                0, out, act_out, acc.as<float>(), bias, N, OC, act, vec);
}

template <>
void linear_backward<bf16>(const LinearBackward<bf16>& c) {
  bf16 *dinp = c.dinp, *dweight = c.dweight, *dbias = c.dbias;
  const bf16 *dout = c.dout, *inp = c.inp, *weight = c.weight, *act_of = c.act_of;
  const int64_t N = c.N, C = c.C, OC = c.OC;
  const bool overwrite_dinp = c.overwrite_dinp;
  const Activation act = c.act;
  if (dinp && N * C > 0) {  // (N, OC) @ (OC, C)
    if (act == Activation::None) {
      gemm_bf16(false, false, N, C, OC, 1.0f, bits(dout), OC, 0, bits(weight), C, 0, overwrite_dinp ? 0.0f : 1.0f, dinp,
                C, 0, 1, "linear_backward (dinp)");
    } else {
      Scratch acc(size_t(N * C) * sizeof(float));
      gemm_bf16(false, false, N, C, OC, 1.0f, bits(dout), OC, 0, bits(weight), C, 0, 0.0f, acc.as<float>(), C, 0, 1,
                "linear_backward (dinp)");
      const bool vec = vectors_fit(dinp, act_of);
      launch_kernel("linear_backward (activation)", activation_grad_bf16_out_kernel, map_blocks(N * C, vec), kThreads,
                    0, dinp, acc.as<float>(), act_of, N * C, act, overwrite_dinp, vec);
    }
  }
  if (dweight && OC * C > 0) {  // (OC, N) @ (N, C), added to what dweight held
    gemm_bf16(true, false, OC, C, N, 1.0f, bits(dout), OC, 0, bits(inp), C, 0, 1.0f, dweight, C, 0, 1,
              "linear_backward (dweight)");
  }
  if (dbias && N > 0) add_column_sums(dbias, dout, N, OC);
}
TINYGPT_CUDA_END

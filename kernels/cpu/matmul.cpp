// Batched matmul and the linear layer, forward and backward, on top of the blocked gemm.
#include <algorithm>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace tinygpt::cpu {
namespace {

/// Calls f(i) for every batch i. Many small products run one per thread (gemm then stays
/// single-threaded inside the parallel region); few large ones run in turn, each using all threads.
template <class F>
void for_each_batch(int64_t batch, int64_t flops_per_batch, F f) {
  const bool across = batch >= omp_get_max_threads() && flops_per_batch < (int64_t(1) << 22);
#pragma omp parallel for if (across)
  for (int64_t i = 0; i < batch; ++i) f(i);
}

/// C = alpha op(A) op(B) + beta C with beta 0 or 1, the products as MatmulMath asks (gemm's bf16 rounding).
template <class T>
void product(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
             T beta, T* C, int64_t ldc, bool bf16) {
  gemm<T>(ta, tb, M, N, K, T(1), A, lda, B, ldb, beta, C, ldc, bf16);
}

/// The same over bf16 storage: the products of the stored values summed in f32 (gemm over bf16), each element of C
/// rounded once as its block of C is done (Bf16Out), after adding what it held when beta is 1.
void product(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const bf16* A, int64_t lda, const bf16* B, int64_t ldb,
             bf16 beta, bf16* C, int64_t ldc, bool) {
  const Bf16Out o{C, ldc, float(beta) != 0.0f};
  Epilogue<float> ep;
  ep.out16 = &o;
  gemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, nullptr, N, ep);
}

}  // namespace

template <class T>
void matmul_forward(T* out, const T* a, const T* b, const MatmulGeom& g) {
  const int64_t batch_a = g.batch_a, batch_b = g.batch_b, M = g.M, K = g.K, N = g.N;
  const bool trans_a = g.trans_a, trans_b = g.trans_b;
  const bool bf16 = g.math == MatmulMath::BF16;
  const int64_t lda = trans_a ? M : K, ldb = trans_b ? K : N;
  if (batch_b == 1 && !trans_a) {
    // Rows of every batch of a are contiguous: one product of (batch_a * M, K) by the shared b.
    product(false, trans_b, batch_a * M, N, K, a, lda, b, ldb, T(0.0f), out, N, bf16);
    return;
  }
  const int64_t batch = std::max(batch_a, batch_b);
  for_each_batch(batch, M * N * K, [&](int64_t i) {
    const T* ai = a + (batch_a == 1 ? 0 : i) * M * K;
    const T* bi = b + (batch_b == 1 ? 0 : i) * K * N;
    product(trans_a, trans_b, M, N, K, ai, lda, bi, ldb, T(0.0f), out + i * M * N, N, bf16);
  });
}

template <class T>
void matmul_backward(T* da, T* db, const T* dout, const T* a, const T* b, const MatmulGeom& g) {
  const int64_t batch_a = g.batch_a, batch_b = g.batch_b, M = g.M, K = g.K, N = g.N;
  const bool trans_a = g.trans_a, trans_b = g.trans_b;
  const bool bf16 = g.math == MatmulMath::BF16;
  const int64_t lda = trans_a ? M : K, ldb = trans_b ? K : N;
  const int64_t batch = std::max(batch_a, batch_b);
  // da: op(a) = dout @ op(b)^T, stored transposed when trans_a. Accumulates (beta = 1).
  auto grad_a = [&](int64_t i, T* dai) {
    const T* bi = b + (batch_b == 1 ? 0 : i) * K * N;
    const T* gi = dout + i * M * N;
    if (trans_a) {
      product(trans_b, true, K, M, N, bi, ldb, gi, N, T(1.0f), dai, M, bf16);
    } else {
      product(false, !trans_b, M, K, N, gi, N, bi, ldb, T(1.0f), dai, K, bf16);
    }
  };
  // db: op(b) = op(a)^T @ dout, stored transposed when trans_b.
  auto grad_b = [&](int64_t i, T* dbi) {
    const T* ai = a + (batch_a == 1 ? 0 : i) * M * K;
    const T* gi = dout + i * M * N;
    if (trans_b) {
      product(true, trans_a, N, K, M, gi, N, ai, lda, T(1.0f), dbi, K, bf16);
    } else {
      product(!trans_a, false, K, N, M, ai, lda, gi, N, T(1.0f), dbi, N, bf16);
    }
  };
  if (batch_b == 1 && !trans_a) {
    // Same flattening as the forward pass: a and dout are (batch_a * M, .) matrices.
    if (da) product(false, !trans_b, batch_a * M, K, N, dout, N, b, ldb, T(1.0f), da, K, bf16);
    if (db) {
      if (trans_b) {
        product(true, false, N, K, batch_a * M, dout, N, a, lda, T(1.0f), db, K, bf16);
      } else {
        product(true, false, K, N, batch_a * M, a, lda, dout, N, T(1.0f), db, N, bf16);
      }
    }
    return;
  }
  // A gradient shared by all batches is summed in batch order on one thread at a time: no races.
  if (da) {
    if (batch_a == 1) {
      for (int64_t i = 0; i < batch; ++i) grad_a(i, da);
    } else {
      for_each_batch(batch, M * N * K, [&](int64_t i) { grad_a(i, da + i * M * K); });
    }
  }
  if (db) {
    if (batch_b == 1) {
      for (int64_t i = 0; i < batch; ++i) grad_b(i, db);
    } else {
      for_each_batch(batch, M * N * K, [&](int64_t i) { grad_b(i, db + i * K * N); });
    }
  }
}

template <class T>
void linear_forward(const LinearForward<T>& c) {
  // Bias and activation in the epilogue, while each tile of out is in cache.
  const Epilogue<T> ep{c.bias, c.act, c.act != Activation::None ? c.act_out : nullptr, nullptr};
  gemm<T>(false, true, c.N, c.OC, c.C, T(1), c.inp, c.C, c.weight, c.C, T(0), c.out, c.OC, c.math == MatmulMath::BF16,
          ep);
}

template <class T>
void linear_backward(const LinearBackward<T>& c) {
  T *dinp = c.dinp, *dweight = c.dweight, *dbias = c.dbias;
  const T *dout = c.dout, *inp = c.inp, *weight = c.weight;
  const int64_t N = c.N, C = c.C, OC = c.OC;
  const bool bf16 = c.math == MatmulMath::BF16;
  const T beta = c.overwrite_dinp ? T(0) : T(1);  // beta 0: dinp is never read
  // With an activation, dinp = (dout @ weight) * act'(act_of): the gradient through the activation that made inp,
  // multiplied in the epilogue.
  const Epilogue<T> ep{nullptr, c.act, nullptr, c.act != Activation::None ? c.act_of : nullptr};
  if (dinp) gemm<T>(false, false, N, C, OC, T(1), dout, OC, weight, C, beta, dinp, C, bf16, ep);  // (N, OC) @ (OC, C)
  if (dweight) gemm<T>(true, false, OC, C, N, T(1), dout, OC, inp, C, T(1), dweight, C, bf16);    // (OC, N) @ (N, C)
  if (dbias) {
    // Column sums of dout: private rows per thread, added in thread order.
    const int nth = N * OC >= kParallelGrain ? omp_get_max_threads() : 1;
    std::vector<T> partial(size_t(nth * OC), T(0));
#pragma omp parallel num_threads(nth)
    {
      const int tid = omp_get_thread_num(), team = omp_get_num_threads();
      T* p = partial.data() + tid * OC;
      for (int64_t n = N * tid / team; n < N * (tid + 1) / team; ++n) {
        const T* g = dout + n * OC;
        for (int64_t o = 0; o < OC; ++o) p[o] += g[o];
      }
    }
    for (int t = 0; t < nth; ++t) {
      for (int64_t o = 0; o < OC; ++o) dbias[o] += partial[t * OC + o];
    }
  }
}

// bf16 storage: each product summed in f32 block by block and stored in bf16 by gemm's epilogue (Bf16Out): the bias
// added, the output rounded once (and act(out) from the f32 value); backward likewise, the gradients scaled by
// act', added to what they held in f32 and rounded once.
template <>
void linear_forward<bf16>(const LinearForward<bf16>& c) {
  std::vector<float> b(c.bias ? size_t(c.OC) : 0);
  std::copy_n(c.bias, b.size(), b.begin());
  Bf16Out o{c.out, c.OC};
  Epilogue<float> ep{c.bias ? b.data() : nullptr, c.act};
  if (c.act != Activation::None) o.act_out = c.act_out;
  ep.out16 = &o;
  gemm(false, true, c.N, c.OC, c.C, 1.0f, c.inp, c.C, c.weight, c.C, 0.0f, nullptr, c.OC, ep);
}

template <>
void linear_backward<bf16>(const LinearBackward<bf16>& c) {
  bf16 *dinp = c.dinp, *dweight = c.dweight, *dbias = c.dbias;
  const bf16 *dout = c.dout, *inp = c.inp, *weight = c.weight;
  const int64_t N = c.N, C = c.C, OC = c.OC;
  if (dinp) {
    // (N, OC) @ (OC, C), times act'(act_of) with an activation, plus what dinp held unless it is overwritten.
    Bf16Out o{dinp, C, !c.overwrite_dinp};
    Epilogue<float> ep;
    if (c.act != Activation::None) ep.act = c.act, o.act_of = c.act_of;
    ep.out16 = &o;
    gemm(false, false, N, C, OC, 1.0f, dout, OC, weight, C, 0.0f, nullptr, C, ep);
  }
  if (dweight) product(true, false, OC, C, N, dout, OC, inp, C, bf16(1.0f), dweight, C, true);  // (OC, N) @ (N, C)
  if (dbias) {
    // Column sums of dout in f32 (rows in a fixed order), added to dbias and rounded once.
    std::vector<float> sum(static_cast<size_t>(OC), 0.0f);
    for (int64_t r = 0; r < N; ++r) {
      const bf16* g = dout + r * OC;
#pragma omp simd
      for (int64_t o = 0; o < OC; ++o) sum[size_t(o)] += float(g[o]);
    }
    for (int64_t o = 0; o < OC; ++o) dbias[o] = bf16(float(dbias[o]) + sum[size_t(o)]);
  }
}

// The storage types kernels/kernel_list.h lists for each kernel.
TINYGPT_INSTANTIATE_F32_F64_BF16(matmul_forward)
TINYGPT_INSTANTIATE_F32_F64_BF16(matmul_backward)
// bf16's linear layers are the specializations above.
TINYGPT_INSTANTIATE_F32_F64(linear_forward)
TINYGPT_INSTANTIATE_F32_F64(linear_backward)

}  // namespace tinygpt::cpu

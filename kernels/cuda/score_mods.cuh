// Score modifiers on the GPU (kernels/score_mods.h): what runs around the attention kernels. The kernels themselves
// apply the per-element terms (score_logit, score_dp, score_ds in attention_common.cuh) and skip tiles outside a
// window; this header computes Shaw's R = Q A_K^T and G = dO A_V^T rows before them, and after them the relative
// values' Pbar and O += Pbar A_V (forward), dR and the learned tables' gradients (backward).
//
// The pieces after the kernels walk one query row (or one head and distance) per thread and recompute the scores
// they need from q and k, so they cost about one naive attention pass each; every sum runs in a fixed order, so the
// results are deterministic. They are written for clarity first, not tuned for speed (the GPU timings in
// docs/RESULTS.md, "One GPU", are of attention without modifiers).
#pragma once

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/launch.cuh"

TINYGPT_CUDA_BEGIN
namespace {

/// The strides of a query-row operand (q, out, dout, dq), by value for a kernel.
struct RowStrides {
  int64_t stride[3];
};

__device__ __forceinline__ int64_t row_b(const AttentionGeom& g, int64_t row) { return row / (g.NH * g.T); }
__device__ __forceinline__ int64_t row_h(const AttentionGeom& g, int64_t row) { return row / g.T % g.NH; }
__device__ __forceinline__ int64_t row_t(const AttentionGeom& g, int64_t row) { return row % g.T; }

/// out[row, c] = x_row . table[c] (R = Q A_K^T, G = dO A_V^T); one thread per (row, c).
__global__ void rel_rows_kernel(float* out, const float* x, RowStrides xs, const float* table, int64_t D,
                                AttentionGeom g) {
  const int64_t W = g.mods.rel_width();
  TINYGPT_CUDA_LOOP(i, g.B * g.NH * g.T * W) {
    const int64_t row = i / W, c = i % W;
    const float* xr = at(x, xs.stride, row_b(g, row), row_h(g, row), row_t(g, row));
    float acc = 0.0f;
    for (int64_t e = 0; e < D; ++e) acc += xr[e] * table[c * D + e];
    out[i] = acc;
  }
}

/// y_row += coef_row @ table (O += Pbar A_V, dQ += dR A_K); one thread per (row, e).
__global__ void add_rows_table_kernel(float* y, RowStrides ys, const float* coef, const float* table, int64_t D,
                                      AttentionGeom g) {
  const int64_t W = g.mods.rel_width();
  TINYGPT_CUDA_LOOP(i, g.B * g.NH * g.T * D) {
    const int64_t row = i / D, e = i % D;
    float acc = 0.0f;
    for (int64_t c = 0; c < W; ++c) acc += coef[row * W + c] * table[c * D + e];
    at(y, ys.stride, row_b(g, row), row_h(g, row), row_t(g, row))[e] += acc;
  }
}

/// dtable[c, e] += sum over the rows, in order, of coef[row, c] * y_row[e] (dA_K += dR^T Q, dA_V += Pbar^T dO); one
/// thread per (c, e).
__global__ void table_grad_kernel(float* dtable, const float* coef, const float* y, RowStrides ys, int64_t D,
                                  AttentionGeom g) {
  const int64_t W = g.mods.rel_width();
  TINYGPT_CUDA_LOOP(i, W * D) {
    const int64_t c = i / D, e = i % D;
    float acc = 0.0f;
    for (int64_t row = 0; row < g.B * g.NH * g.T; ++row) {
      acc += coef[row * W + c] * at(y, ys.stride, row_b(g, row), row_h(g, row), row_t(g, row))[e];
    }
    dtable[i] += acc;
  }
}

/// The keys of query t at clipped distance column c: [first, last], empty when first > last.
__device__ __forceinline__ void keys_of_column(const AttentionGeom& g, int64_t t, int64_t c, int64_t& first,
                                               int64_t& last) {
  const int64_t m = g.mods.max_rel, tq = t + g.S - g.T;
  first = c == 0 ? 0 : tq + c - m;
  last = c == 2 * m ? g.S - 1 : tq + c - m;
  first = max64(first, 0);
  last = min64(last, g.S - 1);
}

/// The logit of (b, h, t, s) computed from scratch (q . k and the modifiers), and its capped score.
__device__ float logit_from_scratch(const AttentionGeom& g, const float* q, const float* k, const float* mask,
                                    const uint8_t* kp, int64_t b, int64_t h, int64_t t, int64_t s, float& capped) {
  const float* qr = at(q, g.q_stride, b, h, t);
  const float* kr = at(k, g.k_stride, b, h / (g.NH / g.NKV), s);
  float qk = 0.0f;
  for (int64_t e = 0; e < g.E; ++e) qk += qr[e] * kr[e];
  return score_logit(g, kp, mask, b, h, t, s, qk, capped);
}

/// The backward of element (b, h, t, s) from scratch: the logit's gradient and the raw product's; false when hidden.
__device__ bool element_grads(const AttentionGeom& g, const float* q, const float* k, const float* v, const float* dout,
                              const float* lse, const float* D, const float* mask, const uint8_t* kp, int64_t b,
                              int64_t h, int64_t t, int64_t s, float& dlogit, float& ds) {
  const int64_t row = (b * g.NH + h) * g.T + t;
  if (lse[row] == -INFINITY) return false;
  float capped;
  const float x = logit_from_scratch(g, q, k, mask, kp, b, h, t, s, capped);
  if (x == -INFINITY) return false;
  const float* gr = at(dout, g.o_stride, b, h, t);
  const float* vr = at(v, g.v_stride, b, h / (g.NH / g.NKV), s);
  float dov = 0.0f;
  for (int64_t e = 0; e < g.Ev; ++e) dov += gr[e] * vr[e];
  const float p = expf(x - lse[row]);
  dlogit = p * (score_dp(g, b, h, t, s, dov) * dropout_factor(g, b, h, t, s) - D[row]);
  ds = score_ds(g, dlogit, capped);
  return true;
}

/// Pbar[row, c]: the row's dropped probabilities summed over the keys at clipped distance c; one thread per (row, c).
__global__ void rel_probs_kernel(float* pbar, const float* q, const float* k, const float* lse, const float* mask,
                                 const uint8_t* kp, AttentionGeom g) {
  const int64_t W = g.mods.rel_width();
  TINYGPT_CUDA_LOOP(i, g.B * g.NH * g.T * W) {
    const int64_t row = i / W, c = i % W, b = row_b(g, row), h = row_h(g, row), t = row_t(g, row);
    float acc = 0.0f;
    if (lse[row] != -INFINITY) {
      int64_t first, last;
      keys_of_column(g, t, c, first, last);
      for (int64_t s = first; s <= last; ++s) {
        float capped;
        const float x = logit_from_scratch(g, q, k, mask, kp, b, h, t, s, capped);
        if (x != -INFINITY) acc += expf(x - lse[row]) * dropout_factor(g, b, h, t, s);
      }
    }
    pbar[i] = acc;
  }
}

/// dR[row, c]: the raw products' gradients of the row summed over the keys at clipped distance c.
__global__ void rel_dR_kernel(float* dR, const float* q, const float* k, const float* v, const float* dout,
                              const float* lse, const float* D, const float* mask, const uint8_t* kp, AttentionGeom g) {
  const int64_t W = g.mods.rel_width();
  TINYGPT_CUDA_LOOP(i, g.B * g.NH * g.T * W) {
    const int64_t row = i / W, c = i % W, b = row_b(g, row), h = row_h(g, row), t = row_t(g, row);
    int64_t first, last;
    keys_of_column(g, t, c, first, last);
    float acc = 0.0f;
    for (int64_t s = first; s <= last; ++s) {
      float dlogit, ds;
      if (element_grads(g, q, k, v, dout, lse, D, mask, kp, b, h, t, s, dlogit, ds)) acc += ds;
    }
    dR[i] = acc;
  }
}

/// acc[h, d + S - 1]: the logits' gradients of head h at distance d, summed over batches and queries in order; one
/// thread per (head, distance), distances d in [-(S - 1), T - 1].
__global__ void t5_distance_kernel(float* acc, const float* q, const float* k, const float* v, const float* dout,
                                   const float* lse, const float* D, const float* mask, const uint8_t* kp,
                                   AttentionGeom g) {
  const int64_t n = g.S + g.T - 1;
  TINYGPT_CUDA_LOOP(i, g.NH * n) {
    const int64_t h = i / n, d = i % n - (g.S - 1);
    float sum = 0.0f;
    for (int64_t b = 0; b < g.B; ++b) {
      for (int64_t t = 0; t < g.T; ++t) {
        const int64_t s = t + g.S - g.T + d;
        float dlogit, ds;
        if (s >= 0 && s < g.S && element_grads(g, q, k, v, dout, lse, D, mask, kp, b, h, t, s, dlogit, ds))
          sum += dlogit;
      }
    }
    acc[i] = sum;
  }
}

/// dt5[h, bucket] += the by-distance sums of head h whose distance falls in the bucket, in order of distance.
__global__ void t5_fold_kernel(float* dt5, const float* acc, AttentionGeom g) {
  const ScoreMods& m = g.mods;
  const int64_t n = g.S + g.T - 1;
  TINYGPT_CUDA_LOOP(i, g.NH * m.t5_buckets) {
    const int64_t h = i / m.t5_buckets, bucket = i % m.t5_buckets;
    float sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      if (t5_bucket(j - (g.S - 1), m.t5_buckets, m.t5_max_distance, m.t5_bidirectional) == bucket)
        sum += acc[h * n + j];
    }
    static_cast<float*>(m.d_t5_bias)[i] += sum;
  }
}

RowStrides strides_of(const int64_t* s) { return {{s[0], s[1], s[2]}}; }

/// The score modifiers' launches around one attention call: R (and G in the backward) before the kernels, which read
/// them through geom(); the relative values and the tables' gradients after.
class ModLaunch {
 public:
  /// dout: null in the forward.
  ModLaunch(const AttentionGeom& g, const float* q, const float* dout)
      : g_(g),
        rows_(g.B * g.NH * g.T * g.mods.rel_width()),
        R_(g.mods.rel_k ? size_t(rows_) * sizeof(float) : 0),
        G_(dout && g.mods.rel_v ? size_t(rows_) * sizeof(float) : 0) {
    const ScoreMods& m = g.mods;
    if (m.rel_k) {
      launch_kernel("attention (relative keys: R)", rel_rows_kernel, blocks_for(rows_), kThreads, 0, R_.as<float>(), q,
                    strides_of(g.q_stride), static_cast<const float*>(m.rel_k), g.E, g);
      g_.mods.gpu_R = R_.as<float>();
    }
    if (dout && m.rel_v) {
      launch_kernel("attention (relative values: G)", rel_rows_kernel, blocks_for(rows_), kThreads, 0, G_.as<float>(),
                    dout, strides_of(g.o_stride), static_cast<const float*>(m.rel_v), g.Ev, g);
      g_.mods.gpu_G = G_.as<float>();
    }
  }

  const AttentionGeom& geom() const { return g_; }

  /// After the forward kernel: Pbar, then O += Pbar A_V.
  void finish_forward(float* out, const float* q, const float* k, const float* lse, const float* mask,
                      const uint8_t* kp) {
    const ScoreMods& m = g_.mods;
    if (!m.rel_v) return;
    float* pbar = static_cast<float*>(m.rel_probs);
    launch_kernel("attention (relative values: Pbar)", rel_probs_kernel, blocks_for(rows_), kThreads, 0, pbar, q, k,
                  lse, mask, kp, g_);
    launch_kernel("attention (relative values: O += Pbar A_V)", add_rows_table_kernel,
                  blocks_for(g_.B * g_.NH * g_.T * g_.Ev), kThreads, 0, out, strides_of(g_.o_stride),
                  static_cast<const float*>(pbar), static_cast<const float*>(m.rel_v), g_.Ev, g_);
  }

  /// After the backward kernels: dR, then dQ += dR A_K and dA_K += dR^T Q; dA_V += Pbar^T dO; T5's table.
  void finish_backward(float* dq, const float* dout, const float* q, const float* k, const float* v, const float* lse,
                       const float* D, const float* mask, const uint8_t* kp) {
    const ScoreMods& m = g_.mods;
    if (m.rel_k && (dq || m.d_rel_k)) {
      Scratch dR(size_t(rows_) * sizeof(float));
      launch_kernel("attention (relative keys: dR)", rel_dR_kernel, blocks_for(rows_), kThreads, 0, dR.as<float>(), q,
                    k, v, dout, lse, D, mask, kp, g_);
      const float* rel_k = static_cast<const float*>(m.rel_k);
      if (dq) {
        launch_kernel("attention (relative keys: dQ += dR A_K)", add_rows_table_kernel,
                      blocks_for(g_.B * g_.NH * g_.T * g_.E), kThreads, 0, dq, strides_of(g_.q_stride),
                      static_cast<const float*>(dR.as<float>()), rel_k, g_.E, g_);
      }
      if (m.d_rel_k) {
        launch_kernel("attention (relative keys: dA_K)", table_grad_kernel, blocks_for(m.rel_width() * g_.E), kThreads,
                      0, static_cast<float*>(m.d_rel_k), static_cast<const float*>(dR.as<float>()), q,
                      strides_of(g_.q_stride), g_.E, g_);
      }
    }
    if (m.rel_v && m.d_rel_v) {
      launch_kernel("attention (relative values: dA_V)", table_grad_kernel, blocks_for(m.rel_width() * g_.Ev), kThreads,
                    0, static_cast<float*>(m.d_rel_v), static_cast<const float*>(m.rel_probs), dout,
                    strides_of(g_.o_stride), g_.Ev, g_);
    }
    if (m.d_t5_bias) {
      const int64_t n = g_.NH * (g_.S + g_.T - 1);
      Scratch acc(size_t(n) * sizeof(float));
      launch_kernel("attention (T5 bias: by distance)", t5_distance_kernel, blocks_for(n), kThreads, 0, acc.as<float>(),
                    q, k, v, dout, lse, D, mask, kp, g_);
      launch_kernel("attention (T5 bias: by bucket)", t5_fold_kernel, blocks_for(g_.NH * m.t5_buckets), kThreads, 0,
                    static_cast<float*>(m.d_t5_bias), static_cast<const float*>(acc.as<float>()), g_);
    }
  }

 private:
  AttentionGeom g_;
  int64_t rows_;
  Scratch R_, G_;
};

}  // namespace
TINYGPT_CUDA_END

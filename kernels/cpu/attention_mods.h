// Flash attention on the CPU, the score modifiers' tiles (kernels/score_mods.h): Shaw's relative rows and tables,
// the naive kernels' element backward (modified_element_backward), position biases a row at a time, and ModTile,
// which applies the modifiers to a tile a row at a time. The logit's arithmetic is kernels/scalar_math.h's
// (modified_logit, modified_score and its gradient), shared with the GPU. Only
// kernels/cpu/attention.cpp includes it.
#pragma once

#include "attention_tiles.h"

namespace tinygpt::cpu::attention_detail {

// ---------------------------------------------------------------------------------------------------------------
// Score modifiers (kernels/score_mods.h). When any is on, the logits and gradients of a tile come from the two
// per-element functions below instead of the plain paths of attention_tiles.h; the naive kernels call the same two.

/// Shaw's relative positions per query row, (B, NH, T, 2m + 1) each, null when unused: R = Q A_K^T (forward and
/// backward), G = dO A_V^T and dR, the raw-product gradients summed per clipped distance (backward).
template <class T>
struct RelRows {
  const T* R = nullptr;
  const T* G = nullptr;
  T* dR = nullptr;
};

/// The (b, h) block of a tensor read through three strides: its first query row (rows follow at stride[2]).
template <class P>
P head_block(P base, const int64_t* stride, int64_t bh, int64_t NH) {
  return base + bh / NH * stride[0] + bh % NH * stride[1];
}

/// out[row, c] = x_row . table[c] for every query row (b, h, t) of x (read through `stride`) and c < 2m + 1: one
/// GEMM per head, (T, D) @ (D, 2m + 1). `out` is resized, never shrunk (its memory is reused call after call).
template <class T>
void rows_times_table(std::vector<T>& out, const T* x, const int64_t* stride, const T* table, int64_t D,
                      const AttentionGeom& g) {
  const int64_t W = g.mods.rel_width(), heads = g.B * g.NH;
  out.resize(size_t(heads * g.T * W));
#pragma omp parallel for if (heads * g.T * W * D >= kParallelGrain)
  for (int64_t bh = 0; bh < heads; ++bh) {
    gemm(false, true, g.T, W, D, T(1), head_block(x, stride, bh, g.NH), stride[2], table, D, T(0),
         out.data() + bh * g.T * W, W);
  }
}

/// y_row += coef[row] @ table for every query row of y (read through `stride`): dQ += dR A_K, O += Pbar A_V.
template <class T>
void add_rows_times_table(T* y, const int64_t* stride, const T* coef, const T* table, int64_t D,
                          const AttentionGeom& g) {
  const int64_t W = g.mods.rel_width(), heads = g.B * g.NH;
#pragma omp parallel for if (heads * g.T * W * D >= kParallelGrain)
  for (int64_t bh = 0; bh < heads; ++bh) {
    gemm(false, false, g.T, D, W, T(1), coef + bh * g.T * W, W, table, D, T(1), head_block(y, stride, bh, g.NH),
         stride[2]);
  }
}

/// dtable += coef^T y over every query row: dA_K += dR^T Q, dA_V += Pbar^T dO. The heads in a fixed number of chunks,
/// one GEMM per head into its chunk's partial sum, the chunks side by side and their sums added in order: the result
/// does not depend on the thread count.
template <class T>
void add_table_grad(T* dtable, const T* coef, const T* y, const int64_t* stride, int64_t D, const AttentionGeom& g) {
  const int64_t W = g.mods.rel_width(), heads = g.B * g.NH, chunks = std::min<int64_t>(heads, 8);
  std::vector<T> partial(size_t(chunks * W * D), T(0));
#pragma omp parallel for schedule(dynamic, 1) if (heads * g.T * W * D >= kParallelGrain)
  for (int64_t c = 0; c < chunks; ++c) {
    for (int64_t bh = c * heads / chunks; bh < (c + 1) * heads / chunks; ++bh) {
      gemm(true, false, W, D, g.T, T(1), coef + bh * g.T * W, W, head_block(y, stride, bh, g.NH), stride[2], T(1),
           partial.data() + c * W * D, D);
    }
  }
  for (int64_t c = 0; c < chunks; ++c) axpy_row(dtable, T(1), partial.data() + c * W * D, W * D);
}

/// The relative rows a kernel call needs, computed once per call. Forward: R. Backward: R, G, and dR when dQ or
/// dA_K is wanted; finish() then adds dR A_K to dQ, dR^T Q to dA_K and Pbar^T dO to dA_V. Their memory is the calling
/// thread's, kept from call to call (the three-minute job's are 0.8 MB each, four of them a layer and step: allocated
/// afresh, their pages were faulted in every time).
template <class T>
struct RelBuffers {
  std::vector<T>& R = kept(0);
  std::vector<T>& G = kept(1);
  std::vector<T>& dR = kept(2);
  bool has_R = false, has_G = false, has_dR = false;

  RelBuffers(const AttentionGeom& g, const T* q, const T* dout, bool want_dq) {
    const ScoreMods& m = g.mods;
    has_R = m.rel_k != nullptr;
    has_G = dout && m.rel_v;
    has_dR = dout && m.rel_k && (want_dq || m.d_rel_k);
    if (has_R) rows_times_table(R, q, g.q_stride, static_cast<const T*>(m.rel_k), g.E, g);
    if (has_G) rows_times_table(G, dout, g.o_stride, static_cast<const T*>(m.rel_v), g.Ev, g);
    if (has_dR) {
      dR.resize(size_t(g.B * g.NH * g.T * m.rel_width()));
      std::fill(dR.begin(), dR.end(), T(0));
    }
  }
  RelBuffers(const RelBuffers&) = delete;
  RelBuffers& operator=(const RelBuffers&) = delete;
  RelRows<T> rows() { return {has_R ? R.data() : nullptr, has_G ? G.data() : nullptr, has_dR ? dR.data() : nullptr}; }

  static std::vector<T>& kept(int i) {
    thread_local std::array<std::vector<T>, 3> buffers;
    return buffers[size_t(i)];
  }

  void finish(T* dq, const T* dout, const T* q, const AttentionGeom& g) const {
    const ScoreMods& m = g.mods;
    if (has_dR && dq) add_rows_times_table(dq, g.q_stride, dR.data(), static_cast<const T*>(m.rel_k), g.E, g);
    if (has_dR && m.d_rel_k) add_table_grad(static_cast<T*>(m.d_rel_k), dR.data(), q, g.q_stride, g.E, g);
    if (m.rel_v && m.d_rel_v) {
      add_table_grad(static_cast<T*>(m.d_rel_v), static_cast<const T*>(m.rel_probs), dout, g.o_stride, g.Ev, g);
    }
  }
};

/// The output's relative-value term after the attention proper: O += Pbar A_V.
template <class T>
void add_relative_values(T* out, const AttentionGeom& g) {
  if (g.mods.rel_v) {
    add_rows_times_table(out, g.o_stride, static_cast<const T*>(g.mods.rel_probs), static_cast<const T*>(g.mods.rel_v),
                         g.Ev, g);
  }
}

/// One element of the backward: raw product x and dp = dO_t . v_s in, the dropped probability Pd and the raw
/// product's gradient dS out (both 0 where hidden). With `tables`, the learned tables' gradients are summed too:
/// into dR's row of t (owned by the caller) and dt5 (the caller's partial sum for head h, t5_buckets long).
template <class T>
inline void modified_element_backward(const AttentionGeom& g, int64_t b, int64_t h, int64_t t, int64_t s, T& x, T& dp,
                                      T bias, int32_t bucket, const T* lse, const T* D, const T* mask,
                                      const uint8_t* kp, const RelRows<T>& rel, bool tables, T* dt5) {
  const ScoreMods& m = g.mods;
  const int64_t row = head_row(g, b, h, t), col = rel_column(s - (t + g.S - g.T), m.max_rel);
  T capped = 0;
  const T logit = lse[row] == kNegInf<T> ? kNegInf<T> : modified_logit(g, kp, mask, rel.R, b, h, t, s, x, bias, capped);
  if (logit == kNegInf<T>) {
    x = dp = T(0);
    return;
  }
  const T p = std::exp(logit - lse[row]);
  dp = modified_dp(g, rel.G, b, h, t, s, dp);
  T f = 1;
  if (g.dropout_p > 0.0f) {
    f = dropout_keep(g.dropout_seed.value(), dropout_row(g, b, h, t) + s, g.dropout_p) ? dropout_scale<T>(g.dropout_p)
                                                                                       : T(0);
  }
  const T dlogit = p * (dp * f - D[row]);
  const T ds = modified_score_grad(dlogit, capped, T(g.scale), T(m.softcap));
  if (tables) {
    if (dt5) dt5[bucket] += dlogit;
    if (rel.dR) rel.dR[row * m.rel_width() + col] += ds;
  }
  x = p * f;
  dp = ds;
}

/// tanh of every lane, from exp_vec: sign(y) (1 - e) / (1 + e) with e = exp(-2 |y|) (absolute error a few ulp of 1).
inline Vec<float> tanh_vec(Vec<float> y) {
  const Vec<float> a = y < 0.0f ? -y : y;
  const Vec<float> e = exp_vec(a * -2.0f);
  const Vec<float> t = (1.0f - e) / (1.0f + e);
  return y < 0.0f ? -t : t;
}
inline Vec<double> tanh_vec(Vec<double> y) {
  for (int64_t i = 0; i < kLanes<double>; ++i) y[i] = std::tanh(y[i]);
  return y;
}

/// The biases after the cap (ALiBi, T5) of every head and distance d in [-(S - 1), T - 1], computed once per kernel
/// call, in both lane orders: fwd (d growing along a row: query-major rows) and rev (d falling: key-major rows),
/// with kCols zeros of slack at both ends for padded lanes; T5's buckets likewise, for its gradient.
template <class T>
struct PositionBias {
  bool on = false;
  int64_t dmin = 0, dmax = 0, stride = 0;
  std::vector<T> fwd, rev;                      // (NH, stride)
  std::vector<int32_t> bucket_fwd, bucket_rev;  // (stride)

  explicit PositionBias(const AttentionGeom& g) : on(has_position_bias(g.mods)) {
    if (!on) return;
    dmin = -(g.S - 1), dmax = g.T - 1, stride = dmax - dmin + 1 + 2 * kCols<T>;
    fwd.assign(size_t(g.NH * stride), T(0));
    rev.assign(size_t(g.NH * stride), T(0));
    for (int64_t h = 0; h < g.NH; ++h) {
      for (int64_t d = dmin; d <= dmax; ++d) {
        const T x = position_bias<T>(g, h, d);
        fwd[size_t(h * stride + kCols<T> + d - dmin)] = x;
        rev[size_t(h * stride + kCols<T> + dmax - d)] = x;
      }
    }
    if (!g.mods.t5_bias) return;
    bucket_fwd.assign(size_t(stride), 0);
    bucket_rev.assign(size_t(stride), 0);
    for (int64_t d = dmin; d <= dmax; ++d) {
      const int32_t k = t5_bucket(d, g.mods.t5_buckets, g.mods.t5_max_distance, g.mods.t5_bidirectional);
      bucket_fwd[size_t(kCols<T> + d - dmin)] = k;
      bucket_rev[size_t(kCols<T> + dmax - d)] = k;
    }
  }
  /// Offsets of a row whose lane 0 has distance d: in fwd and bucket_fwd (d grows), rev and bucket_rev (d falls).
  int64_t at_fwd(int64_t d) const { return kCols<T> + d - dmin; }
  int64_t at_rev(int64_t d) const { return kCols<T> + dmax - d; }
};

/// Per-thread scratch of ModTile: the capped scores of a tile, which the soft-cap's gradient needs; for Shaw's
/// tables in key-major tiles, the first and last (clipped) columns of R, G and dR for the tile's queries, contiguous.
template <class T>
struct ModScratch {
  std::vector<T> capped;
  std::vector<T> R_ends, G_ends, dR_ends;  // (2, nr): column 0, then column 2m
  std::vector<T> pbar_ends;                // add_rel_probs's sums of the clipped lanes, likewise
};

/// The lanes [lo, hi) of a row split by Shaw's clipped column, lane l at distance d0 + l (query-major rows: lanes are
/// keys) or d0 - l (key-major: lanes are queries). [lo, a) and [b, hi) are clipped (query-major: to column 0, then
/// 2m; key-major: 2m, then 0), [a, b) is the band |d| < m, lane l in column d + m.
struct RelSplit {
  int64_t a, b;
};
inline RelSplit rel_split(int64_t lo, int64_t hi, int64_t d0, bool key_major, int64_t m) {
  if (!key_major) {
    const int64_t a = std::clamp(-m - d0 + 1, lo, hi);
    return {a, std::clamp(m - d0, a, hi)};
  }
  const int64_t a = std::clamp(d0 - m + 1, lo, hi);
  return {a, std::clamp(d0 + m, a, hi)};
}

/// The first and last columns of `table`'s rows first_row .. first_row + n - 1, as two contiguous runs of n.
template <class T>
void table_ends(std::vector<T>& ends, const T* table, int64_t first_row, int64_t n, int64_t W) {
  ends.resize(size_t(2 * n));
  for (int64_t i = 0; i < n; ++i) {
    ends[size_t(i)] = table[(first_row + i) * W];
    ends[size_t(n + i)] = table[(first_row + i) * W + W - 1];
  }
}

/// The modifiers over a tile of queries [t0, t0 + nr) and keys [s0, s0 + nc) of head (b, h), row by row with the
/// row's lanes contiguous: key-major tiles (row j = key s0 + j, lanes = queries) and query-major ones (row i = query
/// t0 + i, lanes = keys). Element (i, j) has distance d = c0 + j - i. The biases and T5 buckets depend on d only, so
/// they are computed once per tile, in both lane orders: bias_fwd[d - dmin] (query-major rows, d grows along the
/// lanes) and bias_rev[dmax - d] (key-major rows, d falls). Scaling, the soft-cap and the biases run on whole
/// vectors; Shaw's R, G and dR by runs of lanes (the lanes clipped to the first or last column, then the band
/// |d| < m); the mask, documents, padding and T5's gradient per visible element.
template <class T>
class ModTile {
 public:
  ModTile(const AttentionGeom& g, int64_t b, int64_t h, int64_t t0, int64_t nr, int64_t s0, int64_t nc,
          const RelRows<T>& rel, const PositionBias<T>& pb, ModScratch<T>& sc)
      : g_(g),
        m_(g.mods),
        b_(b),
        h_(h),
        t0_(t0),
        nr_(nr),
        s0_(s0),
        nc_(nc),
        c0_(s0 - t0 - (g.S - g.T)),
        rel_(rel),
        pb_(pb),
        sc_(sc) {}

  /// Key-major raw products st (row stride ld, lanes [0, lanes) computed) -> logits; hidden and padding lanes -inf.
  void logits_key_major(T* st, int64_t ld, int64_t lanes, const T* mask, const uint8_t* kp) {
    if (rel_.R) table_ends(sc_.R_ends, rel_.R, head_row(g_, b_, h_, t0_), nr_, m_.rel_width());
    for (int64_t j = 0; j < nc_; ++j) key_row(j, st + j * ld, lanes, mask, kp, capped_row(j, ld));
  }

  /// Key-major raw products st and dO.v products dpt -> Pd and dS (the raw product's gradient), with the tables'
  /// gradients: dR's rows, and with T5 the logits' gradients summed per distance into by_distance (laid out as
  /// PositionBias::rev; the caller folds it into buckets). lse_t and D_t per query lane (+inf for a query that sees
  /// nothing).
  void probs_and_ds_key_major(T* st, T* dpt, int64_t ld, int64_t lanes, const T* lse_t, const T* D_t, const T* mask,
                              const uint8_t* kp, T* by_distance) {
    const int64_t W = m_.rel_width(), row0 = head_row(g_, b_, h_, t0_);
    if (rel_.R) table_ends(sc_.R_ends, rel_.R, row0, nr_, W);
    if (rel_.G) table_ends(sc_.G_ends, rel_.G, row0, nr_, W);
    if (rel_.dR) sc_.dR_ends.assign(size_t(2 * nr_), T(0));
    for (int64_t j = 0; j < nc_; ++j) {
      T* capped = capped_row(j, ld);
      const Span v = key_row(j, st + j * ld, lanes, mask, kp, capped);
      backward_row(st + j * ld, dpt + j * ld, lanes, v, lse_t, D_t, true, capped, true,
                   by_distance ? by_distance + pb_.at_rev(c0_ + j) : nullptr, [&](int64_t l) {
                     return Where{t0_ + l, s0_ + j};
                   });
    }
    for (int64_t i = 0; i < nr_ && rel_.dR; ++i) {  // the clipped lanes' sums into the first and last columns
      rel_.dR[(row0 + i) * W] += sc_.dR_ends[size_t(i)];
      rel_.dR[(row0 + i) * W + W - 1] += sc_.dR_ends[size_t(nr_ + i)];
    }
  }

  /// Query-major raw products s and dp (row stride ld, lanes [0, lanes)) -> Pd and dS; with `tables`, dS summed into
  /// dR's rows of the tile's queries too (the one-pass backward, whose task owns them); no T5 gradient.
  void probs_and_ds_query_major(T* s, T* dp, int64_t ld, int64_t lanes, const T* lse, const T* D, const T* mask,
                                const uint8_t* kp, bool tables) {
    for (int64_t i = 0; i < nr_; ++i) {
      const int64_t t = t0_ + i, row = head_row(g_, b_, h_, t);
      T* x = s + i * ld;
      T* d = dp + i * ld;
      if (lse[row] == kNegInf<T>) {
        std::fill(x, x + lanes, T(0));
        std::fill(d, d + lanes, T(0));
        continue;
      }
      T* capped = m_.softcap > 0 ? scratch_capped(ld) + i * ld : nullptr;
      const Span v =
          span(std::clamp<int64_t>(key_begin(g_, t) - s0_, 0, nc_), std::clamp<int64_t>(key_end(g_, t) - s0_, 0, nc_));
      auto where = [&](int64_t l) { return Where{t, s0_ + l}; };
      forward_row(x, lanes, v, pb_.on ? pb_.fwd.data() + h_ * pb_.stride + pb_.at_fwd(c0_ - i) : nullptr, mask, kp,
                  capped, false, where);
      backward_row(x, d, lanes, v, lse + row, D + row, false, capped, tables, nullptr, where);
    }
  }

 private:
  struct Where {
    int64_t t, s;
  };
  struct Span {
    int64_t lo, hi;  // visible lanes by position (causal, window): [lo, hi)
  };
  static Span span(int64_t lo, int64_t hi) { return {lo, std::max(lo, hi)}; }

  T* scratch_capped(int64_t ld) {
    const size_t need = size_t(std::max(nr_, nc_) * ld + kCols<T>);
    if (sc_.capped.size() < need) sc_.capped.resize(need);
    return sc_.capped.data();
  }
  T* capped_row(int64_t j, int64_t ld) { return m_.softcap > 0 ? scratch_capped(ld) + j * ld : nullptr; }

  /// One key-major row (key s0 + j): its visible queries, then forward_row.
  Span key_row(int64_t j, T* x, int64_t lanes, const T* mask, const uint8_t* kp, T* capped) {
    const int64_t s = s0_ + j;
    const Span v = span(std::clamp<int64_t>(query_begin(g_, s) - t0_, 0, nr_),
                        std::clamp<int64_t>(query_end(g_, s) - t0_, 0, nr_));
    const T* bias = pb_.on ? pb_.rev.data() + h_ * pb_.stride + pb_.at_rev(c0_ + j) : nullptr;
    forward_row(x, lanes, v, bias, mask, kp, capped, true, [&](int64_t l) { return Where{t0_ + l, s}; });
    return v;
  }

  /// Raw products -> logits over one row's lanes: + Shaw's R, times scale, capped (kept in `capped`), + biases,
  /// + mask; -inf outside the visible span, for padded keys and for keys of other documents.
  template <class At>
  void forward_row(T* x, int64_t lanes, Span v, const T* bias, const T* mask, const uint8_t* kp, T* capped,
                   bool key_major, At where) {
    constexpr int64_t L = kLanes<T>;
    if (rel_.R) add_by_distance(x, v, rel_.R, sc_.R_ends, key_major, where(0));
    const T scale = T(g_.scale), cap = T(m_.softcap);
    auto tanh = [](Vec<T> y) { return tanh_vec(y); };
    for (int64_t l = 0; l < lanes; l += L) {
      Vec<T> y;
      store(x + l, modified_score(load(x + l), bias ? load(bias + l) : splat(T(0)), scale, cap, tanh, y));
      if (capped) store(capped + l, y);
    }
    for (int64_t l = v.lo; l < v.hi && mask; ++l) {
      const Where w = where(l);
      x[l] += at(mask, g_.mask_stride, b_, h_, w.t)[w.s * g_.mask_stride[3]];
    }
    // Padded keys and other documents: a key-major row has one key (and lanes of queries), a query-major row lanes of
    // keys; the lanes' ids are contiguous either way.
    const Where w0 = where(0);
    const uint8_t* kp_lanes = kp ? kp + b_ * g_.S + w0.s : nullptr;
    if (kp && key_major && kp_lanes[0]) v.hi = v.lo;  // the whole row is a padded key
    for (int64_t l = v.lo; l < v.hi && kp && !key_major; ++l) x[l] = kp_lanes[l] ? kNegInf<T> : x[l];
    if (m_.q_doc) {
      const int32_t* lane_doc = key_major ? m_.q_doc + b_ * g_.T + w0.t : m_.k_doc + b_ * g_.S + w0.s;
      const int32_t row_doc = key_major ? m_.k_doc[b_ * g_.S + w0.s] : m_.q_doc[b_ * g_.T + w0.t];
      for (int64_t l = v.lo; l < v.hi; ++l) x[l] = lane_doc[l] != row_doc ? kNegInf<T> : x[l];
    }
    std::fill(x, x + std::min(v.lo, lanes), kNegInf<T>);
    std::fill(x + std::min(v.hi, lanes), x + lanes, kNegInf<T>);
  }

  /// Logits x and dO.v products dp of one row -> Pd and dS (modified_element_backward's math on whole vectors).
  /// lse and D per lane (per_lane) or one value for the row. With `tables`, the learned tables' gradients too: dR's
  /// rows (owned by the caller's task) and, with by_distance, the logits' gradients added lane by lane.
  template <class At>
  void backward_row(T* x, T* dp, int64_t lanes, Span v, const T* lse, const T* D, bool per_lane, const T* capped,
                    bool tables, T* by_distance, At where) {
    const bool key_major = per_lane;  // key-major rows have a query (its lse and D) per lane
    constexpr int64_t L = kLanes<T>;
    const T scale = T(g_.scale), cap = T(m_.softcap);
    auto lse_at = [&](int64_t l) { return per_lane ? load(lse + l) : splat(*lse); };
    auto D_at = [&](int64_t l) { return per_lane ? load(D + l) : splat(*D); };
    auto ds_of = [&](Vec<T> dlogit, int64_t l) {  // the raw product's gradient from the logit's
      return modified_score_grad(dlogit, capped ? load(capped + l) : splat(T(0)), scale, cap);
    };
    if (rel_.G) add_by_distance(dp, v, rel_.G, sc_.G_ends, key_major, where(0));
    const bool t5 = tables && by_distance;
    if (g_.dropout_p <= 0.0f && !t5) {  // the common case: one pass over whole vectors
      for (int64_t l = 0; l < lanes; l += L) {
        const Vec<T> p = exp_vec(load(x + l) - lse_at(l));
        store(x + l, p);
        store(dp + l, ds_of(p * (load(dp + l) - D_at(l)), l));
      }
    } else {
      for (int64_t l = 0; l < lanes; l += L) store(x + l, exp_vec(load(x + l) - lse_at(l)));
    }
    if (g_.dropout_p > 0.0f) {
      const T keep_scale = dropout_scale<T>(g_.dropout_p);
      for (int64_t l = v.lo; l < v.hi; ++l) {
        const Where w = where(l);
        const T f =
            dropout_keep(g_.dropout_seed.value(), dropout_row(g_, b_, h_, w.t) + w.s, g_.dropout_p) ? keep_scale : T(0);
        const T p = x[l];
        dp[l] = p * (dp[l] * f - (per_lane ? D[l] : *D));
        x[l] = p * f;
      }
    } else if (t5) {
      for (int64_t l = 0; l < lanes; l += L) store(dp + l, load(x + l) * (load(dp + l) - D_at(l)));
    }
    if (g_.dropout_p > 0.0f || t5) {  // dp holds the logits' gradients: T5's table takes them, then to dS
      std::fill(dp, dp + std::min(v.lo, lanes), T(0));  // lanes the dropout loop skipped
      std::fill(dp + std::min(v.hi, lanes), dp + lanes, T(0));
      if (t5) {  // every lane: hidden ones hold exactly 0 (p = 0)
        for (int64_t l = 0; l < lanes; l += L) store(by_distance + l, load(by_distance + l) + load(dp + l));
      }
      for (int64_t l = 0; l < lanes; l += L) store(dp + l, ds_of(load(dp + l), l));
    }
    if (tables && rel_.dR) {  // Shaw's dR: the clipped lanes summed, the band lane by lane
      const Where w0 = where(0);
      const int64_t d0 = w0.s - (w0.t + g_.S - g_.T), m = m_.max_rel, W = m_.rel_width();
      const RelSplit r = rel_split(v.lo, v.hi, d0, key_major, m);
      if (!key_major) {  // a query-major row (one pass): its own row of dR
        T* row = rel_.dR + head_row(g_, b_, h_, w0.t) * W;
        T first = 0, last = 0;
#pragma omp simd reduction(+ : first)
        for (int64_t l = v.lo; l < r.a; ++l) first += dp[l];
        for (int64_t l = r.a; l < r.b; ++l) row[d0 + l + m] += dp[l];
#pragma omp simd reduction(+ : last)
        for (int64_t l = r.b; l < v.hi; ++l) last += dp[l];
        row[0] += first;
        row[W - 1] += last;
      } else {  // key-major rows (pass 2): the clipped lanes into dR_ends, flushed by the caller
        T* last = sc_.dR_ends.data() + nr_;
        T* first = sc_.dR_ends.data();
        for (int64_t l = v.lo; l < r.a; ++l) last[l] += dp[l];
        const int64_t band = head_row(g_, b_, h_, t0_) * W + d0 + m;  // lane l: dR[band + l (W - 1)]
        for (int64_t l = r.a; l < r.b; ++l) rel_.dR[band + l * (W - 1)] += dp[l];
        for (int64_t l = r.b; l < v.hi; ++l) first[l] += dp[l];
      }
    }
    // Lanes outside the visible span (and padding lanes): exactly zero.
    std::fill(dp, dp + std::min(v.lo, lanes), T(0));
    std::fill(dp + std::min(v.hi, lanes), dp + lanes, T(0));
    std::fill(x, x + std::min(v.lo, lanes), T(0));
    std::fill(x + std::min(v.hi, lanes), x + lanes, T(0));
  }

  /// x[l] += table[(query of lane l), clipped column of lane l] over the lanes of v (Shaw's R or G gathered by
  /// distance): the clipped lanes as whole runs, then the band |d| < m. w0: lane 0's query and key. Key-major rows
  /// (lanes are the tile's queries) read the clipped columns from `ends` (table_ends of the tile's queries).
  void add_by_distance(T* x, Span v, const T* table, const std::vector<T>& ends, bool key_major, Where w0) const {
    const int64_t d0 = w0.s - (w0.t + g_.S - g_.T), m = m_.max_rel, W = m_.rel_width();
    const RelSplit r = rel_split(v.lo, v.hi, d0, key_major, m);
    if (!key_major) {  // one query: its row of the table, the band contiguous
      const T* row = table + head_row(g_, b_, h_, w0.t) * W;
      const T first = row[0], last = row[W - 1];
      for (int64_t l = v.lo; l < r.a; ++l) x[l] += first;
      for (int64_t l = r.a; l < r.b; ++l) x[l] += row[d0 + l + m];
      for (int64_t l = r.b; l < v.hi; ++l) x[l] += last;
      return;
    }
    const T* first = ends.data();
    const T* last = ends.data() + nr_;
    for (int64_t l = v.lo; l < r.a; ++l) x[l] += last[l];
    const int64_t band = head_row(g_, b_, h_, t0_) * W + d0 + m;  // lane l: table[band + l (W - 1)]
    for (int64_t l = r.a; l < r.b; ++l) x[l] += table[band + l * (W - 1)];
    for (int64_t l = r.b; l < v.hi; ++l) x[l] += first[l];
  }

  const AttentionGeom& g_;
  const ScoreMods& m_;
  int64_t b_, h_, t0_, nr_, s0_, nc_, c0_;
  const RelRows<T>& rel_;
  const PositionBias<T>& pb_;
  ModScratch<T>& sc_;
};

/// pbar (nr x (2m + 1)) += the probabilities of a key-major tile (queries [t0, t0 + nr), keys [s0, s0 + nc), row
/// stride ld) summed per clipped distance.
/// The clipped lanes of each key-major row are summed per query in `ends` (2 nr) first, the band added lane by lane.
template <class T>
void add_rel_probs(T* pbar, const T* st, int64_t ld, int64_t t0, int64_t nr, int64_t s0, int64_t nc,
                   const AttentionGeom& g, std::vector<T>& ends) {
  const int64_t W = g.mods.rel_width(), m = g.mods.max_rel;
  ends.assign(size_t(2 * nr), T(0));
  T* first = ends.data();
  T* last = ends.data() + nr;
  for (int64_t j = 0; j < nc; ++j) {
    const T* row = st + j * ld;
    const int64_t d0 = s0 + j - (t0 + g.S - g.T);  // lane i (query t0 + i): distance d0 - i
    const RelSplit r = rel_split(0, nr, d0, true, m);
    for (int64_t i = 0; i < r.a; ++i) last[i] += row[i];
    for (int64_t i = r.a; i < r.b; ++i) pbar[i * W + d0 - i + m] += row[i];
    for (int64_t i = r.b; i < nr; ++i) first[i] += row[i];
  }
  for (int64_t i = 0; i < nr; ++i) {
    pbar[i * W] += first[i];
    pbar[i * W + W - 1] += last[i];
  }
}

/// Whether any query of [t0, t0 + nr) can share a document with any key of [s0, s0 + nc): false when their ranges
/// of ids do not meet, so the tile is skipped whole (packed documents have ascending ids).
inline bool docs_may_meet(const AttentionGeom& g, int64_t b, int64_t t0, int64_t nr, int64_t s0, int64_t nc) {
  const ScoreMods& m = g.mods;
  if (!m.q_doc) return true;
  const auto [q_lo, q_hi] = std::minmax_element(m.q_doc + b * g.T + t0, m.q_doc + b * g.T + t0 + nr);
  const auto [k_lo, k_hi] = std::minmax_element(m.k_doc + b * g.S + s0, m.k_doc + b * g.S + s0 + nc);
  return !(*q_hi < *k_lo || *k_hi < *q_lo);
}

}  // namespace tinygpt::cpu::attention_detail

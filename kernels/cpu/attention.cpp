// Attention kernels: a naive reference and flash attention (forward and FlashAttention-2 backward).
//
// Flash tile products. Every product is one register-blocked micro-kernel, C (+)= A @ B with a kRows x kCols
// block of C in vector registers (6 x 16 floats in 12 AVX2 accumulators; 6 x 32 in 12 AVX-512 ones), A read
// through arbitrary strides and B by contiguous rows. Q, K, V and dO are therefore read in place through their strides;
// the only packing is a transposed copy of one operand per tile, chosen so that it is amortized over a whole task:
//   forward, parallel over (batch, head, query tile): Q^T is packed once; each key tile gives the key-major
//     score tile S^T = K Q^T (rows are keys, lanes are queries), the online softmax (running max m, running
//     sum l) runs on all query lanes at once, and O += P V reads P transposed out of S^T;
//   backward pass 1, parallel over (batch, kv head, key tile): K^T and V^T are packed once; for every head of
//     the group and every query tile that sees the key tile: S = Q K^T, dP = dO V^T (query-major),
//     P = exp(S * scale + mask - lse), dS = P * (dP - D) with D = rowsum(dO * O) precomputed,
//     dV += P^T dO, dK += dS^T Q;
//   backward pass 2, parallel over (batch, head, query tile): Q^T and dO^T are packed once; per key tile
//     S^T = K Q^T, dP^T = V dO^T (key-major), dS as above, dQ += dS K.
// Each gradient element is summed by exactly one task in a fixed order: no atomics, no per-thread copies, and
// the result does not depend on the number of threads. The price is that S and dP are computed in both
// passes (7 tile products per tile pair instead of 5). Where there are enough (batch, kv head) pairs to keep the
// threads busy (training shapes) and no score modifier, pass 1's task is a whole (batch, kv head): it then also
// owns its heads' dQ rows, sums dQ += dS K in a scratch of group x T x E, and pass 2 is skipped (5 products).
//
// Tiles: Br = Bc = 64 for head dims up to 128 (sizes from 32 to 128 tied, 64 x 64 never worse); beyond that
// 32 x 32 keeps the packed E x Br tile at 32 KiB. Causal with T <= 128: one register block (kCols: 16 with AVX2, 32
// with AVX-512), as the diagonal tiles compute their masked half too, so smaller tiles waste less on nanoGPT's CPU
// recipe (docs/RESULTS.md, "Measurements behind design decisions"). Per thread the scratch is a few tiles:
// O(Br * Bc + (Br + Bc) * (E + Ev)), no T x S buffer. Causal: key tiles entirely above the diagonal are never
// visited (forward and both backward passes); tiles crossing it are masked element by element.
//
// bf16 operands (AttentionMath::BF16, float only): every tile product goes through TileProducts, which rounds its
// operands to bf16 (Q, K, V, dO, and the P and dS tiles) and sums in f32, on the unit gemm's bf16 products use
// (AMX-BF16 tiles or AVX512-BF16 dot products; kernels/cpu/tile_bf16.h: each product packs its operands, bar bf16 rows
// that AVX512-BF16 reads in place, so the tiles are larger there, see flash_tiles), else on rounded copies for the f32
// micro-kernel. Softmax statistics, D and the outputs stay f32.
//
// exp() is a vectorized polynomial for float (see exp_vec); the naive reference uses std::exp. The building blocks
// live in attention_tiles.h (tile products, tile sizes, softmax pieces), attention_mods.h (the score modifiers'
// tiles) and attention_decode.h (the rows' store, and decoding's one query row: K and V read in place, no tiles);
// this file has the naive and flash kernels themselves.
#include <string>

#include "kernels/base.h"
#include "kernels/cpu/attention_decode.h"
#include "kernels/cpu/attention_mods.h"
#include "kernels/cpu/attention_tiles.h"
#include "kernels/cpu/cpu_kernels.h"

namespace tinygpt::cpu {

using namespace attention_detail;  // NOLINT: this file's own building blocks

// ---------------------------------------------------------------------------------------------------------------
// Naive reference.

template <class T>
void attention_naive_forward(T* out, T* weights, T* lse, const T* q, const T* k, const T* v, const T* mask,
                             const uint8_t* key_padding, const AttentionGeom& g) {
  const int64_t rows = g.B * g.NH * g.T, group = g.NH / g.NKV, W = g.mods.rel_width();
  const T scale = T(g.scale), keep_scale = dropout_scale<T>(g.dropout_p);
  const bool mods = g.mods.any();
  T* pbar = g.mods.rel_v ? static_cast<T*>(g.mods.rel_probs) : nullptr;
  if (pbar) std::fill_n(pbar, rows * W, T(0));
  RelBuffers<T> relative(g, q, nullptr, false);
  const RelRows<T> rel = relative.rows();
#pragma omp parallel if (rows * g.S * (g.E + g.Ev) >= kParallelGrain)
  {
    std::vector<T> scratch(weights ? 0 : size_t(g.S));
#pragma omp for schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t b = row / (g.NH * g.T), h = row / g.T % g.NH, t = row % g.T, kvh = h / group;
      T* p = weights ? weights + row * g.S : scratch.data();
      const T* qr = at(q, g.q_stride, b, h, t);
      const T* mr = mask ? at(mask, g.mask_stride, b, h, t) : nullptr;
      const int64_t end = causal_end(g, t);
      T mx = kNegInf<T>;
      for (int64_t s = 0; s < g.S; ++s) {
        T x = kNegInf<T>;
        if (mods) {
          T capped;
          x = modified_logit(g, key_padding, mask, rel.R, b, h, t, s, dot(qr, at(k, g.k_stride, b, kvh, s), g.E),
                             position_bias<T>(g, h, s - (t + g.S - g.T)), capped);
        } else if (s < end && !(key_padding && key_padding[b * g.S + s])) {
          x = scale * dot(qr, at(k, g.k_stride, b, kvh, s), g.E);
          if (mr) x += mr[s * g.mask_stride[3]];
        }
        p[s] = x;
        mx = std::max(mx, x);
      }
      T* o = at(out, g.o_stride, b, h, t);
      std::fill_n(o, g.Ev, T(0));
      if (mx == kNegInf<T>) {  // no visible key
        std::fill_n(p, g.S, T(0));
        lse[row] = kNegInf<T>;
        continue;
      }
      T sum = 0;
      for (int64_t s = 0; s < g.S; ++s) sum += p[s] = std::exp(p[s] - mx);
      for (int64_t s = 0; s < g.S; ++s) p[s] /= sum;
      lse[row] = mx + std::log(sum);
      const DropoutRow drop(g.dropout_seed.value(), dropout_row(g, b, h, t));
      for (int64_t s = 0; s < g.S; ++s) {
        T w = p[s];
        if (g.dropout_p > 0.0f) w = drop.keep(s, g.dropout_p) ? w * keep_scale : T(0);
        if (w != T(0)) axpy_row(o, w, at(v, g.v_stride, b, kvh, s), g.Ev);
        if (pbar) pbar[row * W + rel_column(s - (t + g.S - g.T), g.mods.max_rel)] += w;
      }
    }
  }
  add_relative_values(out, g);
}

/// D = rowsum(dO * O) per query row (B * NH * T of them), the backward passes' correction term.
template <class T>
std::vector<T> rowsum_dout_out(const T* dout, const T* out, const AttentionGeom& g, bool parallel) {
  const int64_t rows = g.B * g.NH * g.T;
  std::vector<T> D(static_cast<size_t>(rows));
#pragma omp parallel for if (parallel)
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t b = row / (g.NH * g.T), h = row / g.T % g.NH, t = row % g.T;
    D[row] = dot(at(dout, g.o_stride, b, h, t), at(out, g.o_stride, b, h, t), g.Ev);
  }
  return D;
}

template <class T>
void attention_naive_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                              const T* lse, const T* mask, const uint8_t* key_padding, const AttentionGeom& g) {
  const int64_t rows = g.B * g.NH * g.T, group = g.NH / g.NKV;
  const T scale = T(g.scale), keep_scale = dropout_scale<T>(g.dropout_p);
  const bool parallel = rows * g.S * (g.E + g.Ev) >= kParallelGrain;
  const bool mods = g.mods.any();
  bool tables = false;  // element() also sums the tables' gradients (in the serial loop at the end only)
  RelBuffers<T> relative(g, q, dout, dq != nullptr);
  const RelRows<T> rel = relative.rows();
  const std::vector<T> D = rowsum_dout_out(dout, out, g, parallel);
  // P, dP and dS of element (b, h, t, s); false when the key is invisible to the query (or both are 0).
  auto element = [&](int64_t b, int64_t h, int64_t t, int64_t s, T& pd, T& ds) {
    const int64_t row = (b * g.NH + h) * g.T + t, kvh = h / group;
    if (mods) {
      pd = dot(at(q, g.q_stride, b, h, t), at(k, g.k_stride, b, kvh, s), g.E);
      ds = dot(at(dout, g.o_stride, b, h, t), at(v, g.v_stride, b, kvh, s), g.Ev);
      const int64_t d = s - (t + g.S - g.T);
      const int32_t bucket =
          g.mods.t5_bias ? t5_bucket(d, g.mods.t5_buckets, g.mods.t5_max_distance, g.mods.t5_bidirectional) : 0;
      T* dt5 = tables && g.mods.d_t5_bias ? static_cast<T*>(g.mods.d_t5_bias) + h * g.mods.t5_buckets : nullptr;
      modified_element_backward(g, b, h, t, s, pd, ds, position_bias<T>(g, h, d), bucket, lse, D.data(), mask,
                                key_padding, rel, tables, dt5);
      return pd != T(0) || ds != T(0);
    }
    if (lse[row] == kNegInf<T> || s >= causal_end(g, t) || (key_padding && key_padding[b * g.S + s])) return false;
    T x = scale * dot(at(q, g.q_stride, b, h, t), at(k, g.k_stride, b, kvh, s), g.E);
    if (mask) x += at(mask, g.mask_stride, b, h, t)[s * g.mask_stride[3]];
    const T p = std::exp(x - lse[row]);
    T f = 1;
    if (g.dropout_p > 0.0f)
      f = dropout_keep(g.dropout_seed.value(), dropout_row(g, b, h, t) + s, g.dropout_p) ? keep_scale : T(0);
    const T dp = dot(at(dout, g.o_stride, b, h, t), at(v, g.v_stride, b, kvh, s), g.Ev) * f;
    pd = p * f;
    ds = p * (dp - D[row]) * scale;
    return true;
  };
  if (dq) {
#pragma omp parallel for if (parallel)
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t b = row / (g.NH * g.T), h = row / g.T % g.NH, t = row % g.T, kvh = h / group;
      T* dqr = at(dq, g.q_stride, b, h, t);
      for (int64_t s = 0; s < g.S; ++s) {
        T pd, ds;
        if (element(b, h, t, s, pd, ds)) axpy_row(dqr, ds, at(k, g.k_stride, b, kvh, s), g.E);
      }
    }
  }
  if (dk || dv) {
    // One task per (batch, kv head, key): it owns dk and dv of that key and sums over the group's heads.
    const int64_t keys = g.B * g.NKV * g.S;
#pragma omp parallel for if (parallel)
    for (int64_t key = 0; key < keys; ++key) {
      const int64_t b = key / (g.NKV * g.S), kvh = key / g.S % g.NKV, s = key % g.S;
      T* dkr = dk ? at(dk, g.k_stride, b, kvh, s) : nullptr;
      T* dvr = dv ? at(dv, g.v_stride, b, kvh, s) : nullptr;
      for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        for (int64_t t = 0; t < g.T; ++t) {
          T pd, ds;
          if (!element(b, h, t, s, pd, ds)) continue;
          if (dvr) axpy_row(dvr, pd, at(dout, g.o_stride, b, h, t), g.Ev);
          if (dkr) axpy_row(dkr, ds, at(q, g.q_stride, b, h, t), g.E);
        }
      }
    }
  }
  if (rel.dR || g.mods.d_t5_bias) {  // dR and the T5 table's gradient, one element at a time
    tables = true;
    for (int64_t row = 0; row < rows; ++row) {
      for (int64_t s = 0; s < g.S; ++s) {
        T pd, ds;
        element(row / (g.NH * g.T), row / g.T % g.NH, row % g.T, s, pd, ds);
      }
    }
  }
  relative.finish(dq, dout, q, g);
}

// ---------------------------------------------------------------------------------------------------------------
// Flash attention.

namespace {

/// Additive masks and the tables of relative positions (Shaw's) and of T5's bias are read and written in the kernels'
/// math type: bf16 storage takes none of them (its op sends such calls through f32).
template <class T, class S>
void check_storage_call(const T* mask, const AttentionGeom& g, const char* who) {
  if constexpr (!std::is_same_v<S, T>) {
    const ScoreMods& m = g.mods;
    if (mask != nullptr || m.rel_k != nullptr || m.rel_v != nullptr || m.t5_bias != nullptr || m.d_t5_bias != nullptr) {
      throw Error(std::string(who) +
                  ": bf16 storage takes no additive mask, relative positions or T5 bias "
                  "(kernels/attention.h, flash_bf16_takes)");
    }
  }
}

/// q as the relative-position buffers read it: only where it is stored in T (check_storage_call rules out the rest).
template <class T, class S>
const T* as_math(const S* x) {
  if constexpr (std::is_same_v<S, T>) {
    return x;
  } else {
    return nullptr;
  }
}

/// Dropout on a key-major tile of probabilities (row j: key s0 + j, nr query lanes): kept ones scaled, the rest 0.
template <class T>
inline void drop_key_major(T* st, int64_t Br, int64_t nr, int64_t s0, int64_t nc, const DropoutRows& drop, float p,
                           T keep_scale) {
  for (int64_t j = 0; j < nc; ++j) {
    T* row = st + j * Br;
    for (int64_t i = 0; i < nr; ++i) row[i] = drop.keep(i, s0 + j, p) ? row[i] * keep_scale : T(0);
  }
}

/// The flash forward with math type T on operands stored as S (T itself, or bf16 widened tile by tile for f32 math).
template <class T, class S>
void flash_forward(S* out, T* lse, const S* q, const S* k, const S* v, const T* mask, const uint8_t* key_padding,
                   const AttentionGeom& g) {
  check_storage_call<T, S>(mask, g, "attention_flash_forward");
  if constexpr (std::is_same_v<T, float>) {
    if (g.T == 1 && g.dropout_p == 0.0f && !g.mods.any() && g.E % kLanes<float> == 0 && g.Ev % kLanes<float> == 0)
      return decode_forward<S>(out, lse, q, k, v, mask, key_padding, g);
  }
  const Tiles tiles = flash_tiles(g);
  const int64_t Br = tiles.Br, Bc = tiles.Bc;  // plain variables: clang 14 cannot capture structured bindings
  const int64_t group = g.NH / g.NKV, n_qtiles = ceil_div(g.T, Br), tasks = g.B * g.NH * n_qtiles;
  const T keep_scale = dropout_scale<T>(g.dropout_p);
  const bool dropout = g.dropout_p > 0.0f, mods = g.mods.any();
  T* const rel_probs = g.mods.rel_v ? static_cast<T*>(g.mods.rel_probs) : nullptr;
  const int64_t W = g.mods.rel_width();
  RelBuffers<T> relative(g, as_math<T>(q), nullptr, false);
  const RelRows<T> rel = relative.rows();
  const PositionBias<T> position(g);
#pragma omp parallel if (g.B * g.NH * g.T * g.S * (g.E + g.Ev) >= kParallelGrain)
  {
    // Per thread: Q^T tile, key-major score tile, output accumulator, and per-query m, l, exp(m_old - m_new);
    // with modifiers, the biases per distance and the probabilities per clipped distance (Pbar, unnormalized).
    std::vector<T> st(size_t(Bc * Br)), o(size_t(Br * g.Ev));
    OnlineSoftmax<T> softmax(Br);
    std::vector<T> pbar(rel_probs ? size_t(Br * W) : 0);
    DropoutRows drop(dropout ? Br : 0);  // the tile's query rows
    ModScratch<T> scratch;
    TileProducts<T, S> product(g);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      // Last query tiles first: under a causal mask they see the most keys, so the dynamic schedule ends evenly.
      const int64_t b = task / (g.NH * n_qtiles), h = task / n_qtiles % g.NH;
      const int64_t t0 = (n_qtiles - 1 - task % n_qtiles) * Br;
      const int64_t kvh = h / group, nr = std::min(Br, g.T - t0), n_pad = round_up(nr, kCols<T>);
      drop.fill(g, b, h, t0);
      product.hold_transposed(0, at(q, g.q_stride, b, h, t0), g.q_stride[2], nr, n_pad, g.E);  // Q^T
      std::fill(o.begin(), o.end(), T(0));
      softmax.reset();
      std::fill(pbar.begin(), pbar.end(), T(0));
      // Keys no query of the tile sees (past the last row's diagonal, before the first row's window) are skipped.
      const int64_t s_begin = key_begin(g, t0), s_end = key_end(g, t0 + nr - 1);
      for (int64_t s0 = s_begin; s0 < s_end; s0 += Bc) {
        const int64_t nc = std::min(Bc, s_end - s0);
        if (!docs_may_meet(g, b, t0, nr, s0, nc)) continue;
        product(st.data(), Br, Strided<S>{at(k, g.k_stride, b, kvh, s0), g.k_stride[2], 1}, 0, nc, g.E, n_pad, false,
                causal_band(g, !mods, t0, s0, false, false));
        // Without modifiers or an additive mask the scores stay unscaled here: the softmax scales them as it takes
        // their exp, one pass over the tile fewer.
        const bool fold_scale = !mods && mask == nullptr;
        if (mods) {
          ModTile<T>(g, b, h, t0, nr, s0, nc, rel, position, scratch)
              .logits_key_major(st.data(), Br, n_pad, mask, key_padding);
        } else {
          key_major_logits(st.data(), Br, nc, nr, n_pad, b, h, t0, s0, mask, key_padding, g, !fold_scale);
        }
        // Online softmax, every query lane at once; the output rows (and Pbar) rescaled to the new running max.
        softmax.update(st.data(), Br, nc, n_pad, fold_scale ? T(g.scale) : T(1));
        softmax.rescale(nr, o.data(), g.Ev, rel_probs ? pbar.data() : nullptr, W);
        if (dropout) drop_key_major(st.data(), Br, nr, s0, nc, drop, g.dropout_p, keep_scale);
        if (rel_probs) add_rel_probs(pbar.data(), st.data(), Br, t0, nr, s0, nc, g, scratch.pbar_ends);
        // O += P V, P read transposed out of the key-major tile.
        product(o.data(), g.Ev, Strided<T>{st.data(), 1, Br}, at(v, g.v_stride, b, kvh, s0), g.v_stride[2], nr, nc,
                g.Ev, true, causal_band(g, !mods, t0, s0, true, true));
      }
      store_rows(out, lse, rel_probs, softmax, o.data(), pbar.data(), W, b, h, t0, nr, g);
    }
  }
  if constexpr (std::is_same_v<S, T>) add_relative_values(out, g);
}

/// What the flash backward's passes share: the operands and gradients (stored as S), the geometry, D = rowsum(dO * O)
/// per query row, the score modifiers' tables, the tile sizes, and whether the gradients are added to (else stored:
/// they hold nothing yet).
template <class T, class S>
struct BackwardArgs {
  S *dq, *dk, *dv;
  const S *dout, *q, *k, *v;
  const T *lse, *mask;
  const uint8_t* key_padding;
  const AttentionGeom& g;
  const std::vector<T>& D;
  const RelRows<T>& rel;
  const PositionBias<T>& position;
  Tiles tiles;
  bool parallel, mods, add;
};

/// Without modifiers: a key-major tile of logits (row j: key s0 + j) made probabilities P = exp(x - lse) in place,
/// and dP beside it made dS = P * (dP - D) * scale, with dropout (drop) on dP's kept entries scaled.
template <class T>
inline void key_major_probs_and_ds(T* st, T* dpt, int64_t Br, int64_t nr, int64_t nc, int64_t n_pad, int64_t s0,
                                   const T* lse_t, const T* D_t, const DropoutRows* drop, const AttentionGeom& g,
                                   T keep_scale) {
  constexpr int64_t L = kLanes<T>;
  const T scale = T(g.scale);
  for (int64_t j = 0; j < nc; ++j) {
    T* row = st + j * Br;
    T* drow = dpt + j * Br;
    for (int64_t i = 0; i < n_pad; i += L) {
      const Vec<T> p = exp_vec(load(row + i) - load(lse_t + i));
      store(row + i, p);
      if (!drop) store(drow + i, p * (load(drow + i) - load(D_t + i)) * scale);
    }
    if (drop) {
      for (int64_t i = 0; i < nr; ++i) {
        const bool keep = drop->keep(i, s0 + j, g.dropout_p);
        drow[i] = row[i] * (drow[i] * (keep ? keep_scale : T(0)) - D_t[i]) * scale;
      }
    }
  }
}

/// A key tile no query sees: its dK and dV rows stored as zeros.
template <class T, class S>
inline void zero_key_rows(const BackwardArgs<T, S>& a, int64_t b, int64_t kvh, int64_t s0, int64_t nc) {
  const AttentionGeom& g = a.g;
  for (int64_t j = 0; j < nc; ++j) {
    if (a.dk) std::fill_n(at(a.dk, g.k_stride, b, kvh, s0 + j), g.E, S(0.0f));
    if (a.dv) std::fill_n(at(a.dv, g.v_stride, b, kvh, s0 + j), g.Ev, S(0.0f));
  }
}

/// One pass: the dQ rows of the kv head's group of query heads (`dq_acc`, head by head), added or stored.
template <class T, class S>
inline void add_group_dq(const BackwardArgs<T, S>& a, const T* dq_acc, int64_t b, int64_t kvh) {
  const AttentionGeom& g = a.g;
  const int64_t group = g.NH / g.NKV;
  for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    for (int64_t t = 0; t < g.T; ++t) {
      add_row(at(a.dq, g.q_stride, b, h, t), dq_acc + ((h - kvh * group) * g.T + t) * g.E, g.E, a.add);
    }
  }
}

/// Backward pass 1: dK, dV per (batch, kv head, key tile), query-major tiles; with `one_pass`, per (batch, kv head),
/// dQ too.
template <class T, class S>
void backward_key_tiles(const BackwardArgs<T, S>& a, bool one_pass) {
  const AttentionGeom& g = a.g;
  S *const dk = a.dk, *const dv = a.dv;
  const S *const dout = a.dout, *const q = a.q, *const k = a.k, *const v = a.v;
  const T *const lse = a.lse, *const mask = a.mask;
  const uint8_t* const key_padding = a.key_padding;
  const RelRows<T>& rel = a.rel;
  const PositionBias<T>& position = a.position;
  const int64_t Br = a.tiles.Br, Bc = a.tiles.Bc, group = g.NH / g.NKV;
  const int64_t os = g.o_stride[2], qs = g.q_stride[2], ks = g.k_stride[2], vs = g.v_stride[2];
  const bool parallel = a.parallel, mods = a.mods, add = a.add;
  const std::vector<T>& D = a.D;
  const int64_t n_ktiles = ceil_div(g.S, Bc), tasks = g.B * g.NKV * (one_pass ? 1 : n_ktiles);
#pragma omp parallel if (parallel)
  {
    std::vector<T> s(size_t(Br * Bc)), dp(size_t(Br * Bc));
    std::vector<T> dk_acc(size_t(Bc * g.E)), dv_acc(size_t(Bc * g.Ev));
    std::vector<T> dq_acc(one_pass ? size_t(group * g.T * g.E) : 0);  // one pass: the task's heads' dQ
    ModScratch<T> scratch;
    TileProducts<T, S> product(g);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t bkv = one_pass ? task : task / n_ktiles, b = bkv / g.NKV, kvh = bkv % g.NKV;
      const int64_t kt_begin = one_pass ? 0 : task % n_ktiles, kt_end = one_pass ? n_ktiles : kt_begin + 1;
      std::fill(dq_acc.begin(), dq_acc.end(), T(0));
      for (int64_t kt = kt_begin; kt < kt_end; ++kt) {
        const int64_t s0 = kt * Bc, nc = std::min(Bc, g.S - s0), nc_pad = round_up(nc, kCols<T>);
        // The queries that see any key of the tile (causal: s0 <= t + S - T; window); other query tiles are skipped.
        const int64_t t_first = query_begin(g, s0), t_end = query_end(g, s0 + nc - 1);
        if (t_first >= t_end) {
          if (!add) zero_key_rows(a, b, kvh, s0, nc);
          continue;
        }
        const S* k0 = at(k, g.k_stride, b, kvh, s0);
        product.hold_transposed(0, k0, ks, nc, nc_pad, g.E);                              // K^T
        product.hold_transposed(1, at(v, g.v_stride, b, kvh, s0), vs, nc, nc_pad, g.Ev);  // V^T
        if (one_pass) product.hold_rows(2, k0, ks, nc, g.E);                              // K
        std::fill(dk_acc.begin(), dk_acc.end(), T(0));
        std::fill(dv_acc.begin(), dv_acc.end(), T(0));
        for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
          for (int64_t t0 = t_first / Br * Br; t0 < t_end; t0 += Br) {
            const int64_t nr = std::min(Br, g.T - t0);
            if (!docs_may_meet(g, b, t0, nr, s0, nc)) continue;
            const S* q0 = at(q, g.q_stride, b, h, t0);
            const S* do0 = at(dout, g.o_stride, b, h, t0);
            const Band scores = causal_band(g, !mods, t0, s0, true, false);
            product(s.data(), Bc, Strided<S>{q0, qs, 1}, 0, nr, g.E, nc_pad, false, scores);
            product(dp.data(), Bc, Strided<S>{do0, os, 1}, 1, nr, g.Ev, nc_pad, false, scores);
            if (mods) {
              ModTile<T>(g, b, h, t0, nr, s0, nc, rel, position, scratch)
                  .probs_and_ds_query_major(s.data(), dp.data(), Bc, nc_pad, lse, D.data(), mask, key_padding,
                                            one_pass);
            } else {
              query_major_probs_and_ds(s.data(), dp.data(), Bc, nr, nc, b, h, t0, s0, lse, D.data(), mask, key_padding,
                                       g);
            }
            // dV += Pd^T dO and dK += dS^T Q: the tiles read transposed; one pass: dQ += dS K.
            const Band by_key = causal_band(g, !mods, t0, s0, false, true);
            if (dv) product(dv_acc.data(), g.Ev, Strided<T>{s.data(), 1, Bc}, do0, os, nc, nr, g.Ev, true, by_key);
            if (dk) product(dk_acc.data(), g.E, Strided<T>{dp.data(), 1, Bc}, q0, qs, nc, nr, g.E, true, by_key);
            if (one_pass) {
              T* dq_rows = dq_acc.data() + ((h - kvh * group) * g.T + t0) * g.E;
              product(dq_rows, g.E, Strided<T>{dp.data(), Bc, 1}, 2, nr, nc, g.E, true,
                      causal_band(g, !mods, t0, s0, true, true));
            }
          }
        }
        for (int64_t j = 0; j < nc; ++j) {
          if (dk) add_row(at(dk, g.k_stride, b, kvh, s0 + j), dk_acc.data() + j * g.E, g.E, add);
          if (dv) add_row(at(dv, g.v_stride, b, kvh, s0 + j), dv_acc.data() + j * g.Ev, g.Ev, add);
        }
      }
      if (one_pass) add_group_dq(a, dq_acc.data(), b, kvh);
    }
  }
}

/// Backward pass 2: dQ per (batch, head, query tile), key-major tiles; also the learned tables' gradients: a task owns
/// dR's rows of its queries and sums T5's into its own partial, added up in task order at the end.
template <class T, class S>
void backward_query_tiles(const BackwardArgs<T, S>& a) {
  const AttentionGeom& g = a.g;
  S* const dq = a.dq;
  const S *const dout = a.dout, *const q = a.q, *const k = a.k, *const v = a.v;
  const T *const lse = a.lse, *const mask = a.mask;
  const uint8_t* const key_padding = a.key_padding;
  const RelRows<T>& rel = a.rel;
  const PositionBias<T>& position = a.position;
  const int64_t Br = a.tiles.Br, Bc = a.tiles.Bc, group = g.NH / g.NKV;
  const int64_t os = g.o_stride[2], qs = g.q_stride[2], ks = g.k_stride[2], vs = g.v_stride[2];
  const bool parallel = a.parallel, mods = a.mods, add = a.add;
  const std::vector<T>& D = a.D;
  const int64_t n_qtiles = ceil_div(g.T, Br), tasks = g.B * g.NH * n_qtiles, buckets = g.mods.t5_buckets;
  std::vector<T> t5_partial(g.mods.d_t5_bias ? size_t(tasks * buckets) : 0);
  const T keep_scale = dropout_scale<T>(g.dropout_p);
  const bool dropout = g.dropout_p > 0.0f;
#pragma omp parallel if (parallel)
  {
    std::vector<T> st(size_t(Bc * Br)), dpt(size_t(Bc * Br));
    std::vector<T> dq_acc(size_t(Br * g.E)), lse_t(static_cast<size_t>(Br)), D_t(static_cast<size_t>(Br));
    std::vector<T> by_distance(g.mods.d_t5_bias ? size_t(position.stride) : 0);  // T5: logits' gradients per distance
    DropoutRows drop(dropout ? Br : 0);                                          // the tile's query rows
    ModScratch<T> scratch;
    TileProducts<T, S> product(g);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / (g.NH * n_qtiles), h = task / n_qtiles % g.NH;
      const int64_t t0 = (n_qtiles - 1 - task % n_qtiles) * Br;  // heaviest first, as in the forward pass
      const int64_t kvh = h / group, nr = std::min(Br, g.T - t0), n_pad = round_up(nr, kCols<T>);
      const int64_t s_begin = key_begin(g, t0), s_end = key_end(g, t0 + nr - 1);
      if (s_begin >= s_end) {
        for (int64_t i = 0; i < nr && dq && !add; ++i) std::fill_n(at(dq, g.q_stride, b, h, t0 + i), g.E, S(0.0f));
        continue;
      }
      drop.fill(g, b, h, t0);
      T* const dt5 = t5_partial.empty() ? nullptr : t5_partial.data() + task * buckets;
      std::fill(by_distance.begin(), by_distance.end(), T(0));
      product.hold_transposed(0, at(q, g.q_stride, b, h, t0), qs, nr, n_pad, g.E);      // Q^T
      product.hold_transposed(1, at(dout, g.o_stride, b, h, t0), os, nr, n_pad, g.Ev);  // dO^T
      for (int64_t i = 0; i < n_pad; ++i) {
        // +inf for a query with no visible key (and for padding lanes): exp(x - inf) = 0 whatever x is.
        const T L_i = i < nr ? lse[(b * g.NH + h) * g.T + t0 + i] : kNegInf<T>;
        lse_t[size_t(i)] = L_i == kNegInf<T> ? std::numeric_limits<T>::infinity() : L_i;
        D_t[size_t(i)] = i < nr ? D[size_t((b * g.NH + h) * g.T + t0 + i)] : T(0);
      }
      std::fill(dq_acc.begin(), dq_acc.end(), T(0));
      for (int64_t s0 = s_begin; s0 < s_end; s0 += Bc) {
        const int64_t nc = std::min(Bc, s_end - s0);
        if (!docs_may_meet(g, b, t0, nr, s0, nc)) continue;
        const S* k0 = at(k, g.k_stride, b, kvh, s0);
        const Band scores = causal_band(g, !mods, t0, s0, false, false);
        product(st.data(), Br, Strided<S>{k0, ks, 1}, 0, nc, g.E, n_pad, false, scores);
        product(dpt.data(), Br, Strided<S>{at(v, g.v_stride, b, kvh, s0), vs, 1}, 1, nc, g.Ev, n_pad, false, scores);
        if (mods) {
          ModTile<T>(g, b, h, t0, nr, s0, nc, rel, position, scratch)
              .probs_and_ds_key_major(st.data(), dpt.data(), Br, n_pad, lse_t.data(), D_t.data(), mask, key_padding,
                                      dt5 ? by_distance.data() : nullptr);
        } else {
          key_major_logits(st.data(), Br, nc, nr, n_pad, b, h, t0, s0, mask, key_padding, g);
          key_major_probs_and_ds(st.data(), dpt.data(), Br, nr, nc, n_pad, s0, lse_t.data(), D_t.data(),
                                 dropout ? &drop : nullptr, g, keep_scale);
        }
        // dQ += dS K, dS read transposed out of the key-major tile.
        if (dq) {
          product(dq_acc.data(), g.E, Strided<T>{dpt.data(), 1, Br}, k0, ks, nr, nc, g.E, true,
                  causal_band(g, !mods, t0, s0, true, true));
        }
      }
      for (size_t k = 0; k < by_distance.size() && dt5; ++k) dt5[position.bucket_rev[k]] += by_distance[k];
      if (!dq) continue;
      for (int64_t i = 0; i < nr; ++i) add_row(at(dq, g.q_stride, b, h, t0 + i), dq_acc.data() + i * g.E, g.E, add);
    }
  }
  for (int64_t task = 0; task < tasks && !t5_partial.empty(); ++task) {
    const int64_t h = task / n_qtiles % g.NH;
    axpy_row(static_cast<T*>(g.mods.d_t5_bias) + h * buckets, T(1), t5_partial.data() + task * buckets, buckets);
  }
}

/// The flash backward with math type T on operands and gradients stored as S (each gradient element rounded once).
template <class T, class S>
void flash_backward(S* dq, S* dk, S* dv, const S* dout, const S* q, const S* k, const S* v, const S* out, const T* lse,
                    const T* mask, const uint8_t* key_padding, const AttentionGeom& g) {
  check_storage_call<T, S>(mask, g, "attention_flash_backward");
  const Tiles tiles = flash_tiles(g);
  const int64_t rows = g.B * g.NH * g.T, group = g.NH / g.NKV;
  const bool parallel = rows * g.S * (g.E + g.Ev) >= kParallelGrain, mods = g.mods.any();
  RelBuffers<T> relative(g, as_math<T>(q), as_math<T>(dout), dq != nullptr);
  const RelRows<T> rel = relative.rows();
  const PositionBias<T> position(g);
  std::vector<T> D(static_cast<size_t>(rows));  // rowsum(dO * O), (B, NH, T)
#pragma omp parallel for if (parallel)
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t b = row / (g.NH * g.T), h = row / g.T % g.NH, t = row % g.T;
    D[size_t(row)] = dot(at(dout, g.o_stride, b, h, t), at(out, g.o_stride, b, h, t), g.Ev);
  }
  // Each gradient row is written by one task once: stored where the gradients hold nothing yet (the rows no task
  // visits zeroed by the task that skips them), else added.
  const bool add = !g.grads_unwritten;

  // One pass instead of two where each (batch, kv head) can be a task of its own: the task then owns its heads' dQ
  // rows too and sums dQ += dS K from pass 1's dS tiles, so pass 2's recomputation of S and dP (and their exp) goes
  // away. Taken when there are tasks enough to share among threads (a fixed count, not the thread count: the
  // result must not depend on it), the heads' dQ fits a thread's scratch, and no score modifier needs pass 2 (T5's
  // table gradient, summed per distance in key-major tiles; Shaw's dR rows are the task's own, summed in pass 1).
  constexpr int64_t kOnePassTasks = 32;
  const bool one_pass =
      dq != nullptr && !g.mods.d_t5_bias && g.B * g.NKV >= kOnePassTasks && group * g.T * g.E <= (int64_t(1) << 20);
  const BackwardArgs<T, S> args{dq,          dk, dv, dout, q,        k,     v,        lse,  mask,
                                key_padding, g,  D,  rel,  position, tiles, parallel, mods, add};
  if (dk || dv || one_pass) backward_key_tiles(args, one_pass);
  if (!one_pass && (dq || rel.dR || g.mods.d_t5_bias)) backward_query_tiles(args);
  if constexpr (std::is_same_v<S, T>) relative.finish(dq, dout, q, g);
}

}  // namespace

template <class T>
void attention_flash_forward(T* out, T* lse, const T* q, const T* k, const T* v, const T* mask,
                             const uint8_t* key_padding, const AttentionGeom& g) {
  flash_forward<T, T>(out, lse, q, k, v, mask, key_padding, g);
}

template <class T>
void attention_flash_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                              const T* lse, const T* mask, const uint8_t* key_padding, const AttentionGeom& g) {
  flash_backward<T, T>(dq, dk, dv, dout, q, k, v, out, lse, mask, key_padding, g);
}

// bf16 storage: the f32 kernels with bf16 operands (AttentionMath::BF16), each tile widened where it is used.
void attention_flash_forward_bf16(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                                  const AttentionGeom& g) {
  AttentionGeom f = g;
  f.math = AttentionMath::BF16;
  flash_forward<float, bf16>(out, lse, q, k, v, nullptr, nullptr, f);
}

void attention_flash_backward_bf16(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k,
                                   const bf16* v, const bf16* out, const float* lse, const AttentionGeom& g) {
  AttentionGeom f = g;
  f.math = AttentionMath::BF16;
  flash_backward<float, bf16>(dq, dk, dv, dout, q, k, v, out, lse, nullptr, nullptr, f);
}

// The storage types kernels/kernel_list.h lists for each kernel.
TINYGPT_INSTANTIATE_F32_F64(attention_naive_forward)
TINYGPT_INSTANTIATE_F32_F64(attention_naive_backward)
TINYGPT_INSTANTIATE_F32_F64(attention_flash_forward)
TINYGPT_INSTANTIATE_F32_F64(attention_flash_backward)

}  // namespace tinygpt::cpu

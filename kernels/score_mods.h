// Score modifiers of flash attention, FlexAttention style: each changes the logit of (query t, key s) before the
// softmax, inside the kernels, never through a materialized T x S bias. They travel with the call in
// AttentionGeom::mods (plain data and pointers, as FlashAttention's params) and compose with causal, padding, the
// additive mask, dropout and grouped-query heads.
//
// Positions: query t sits at position tq = t + S - T (bottom-right aligned, as the causal mask), key s at s, and
// d = s - tq is the key's distance from the query (negative in the past). The logit of (t, s) is
//
//   x      = scale * q_t . (k_s + A_K[rel(d)])                       raw product plus Shaw's relative key term
//   x      = cap * tanh(x / cap)                                     soft-capping, when cap > 0
//   logit  = x + alibi_h(d) + t5[h, bucket(d)] + mask[t, s]          biases, after the cap (as Gemma 2 and T5)
//   logit  = -inf where a mask hides the key: causal, padding, window (|d| >= W), document (ids differ)
//
// and Shaw's relative values add sum_s P[t, s] A_V[rel(d)] to the output. No (T, S, E) tensor is ever built: the
// kernels compute R = Q A_K^T (T x (2m + 1) per head) and gather it by diagonal; the output's term is Pbar A_V
// with Pbar[t, c] the probabilities summed per clipped distance c = rel(d). In the backward the raw-product
// gradients summed per clipped distance give dR, then dQ += dR A_K and dA_K += dR^T Q; on the value side
// dP[t, s] gains dO_t . A_V[rel(d)] and dA_V += Pbar^T dO.
//
// The kernels use the modifiers through these pieces only, so a new modifier adds its case to them and to
// ScoreMods, never to the tiling code:
//   key_begin / key_end, query_begin / query_end   (kernels/scalar_math.h) the key (query) range a query (key) can
//                                   see by position: tiles outside are skipped (a window costs O(T W), not O(T S));
//   mods_visible                    (kernels/scalar_math.h) whether a modifier hides one (t, s);
//   docs_may_meet                   whole-tile skipping by data (documents; kernels/cpu/attention.cpp);
//   the per-element math            written once in kernels/scalar_math.h: modified_score (scale, cap, biases) and
//                                   its gradient for scalars and the CPU's vectors, modified_logit and modified_dp
//                                   (Shaw's rows, masks) for one element; the CPU's naive kernels, its ModTile (a
//                                   row of vectors at a time, kernels/cpu/attention_mods.h) and the GPU's
//                                   score_logit / score_dp / score_ds (kernels/cuda/attention_common.cuh) call them.
// To add one: a field in ScoreModSettings (its range in check_score_mods, here), its term in the per-element forward
// and its derivative in the backward (and a range in key_begin/key_end if it hides keys), and as a model option a
// GPTConfig field with its row in nn::score_modifiers (nn/gpt.h); docs/DESIGN.md walks through it.
#pragma once

#include <cmath>
#include <cstdint>

#include "host_device.h"
#ifndef __CUDACC__
#include <fmt/format.h>

#include <string_view>

#include "base.h"
#endif

namespace tinygpt {

/// The score modifiers' settings: the one struct that carries them from the model's config (nn::GPTConfig::score_mods)
/// through the layer (nn::MultiHeadAttentionConfig::mods) and the op (ScoreModOptions) to the kernels (ScoreMods),
/// checked by one function (check_score_mods, below).
struct ScoreModSettings {
  int64_t window = 0;      // > 0: keys with |d| < window only (with causal: the last `window` keys)
  double softcap = 0;      // > 0: x -> cap * tanh(x / cap)
  bool alibi = false;      // + alibi_slope(h, NH) * -|d|
  int32_t t5_buckets = 0;  // > 0: T5's learned bias per head and log-spaced distance bucket
  int32_t t5_max_distance = 128;
  bool t5_bidirectional = false;
  int64_t max_rel = 0;  // m > 0: Shaw's relative positions, distances clipped to [-m, m]
};

/// Whether a call has any score modifier: a setting that changes the logit (window, softcap, alibi) or data (the
/// documents, T5's table, Shaw's tables). The one definition: the kernels' ScoreMods and the op's ScoreModOptions
/// (autograd/attention.h) both ask it.
TINYGPT_HOST_DEVICE inline bool any_score_mod(const ScoreModSettings& s, bool docs, bool t5_table, bool rel_tables) {
  return s.window > 0 || s.softcap > 0 || s.alibi || docs || t5_table || rel_tables;
}

#ifndef __CUDACC__  // host code: the CUDA sources are C++17 and need no check of their own
/// Throws an Error naming the first setting out of range (window, softcap, T5's buckets and max distance, max_rel),
/// its message starting with `who`. The one check of the settings: the model's config, the layer and the op call it.
inline void check_score_mods(const ScoreModSettings& s, std::string_view who) {
  if (s.window < 0) throw Error(fmt::format("{}: window must be >= 0 (0: none), got {}", who, s.window));
  if (!(s.softcap >= 0.0) || !std::isfinite(s.softcap)) {
    throw Error(fmt::format("{}: softcap must be a finite number >= 0 (0: none), got {}", who, s.softcap));
  }
  constexpr int64_t kMaxTable = int64_t(1) << 20;  // rows of a learned table: far beyond any use, far below overflow
  if (s.max_rel < 0 || s.max_rel > kMaxTable) {
    throw Error(fmt::format("{}: max_rel (Shaw's relative positions) must be in [0, {}] (0: off), got {}", who,
                            kMaxTable, s.max_rel));
  }
  if (s.t5_buckets < 0 || s.t5_buckets > kMaxTable) {
    throw Error(fmt::format("{}: t5_buckets must be in [0, {}] (0: no T5 bias), got {}", who, kMaxTable, s.t5_buckets));
  }
  if (s.t5_buckets > 0) {
    const int64_t exact = (s.t5_bidirectional ? s.t5_buckets / 2 : s.t5_buckets) / 2;
    if (exact < 1 || s.t5_max_distance <= exact) {
      throw Error(
          fmt::format("{}: T5 bias needs at least {} t5_buckets and a t5_max_distance above the exact half "
                      "({}); got {} buckets, max distance {}",
                      who, s.t5_bidirectional ? 4 : 2, exact, s.t5_buckets, s.t5_max_distance));
    }
  }
}
#endif

/// The settings with the kernels' data: document ids, the learned tables (sized by t5_buckets and max_rel) and
/// their gradients.
struct ScoreMods : ScoreModSettings {
  // Masks by data.
  const int32_t* q_doc = nullptr;  // (B, T) document id of each query; with k_doc, a query sees its document only
  const int32_t* k_doc = nullptr;  // (B, S) document id of each key
  // Tables of the logit's terms.
  const void* t5_bias = nullptr;  // (NH, t5_buckets) learned bias of each head and bucket, element type of q
  const void* rel_k = nullptr;    // A_K (2m + 1, E): the raw product gains q_t . A_K[rel(d)] (may be null)
  const void* rel_v = nullptr;    // A_V (2m + 1, Ev): the output gains sum_s P[t, s] A_V[rel(d)] (may be null)
  void* rel_probs = nullptr;      // with rel_v: Pbar (B, NH, T, 2m + 1), the (dropped) probabilities summed per
                                  // clipped distance; written by the forward, read by the backward
  // Gradients of the learned tables (backward; any may be null): += the tables' gradients.
  void* d_rel_k = nullptr;    // (2m + 1, E)
  void* d_rel_v = nullptr;    // (2m + 1, Ev)
  void* d_t5_bias = nullptr;  // (NH, t5_buckets)
  // Set by the GPU launchers for their own kernels (callers leave them null): R and G rows, (B, NH, T, 2m + 1).
  const float* gpu_R = nullptr;
  const float* gpu_G = nullptr;

  TINYGPT_HOST_DEVICE bool any() const {
    return any_score_mod(*this, q_doc != nullptr, t5_bias != nullptr, rel_k != nullptr || rel_v != nullptr);
  }
  TINYGPT_HOST_DEVICE int64_t rel_width() const { return 2 * max_rel + 1; }
};

/// ALiBi's slope of head h of n (Press et al.): for n a power of two the geometric sequence 2^(-8 (h + 1) / n);
/// otherwise the slopes of the power of two p below n, then every other slope of 2p for the remaining heads.
TINYGPT_HOST_DEVICE inline double alibi_slope(int64_t h, int64_t n) {
  int64_t p = 1;
  while (2 * p <= n) p *= 2;
  if (h < p) return exp2(-8.0 * double(h + 1) / double(p));
  return exp2(-8.0 * double(2 * (h - p) + 1) / double(2 * p));
}

/// T5's bucket of distance d = key position - query position (Raffel et al.; Hugging Face's
/// _relative_position_bucket): half the buckets exact, the rest log-spaced up to max_distance; bidirectional
/// splits the buckets between the past and the future, otherwise every future key shares bucket 0.
TINYGPT_HOST_DEVICE inline int32_t t5_bucket(int64_t d, int32_t buckets, int32_t max_distance, bool bidirectional) {
  int32_t ret = 0;
  int64_t n;
  if (bidirectional) {
    buckets /= 2;
    if (d > 0) ret += buckets;
    n = d < 0 ? -d : d;
  } else {
    n = d < 0 ? -d : 0;
  }
  const int32_t max_exact = buckets / 2;
  if (n < max_exact) return ret + int32_t(n);
  // In float, as the reference computes it, so the buckets agree at their edges.
  const float denominator = float(::log(double(max_distance) / double(max_exact)));
  const int32_t v = max_exact + int32_t(logf(float(n) / float(max_exact)) / denominator * float(buckets - max_exact));
  return ret + (v < buckets - 1 ? v : buckets - 1);
}

/// Column of distance d in Shaw's tables: clip(d, -m, m) + m.
TINYGPT_HOST_DEVICE inline int64_t rel_column(int64_t d, int64_t m) { return (d < -m ? -m : d > m ? m : d) + m; }

}  // namespace tinygpt

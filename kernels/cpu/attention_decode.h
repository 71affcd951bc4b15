#pragma once
// The flash forward's last step for a query tile (store_rows), and its path for decoding (decode_forward): one
// query row per head, K and V read where they lie. Internal to attention.cpp.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../attention.h"
#include "../bf16.h"
#include "../scalar_math.h"
#include "attention_mods.h"
#include "attention_tiles.h"
#include "bf16_rows.h"

namespace tinygpt::cpu::attention_detail {

/// The flash forward's last step for a query tile: each row's output (o / l, rounded once as stored), its lse, and
/// with relative values its probabilities per clipped distance (Pbar / l); a row that saw no key gets 0 and -inf.
template <class T, class S>
inline void store_rows(S* out, T* lse, T* rel_probs, const OnlineSoftmax<T>& softmax, const T* o, const T* pbar,
                       int64_t W, int64_t b, int64_t h, int64_t t0, int64_t nr, const AttentionGeom& g) {
  for (int64_t i = 0; i < nr; ++i) {
    S* orow = at(out, g.o_stride, b, h, t0 + i);
    T& lse_i = lse[(b * g.NH + h) * g.T + t0 + i];
    const T l_i = softmax.l[size_t(i)];
    if (l_i > T(0)) {
      const T inv = T(1) / l_i;
      const T* acc = o + i * g.Ev;
      if constexpr (std::is_same_v<S, T>) {
        for (int64_t e = 0; e < g.Ev; ++e) orow[e] = acc[e] * inv;
      } else {  // scaled and rounded once, as the row is stored
        round_scaled(orow, acc, inv, g.Ev);
      }
      lse_i = softmax.m[size_t(i)] + std::log(l_i);
      if (rel_probs) {
        for (int64_t c = 0; c < W; ++c) rel_probs[head_row(g, b, h, t0 + i) * W + c] = pbar[i * W + c] * inv;
      }
    } else {
      std::fill_n(orow, g.Ev, S(0.0f));
      lse_i = kNegInf<T>;
      if (rel_probs) std::fill_n(rel_probs + head_row(g, b, h, t0 + i) * W, W, T(0));
    }
  }
}

/// Lanes [0, kLanes) of x stored as S, as an operand: widened from bf16, or f32 rounded to bf16 where `round` (as
/// round_bf16: nearest, ties to even, NaN quieted), written on vectors: a loop of round_bf16 over the lanes was not
/// vectorized, and made decoding's attention 3 to 4 times slower.
template <class S>
inline Vec<float> operand_lanes(const S* x, bool round) {
  typedef uint32_t VU __attribute__((vector_size(kVecBytes)));
  Vec<float> v;
  if constexpr (std::is_same_v<S, float>) {
    v = load(x);
    if (!round) return v;
  } else {
    for (int64_t l = 0; l < kLanes<float>; ++l) v[l] = float(x[l]);
    return v;
  }
  VU u;
  std::memcpy(&u, &v, sizeof u);
  const VU rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u, nan = (u & 0xffff0000u) | 0x00400000u;
  u = (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
  std::memcpy(&v, &u, sizeof v);
  return v;
}

/// Decoding: one query row per head (T == 1), f32 math, no dropout or score modifier. The row's logits over the keys
/// it sees, their softmax and the values they weight, K and V read where they lie: the tile products would pack the
/// whole cache for a single row, as much work as the products. BF16 math rounds q, k, v and the probabilities to
/// bf16, as the tile products do; the sums are f32. Head dims a multiple of the vector width (else the tiles).
template <class S>
void decode_forward(S* out, float* lse, const S* q, const S* k, const S* v, const float* mask,
                    const uint8_t* key_padding, const AttentionGeom& g) {
  constexpr int64_t L = kLanes<float>;
  const bool round = g.math == AttentionMath::BF16;
  const int64_t group = g.NH / g.NKV, s0 = key_begin(g, 0), n = std::max<int64_t>(key_end(g, 0) - s0, 0);
#pragma omp parallel if (g.B * g.NH * g.S * (g.E + g.Ev) >= kParallelGrain)
  {
    std::vector<Vec<float>> qrow(size_t(g.E / L)), o(size_t(g.Ev / L));
    std::vector<float> p(size_t(round_up(n, L)));
    OnlineSoftmax<float> softmax(1);
#pragma omp for schedule(static)
    for (int64_t task = 0; task < g.B * g.NH; ++task) {
      const int64_t b = task / g.NH, h = task % g.NH, kvh = h / group;
      const S* qs = at(q, g.q_stride, b, h, 0);
      for (int64_t e = 0; e < g.E; e += L) qrow[size_t(e / L)] = operand_lanes(qs + e, round);
      for (int64_t j = 0; j < n; ++j) {
        const S* kr = at(k, g.k_stride, b, kvh, s0 + j);
        Vec<float> dot{};
        for (int64_t e = 0; e < g.E; e += L) dot += qrow[size_t(e / L)] * operand_lanes(kr + e, round);
        p[size_t(j)] = hsum<float>(dot);
      }
      std::fill(p.begin() + n, p.end(), kNegInf<float>);
      key_major_logits(p.data(), 1, n, 1, 1, b, h, 0, s0, mask, key_padding, g);
      softmax.reset();
      std::fill(o.begin(), o.end(), Vec<float>{});
      const float m = *std::max_element(p.begin(), p.end());
      if (m != kNegInf<float>) {
        Vec<float> sums{};
        for (int64_t j = 0; j < n; j += L) {
          const Vec<float> e = exp_vec(load(p.data() + j) - m);  // masked keys: exactly 0
          store(p.data() + j, e);
          sums += e;
        }
        for (int64_t j = 0; j < n; ++j) {
          const float pj = round ? round_bf16(p[size_t(j)]) : p[size_t(j)];
          if (pj == 0.0f) continue;
          const S* vr = at(v, g.v_stride, b, kvh, s0 + j);
          for (int64_t e = 0; e < g.Ev; e += L) o[size_t(e / L)] += pj * operand_lanes(vr + e, round);
        }
        softmax.m[0] = m;
        softmax.l[0] = hsum<float>(sums);
      }
      store_rows<float, S>(out, lse, nullptr, softmax, reinterpret_cast<const float*>(o.data()), nullptr, 0, b, h, 0, 1,
                           g);
    }
  }
}

}  // namespace tinygpt::cpu::attention_detail

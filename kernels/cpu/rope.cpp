// Rotary position embeddings (RoPE), half-split pairing as GPT-NeoX and LLaMA (Hugging Face layout):
// feature i is rotated with feature i + E/2 by angle pos * inv_freq(i) (kernels/rope_freqs.h).
#include <array>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/cpu/bf16_rows.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/rope_freqs.h"

namespace tinygpt::cpu {
namespace {

/// The (cos, sin) of sign * angle of every (position, pair) of a call: pos0 + l for l < L, E / 2 pairs. Computed
/// once per call, not once per head and batch row (pow, cos and sin in double cost ~100 ns a pair: nanoGPT's CPU
/// recipe with --rope spent a third of its step on them), and kept for the next call with the same positions: every
/// layer's q and k of a step share one table (SmolLM2's 30 layers recomputed it 60 times a step, 100 ms). One table
/// per direction (sign), per calling thread.
template <class T>
const std::vector<T>& rope_table(int64_t L, int64_t E, int64_t pos0, const RopeFreqs& freqs, double sign,
                                 bool parallel) {
  struct Kept {
    int64_t L = -1, E = -1, pos0 = -1;
    RopeFreqs freqs;
    std::vector<T> cs;
  };
  thread_local std::array<Kept, 2> kept;
  Kept& k = kept[sign < 0 ? 1 : 0];
  if (k.L == L && k.E == E && k.pos0 == pos0 && k.freqs.base == freqs.base && k.freqs.scaling == freqs.scaling) {
    return k.cs;
  }
  const int64_t half = E / 2;
  k.L = -1;  // invalid until filled
  k.cs.resize(size_t(2 * L * half));
  T* cs = k.cs.data();
#pragma omp parallel for if (parallel && L * half >= 1024)
  for (int64_t l = 0; l < L; ++l) {
    const double pos = double(pos0 + l);
    for (int64_t i = 0; i < half; ++i) {
      const double angle = sign * pos * rope_inv_freq(freqs, i, E);
      cs[2 * (l * half + i)] = T(std::cos(angle));
      cs[2 * (l * half + i) + 1] = T(std::sin(angle));
    }
  }
  k.L = L, k.E = E, k.pos0 = pos0, k.freqs = freqs;
  return k.cs;
}

/// Row y = R x of one head (E features, the half-split pairs), cs its (cos, sin) pairs; += into y when accumulating.
template <class C>
inline void rotate_row(C* y, const C* x, const C* cs, int64_t half, bool accumulate) {
  for (int64_t i = 0; i < half; ++i) {
    const C c = cs[2 * i], s = cs[2 * i + 1];
    const C a = x[i], b = x[i + half];
    const C ra = a * c - b * s, rb = a * s + b * c;
    y[i] = accumulate ? y[i] + ra : ra;
    y[i + half] = accumulate ? y[i + half] + rb : rb;
  }
}

/// out = R(sign * theta) inp for the first n_rot heads of every position; the other heads are copied
/// (forward) or passed through (backward, accumulating). bf16 storage: each head's row widened, rotated in f32 (the
/// f32 kernel's arithmetic) and rounded once, the sum with what out held (backward) in f32.
template <class T>
void rotate(T* out, const T* inp, int64_t B, int64_t L, int64_t NH, int64_t E, int64_t n_rot, int64_t pos0,
            const RopeFreqs& freqs, double sign, bool accumulate) {
  using C = compute_t<T>;
  const int64_t half = E / 2;
  const bool parallel = B * L * NH * E >= kParallelGrain;
  const std::vector<C>& cs = rope_table<C>(L, E, pos0, freqs, sign, parallel);
#pragma omp parallel if (parallel)
  {
    std::vector<float> wide(std::is_same_v<T, C> ? 0 : size_t(2 * E));  // bf16: a row in, a row out
#pragma omp for
    for (int64_t bl = 0; bl < B * L; ++bl) {
      const C* cs_l = cs.data() + 2 * (bl % L) * half;
      for (int64_t h = 0; h < NH; ++h) {
        const T* x = inp + (bl * NH + h) * E;
        T* y = out + (bl * NH + h) * E;
        const C* xc;  // the row in the compute type: in place, or (bf16) widened into `wide`
        C* yc;
        if constexpr (std::is_same_v<T, C>) {
          xc = x, yc = y;
        } else {
          xc = wide.data(), yc = wide.data() + E;
          widen_range(wide.data(), x, E);
          if (accumulate) widen_range(yc, y, E);
        }
        if (h < n_rot) {
          rotate_row(yc, xc, cs_l, half, accumulate);
        } else {
          for (int64_t d = 0; d < E; ++d) yc[d] = accumulate ? yc[d] + xc[d] : xc[d];
        }
        if constexpr (!std::is_same_v<T, C>) round_range(y, yc, E);
      }
    }
  }
}

}  // namespace

template <class T>
void rope_forward(T* out, const T* inp, int64_t B, int64_t L, int64_t NH, int64_t E, int64_t n_rot, int64_t pos0,
                  RopeFreqs freqs) {
  rotate(out, inp, B, L, NH, E, n_rot, pos0, freqs, 1.0, false);
}

template <class T>
void rope_backward(T* dinp, const T* dout, int64_t B, int64_t L, int64_t NH, int64_t E, int64_t n_rot, int64_t pos0,
                   RopeFreqs freqs) {
  rotate(dinp, dout, B, L, NH, E, n_rot, pos0, freqs, -1.0, true);  // the inverse rotation is the transpose
}

// The storage types kernels/kernel_list.h lists for each kernel.
TINYGPT_INSTANTIATE_F32_F64_BF16(rope_forward)
TINYGPT_INSTANTIATE_F32_F64_BF16(rope_backward)

}  // namespace tinygpt::cpu

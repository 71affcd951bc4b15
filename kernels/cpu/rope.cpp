// Rotary position embeddings (RoPE), half-split pairing as GPT-NeoX and LLaMA (Hugging Face layout):
// feature i is rotated with feature i + E/2 by angle pos * inv_freq(i) (kernels/rope_freqs.h).
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/rope_freqs.h"

namespace tinygpt::cpu {
namespace {

/// out = R(sign * theta) inp for the first n_rot heads of every position; the other heads are copied
/// (forward) or passed through (backward, accumulating).
template <class T>
void rotate(T* out, const T* inp, int64_t B, int64_t L, int64_t NH, int64_t E, int64_t n_rot, int64_t pos0,
            const RopeFreqs& freqs, double sign, bool accumulate) {
  const int64_t half = E / 2;
  // cos and sin of every (position, pair) once per call, not once per head and batch row (pow, cos and sin in
  // double cost ~100 ns a pair: nanoGPT's CPU recipe with --rope spent a third of its step on them).
  std::vector<T> cs(size_t(2 * L * half));
  const bool parallel = B * L * NH * E >= kParallelGrain;
#pragma omp parallel for if (parallel && L * half >= 1024)
  for (int64_t l = 0; l < L; ++l) {
    const double pos = double(pos0 + l);
    for (int64_t i = 0; i < half; ++i) {
      const double angle = sign * pos * rope_inv_freq(freqs, i, E);
      cs[size_t(2 * (l * half + i))] = T(std::cos(angle));
      cs[size_t(2 * (l * half + i) + 1)] = T(std::sin(angle));
    }
  }
#pragma omp parallel for if (parallel)
  for (int64_t bl = 0; bl < B * L; ++bl) {
    const T* cs_l = cs.data() + 2 * (bl % L) * half;
    for (int64_t h = 0; h < NH; ++h) {
      const T* x = inp + (bl * NH + h) * E;
      T* y = out + (bl * NH + h) * E;
      if (h >= n_rot) {
        for (int64_t d = 0; d < E; ++d) y[d] = accumulate ? y[d] + x[d] : x[d];
        continue;
      }
      for (int64_t i = 0; i < half; ++i) {
        const T c = cs_l[2 * i], s = cs_l[2 * i + 1];
        const T a = x[i], b = x[i + half];
        const T ra = a * c - b * s, rb = a * s + b * c;
        y[i] = accumulate ? y[i] + ra : ra;
        y[i + half] = accumulate ? y[i + half] + rb : rb;
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
TINYGPT_INSTANTIATE_F32_F64(rope_forward)
TINYGPT_INSTANTIATE_F32_F64(rope_backward)

}  // namespace tinygpt::cpu

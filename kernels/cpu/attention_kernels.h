// Scaled dot-product attention on the CPU: a naive reference that materializes the scores, and flash
// attention (tiled, online softmax, no T x S buffer). Layout, masking and dropout: kernels/attention.h.
// `mask` is the additive mask (may be null), `key_padding` (B, S) nonzero ignores a key (may be null).
#pragma once

#include <cstdint>

#include "../attention.h"

namespace tinygpt::cpu {

/// out (B, NH, T, Ev) and lse (B, NH, T); weights (B, NH, T, S), contiguous, receives the softmax
/// probabilities before dropout when not null.
template <class T>
void attention_naive_forward(T* out, T* weights, T* lse, const T* q, const T* k, const T* v, const T* mask,
                             const uint8_t* key_padding, const AttentionGeom& g);
/// dq, dk, dv += gradients (any may be null; each uses the strides of its input, dout those of out).
template <class T>
void attention_naive_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                              const T* lse, const T* mask, const uint8_t* key_padding, const AttentionGeom& g);

/// Flash attention forward: saves only out (B, NH, T, Ev) and lse (B, NH, T).
template <class T>
void attention_flash_forward(T* out, T* lse, const T* q, const T* k, const T* v, const T* mask,
                             const uint8_t* key_padding, const AttentionGeom& g);
/// FlashAttention-2 backward: recomputes P tile by tile from lse; dq, dk, dv += gradients (any may be null).
/// Deterministic: every gradient element is summed by one thread in a fixed order.
template <class T>
void attention_flash_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                              const T* lse, const T* mask, const uint8_t* key_padding, const AttentionGeom& g);

}  // namespace tinygpt::cpu

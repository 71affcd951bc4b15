// Scaled dot-product attention on the CPU: a naive reference that materializes the scores, and flash
// attention (tiled, online softmax, no T x S buffer). Layout, masking and dropout: kernels/attention.h.
// `mask` is the additive mask (may be null), `key_padding` (B, S) nonzero ignores a key (may be null).
#pragma once

#include <cstdint>

#include "../attention.h"
#include "../bf16.h"

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

/// Flash forward on bf16 storage: out (bf16, strides g.o_stride) and lse (f32) of bf16 q, k, v, without an additive
/// mask, relative positions or T5 bias (any head dim, stride or alignment); the CPU twin of the GPU kernel
/// (kernels/cuda/flash_bf16.cuh) on the calls flash_bf16_takes accepts. The f32 flash kernel with bf16 operands
/// (g.math = BF16), each K, V (and Q) tile widened in the thread's scratch as it is loaded, each output row rounded once.
void attention_flash_forward_bf16(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                                  const AttentionGeom& g);
/// Its backward: dq, dk, dv (bf16, any may be null) get the gradients, stored when g.grads_unwritten, else added
/// (each sum rounded once); dout has out's strides. The f32 flash backward with bf16 operands, widening tile by tile.
void attention_flash_backward_bf16(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k,
                                   const bf16* v, const bf16* out, const float* lse, const AttentionGeom& g);

}  // namespace tinygpt::cpu

// Geometry of scaled dot-product attention, shared by the CPU and CUDA kernels.
//
// q is read as (B, NH, T, E), k as (B, NKV, S, E), v as (B, NKV, S, Ev) and the output written as
// (B, NH, T, Ev), each through explicit element strides of its first three indices (the feature index is
// contiguous), so q, k and v can be read straight out of a fused QKV projection of shape (B, T, 3, NH, E)
// and the output written as (B, T, NH, Ev), the layout the output projection wants. Gradients use the
// strides of the tensor they belong to (dq those of q, dout those of the output, and so on).
//
// Query head h reads key/value head h / (NH / NKV) (grouped-query attention; NKV == NH is plain
// multi-head, NKV == 1 multi-query).
//
// Masking, all combined: causal is aligned bottom-right (query t sees key s iff s <= t + S - T, as in
// FlashAttention, so the last query row sees every key: what incremental decoding needs); key_padding
// (B, S) nonzero means "ignore this key"; mask is an additive (B, NH, T, S) float mask read through
// mask_strides (0 along broadcast dims; -inf removes a key). A query row with no visible key produces
// zeros and zero gradients, never NaN, and its saved logsumexp is -inf.
//
// Score modifiers (kernels/score_mods.h) change the logits further and hide more keys.
//
// Dropout (p > 0) drops attention probabilities: element (b, h, t, s) is kept iff
// dropout_keep(seed, ((b * NH + h) * T + t) * S + s, p), and kept ones are scaled by 1 / (1 - p).
#pragma once

#include <cstdint>

#include "dropout_hash.h"
#include "numerics.h"
#include "score_mods.h"

namespace tinygpt {

struct AttentionGeom {
  int64_t B, NH, NKV, T, S, E, Ev;
  int64_t q_stride[3];     // b, h, t
  int64_t k_stride[3];     // b, kv head, s
  int64_t v_stride[3];     // b, kv head, s
  int64_t o_stride[3];     // b, h, t
  int64_t mask_stride[4];  // b, h, t, s; used only when a mask is given
  double scale;            // usually 1 / sqrt(E)
  bool causal;
  float dropout_p;
  DropoutSeed dropout_seed;                 // read where the kernels run (value()): see kernels/dropout_hash.h
  AttentionMath math = AttentionMath::F32;  // the flash kernels' operand format (the CPU has F32 and BF16; TF32 as F32)
  // Flash backward only: dq, dk and dv hold anything (NaN included) and are written (=), not added to; the GPU
  // and CPU kernels store each row once (the CPU zeroes the rows no task visits). For the views of a fused qkv gradient
  // that no op has written yet (Node::unwritten_disjoint): no memset of it, and no read of those zeros.
  bool grads_unwritten = false;
  FlashVariants flash = {};  // the GPU's bf16 flash kernels that wait for a measurement (kernels/numerics.h)
  ScoreMods mods;            // relative positions, ALiBi, T5 bias, window, documents, soft-cap (kernels/score_mods.h)
};

/// Whether the flash forward on bf16 storage (attention_flash_forward_bf16) takes a call: head dim 64 or 128 for q, k
/// and v alike, no score modifier (a mask or key padding the caller rules out: the kernel takes none; dropout it does),
/// and every row of q, k, v and out on a 16-byte boundary (pointers and strides in whole 8-element chunks).
inline bool flash_bf16_takes(const AttentionGeom& g, const void* q, const void* k, const void* v, const void* out) {
  const auto whole = [](const void* p, const int64_t* stride) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0 && stride[0] % 8 == 0 && stride[1] % 8 == 0 && stride[2] % 8 == 0;
  };
  return (g.E == 64 || g.E == 128) && g.Ev == g.E && !g.mods.any() && whole(q, g.q_stride) && whole(k, g.k_stride) &&
         whole(v, g.v_stride) && whole(out, g.o_stride);
}

}  // namespace tinygpt

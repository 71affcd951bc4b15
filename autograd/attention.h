// Scaled dot-product attention as one differentiable op. Flash attention (tiled, online softmax, saves only the
// output and the per-row logsumexp) runs by default; a naive kernel that materializes the (T, S) scores is the
// reference in tests. When the weights are asked for, the same math runs as composed ops (matmul, masks, softmax,
// dropout, matmul), so the returned weights are part of the graph, as torch.nn.MultiheadAttention's are.
//
// Mask conventions (all combine):
//   is_causal         bottom-right aligned: query t sees key s iff s <= t + S - T (as FlashAttention;
//                     with T == S the usual lower triangle, with T < S the queries are the last T positions)
//   key_padding_mask  (B, S) bool, true = ignore that key (torch.nn.MultiheadAttention's convention)
//   attn_mask         broadcastable to (B, NH, T, S): bool with true = masked out (as
//                     torch.nn.MultiheadAttention; note torch's functional SDPA uses the opposite), or an
//                     additive float mask of the inputs' dtype (-inf removes a key). Masks get no gradient.
// A query row that sees no key yields zeros and zero gradients.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "../kernels/dropout_hash.h"
#include "../kernels/numerics.h"
#include "../kernels/score_mods.h"
#include "autograd.h"
#include "tensor.h"

namespace tinygpt {

enum class AttentionImpl : uint8_t {
  Auto,   // flash, or composed ops when weights are requested
  Naive,  // the reference kernel that materializes the scores
  Flash,  // never holds the (T, S) weights, so it cannot return them
};

/// Score modifiers inside the kernels (kernels/score_mods.h has the math), all composable with the masks above: the
/// settings (window, softcap, alibi, T5's max distance and direction) and the data. A query's position is
/// t + S - T, a key's s. The learned tables get gradients; their shapes give t5_buckets and max_rel (left 0, or equal
/// to the tables').
struct ScoreModOptions : ScoreModSettings {
  Tensor doc_ids;         // (B, T) i32: a query sees only keys of its own document (packed sequences)
  Tensor key_doc_ids;     // (B, S) i32, the keys' documents when they are not the queries' (default: doc_ids)
  Tensor t5_bias;         // (NH, buckets): T5's learned bias per head and log-spaced distance bucket
  Tensor relative_key;    // (2m + 1, E): Shaw's A_K, distances clipped to [-m, m]
  Tensor relative_value;  // (2m + 1, Ev): Shaw's A_V (needs relative_key's m, or may come alone)

  bool any() const {
    return any_score_mod(*this, doc_ids.defined(), t5_bias.defined(),
                         relative_key.defined() || relative_value.defined());
  }
};

struct AttentionOptions {
  bool is_causal = false;
  Tensor attn_mask;
  Tensor key_padding_mask;
  double dropout_p = 0.0;  // probability of dropping an attention weight (pass 0 in evaluation)
  DropoutSeed dropout_seed;
  std::optional<double> scale;  // default 1 / sqrt(E)
  bool need_weights = false;    // also return the (B, NH, T, S) attention weights (after dropout, as torch)
  AttentionImpl impl = AttentionImpl::Auto;
  Numerics numerics;  // on the GPU: the flash kernels' operand format; TF32 for the weights path's matmuls
  ScoreModOptions mods;
};

struct AttentionResult {
  Tensor out;
  Tensor weights;  // when need_weights: (B, NH, T, S), part of the graph (a loss on them has gradients); with score
                   // modifiers, from the naive kernel and outside the graph (refused when a gradient is wanted)
};

/// q (B, NH, T, E), k (B, NKV, S, E), v (B, NKV, S, Ev) -> out (B, NH, T, Ev); NH divisible by NKV.
AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionOptions& options = {});

/// The ways the op computes attention, in the order it asks them; a call runs on the first that takes it:
/// "flash_bf16_storage" (bf16 tensors, a flash call without mask, padding or score modifier: the kernels that read
/// and write bf16 as stored), "bf16_through_f32" (other bf16 calls: f32 copies, then these paths again),
/// "weights_graph" (need_weights without score modifiers: the math as recorded ops), "naive" (AttentionImpl::Naive,
/// or need_weights with modifiers: the T x S kernels), "flash_tensor_cores" (the GPU's flash kernels with tf32 or
/// bf16 operands on tensor cores, where the GPU has them and the tiles fit its shared memory:
/// cuda::flash_tensor_cores), "flash" (the flash kernels: the CPU's, or the GPU's f32 ones on CUDA cores).
std::vector<std::string_view> attention_paths();
/// The path scaled_dot_product_attention(q, k, v, options) runs on (its shape checks made; nothing computed).
std::string_view attention_path(const Tensor& q, const Tensor& k, const Tensor& v,
                                const AttentionOptions& options = {});

/// Self-attention read straight out of a fused projection qkv (B, T, (NH + 2 NKV) * E), holding the NH query
/// heads, then the NKV key heads, then the NKV value heads; out (B, T, NH * E). No permute copies.
AttentionResult fused_self_attention(const Tensor& qkv, int64_t num_heads, int64_t num_kv_heads,
                                     const AttentionOptions& options = {});

/// Heads packed in the last dim: q (B, T, NH * E), k (B, S, NKV * E), v (B, S, NKV * Ev) -> out (B, T, NH * Ev).
AttentionResult packed_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t num_heads,
                                 int64_t num_kv_heads, const AttentionOptions& options = {});

/// Inference with a key/value cache: q (B, T, NH * E) holds the last T of `len` positions and attends
/// causally to positions [0, len) of k_cache (B, capacity, NKV * E) and v_cache (B, capacity, NKV * Ev),
/// read in place. Returns (B, T, NH * Ev). Not differentiable (call it under NoGradGuard or on tensors
/// that need no gradient). `mods` applies score modifiers (positions are relative to the cache's start).
Tensor cached_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, int64_t len, int64_t num_heads,
                        int64_t num_kv_heads, const Numerics& numerics = {}, const ScoreModOptions& mods = {});

/// A bool mask (true = masked out) as an additive one of `dtype`: -inf where masked, 0 elsewhere; a float mask as it
/// is. Outside the graph (masks get no gradient), on the mask's device.
Tensor as_additive_mask(const Tensor& mask, DType dtype);

}  // namespace tinygpt

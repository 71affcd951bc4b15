// Multi-head attention with the semantics of torch.nn.MultiheadAttention (batch_first, add_bias_kv, add_zero_attn
// included), plus grouped-query heads, rotary position embeddings and the score modifiers of the flash kernels
// (Shaw's relative positions, ALiBi, T5 bias, sliding window, document masks, soft-cap). Self-attention (query, key and
// value the same tensor) runs one fused QKV projection and reads q, k and v straight out of it; cross-attention
// projects each input with its own rows of the projection. Set TINYGPT_TRACE_SHAPES=1 to log every stage's shape.
//
// add_bias_kv and add_zero_attn append key/value positions after the S keys, as torch does: first the learned
// bias_k / bias_v, (1, 1, NKV * head_dim) (torch's (1, 1, embed_dim); with grouped-query heads one bias per key/value
// head), then a zero key and value. No query is ever hidden from them: key_padding_mask and attn_mask are padded with
// false / 0 columns, and is_causal hides the keys s > t + S - T among the S real keys only (the causal mask torch
// asks for, padded as torch pads it; torch's is_causal is a hint for that mask, and where torch hands the hint to
// F.scaled_dot_product_attention it also hides the appended keys, which tinygpt does not). The attention weights
// then have S + 1 or S + 2 key columns, as torch's. The appended positions have no place in position-aware attention:
// RoPE, relative positions, ALiBi, T5 bias, a window and document masks are refused with them, as is the KV cache.
#pragma once

#include "../autograd/attention.h"
#include "../kernels/rope_freqs.h"
#include "layers.h"

namespace tinygpt::nn {

struct MultiHeadAttentionConfig {
  int64_t embed_dim = 0;
  int64_t num_heads = 1;
  int64_t num_kv_heads = 0;  // 0: same as num_heads; fewer: grouped-query (1: multi-query)
  int64_t head_dim = 0;      // each head's width (0: embed_dim / num_heads, torch's; else q, k, v are num_heads x it)
  int64_t kdim = 0;          // features of `key` (0: embed_dim)
  int64_t vdim = 0;          // features of `value` (0: embed_dim)
  bool bias = true;
  bool out_bias = true;        // with bias, the output projection's too (false: the q, k, v projections' only, Qwen2)
  bool add_bias_kv = false;    // learned bias_k, bias_v appended to the keys and values (one more key position)
  bool add_zero_attn = false;  // a zero key and value appended (after bias_k / bias_v)
  bool batch_first = true;     // false: query, key, value and the output are sequence-first (T, B, E)
  double dropout = 0.0;        // on the attention weights, in training mode
  bool rope = false;           // rotate q and k by position (RoPE) instead of relying on learned positions
  RopeFreqs rope_freqs{};      // with rope: base and scaling (kernels/rope_freqs.h)
  double proj_init_std = kInitStd;  // of the output projection (GPT-2 scales it down with depth)
  // Score modifiers inside the attention kernels (kernels/score_mods.h): window, softcap, alibi, T5's bias (t5_buckets
  // > 0: a learned table t5_bias (num_heads, buckets)), Shaw's relative positions (max_rel = m > 0: tables
  // relative_key and relative_value of (2m + 1, head_dim) shared by the heads).
  ScoreModSettings mods{};
  bool relative_values = true;  // with max_rel: false, relative_key only
  bool qk_norm =
      false;  // QK-norm: each head's query and key LayerNorm'd over head_dim (gains q_norm, k_norm), before RoPE
};

/// What a call passes beside query, key and value: torch's forward arguments, by name
/// (`attn.forward(x, x, x, {.is_causal = true, .doc_ids = docs})`).
struct MultiHeadAttentionCall {
  Tensor key_padding_mask{};  // (B, S) bool, true = ignore
  Tensor attn_mask{};         // bool (true = masked out) or additive float, broadcastable to (B, NH, T, S); batch-first
  bool is_causal = false;
  bool need_weights = false;
  bool average_attn_weights = true;  // with need_weights: (B, T, S') averaged over heads, else (B, NH, T, S')
  int64_t pos0 = 0;                  // the position of the first query (and key), for RoPE
  Tensor doc_ids{};                  // (B, T) i32, self-attention over packed documents: a query sees only keys
                                     // of its own document
};

class MultiHeadAttention : public Module {
 public:
  MultiHeadAttention(const MultiHeadAttentionConfig& config, Generator& gen = default_generator());

  struct Output {
    Tensor out;      // (B, T, embed_dim); (T, B, embed_dim) with batch_first = false
    Tensor weights;  // when need_weights: (B, T, S') averaged over heads, or (B, NH, T, S'), in either layout;
                     // S' = S plus the appended bias and zero positions (add_bias_kv, add_zero_attn)
  };

  using Call = MultiHeadAttentionCall;

  /// query (B, T, embed_dim), key (B, S, kdim), value (B, S, vdim); with batch_first = false (T, B, embed_dim),
  /// (S, B, kdim), (S, B, vdim). The masks are batch-first in both layouts, as torch's.
  Output forward(const Tensor& query, const Tensor& key, const Tensor& value, const Call& call = {}) const;

  /// Inference for self-attention with a key/value cache: x (B, T, embed_dim) holds positions
  /// [pos, pos + T); their keys and values are written into k_cache, v_cache (B, capacity, NKV * head_dim)
  /// and the queries attend causally to positions [0, pos + T). Needs the fused projection, and neither
  /// add_bias_kv nor add_zero_attn. With batch_first = false x and the result are (T, B, embed_dim); the caches keep
  /// their (B, capacity, NKV * head_dim) layout.
  Tensor forward_cached(const Tensor& x, Tensor& k_cache, Tensor& v_cache, int64_t pos) const;

  const MultiHeadAttentionConfig& config() const { return config_; }
  int64_t head_dim() const { return config_.head_dim; }

  std::unique_ptr<Linear> c_attn;                  // fused (NH + 2 NKV) * E rows, when kdim == vdim == embed_dim
  std::unique_ptr<Linear> q_proj, k_proj, v_proj;  // otherwise
  Linear c_proj;
  Tensor relative_key, relative_value;        // (2m + 1, head_dim), with max_relative_position
  Tensor t5_bias;                             // (num_heads, t5_buckets), with t5_buckets
  Tensor bias_k, bias_v;                      // (1, 1, NKV * head_dim), with add_bias_kv (torch's names and shape)
  std::unique_ptr<LayerNorm> q_norm, k_norm;  // over head_dim, gain only, shared by the heads; with qk_norm

 private:
  /// The score modifiers of this layer for the kernels.
  ScoreModOptions score_mods(const Tensor& doc_ids) const;
  /// With qk_norm, the fused projection's (B, L, (NH + 2 NKV) E) with its q and k heads normalized; else as given.
  Tensor normalize_qk(const Tensor& qkv) const;
  /// Without the fused self-attention path: q (B, T, NH E), k and v (B, S, NKV E) projected apart (cross-attention
  /// with fused weights: each from its rows of c_attn), q and k normalized (qk_norm) and rotated (rope) from pos0.
  struct Projected {
    Tensor q, k, v;
  };
  Projected project_apart(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, int64_t pos0) const;

  MultiHeadAttentionConfig config_;
  Generator* gen_;
};

}  // namespace tinygpt::nn

#include "nn/attention.h"

#include <cmath>
#include <cstdlib>

namespace tinygpt::nn {
namespace {

MultiHeadAttentionConfig resolve(MultiHeadAttentionConfig c) {
  if (c.num_kv_heads == 0) c.num_kv_heads = c.num_heads;
  if (c.kdim == 0) c.kdim = c.embed_dim;
  if (c.vdim == 0) c.vdim = c.embed_dim;
  if (c.embed_dim <= 0 || c.num_heads <= 0 || c.num_kv_heads <= 0) {
    throw Error(fmt::format("MultiHeadAttention: embed_dim ({}), num_heads ({}) and num_kv_heads ({}) must be positive",
                            c.embed_dim, c.num_heads, c.num_kv_heads));
  }
  if (c.embed_dim % c.num_heads != 0) {
    throw Error(fmt::format("MultiHeadAttention: embed_dim {} is not divisible by num_heads {}", c.embed_dim, c.num_heads));
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    throw Error(fmt::format("MultiHeadAttention: num_heads {} is not divisible by num_kv_heads {}", c.num_heads,
                            c.num_kv_heads));
  }
  if (c.rope && (c.embed_dim / c.num_heads) % 2 != 0) {
    throw Error(fmt::format("MultiHeadAttention: RoPE needs an even head dim, got {}", c.embed_dim / c.num_heads));
  }
  if (!(c.dropout >= 0.0 && c.dropout < 1.0)) throw Error(fmt::format("MultiHeadAttention: dropout must be in [0, 1), got {}", c.dropout));
  if (c.max_relative_position < 0 || c.t5_buckets < 0 || c.window < 0 || !(c.softcap >= 0.0)) {
    throw Error(fmt::format("MultiHeadAttention: max_relative_position ({}), t5_buckets ({}), window ({}) and softcap ({}) "
                            "must be >= 0",
                            c.max_relative_position, c.t5_buckets, c.window, c.softcap));
  }
  return c;
}

bool trace_shapes() {
  static const bool on = [] {
    const char* v = std::getenv("TINYGPT_TRACE_SHAPES");
    return v != nullptr && *v != '\0' && std::string(v) != "0";
  }();
  return on;
}

void trace(const char* stage, const Tensor& t) {
  if (trace_shapes()) fmt::print(stderr, "[attention] {:<28} {}\n", stage, t.shape().str());
}

}  // namespace

MultiHeadAttention::MultiHeadAttention(const MultiHeadAttentionConfig& config, Generator& gen)
    : c_proj(resolve(config).embed_dim, resolve(config).embed_dim, config.bias, gen, config.proj_init_std), config_(resolve(config)), gen_(&gen) {
  const auto& c = config_;
  const int64_t E = head_dim();
  if (c.kdim == c.embed_dim && c.vdim == c.embed_dim) {
    c_attn = std::make_unique<Linear>(c.embed_dim, (c.num_heads + 2 * c.num_kv_heads) * E, c.bias, gen);
    register_module("c_attn", *c_attn);
  } else {
    q_proj = std::make_unique<Linear>(c.embed_dim, c.num_heads * E, c.bias, gen);
    k_proj = std::make_unique<Linear>(c.kdim, c.num_kv_heads * E, c.bias, gen);
    v_proj = std::make_unique<Linear>(c.vdim, c.num_kv_heads * E, c.bias, gen);
    register_module("q_proj", *q_proj);
    register_module("k_proj", *k_proj);
    register_module("v_proj", *v_proj);
  }
  register_module("c_proj", c_proj);
  const int64_t m = c.max_relative_position;
  if (m > 0) {
    relative_key = register_parameter("relative_key", randn({2 * m + 1, E}, gen, DType::F32, Device::CPU, kInitStd));
    if (c.relative_values) {
      relative_value = register_parameter("relative_value", randn({2 * m + 1, E}, gen, DType::F32, Device::CPU, kInitStd));
    }
  }
  if (c.t5_buckets > 0) {
    t5_bias = register_parameter("t5_bias", randn({c.num_heads, c.t5_buckets}, gen, DType::F32, Device::CPU, kInitStd));
  }
}

ScoreModOptions MultiHeadAttention::score_mods(const Tensor& doc_ids) const {
  const auto& c = config_;
  ScoreModOptions m;
  m.relative_key = relative_key;
  m.relative_value = relative_value;
  m.alibi = c.alibi;
  m.t5_bias = t5_bias;
  m.t5_max_distance = c.t5_max_distance;
  m.t5_bidirectional = c.t5_bidirectional;
  m.window = c.window;
  m.softcap = c.softcap;
  m.doc_ids = doc_ids;
  return m;
}

MultiHeadAttention::Output MultiHeadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                                       const Tensor& key_padding_mask, const Tensor& attn_mask,
                                                       bool is_causal, bool need_weights, bool average_attn_weights,
                                                       int64_t pos0, const Tensor& doc_ids) const {
  const auto& c = config_;
  const int64_t NH = c.num_heads, NKV = c.num_kv_heads, E = head_dim();
  if (query.ndim() != 3 || query.size(2) != c.embed_dim) {
    throw Error(fmt::format("MultiHeadAttention: query must be (B, T, {}), got {}", c.embed_dim, query.shape().str()));
  }
  if (key.ndim() != 3 || key.size(2) != c.kdim || value.ndim() != 3 || value.size(2) != c.vdim ||
      key.size(0) != query.size(0) || value.size(0) != query.size(0) || key.size(1) != value.size(1)) {
    throw Error(fmt::format("MultiHeadAttention: key must be (B, S, {}) and value (B, S, {}) with query's B; got {} and {}",
                            c.kdim, c.vdim, key.shape().str(), value.shape().str()));
  }
  AttentionOptions opts;
  opts.is_causal = is_causal;
  opts.attn_mask = attn_mask;
  opts.key_padding_mask = key_padding_mask;
  opts.need_weights = need_weights;
  opts.numerics = numerics();
  opts.mods = score_mods(doc_ids);
  if (training() && c.dropout > 0.0) {
    opts.dropout_p = c.dropout;
    opts.dropout_seed = gen_->next_u64();
  }
  trace("query", query);
  AttentionResult r;
  const bool self = query.impl_ptr() == key.impl_ptr() && key.impl_ptr() == value.impl_ptr();
  if (self && c_attn) {
    Tensor qkv = c_attn->forward(query);  // (B, T, (NH + 2 NKV) * E)
    trace("fused qkv projection", qkv);
    if (c.rope) qkv = rope(qkv, E, NH + NKV, pos0, c.rope_base);  // rotate the q and k heads, not v
    r = fused_self_attention(qkv, NH, NKV, opts);
  } else {
    Tensor q, k, v;
    if (c_attn) {
      // Cross-attention with the fused weights: each input gets its own rows of c_attn.
      auto rows = [&](const Tensor& t, int64_t first, int64_t count) {
        return t.defined() ? narrow(t, 0, first * E, count * E) : Tensor();
      };
      q = linear(query, rows(c_attn->weight, 0, NH), rows(c_attn->bias, 0, NH), numerics());
      k = linear(key, rows(c_attn->weight, NH, NKV), rows(c_attn->bias, NH, NKV), numerics());
      v = linear(value, rows(c_attn->weight, NH + NKV, NKV), rows(c_attn->bias, NH + NKV, NKV), numerics());
    } else {
      q = q_proj->forward(query);
      k = k_proj->forward(key);
      v = v_proj->forward(value);
    }
    trace("q projection (B, T, NH*E)", q);
    trace("k projection (B, S, NKV*E)", k);
    trace("v projection (B, S, NKV*E)", v);
    if (c.rope) {
      q = rope(q, E, NH, pos0, c.rope_base);
      k = rope(k, E, NKV, pos0, c.rope_base);
    }
    r = packed_attention(q, k, v, NH, NKV, opts);
  }
  trace("attention output (B, T, NH*E)", r.out);
  Output out{c_proj.forward(r.out), Tensor()};
  trace("output projection", out.out);
  if (need_weights) {
    out.weights = average_attn_weights ? mean(r.weights, 1) : r.weights;
    trace("attention weights", out.weights);
  }
  return out;
}

Tensor MultiHeadAttention::forward_cached(const Tensor& x, Tensor& k_cache, Tensor& v_cache, int64_t pos) const {
  const auto& c = config_;
  const int64_t NH = c.num_heads, NKV = c.num_kv_heads, E = head_dim(), T = x.size(1);
  if (!c_attn) throw Error("MultiHeadAttention: forward_cached needs the fused QKV projection (kdim == vdim == embed_dim)");
  if (pos < 0 || pos + T > k_cache.size(1)) {
    throw Error(fmt::format("MultiHeadAttention: positions [{}, {}) do not fit a cache of {}", pos, pos + T, k_cache.size(1)));
  }
  Tensor qkv = c_attn->forward(x);  // (B, T, (NH + 2 NKV) * E)
  if (c.rope) qkv = rope(qkv, E, NH + NKV, pos, c.rope_base);
  write_slice(k_cache, 1, pos, narrow(qkv, 2, NH * E, NKV * E));
  write_slice(v_cache, 1, pos, narrow(qkv, 2, (NH + NKV) * E, NKV * E));
  const Tensor y = cached_attention(narrow(qkv, 2, 0, NH * E), k_cache, v_cache, pos + T, NH, NKV, numerics(),
                                    score_mods(Tensor()));  // (B, T, NH * E)
  return c_proj.forward(y);
}

}  // namespace tinygpt::nn

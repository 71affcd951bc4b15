#include "nn/attention.h"

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/env.h"

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
  if (c.head_dim < 0)
    throw Error(fmt::format("MultiHeadAttention: head_dim must be 0 or positive, got {}", c.head_dim));
  if (c.head_dim == 0 && c.embed_dim % c.num_heads != 0) {
    throw Error(fmt::format("MultiHeadAttention: embed_dim {} is not divisible by num_heads {} (or give head_dim)",
                            c.embed_dim, c.num_heads));
  }
  if (c.head_dim == 0) c.head_dim = c.embed_dim / c.num_heads;
  if (c.num_heads % c.num_kv_heads != 0) {
    throw Error(fmt::format("MultiHeadAttention: num_heads {} is not divisible by num_kv_heads {}", c.num_heads,
                            c.num_kv_heads));
  }
  if (c.rope && c.head_dim % 2 != 0) {
    throw Error(fmt::format("MultiHeadAttention: RoPE needs an even head dim, got {}", c.head_dim));
  }
  if (!(c.dropout >= 0.0 && c.dropout < 1.0))
    throw Error(fmt::format("MultiHeadAttention: dropout must be in [0, 1), got {}", c.dropout));
  check_score_mods(c.mods, "MultiHeadAttention");
  if (c.add_bias_kv || c.add_zero_attn) {
    // The appended key positions (bias_k / bias_v, the zero key) stand at no sequence position.
    std::string clash;
    auto note = [&](bool on, const char* what) {
      if (on) clash += (clash.empty() ? "" : ", ") + std::string(what);
    };
    note(c.rope, "rope");
    note(c.mods.max_rel > 0, "max_rel (Shaw's relative positions)");
    note(c.mods.alibi, "alibi");
    note(c.mods.t5_buckets > 0, "t5_buckets (T5 bias)");
    note(c.mods.window > 0, "window");
    if (!clash.empty()) {
      throw Error(
          fmt::format("MultiHeadAttention: add_bias_kv and add_zero_attn append key positions that have no "
                      "sequence position, which {} needs; turn one or the other off",
                      clash));
    }
  }
  return c;
}

/// `mask` with `extra` more key columns (its last dim) that hide nothing: false, or 0 in an additive mask, as torch
/// pads attn_mask and key_padding_mask for the appended key positions. A last dim of 1 that broadcast over the S
/// keys is expanded to S first. Outside the graph (masks get no gradient), on the mask's device.
Tensor pad_key_columns(const Tensor& mask, int64_t S, int64_t extra, const char* what) {
  if (!mask.defined() || extra == 0) return mask;
  const int64_t n = mask.ndim() == 0 ? 1 : mask.size(-1);
  if (n != S && n != 1) {
    throw Error(
        fmt::format("MultiHeadAttention: {} of shape {} does not end in the {} keys", what, mask.shape().str(), S));
  }
  std::vector<int64_t> dims = mask.shape().vec();
  if (dims.empty()) dims.push_back(1);
  dims.back() = S + extra;
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < dims.size(); ++i) rows *= dims[i];
  auto pad = [&]<class T>() {
    const std::vector<T> in = mask.to_vector<T>();
    std::vector<T> out(size_t(rows * (S + extra)), T(0));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t s = 0; s < S; ++s) out[size_t(r * (S + extra) + s)] = in[size_t(r * n + (n == 1 ? 0 : s))];
    return from_vector(out, Shape(dims), mask.device());
  };
  if (mask.dtype() == DType::Bool) return pad.operator()<uint8_t>();
  if (mask.dtype() == DType::F32) return pad.operator()<float>();
  if (mask.dtype() == DType::F64) return pad.operator()<double>();
  throw Error(fmt::format("MultiHeadAttention: {} must be bool or float, got {}", what, dtype_name(mask.dtype())));
}

/// is_causal over the S real keys (query t sees key s iff s <= t + S - T, the kernels' bottom-right convention) as a
/// bool (T, S + extra) mask, true = hidden, that never hides the `extra` appended key positions.
Tensor causal_mask_before_appended(int64_t T, int64_t S, int64_t extra, Device device) {
  std::vector<uint8_t> hidden(size_t(T * (S + extra)), 0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < S; ++s) hidden[size_t(t * (S + extra) + s)] = s > t + S - T ? 1 : 0;
  return from_vector(hidden, {T, S + extra}, device);
}

bool trace_shapes() {
  static const bool on = [] {
    const char* v = TINYGPT_ENV("TINYGPT_TRACE_SHAPES");
    return v != nullptr && std::string_view(v) != "0";
  }();
  return on;
}

void trace(const char* stage, const Tensor& t) {
  if (trace_shapes()) fmt::print(stderr, "[attention] {:<28} {}\n", stage, t.shape().str());
}

/// x (B, L, H * E) with every head's E values normalized by `norm`.
Tensor normalize_heads(const LayerNorm& norm, const Tensor& x, int64_t E) {
  const int64_t B = x.size(0), L = x.size(1), H = x.size(2) / E;
  return reshape(norm.forward(reshape(x, {B, L, H, E})), {B, L, H * E});
}

/// query (B, T, embed_dim), key (B, S, kdim) and value (B, S, vdim), sequence-first unless batch_first.
void check_inputs(const MultiHeadAttentionConfig& c, const Tensor& query, const Tensor& key, const Tensor& value) {
  const int bd = c.batch_first ? 0 : 1, ld = c.batch_first ? 1 : 0;  // the inputs' batch and sequence dims
  const char* q_layout = c.batch_first ? "B, T" : "T, B";
  const char* kv_layout = c.batch_first ? "B, S" : "S, B";
  if (query.ndim() != 3 || query.size(2) != c.embed_dim) {
    throw Error(
        fmt::format("MultiHeadAttention: query must be ({}, {}), got {}", q_layout, c.embed_dim, query.shape().str()));
  }
  if (key.ndim() != 3 || key.size(2) != c.kdim || value.ndim() != 3 || value.size(2) != c.vdim ||
      key.size(bd) != query.size(bd) || value.size(bd) != query.size(bd) || key.size(ld) != value.size(ld)) {
    throw Error(fmt::format("MultiHeadAttention: key must be ({}, {}) and value ({}, {}) with query's B; got {} and {}",
                            kv_layout, c.kdim, kv_layout, c.vdim, key.shape().str(), value.shape().str()));
  }
}

/// As torch's add_bias_kv / add_zero_attn: bias_k / bias_v as one more key/value position, then a zero key and value,
/// opts' masks padded with columns that hide nothing, and its is_causal as that mask over the S real keys (q, k, v
/// batch first, projected).
void append_keys(const MultiHeadAttentionConfig& c, const Tensor& bias_k, const Tensor& bias_v, const Tensor& q,
                 Tensor& k, Tensor& v, AttentionOptions& opts) {
  const int64_t NKV = c.num_kv_heads, E = c.head_dim;
  const int64_t B = q.size(0), T = q.size(1), S = k.size(1);
  const Tensor zero = zeros({B, 1, NKV * E}, k.dtype(), k.device());
  std::vector<Tensor> ks{k}, vs{v};
  if (c.add_bias_kv) {
    ks.push_back(zero + bias_k);  // (1, 1, NKV * E) broadcast over the batch
    vs.push_back(zero + bias_v);
  }
  if (c.add_zero_attn) {
    ks.push_back(zero);
    vs.push_back(zero);
  }
  const int64_t extra = int64_t(ks.size()) - 1;
  k = concat(ks, 1);
  v = concat(vs, 1);
  trace("k with appended keys", k);
  trace("v with appended values", v);
  const Tensor kp = opts.key_padding_mask;
  if (kp.defined() && (kp.dtype() != DType::Bool || !(kp.shape() == Shape{B, S}))) {
    throw Error(fmt::format("MultiHeadAttention: key_padding_mask must be a bool (B, S) = ({}, {}) tensor, got {} {}",
                            B, S, dtype_name(kp.dtype()), kp.shape().str()));
  }
  opts.key_padding_mask = pad_key_columns(kp, S, extra, "key_padding_mask");
  Tensor mask = pad_key_columns(opts.attn_mask, S, extra, "attn_mask");
  if (opts.is_causal) {
    const Tensor causal = causal_mask_before_appended(T, S, extra, q.device());
    if (mask.defined()) {
      const DType dtype = mask.dtype() == DType::Bool ? q.dtype() : mask.dtype();
      mask = as_additive_mask(mask, dtype) + as_additive_mask(causal, dtype);
    } else {
      mask = causal;
    }
    opts.is_causal = false;  // the kernels' is_causal would count the appended keys as positions
  }
  opts.attn_mask = mask;
}

}  // namespace

MultiHeadAttention::MultiHeadAttention(const MultiHeadAttentionConfig& config, Generator& gen)
    : c_proj(resolve(config).num_heads * resolve(config).head_dim, resolve(config).embed_dim,
             config.bias && config.out_bias, gen, config.proj_init_std),
      config_(resolve(config)),
      gen_(&gen) {
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
  if (c.qk_norm) {
    q_norm = std::make_unique<LayerNorm>(E, false);
    k_norm = std::make_unique<LayerNorm>(E, false);
    register_module("q_norm", *q_norm);
    register_module("k_norm", *k_norm);
  }
  const int64_t m = c.mods.max_rel;
  if (m > 0) {
    relative_key = register_parameter("relative_key", randn({2 * m + 1, E}, gen, DType::F32, Device::CPU, kInitStd));
    if (c.relative_values) {
      relative_value =
          register_parameter("relative_value", randn({2 * m + 1, E}, gen, DType::F32, Device::CPU, kInitStd));
    }
  }
  if (c.mods.t5_buckets > 0) {
    t5_bias =
        register_parameter("t5_bias", randn({c.num_heads, c.mods.t5_buckets}, gen, DType::F32, Device::CPU, kInitStd));
  }
  if (c.add_bias_kv) {
    // torch's xavier_normal_ of its (1, 1, W) bias_k: fan_in = fan_out = W, std = sqrt(2 / (fan_in + fan_out)).
    const int64_t W = c.num_kv_heads * E;
    const double init_std = std::sqrt(1.0 / double(W));
    bias_k = register_parameter("bias_k", randn({1, 1, W}, gen, DType::F32, Device::CPU, init_std));
    bias_v = register_parameter("bias_v", randn({1, 1, W}, gen, DType::F32, Device::CPU, init_std));
  }
}

Tensor MultiHeadAttention::normalize_qk(const Tensor& qkv) const {
  if (!config_.qk_norm) return qkv;
  const int64_t NH = config_.num_heads, NKV = config_.num_kv_heads, E = head_dim();
  return concat({normalize_heads(*q_norm, narrow(qkv, 2, 0, NH * E), E),
                 normalize_heads(*k_norm, narrow(qkv, 2, NH * E, NKV * E), E), narrow(qkv, 2, (NH + NKV) * E, NKV * E)},
                2);
}

ScoreModOptions MultiHeadAttention::score_mods(const Tensor& doc_ids) const {
  const auto& c = config_;
  ScoreModOptions m;
  static_cast<ScoreModSettings&>(m) = c.mods;
  m.relative_key = relative_key;
  m.relative_value = relative_value;
  m.t5_bias = t5_bias;
  m.doc_ids = doc_ids;
  return m;
}

MultiHeadAttention::Projected MultiHeadAttention::project_apart(const Tensor& q_in, const Tensor& k_in,
                                                                const Tensor& v_in, int64_t pos0) const {
  const auto& c = config_;
  const int64_t NH = c.num_heads, NKV = c.num_kv_heads, E = head_dim();
  Tensor q, k, v;
  if (c_attn) {
    // Cross-attention with the fused weights: each input gets its own rows of c_attn.
    auto rows = [&](const Tensor& t, int64_t first, int64_t count) {
      return t.defined() ? narrow(t, 0, first * E, count * E) : Tensor();
    };
    q = linear(q_in, rows(c_attn->weight, 0, NH), rows(c_attn->bias, 0, NH), numerics());
    k = linear(k_in, rows(c_attn->weight, NH, NKV), rows(c_attn->bias, NH, NKV), numerics());
    v = linear(v_in, rows(c_attn->weight, NH + NKV, NKV), rows(c_attn->bias, NH + NKV, NKV), numerics());
  } else {
    q = q_proj->forward(q_in);
    k = k_proj->forward(k_in);
    v = v_proj->forward(v_in);
  }
  trace("q projection (B, T, NH*E)", q);
  trace("k projection (B, S, NKV*E)", k);
  trace("v projection (B, S, NKV*E)", v);
  if (c.qk_norm) {
    q = normalize_heads(*q_norm, q, E);
    k = normalize_heads(*k_norm, k, E);
  }
  if (c.rope) {
    q = rope(q, E, NH, pos0, c.rope_freqs);
    k = rope(k, E, NKV, pos0, c.rope_freqs);
  }
  return {q, k, v};
}

MultiHeadAttention::Output MultiHeadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                                       const Call& call) const {
  const auto& c = config_;
  const int64_t NH = c.num_heads, NKV = c.num_kv_heads, E = head_dim();
  check_inputs(c, query, key, value);
  const bool extra_keys = c.add_bias_kv || c.add_zero_attn;
  if (extra_keys && call.doc_ids.defined()) {
    throw Error(
        "MultiHeadAttention: doc_ids with add_bias_kv or add_zero_attn: the appended key positions belong to "
        "no document");
  }
  AttentionOptions opts;
  opts.is_causal = call.is_causal;
  opts.attn_mask = call.attn_mask;
  opts.key_padding_mask = call.key_padding_mask;
  opts.need_weights = call.need_weights;
  opts.numerics = numerics();
  opts.mods = score_mods(call.doc_ids);
  if (training() && c.dropout > 0.0) {
    opts.dropout_p = c.dropout;
    opts.dropout_seed = gen_->dropout_seed();
  }
  trace("query", query);
  AttentionResult r;
  const bool self = query.impl_ptr() == key.impl_ptr() && key.impl_ptr() == value.impl_ptr();
  // Batch-first from here on; self-attention transposes once, so it still reads one tensor.
  // bf16 storage: the fused projection reads and writes bf16, RoPE rotates it as stored (in f32, rounded once) and
  // attention reads its q, k and v as stored (QK-norm, an f32 op, runs on an f32 copy); the other projection paths
  // run on f32 copies; the output projection reads bf16 again.
  const bool bf16_in = query.dtype() == DType::BF16;
  const bool fused = self && c_attn && !extra_keys;
  auto f32_if_unfused = [&](const Tensor& t) { return bf16_in && !fused ? cast(t, DType::F32) : t; };
  const Tensor q_in = f32_if_unfused(c.batch_first ? query : transpose(query, 0, 1));
  const Tensor k_in = self ? q_in : f32_if_unfused(c.batch_first ? key : transpose(key, 0, 1));
  const Tensor v_in = self ? q_in : f32_if_unfused(c.batch_first ? value : transpose(value, 0, 1));
  if (!c.batch_first) trace("query made batch-first", q_in);
  if (fused) {
    Tensor qkv = c_attn->forward(q_in);  // (B, T, (NH + 2 NKV) * E)
    if (qkv.dtype() == DType::BF16 && c.qk_norm) qkv = cast(qkv, DType::F32);
    trace("fused qkv projection", qkv);
    qkv = normalize_qk(qkv);
    if (c.rope) qkv = rope(qkv, E, NH + NKV, call.pos0, c.rope_freqs);  // rotate the q and k heads, not v
    r = fused_self_attention(qkv, NH, NKV, opts);
  } else {
    auto [q, k, v] = project_apart(q_in, k_in, v_in, call.pos0);
    if (extra_keys) append_keys(c, bias_k, bias_v, q, k, v, opts);
    r = packed_attention(q, k, v, NH, NKV, opts);
  }
  trace("attention output (B, T, NH*E)", r.out);
  Output out{c_proj.forward(bf16_in ? cast(r.out, DType::BF16) : r.out), Tensor()};
  trace("output projection", out.out);
  if (!c.batch_first) {
    out.out = transpose(out.out, 0, 1);  // (T, B, embed_dim)
    trace("output made sequence-first", out.out);
  }
  if (call.need_weights) {
    out.weights = call.average_attn_weights ? mean(r.weights, 1) : r.weights;
    trace("attention weights", out.weights);
  }
  return out;
}

Tensor MultiHeadAttention::forward_cached(const Tensor& x, Tensor& k_cache, Tensor& v_cache, int64_t pos) const {
  const auto& c = config_;
  if (!c_attn)
    throw Error("MultiHeadAttention: forward_cached needs the fused QKV projection (kdim == vdim == embed_dim)");
  if (c.add_bias_kv || c.add_zero_attn) {
    throw Error(
        "MultiHeadAttention: forward_cached does not support add_bias_kv or add_zero_attn (the appended "
        "key/value positions are not in the cache); use forward");
  }
  if (x.ndim() != 3 || x.size(2) != c.embed_dim) {
    throw Error(fmt::format("MultiHeadAttention: forward_cached's x must be ({}, {}), got {}",
                            c.batch_first ? "B, T" : "T, B", c.embed_dim, x.shape().str()));
  }
  const Tensor xb = c.batch_first ? x : transpose(x, 0, 1);  // (B, T, embed_dim)
  const int64_t NH = c.num_heads, NKV = c.num_kv_heads, E = head_dim(), T = xb.size(1);
  if (pos < 0 || pos + T > k_cache.size(1)) {
    throw Error(
        fmt::format("MultiHeadAttention: positions [{}, {}) do not fit a cache of {}", pos, pos + T, k_cache.size(1)));
  }
  Tensor qkv = c_attn->forward(xb);                             // (B, T, (NH + 2 NKV) * E)
  if (qkv.dtype() == DType::BF16) qkv = cast(qkv, DType::F32);  // the cache and cached attention are f32
  qkv = normalize_qk(qkv);
  if (c.rope) qkv = rope(qkv, E, NH + NKV, pos, c.rope_freqs);
  write_slice(k_cache, 1, pos, narrow(qkv, 2, NH * E, NKV * E));
  write_slice(v_cache, 1, pos, narrow(qkv, 2, (NH + NKV) * E, NKV * E));
  const Tensor y = cached_attention(narrow(qkv, 2, 0, NH * E), k_cache, v_cache, pos + T, NH, NKV, numerics(),
                                    score_mods(Tensor()));  // (B, T, NH * E)
  const Tensor out = c_proj.forward(x.dtype() == DType::BF16 ? cast(y, DType::BF16) : y);
  return c.batch_first ? out : transpose(out, 0, 1);
}

}  // namespace tinygpt::nn

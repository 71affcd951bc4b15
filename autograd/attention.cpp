#include "autograd/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "autograd/op_helpers.h"
#include "autograd/ops.h"

namespace tinygpt {

using detail::ptr;

namespace {

/// A (batch, heads, len, dim) view into a contiguous tensor: element (b, h, l, d) is at
/// offset + b * stride[0] + h * stride[1] + l * stride[2] + d. The base is (B, H, L, D) itself, or, heads last,
/// (B, L, W) with the heads at features [offset, offset + H * D).
struct HeadsView {
  Tensor base;
  int64_t offset;
  int64_t batch, heads, len, dim;
  int64_t stride[3];
  bool heads_last;
};

/// Contiguous (B, H, L, D).
HeadsView heads_first(const Tensor& t, const char* what) {
  if (t.ndim() != 4)
    throw Error(fmt::format("attention: {} must be (B, heads, len, dim), got shape {}", what, t.shape().str()));
  const int64_t B = t.size(0), H = t.size(1), L = t.size(2), D = t.size(3);
  return {t, 0, B, H, L, D, {H * L * D, L * D, D}, false};
}

/// Heads [head0, head0 + heads) of a (B, L, total_heads * D) tensor.
HeadsView heads_last(const Tensor& t, int64_t head0, int64_t heads, int64_t total_heads, int64_t D) {
  const int64_t B = t.size(0), L = t.size(1), W = total_heads * D;
  return {t, head0 * D, B, heads, L, D, {L * W, D, W}, true};
}

/// The view as a (B, H, L, D) tensor of the graph: the base itself, or its heads copied out of a heads-last base.
Tensor heads_first_tensor(const HeadsView& v) {
  if (!v.heads_last) return v.base;
  const bool all = v.offset == 0 && v.heads * v.dim == v.base.size(2);
  const Tensor heads = all ? v.base : narrow(v.base, 2, v.offset, v.heads * v.dim);
  return permute(reshape(heads, {v.batch, v.len, v.heads, v.dim}), {0, 2, 1, 3});
}

/// The additive (B, NH, T, S)-broadcastable mask of dtype `dtype`, with its strides (0 on broadcast dims).
Tensor additive_mask(const Tensor& mask, DType dtype, int64_t B, int64_t NH, int64_t T, int64_t S, int64_t strides[4]) {
  if (mask.ndim() > 4) throw Error(fmt::format("attention: attn_mask has {} dims, at most 4 allowed", mask.ndim()));
  const int64_t full[4] = {B, NH, T, S};
  const auto padded = mask.shape().padded();  // kMaxDims = 5: the last four are (b, h, t, s)
  int64_t s = 1;
  for (int d = 3; d >= 0; --d) {
    const int64_t n = padded[size_t(d + 1)];
    if (n != 1 && n != full[d]) {
      shape_error("attention", "attn_mask must broadcast to (B, NH, T, S)", mask.shape(), Shape{B, NH, T, S});
    }
    strides[d] = n == 1 ? 0 : s;
    s *= n;
  }
  if (mask.dtype() == DType::Bool) return as_additive_mask(mask, dtype);
  if (mask.dtype() != dtype) {
    throw Error(fmt::format("attention: a float attn_mask must have the inputs' dtype ({}), got {}", dtype_name(dtype),
                            dtype_name(mask.dtype())));
  }
  return mask;
}

}  // namespace

namespace {

/// The options' settings with t5_buckets and max_rel from the tables' shapes, checked (check_score_mods), as is
/// the data that needs no geometry: key_doc_ids needs doc_ids.
ScoreModSettings resolved_settings(const ScoreModOptions& o) {
  ScoreModSettings s = o;
  auto from_table = [](auto& setting, int64_t rows, bool defined, const char* what, const char* table) {
    if (defined && setting != 0 && setting != rows) {
      throw Error(fmt::format("attention: {} is {} but {} gives {}", what, setting, table, rows));
    }
    if (!defined && setting != 0)
      throw Error(fmt::format("attention: {} is {} but there is no {}", what, setting, table));
    if (defined) setting = static_cast<std::remove_reference_t<decltype(setting)>>(rows);
  };
  const Tensor& t5 = o.t5_bias;
  from_table(s.t5_buckets, t5.defined() && t5.ndim() == 2 ? t5.size(1) : 0, t5.defined(), "t5_buckets",
             "t5_bias table (NH, buckets)");
  const Tensor& rel = o.relative_key.defined() ? o.relative_key : o.relative_value;
  const int64_t rows = rel.defined() && rel.ndim() == 2 ? rel.size(0) : 0;
  if (rel.defined() && rows % 2 == 0) {
    throw Error(fmt::format("attention: the relative position tables must have 2m + 1 rows, got shapes {} and {}",
                            o.relative_key.defined() ? o.relative_key.shape().str() : "-",
                            o.relative_value.defined() ? o.relative_value.shape().str() : "-"));
  }
  from_table(s.max_rel, (rows - 1) / 2, rel.defined(), "max_rel", "relative position table (2m + 1 rows)");
  check_score_mods(s, "attention");
  if (o.key_doc_ids.defined() && !o.doc_ids.defined())
    throw Error("attention: key_doc_ids needs doc_ids (the queries' documents)");
  return s;
}

/// g.mods from the options, checked against the attention's sizes (B, NH, T, S, E, Ev already in g); `rel_probs`
/// becomes the Pbar buffer (B, NH, T, 2m + 1) the relative values need.
void set_score_mods(AttentionGeom& g, const ScoreModOptions& o, const Tensor& q, Tensor& rel_probs) {
  ScoreMods& m = g.mods;
  static_cast<ScoreModSettings&>(m) = resolved_settings(o);
  auto check_ids = [&](const Tensor& ids, int64_t len, const char* what) {
    if (ids.dtype() != DType::I32 || !(ids.shape() == Shape{g.B, len}) || ids.device() != q.device()) {
      throw Error(fmt::format("attention: {} must be an i32 (B, {}) = ({}, {}) tensor on {}, got {} {} on {}", what,
                              len == g.T ? "T" : "S", g.B, len, device_name(q.device()), dtype_name(ids.dtype()),
                              ids.shape().str(), device_name(ids.device())));
    }
    return ids.data<int32_t>();
  };
  if (o.doc_ids.defined()) {
    m.q_doc = check_ids(o.doc_ids, g.T, "doc_ids");
    if (!o.key_doc_ids.defined() && g.T != g.S) {
      throw Error(
          fmt::format("attention: with {} queries and {} keys, key_doc_ids must give the keys' documents", g.T, g.S));
    }
    m.k_doc = o.key_doc_ids.defined() ? check_ids(o.key_doc_ids, g.S, "key_doc_ids") : m.q_doc;
  }
  auto check_table = [&](const Tensor& t, const char* what, int64_t rows, int64_t cols, const char* want) {
    detail::check_same("attention", q, t);
    if (t.ndim() != 2 || (rows >= 0 && t.size(0) != rows) || t.size(1) != cols) {
      throw Error(fmt::format("attention: {} must be {}, got shape {}", what, want, t.shape().str()));
    }
  };
  if (o.t5_bias.defined()) {
    check_table(o.t5_bias, "t5_bias", g.NH, m.t5_buckets, "(NH, buckets)");
    m.t5_bias = o.t5_bias.raw_data();
  }
  const Tensor& rk = o.relative_key;
  const Tensor& rv = o.relative_value;
  if (rk.defined() || rv.defined()) {
    const int64_t rows = m.rel_width();
    if (rk.defined()) check_table(rk, "relative_key", rows, g.E, "(2m + 1, E)");
    if (rv.defined()) check_table(rv, "relative_value", rows, g.Ev, "(2m + 1, Ev), with relative_key's rows");
    m.rel_k = rk.defined() ? rk.raw_data() : nullptr;
    m.rel_v = rv.defined() ? rv.raw_data() : nullptr;
    if (rv.defined()) rel_probs = empty({g.B, g.NH, g.T, rows}, q.dtype(), q.device());
  }
}

/// The weights path: scores, masks, softmax, dropout and the product with v as recorded ops, so the returned
/// weights are part of the graph (a loss on them reaches q, k and whatever produced them), as in
/// torch.nn.MultiheadAttention. `mask` is the additive attn_mask (may be undefined).
AttentionResult attention_with_weights(const HeadsView& qv, const HeadsView& kv, const HeadsView& vv,
                                       bool out_heads_last, const AttentionGeom& g, const Tensor& mask,
                                       const Tensor& key_padding, const AttentionOptions& o) {
  const int64_t B = g.B, NH = g.NH, NKV = g.NKV, T = g.T, S = g.S, G = NH / NKV;
  const Tensor q = heads_first_tensor(qv), k = heads_first_tensor(kv), v = heads_first_tensor(vv);
  // Query head h reads key/value head h / G, so the G query heads of a group stack into one (G * T)-row product.
  Tensor scores =
      reshape(matmul(reshape(q, {B, NKV, G * T, g.E}), k, false, true, o.numerics), {B, NH, T, S}) * g.scale;
  if (mask.defined()) scores = scores + mask;
  if (g.causal || key_padding.defined()) {
    const std::vector<uint8_t> padded =
        key_padding.defined() ? key_padding.to_vector<uint8_t>() : std::vector<uint8_t>();
    std::vector<uint8_t> hidden(size_t(B * T * S));  // (B, 1, T, S): causal and padding together
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t s = 0; s < S; ++s) {
          const bool after = g.causal && s > t + S - T;
          hidden[size_t((b * T + t) * S + s)] = after || (!padded.empty() && padded[size_t(b * S + s)]);
        }
    scores = scores + as_additive_mask(from_vector(hidden, {B, 1, T, S}).to(q.device()), q.dtype());
  }
  Tensor weights = softmax(scores);  // a row that sees no key is all zeros
  if (o.dropout_p > 0.0) weights = dropout(weights, o.dropout_p, o.dropout_seed);  // same mask as the kernels
  Tensor out = reshape(matmul(reshape(weights, {B, NKV, G * T, S}), v, false, false, o.numerics), {B, NH, T, g.Ev});
  if (out_heads_last) out = reshape(permute(out, {0, 2, 1, 3}), {B, T, NH * g.Ev});
  return {out, weights};
}

/// The call's geometry from the views and options, each checked: shapes that fit together, heads that divide, a
/// dropout probability in [0, 1). out layout: heads first (B, NH, T, Ev) or heads last (B, T, NH * Ev).
AttentionGeom geometry(const HeadsView& q, const HeadsView& k, const HeadsView& v, bool out_heads_last,
                       const AttentionOptions& o) {
  const Tensor& qb = q.base;
  if (qb.dtype() != DType::BF16) detail::check_float("attention", qb, "q");
  detail::check_same("attention", qb, k.base);
  detail::check_same("attention", qb, v.base);
  const int64_t B = q.batch, NH = q.heads, NKV = k.heads, T = q.len, S = k.len, E = q.dim, Ev = v.dim;
  if (k.batch != B || v.batch != B || v.heads != NKV || v.len != S || k.dim != E) {
    throw Error(
        fmt::format("attention: q (B={}, NH={}, T={}, E={}), k (B={}, NKV={}, S={}, E={}) and v (B={}, NKV={}, "
                    "S={}, Ev={}) do not fit together",
                    B, NH, T, E, k.batch, NKV, S, k.dim, v.batch, v.heads, v.len, Ev));
  }
  if (NKV == 0 || NH % NKV != 0) {
    throw Error(fmt::format("attention: {} query heads are not divisible by {} key/value heads", NH, NKV));
  }
  if (!(o.dropout_p >= 0.0 && o.dropout_p < 1.0))
    throw Error(fmt::format("attention: dropout_p must be in [0, 1), got {}", o.dropout_p));

  AttentionGeom g{};
  g.B = B, g.NH = NH, g.NKV = NKV, g.T = T, g.S = S, g.E = E, g.Ev = Ev;
  std::copy_n(q.stride, 3, g.q_stride);
  std::copy_n(k.stride, 3, g.k_stride);
  std::copy_n(v.stride, 3, g.v_stride);
  if (out_heads_last) {
    g.o_stride[0] = T * NH * Ev, g.o_stride[1] = Ev, g.o_stride[2] = NH * Ev;
  } else {
    g.o_stride[0] = NH * T * Ev, g.o_stride[1] = T * Ev, g.o_stride[2] = Ev;
  }
  g.scale = o.scale.value_or(1.0 / std::sqrt(double(E)));
  g.causal = o.is_causal;
  g.dropout_p = float(o.dropout_p);
  g.dropout_seed = o.dropout_seed;
  g.math = o.numerics.attention;
  g.flash = o.numerics.flash;
  return g;
}

/// One call of the op as the paths see it: the views, the output's layout (heads first (B, NH, T, Ev) or heads last
/// (B, T, NH * Ev)), the options and the checked geometry. qkv_partition: q, k and v are the three views of one fused
/// qkv tensor that together cover it (fused_self_attention), so a flash backward may write its gradient without its
/// being zeroed first.
struct Call {
  const HeadsView& q;
  const HeadsView& k;
  const HeadsView& v;
  bool out_heads_last;
  const AttentionOptions& o;
  bool qkv_partition;
  AttentionGeom g;

  bool bf16() const { return q.base.dtype() == DType::BF16; }
  Shape out_shape() const { return out_heads_last ? Shape{g.B, g.T, g.NH * g.Ev} : Shape{g.B, g.NH, g.T, g.Ev}; }
  /// The three views are one fused qkv, all of it: its gradient may be written uninitialized (record's mask 7).
  bool fused_partition() const {
    return qkv_partition && q.base.impl_ptr() == k.base.impl_ptr() && q.base.impl_ptr() == v.base.impl_ptr();
  }
};

AttentionResult attention(const HeadsView& q, const HeadsView& k, const HeadsView& v, bool out_heads_last,
                          const AttentionOptions& o, bool qkv_partition = false);

// --- The paths, in the order the op asks them (kPaths below).

/// A way to compute attention: its name (attention_paths(), the tests'), whether it takes a call, and its forward,
/// which records its backward; the kernels' paths also name their graph node and whether they are the naive kernels.
struct Path {
  using Run = AttentionResult (*)(const Call&, const Path&);
  const char* name;
  bool (*takes)(const Call&);
  Run run;  // every call's, or an f32 call's where run_f64 is set
  const char* node = nullptr;
  bool naive = false;
  Run run_f64 = nullptr;  // the kernels' f64 instantiation

  /// The forward that runs c on this path.
  Run forward(const Call& c) const { return run_f64 != nullptr && c.q.base.dtype() == DType::F64 ? run_f64 : run; }
};

/// bf16 tensors, a flash call without mask, padding or score modifier (dropout is taken): the flash kernels that read
/// and write bf16 as stored (kernels/cuda/flash_bf16.cuh, where flash_bf16_takes: head dim 64 or 128, aligned rows;
/// on the CPU kernels/cpu/attention.cpp, packing tiles from storage, any head dim or stride).
bool takes_flash_bf16(const Call& c) {
  const AttentionOptions& o = c.o;
  const bool lean = o.impl != AttentionImpl::Naive && !o.need_weights && !o.attn_mask.defined() &&
                    !o.key_padding_mask.defined() && !o.mods.any();
  if (!c.bf16() || !lean) return false;
  if (c.q.base.device() == Device::CPU) return true;
  const auto at = [](const HeadsView& x) { return x.base.data<bf16>() + x.offset; };
  return flash_bf16_takes(c.g, at(c.q), at(c.k), at(c.v), /*out: a fresh tensor, aligned*/ nullptr);
}

AttentionResult run_flash_bf16(const Call& c, const Path&) {
  const Tensor& qb = c.q.base;
  AttentionGeom g = c.g;
  g.math = AttentionMath::BF16;
  Tensor out = empty(c.out_shape(), DType::BF16, qb.device());
  const int64_t qo = c.q.offset, ko = c.k.offset, vo = c.v.offset;
  Tensor lse = empty({g.B, g.NH, g.T}, DType::F32, qb.device());
  launch(kernels::attention_flash_forward_bf16, qb.device(), out.data<bf16>(), lse.data<float>(), qb.data<bf16>() + qo,
         c.k.base.data<bf16>() + ko, c.v.base.data<bf16>() + vo, g);
  const Tensor saved_out = out.detach();
  out = record(
      "attention_flash_bf16", out, {qb, c.k.base, c.v.base},
      [=](const Tensor& dout, std::span<const Tensor> in, std::span<Tensor> grads) {
        AttentionGeom gb = g;
        gb.grads_unwritten = detail::unwritten(grads[0]) && detail::unwritten(grads[1]) && detail::unwritten(grads[2]);
        auto at = [](const Tensor& t, int64_t offset) { return t.defined() ? ptr<bf16>(t) + offset : nullptr; };
        // The GPU kernels load dout's rows 16 bytes at a time: a gradient that lies in a slice of a larger
        // buffer off a 16-byte boundary is copied first (a fresh tensor is aligned).
        const bool misaligned = reinterpret_cast<uintptr_t>(dout.raw_data()) % 16 != 0;
        const Tensor d = misaligned && dout.device() == Device::CUDA ? dout.clone() : dout;
        launch(kernels::attention_flash_backward_bf16, d.device(), at(grads[0], qo), at(grads[1], ko), at(grads[2], vo),
               d.data<bf16>(), in[0].data<bf16>() + qo, in[1].data<bf16>() + ko, in[2].data<bf16>() + vo,
               saved_out.data<bf16>(), lse.data<float>(), gb);
      },
      // As the f32 flash's: a fused qkv's three views are written together, all of it, uninitialized.
      c.fused_partition() ? 7u : 0u, /*unwritten_disjoint=*/true);
  return {out, Tensor()};
}

/// Every other call on bf16 tensors goes through f32 as a graph: cast, attention (the paths again), cast back.
bool takes_bf16_through_f32(const Call& c) { return c.bf16(); }

AttentionResult run_bf16_through_f32(const Call& c, const Path&) {
  // One f32 copy per distinct base: a fused qkv's three views stay views of one tensor (and keep qkv_partition).
  HeadsView q32 = c.q, k32 = c.k, v32 = c.v;
  q32.base = cast(c.q.base, DType::F32);
  const auto same = [](const HeadsView& a, const HeadsView& b) { return a.base.impl_ptr() == b.base.impl_ptr(); };
  k32.base = same(c.k, c.q) ? q32.base : cast(c.k.base, DType::F32);
  v32.base = same(c.v, c.q) ? q32.base : same(c.v, c.k) ? k32.base : cast(c.v.base, DType::F32);
  AttentionOptions o32 = c.o;
  if (o32.attn_mask.defined() && o32.attn_mask.dtype() == DType::BF16) o32.attn_mask = o32.attn_mask.to(DType::F32);
  AttentionResult r = attention(q32, k32, v32, c.out_heads_last, o32, c.qkv_partition);
  r.out = cast(r.out, DType::BF16);
  return r;
}

/// f32 and f64 tensors: the score modifiers' tables, the additive mask and the key padding, checked, in the geometry.
struct Prepared {
  AttentionGeom g;
  Tensor rel_probs;  // Pbar, when relative values are on: written by the forward, read by the backward
  Tensor mask;       // additive, of q's dtype
};

Prepared prepare(const Call& c) {
  Prepared p{c.g, Tensor(), Tensor()};
  const Tensor& qb = c.q.base;
  set_score_mods(p.g, c.o.mods, qb, p.rel_probs);
  p.g.mods.rel_probs = p.rel_probs.defined() ? p.rel_probs.raw_data() : nullptr;
  const int64_t B = c.g.B, NH = c.g.NH, T = c.g.T, S = c.g.S;
  if (c.o.attn_mask.defined()) p.mask = additive_mask(c.o.attn_mask, qb.dtype(), B, NH, T, S, p.g.mask_stride);
  const Tensor& kp = c.o.key_padding_mask;
  if (kp.defined() && (kp.dtype() != DType::Bool || !(kp.shape() == Shape{B, S}))) {
    throw Error(fmt::format("attention: key_padding_mask must be a bool (B, S) = ({}, {}) tensor, got {} {}", B, S,
                            dtype_name(kp.dtype()), kp.shape().str()));
  }
  return p;
}

/// need_weights without score modifiers: the math as recorded ops, so the weights are part of the graph.
bool takes_weights_graph(const Call& c) { return c.o.need_weights && !c.o.mods.any(); }

AttentionResult run_weights_graph(const Call& c, const Path&) {
  const Prepared p = prepare(c);
  return attention_with_weights(c.q, c.k, c.v, c.out_heads_last, p.g, p.mask, c.o.key_padding_mask, c.o);
}

/// The inputs of a fused qkv's three views (q, k and v: record()'s bits 0, 1 and 2).
constexpr uint32_t kQkvInputs = 0b111;

/// The kernels for T (f32 or f64), naive (its T x S weights; AttentionImpl::Naive, or need_weights with score
/// modifiers, the weights then outside the graph) or flash (on the GPU on tensor cores where cuda::flash_tensor_cores
/// says so, which the kernel follows); the path's node name is what TINYGPT_PROFILE reports.
template <class T>
AttentionResult run_kernels(const Call& c, const Path& path) {
  const bool naive = path.naive;
  const Prepared p = prepare(c);
  const AttentionGeom g = p.g;
  const Tensor mask = p.mask, rel_probs = p.rel_probs;
  const Tensor& qb = c.q.base;
  const Tensor& kp = c.o.key_padding_mask;
  const std::vector<Tensor> inputs{
      qb, c.k.base, c.v.base, mask, kp, c.o.mods.t5_bias, c.o.mods.relative_key, c.o.mods.relative_value};
  Tensor weights;  // need_weights with score modifiers: the naive kernel's, outside the graph
  if (c.o.need_weights) {
    const bool wants_grad = grad_enabled() && std::any_of(inputs.begin(), inputs.end(), [](const Tensor& t) {
                              return t.defined() && t.requires_grad();
                            });
    if (wants_grad) {
      throw Error(
          "attention: need_weights with score modifiers returns the weights outside the graph; ask for them "
          "under NoGradGuard, or drop need_weights");
    }
    weights = empty({g.B, g.NH, g.T, g.S}, qb.dtype(), qb.device());
  }
  Tensor out = empty(c.out_shape(), qb.dtype(), qb.device());
  const Tensor lse = empty({g.B, g.NH, g.T}, qb.dtype(), qb.device());
  const uint8_t* kp_ptr = kp.defined() ? kp.data<uint8_t>() : nullptr;
  const int64_t qo = c.q.offset, ko = c.k.offset, vo = c.v.offset;
  const T* qp = qb.data<T>() + qo;
  const T* kptr = c.k.base.data<T>() + ko;
  const T* vp = c.v.base.data<T>() + vo;
  if (naive) {
    launch(kernels::attention_naive_forward<T>, qb.device(), out.data<T>(), ptr<T>(weights), ptr<T>(lse), qp, kptr, vp,
           ptr<T>(mask), kp_ptr, g);
  } else {
    launch(kernels::attention_flash_forward<T>, qb.device(), out.data<T>(), ptr<T>(lse), qp, kptr, vp, ptr<T>(mask),
           kp_ptr, g);
  }
  const Tensor saved_out = out.detach();
  const Tensor doc_ids = c.o.mods.doc_ids, key_doc_ids = c.o.mods.key_doc_ids;  // held for g.mods' pointers
  out = record(
      path.node, out, inputs,
      [=](const Tensor& dout, std::span<const Tensor> in, std::span<Tensor> grads) {
        (void)doc_ids, (void)key_doc_ids, (void)rel_probs;
        AttentionGeom gb = g;
        gb.grads_unwritten = detail::unwritten(grads[0]) && detail::unwritten(grads[1]) && detail::unwritten(grads[2]);
        gb.mods.d_t5_bias = grads[5].defined() ? grads[5].raw_data() : nullptr;
        gb.mods.d_rel_k = grads[6].defined() ? grads[6].raw_data() : nullptr;
        gb.mods.d_rel_v = grads[7].defined() ? grads[7].raw_data() : nullptr;
        auto at = [](const Tensor& t, int64_t offset) { return t.defined() ? ptr<T>(t) + offset : nullptr; };
        const auto fn = naive ? kernels::attention_naive_backward<T> : kernels::attention_flash_backward<T>;
        launch(fn, dout.device(), at(grads[0], qo), at(grads[1], ko), at(grads[2], vo), dout.data<T>(),
               in[0].data<T>() + qo, in[1].data<T>() + ko, in[2].data<T>() + vo, saved_out.data<T>(), lse.data<T>(),
               ptr<T>(in[3]), in[4].defined() ? in[4].data<uint8_t>() : nullptr, gb);
      },
      // The flash kernels write the gradients of a fused qkv's three views, together all of it, uninitialized.
      !naive && c.fused_partition() ? kQkvInputs : 0u, /*unwritten_disjoint=*/true);
  return {out, weights};
}

bool takes_naive(const Call& c) { return c.o.impl == AttentionImpl::Naive || c.o.need_weights; }
/// The GPU's flash kernels with tf32 or bf16 operands on tensor cores (compute capability 8.0 or newer, tiles that
/// fit the GPU's shared memory at this head dim); other GPU calls run the f32 kernels on CUDA cores ("flash").
bool takes_flash_tensor_cores(const Call& c) {
  return c.q.base.device() == Device::CUDA && cuda::flash_tensor_cores(c.g.math, std::max(c.g.E, c.g.Ev));
}
bool takes_flash(const Call&) { return true; }

/// The op's one decision: the first path that takes a call runs it.
constexpr Path kPaths[] = {
    {"flash_bf16_storage", takes_flash_bf16, run_flash_bf16},
    {"bf16_through_f32", takes_bf16_through_f32, run_bf16_through_f32},
    {"weights_graph", takes_weights_graph, run_weights_graph},
    {"naive", takes_naive, run_kernels<float>, "attention_naive", /*naive=*/true, run_kernels<double>},
    {"flash_tensor_cores", takes_flash_tensor_cores, run_kernels<float>, "attention_flash_tensor_cores", false,
     run_kernels<double>},
    {"flash", takes_flash, run_kernels<float>, "attention_flash", false, run_kernels<double>},
};

const Path& path_for(const Call& c) {
  for (const Path& p : kPaths) {
    if (p.takes(c)) return p;
  }
  throw Error("attention: no path takes this call");  // unreachable: flash takes every call
}

/// The path that runs c, named by TINYGPT_PROFILE=1.
const Path& chosen_path(const Call& c) {
  const Path& p = path_for(c);
  if (profile::enabled()) profile::add_choice("attention path", p.name);
  return p;
}

Call make_call(const HeadsView& q, const HeadsView& k, const HeadsView& v, bool out_heads_last,
               const AttentionOptions& o, bool qkv_partition) {
  Call c{q, k, v, out_heads_last, o, qkv_partition, geometry(q, k, v, out_heads_last, o)};
  if (o.need_weights && o.impl == AttentionImpl::Flash) {
    throw Error(
        "attention: need_weights materializes the (B, NH, T, S) weights, which flash attention never holds; "
        "use AttentionImpl::Auto or Naive");
  }
  if (c.bf16())
    resolved_settings(o.mods);  // the lean path reads no modifier, but bad settings are refused on every path
  return c;
}

AttentionResult attention(const HeadsView& q, const HeadsView& k, const HeadsView& v, bool out_heads_last,
                          const AttentionOptions& o, bool qkv_partition) {
  const Call c = make_call(q, k, v, out_heads_last, o, qkv_partition);
  const Path& p = chosen_path(c);
  return p.forward(c)(c, p);
}

}  // namespace

AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionOptions& options) {
  return attention(heads_first(q, "q"), heads_first(k, "k"), heads_first(v, "v"), false, options);
}

std::vector<std::string_view> attention_paths() {
  std::vector<std::string_view> names;
  for (const Path& p : kPaths) names.emplace_back(p.name);
  return names;
}

std::string_view attention_path(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options) {
  const HeadsView qv = heads_first(q, "q"), kv = heads_first(k, "k"), vv = heads_first(v, "v");
  return path_for(make_call(qv, kv, vv, false, options, false)).name;
}

AttentionResult fused_self_attention(const Tensor& qkv, int64_t num_heads, int64_t num_kv_heads,
                                     const AttentionOptions& options) {
  const int64_t total = num_heads + 2 * num_kv_heads;
  if (qkv.ndim() != 3 || num_heads <= 0 || num_kv_heads <= 0 || qkv.size(2) % total != 0) {
    throw Error(
        fmt::format("attention: fused qkv must be (B, T, (NH + 2 NKV) * E) with NH = {}, NKV = {}; got shape {}",
                    num_heads, num_kv_heads, qkv.shape().str()));
  }
  const int64_t E = qkv.size(2) / total;
  const HeadsView q = heads_last(qkv, 0, num_heads, total, E), k = heads_last(qkv, num_heads, num_kv_heads, total, E),
                  v = heads_last(qkv, num_heads + num_kv_heads, num_kv_heads, total, E);
  // The training step's call: the op's decision made here, as attention() makes it for the other entries.
  const Call c = make_call(q, k, v, /*out_heads_last=*/true, options, /*qkv_partition=*/true);
  const Path& p = chosen_path(c);
  return p.forward(c)(c, p);
}

AttentionResult packed_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t num_heads,
                                 int64_t num_kv_heads, const AttentionOptions& options) {
  auto check = [&](const Tensor& t, int64_t heads, const char* what) {
    if (t.ndim() != 3 || heads <= 0 || t.size(2) % heads != 0) {
      throw Error(fmt::format("attention: {} must be (B, len, heads * dim) with {} heads; got shape {}", what, heads,
                              t.shape().str()));
    }
    return t.size(2) / heads;
  };
  const int64_t E = check(q, num_heads, "q"), Ek = check(k, num_kv_heads, "k"), Ev = check(v, num_kv_heads, "v");
  return attention(heads_last(q, 0, num_heads, num_heads, E), heads_last(k, 0, num_kv_heads, num_kv_heads, Ek),
                   heads_last(v, 0, num_kv_heads, num_kv_heads, Ev), true, options);
}

Tensor cached_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, int64_t len, int64_t num_heads,
                        int64_t num_kv_heads, const Numerics& numerics, const ScoreModOptions& mods) {
  if (q.ndim() != 3 || k_cache.ndim() != 3 || v_cache.ndim() != 3 || num_heads <= 0 || num_kv_heads <= 0 ||
      q.size(2) % num_heads != 0 || k_cache.size(2) % num_kv_heads != 0 || v_cache.size(2) % num_kv_heads != 0) {
    throw Error(
        fmt::format("cached_attention: q must be (B, T, NH * E) and the caches (B, capacity, NKV * E) with NH = {}, "
                    "NKV = {}; got {}, {} and {}",
                    num_heads, num_kv_heads, q.shape().str(), k_cache.shape().str(), v_cache.shape().str()));
  }
  if (len < q.size(1) || len > k_cache.size(1) || v_cache.size(1) != k_cache.size(1)) {
    throw Error(fmt::format("cached_attention: {} positions with {} queries do not fit caches {} and {}", len,
                            q.size(1), k_cache.shape().str(), v_cache.shape().str()));
  }
  if (k_cache.requires_grad() || v_cache.requires_grad())
    throw Error("cached_attention: the caches must not require a gradient");
  // The first `len` positions of a (B, capacity, heads * D) cache, read in place.
  auto cached = [len](const Tensor& t, int64_t heads) {
    HeadsView view = heads_last(t, 0, heads, heads, t.size(2) / heads);
    view.len = len;
    return view;
  };
  AttentionOptions o;
  o.is_causal = true;
  o.numerics = numerics;
  o.mods = mods;
  return attention(heads_last(q, 0, num_heads, num_heads, q.size(2) / num_heads), cached(k_cache, num_kv_heads),
                   cached(v_cache, num_kv_heads), true, o)
      .out;
}

Tensor as_additive_mask(const Tensor& mask, DType dtype) {
  if (mask.dtype() != DType::Bool) return mask;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const std::vector<uint8_t> bits = mask.to_vector<uint8_t>();
  std::vector<double> add(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) add[i] = bits[i] ? -kInf : 0.0;
  return from_vector(add, mask.shape()).to(dtype).to(mask.device());
}

}  // namespace tinygpt

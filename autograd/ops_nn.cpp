// Ops with fused kernels: softmax, matmul, linear, the MLP, layernorm, embedding, cross-entropy, dropout.
#include <optional>

#include "autograd/op_helpers.h"
#include "autograd/ops.h"
#include "kernels/device.h"

namespace tinygpt {

using detail::ptr;

namespace {

/// Rows (product of all but the last dim) and the last dim of x.
std::pair<int64_t, int64_t> rows_cols(const Tensor& x) {
  const int64_t C = x.ndim() == 0 ? 1 : x.shape()[-1];
  return {C == 0 ? 0 : x.numel() / C, C};
}

/// Throws unless every id in ids (i32) lies in [0, limit), or equals `allowed` when given.
void check_ids(const char* op, const char* what, const Tensor& ids, int64_t limit,
               std::optional<int32_t> allowed = {}) {
  if (ids.dtype() != DType::I32)
    throw Error(fmt::format("{}: {} must be i32, got {}", op, what, dtype_name(ids.dtype())));
  const std::vector<int32_t> v = ids.to_vector<int32_t>();
  for (size_t i = 0; i < v.size(); ++i) {
    if ((v[i] < 0 || v[i] >= limit) && v[i] != allowed) {
      throw Error(fmt::format("{}: {} {} at position {} is out of range [0, {})", op, what, v[i], i, limit));
    }
  }
}

/// Softmax (or log-softmax) over the last dim; backward reads the saved output.
Tensor rowwise_softmax(const char* name, const Tensor& x, bool log) {
  detail::check_float(name, x);
  const auto [N_, C_] = rows_cols(x);
  const int64_t N = N_, C = C_;  // plain variables: clang 14 cannot capture structured bindings
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  dispatch_float(x.dtype(), name, [&]<class T>() {
    launch(log ? kernels::log_softmax_forward<T> : kernels::softmax_forward<T>, x.device(), out.data<T>(), x.data<T>(),
           N, C);
  });
  const Tensor saved = out.detach();
  return record(name, out, {x}, [=](const Tensor& dout, std::span<const Tensor>, std::span<Tensor> grads) {
    dispatch_float(dout.dtype(), name, [&]<class T>() {
      launch(log ? kernels::log_softmax_backward<T> : kernels::softmax_backward<T>, dout.device(), grads[0].data<T>(),
             dout.data<T>(), saved.data<T>(), N, C);
    });
  });
}

}  // namespace

Tensor softmax(const Tensor& x) { return rowwise_softmax("softmax", x, false); }
Tensor log_softmax(const Tensor& x) { return rowwise_softmax("log_softmax", x, true); }

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, const Numerics& numerics) {
  const MatmulMath math = numerics.matmul();
  detail::check_storage("matmul", a, "first operand");
  detail::check_storage("matmul", b, "second operand");
  detail::check_same("matmul", a, b);
  if (a.ndim() < 2 || b.ndim() < 2) shape_error("matmul", "operands need at least 2 dims", a.shape(), b.shape());
  const int64_t M = trans_a ? a.size(-1) : a.size(-2);
  const int64_t K = trans_a ? a.size(-2) : a.size(-1);
  const int64_t Kb = trans_b ? b.size(-1) : b.size(-2);
  const int64_t N = trans_b ? b.size(-2) : b.size(-1);
  if (K != Kb) shape_error("matmul", fmt::format("inner dimensions differ ({} vs {})", K, Kb), a.shape(), b.shape());
  const int64_t batch_a = detail::dims_product(a.shape(), 0, a.ndim() - 2);
  const int64_t batch_b = detail::dims_product(b.shape(), 0, b.ndim() - 2);
  const Tensor& batched = a.ndim() >= b.ndim() ? a : b;
  if (a.ndim() > 2 && b.ndim() > 2 &&
      !std::equal(a.shape().begin(), a.shape().end() - 2, b.shape().begin(), b.shape().end() - 2)) {
    shape_error("matmul", "batch dimensions differ", a.shape(), b.shape());
  }
  std::vector<int64_t> dims(batched.shape().begin(), batched.shape().end() - 2);
  dims.push_back(M);
  dims.push_back(N);
  Tensor out = empty(Shape(dims), a.dtype(), a.device());
  const MatmulGeom geom{.batch_a = batch_a,
                        .batch_b = batch_b,
                        .M = M,
                        .K = K,
                        .N = N,
                        .trans_a = trans_a,
                        .trans_b = trans_b,
                        .math = math};
  dispatch_storage(a.dtype(), "matmul", [&]<class T>() {
    launch(kernels::matmul_forward<T>, a.device(), out.data<T>(), a.data<T>(), b.data<T>(), geom);
  });
  return record("matmul", out, {a, b}, [=](const Tensor& dout, std::span<const Tensor> in, std::span<Tensor> grads) {
    dispatch_storage(dout.dtype(), "matmul", [&]<class T>() {
      launch(kernels::matmul_backward<T>, dout.device(), ptr<T>(grads[0]), ptr<T>(grads[1]), dout.data<T>(),
             in[0].data<T>(), in[1].data<T>(), geom);
    });
  });
}

/// Checks linear's operands (x (..., C), weight (OC, C), bias (OC) or undefined); returns OC.
int64_t check_linear(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  detail::check_storage(op, x);
  detail::check_storage(op, weight, "weight");
  detail::check_same(op, x, weight);
  if (weight.ndim() != 2 || x.ndim() < 1 || x.size(-1) != weight.size(1)) {
    shape_error(op, "input (..., C) needs weight (OC, C)", x.shape(), weight.shape());
  }
  const int64_t OC = weight.size(0);
  if (bias.defined()) {
    detail::check_same(op, x, bias);
    if (bias.ndim() != 1 || bias.size(0) != OC) shape_error(op, "bias must be (OC)", bias.shape(), weight.shape());
  }
  return OC;
}

/// x's shape with the last dimension n.
Shape with_last(const Tensor& x, int64_t n) {
  std::vector<int64_t> dims = x.shape().vec();
  dims.back() = n;
  return Shape(dims);
}

namespace {

/// Where the GPU keeps a layer's input rounded to bf16 from the forward product to the backward one (the kernels'
/// inp16): n bf16 values, two to an I32 element. Undefined, and nothing kept, on the CPU (its GEMM rounds as it packs)
/// or without bf16 products.
Tensor bf16_operand(const Tensor& x, int64_t n, MatmulMath math) {
  if (x.device() != Device::CUDA || math != MatmulMath::BF16 || x.dtype() != DType::F32) return Tensor();
  return empty({(n + 1) / 2}, DType::I32, x.device());
}

uint16_t* bf16_bits(const Tensor& t) { return t.defined() ? reinterpret_cast<uint16_t*>(ptr<int32_t>(t)) : nullptr; }

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Numerics& numerics) {
  const MatmulMath math = numerics.matmul();
  const bool lt = numerics.lt_epilogues;
  const int64_t OC = check_linear("linear", x, weight, bias);
  const auto [N_, C_] = rows_cols(x);
  const int64_t N = N_, C = C_;  // plain variables: clang 14 cannot capture structured bindings
  Tensor out = empty(with_last(x, OC), x.dtype(), x.device());
  const Tensor x16 = bf16_operand(x, N * C, math);
  dispatch_storage(x.dtype(), "linear", [&]<class T>() {
    launch(kernels::linear_forward<T>, x.device(),
           LinearForward<T>{.out = out.data<T>(),
                            .inp = x.data<T>(),
                            .weight = weight.data<T>(),
                            .bias = ptr<T>(bias),
                            .N = N,
                            .C = C,
                            .OC = OC,
                            .math = math,
                            .inp16 = bf16_bits(x16),
                            .lt_epilogues = lt});
  });
  return record(
      "linear", out, {x, weight, bias},
      [=](const Tensor& dout, std::span<const Tensor> in, std::span<Tensor> grads) {
        dispatch_storage(dout.dtype(), "linear", [&]<class T>() {
          launch(kernels::linear_backward<T>, dout.device(),
                 LinearBackward<T>{.dinp = ptr<T>(grads[0]),
                                   .dweight = ptr<T>(grads[1]),
                                   .dbias = ptr<T>(grads[2]),
                                   .dout = dout.data<T>(),
                                   .inp = in[0].data<T>(),
                                   .weight = in[1].data<T>(),
                                   .N = N,
                                   .C = C,
                                   .OC = OC,
                                   .math = math,
                                   .overwrite_dinp = detail::unwritten(grads[0]),
                                   .inp16 = bf16_bits(x16),
                                   .lt_epilogues = lt});
        });
      },
      /*writes_unwritten=*/1u);
}

namespace {

/// mlp's activations: pre = x w_fc^T + b_fc, h = act(pre) (or only its bf16 copy h16), out; x16: x rounded, or none.
struct MlpActivations {
  Tensor pre, h, out, x16, h16;  // handles: the tensors mlp holds
};

/// mlp's two products: pre and h from the first (the activation in its epilogue), out from the second.
void mlp_forward(const Tensor& x, const Tensor& w_fc, const Tensor& b_fc, const Tensor& w_proj, const Tensor& b_proj,
                 Activation act, const MlpActivations& a, MatmulMath math, bool lt) {
  Tensor pre = a.pre, h = a.h, out = a.out, x16 = a.x16, h16 = a.h16;
  const auto [N_, C_] = rows_cols(x);
  const int64_t N = N_, C = C_, H = pre.size(pre.ndim() - 1), OC = out.size(out.ndim() - 1);
  dispatch_storage(x.dtype(), "mlp", [&]<class T>() {
    launch(kernels::linear_forward<T>, x.device(),
           LinearForward<T>{.out = pre.data<T>(),
                            .inp = x.data<T>(),
                            .weight = w_fc.data<T>(),
                            .bias = ptr<T>(b_fc),
                            .N = N,
                            .C = C,
                            .OC = H,
                            .math = math,
                            .act = act,
                            .act_out = ptr<T>(h),
                            .inp16 = bf16_bits(x16),
                            .act16 = bf16_bits(h16),
                            .lt_epilogues = lt});
    launch(kernels::linear_forward<T>, x.device(),
           LinearForward<T>{.out = out.data<T>(),
                            .inp = ptr<T>(h),
                            .weight = w_proj.data<T>(),
                            .bias = ptr<T>(b_proj),
                            .N = N,
                            .C = H,
                            .OC = OC,
                            .math = math,
                            .inp16 = bf16_bits(h16),
                            .lt_epilogues = lt});
  });
}

}  // namespace

Tensor mlp(const Tensor& x, const Tensor& w_fc, const Tensor& b_fc, const Tensor& w_proj, const Tensor& b_proj,
           Activation act, const Numerics& numerics) {
  if (act == Activation::None) throw Error("mlp: needs an activation (GELU or ReLU squared); use linear for none");
  const MatmulMath math = numerics.matmul();
  const bool lt = numerics.lt_epilogues;
  const int64_t H = check_linear("mlp", x, w_fc, b_fc);
  if (w_proj.defined() && w_proj.ndim() == 2 && w_proj.size(1) != H) {
    shape_error("mlp", "the hidden width of w_fc (H, C) must be w_proj's (OC, H)", w_fc.shape(), w_proj.shape());
  }
  Tensor pre = empty(with_last(x, H), x.dtype(), x.device());
  const int64_t OC = check_linear("mlp", pre, w_proj, b_proj);
  const auto [N_, C_] = rows_cols(x);
  const int64_t N = N_, C = C_;
  // pre = x w_fc^T + b_fc and h = act(pre) from one product (the activation in its epilogue); both kept for backward.
  // Where the GPU keeps h rounded to bf16 (h16), the first product writes only that copy of h: the second product's
  // operand, and its weight gradient's in backward. The f32 h is never made.
  const Tensor x16 = bf16_operand(x, N * C, math), h16 = bf16_operand(x, N * H, math);
  const Tensor h = h16.defined() ? Tensor() : empty(pre.shape(), x.dtype(), x.device());
  Tensor out = empty(with_last(x, OC), x.dtype(), x.device());
  mlp_forward(x, w_fc, b_fc, w_proj, b_proj, act, {.pre = pre, .h = h, .out = out, .x16 = x16, .h16 = h16}, math, lt);
  return record(
      "mlp", out, {x, w_fc, b_fc, w_proj, b_proj},
      [=](const Tensor& dout, std::span<const Tensor> in, std::span<Tensor> grads) {
        const bool first = grads[0].defined() || grads[1].defined() || grads[2].defined();
        // The gradient at pre, dout w_proj * act'(pre), formed with act' in the product's epilogue.
        const Tensor dpre = first ? empty(pre.shape(), dout.dtype(), dout.device()) : Tensor();
        dispatch_storage(dout.dtype(), "mlp", [&]<class T>() {
          launch(kernels::linear_backward<T>, dout.device(),
                 LinearBackward<T>{.dinp = ptr<T>(dpre),
                                   .dweight = ptr<T>(grads[3]),
                                   .dbias = ptr<T>(grads[4]),
                                   .dout = dout.data<T>(),
                                   .inp = ptr<T>(h),
                                   .weight = in[3].data<T>(),
                                   .N = N,
                                   .C = H,
                                   .OC = OC,
                                   .math = math,
                                   .overwrite_dinp = true,
                                   .act = act,
                                   .act_of = pre.data<T>(),
                                   .inp16 = bf16_bits(h16),
                                   .lt_epilogues = lt});
          if (first) {
            launch(kernels::linear_backward<T>, dout.device(),
                   LinearBackward<T>{.dinp = ptr<T>(grads[0]),
                                     .dweight = ptr<T>(grads[1]),
                                     .dbias = ptr<T>(grads[2]),
                                     .dout = dpre.data<T>(),
                                     .inp = in[0].data<T>(),
                                     .weight = in[1].data<T>(),
                                     .N = N,
                                     .C = C,
                                     .OC = H,
                                     .math = math,
                                     .overwrite_dinp = detail::unwritten(grads[0]),
                                     .inp16 = bf16_bits(x16),
                                     .lt_epilogues = lt});
          }
        });
      },
      /*writes_unwritten=*/1u);
}

namespace {

/// Checks layer norm's operands; returns its rows and features.
std::pair<int64_t, int64_t> check_layer_norm(const char* op, const Tensor& x, const Tensor& weight,
                                             const Tensor& bias) {
  detail::check_storage(op, x);
  detail::check_storage(op, weight, "weight");
  detail::check_same(op, x, weight);
  const auto [N, C] = rows_cols(x);
  if (weight.ndim() != 1 || weight.size(0) != C) shape_error(op, "weight must be (C)", x.shape(), weight.shape());
  if (bias.defined()) {
    detail::check_same(op, x, bias);
    if (!(bias.shape() == weight.shape())) shape_error(op, "bias must be (C)", x.shape(), bias.shape());
  }
  return {N, C};
}

// layer_norm and rms_norm share these: an RMSNorm is a layer norm without mean (undefined here) and bias, run by the
// rmsnorm kernels.

/// Records the norm's backward for out = norm(x, weight, bias), whose statistics are mean and rstd.
Tensor record_norm(Tensor out, const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& mean,
                   const Tensor& rstd, int64_t N, int64_t C, bool rms) {
  return record(
      rms ? "rms_norm" : "layer_norm", std::move(out), {x, weight, bias},
      [=](const Tensor& dout, std::span<const Tensor> in, std::span<Tensor> grads) {
        dispatch_storage(dout.dtype(), "layer_norm", [&]<class T>() {
          if (rms) {
            launch(kernels::rmsnorm_backward<T>, dout.device(), ptr<T>(grads[0]), ptr<T>(grads[1]), dout.data<T>(),
                   in[0].data<T>(), in[1].data<T>(), rstd.data<compute_t<T>>(), N, C, detail::unwritten(grads[0]));
          } else {
            launch(kernels::layernorm_backward<T>, dout.device(), ptr<T>(grads[0]), ptr<T>(grads[1]), ptr<T>(grads[2]),
                   dout.data<T>(), in[0].data<T>(), in[1].data<T>(), mean.data<compute_t<T>>(),
                   rstd.data<compute_t<T>>(), N, C, detail::unwritten(grads[0]));
          }
        });
      },
      /*writes_unwritten=*/1u);
}

Tensor norm(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, bool rms) {
  const auto rows_features = check_layer_norm(op, x, weight, bias);
  const int64_t N = rows_features.first, C = rows_features.second;  // clang 14 cannot capture structured bindings
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  const Tensor mean = rms ? Tensor() : empty({N}, detail::compute_dtype(x.dtype()), x.device());
  const Tensor rstd = empty({N}, detail::compute_dtype(x.dtype()), x.device());
  dispatch_storage(x.dtype(), op, [&]<class T>() {
    if (rms) {
      launch(kernels::rmsnorm_forward<T>, x.device(), out.data<T>(), ptr<compute_t<T>>(rstd), x.data<T>(),
             weight.data<T>(), N, C, compute_t<T>(eps));
    } else {
      launch(kernels::layernorm_forward<T>, x.device(), out.data<T>(), ptr<compute_t<T>>(mean), ptr<compute_t<T>>(rstd),
             x.data<T>(), weight.data<T>(), ptr<T>(bias), N, C, compute_t<T>(eps));
    }
  });
  return record_norm(out, x, weight, bias, mean, rstd, N, C, rms);
}

std::pair<Tensor, Tensor> add_norm(const char* op, const Tensor& a, const Tensor& b, const Tensor& weight,
                                   const Tensor& bias, double eps, double p, DropoutSeed seed, bool rms) {
  const auto rows_features = check_layer_norm(op, a, weight, bias);
  const int64_t N = rows_features.first, C = rows_features.second;  // clang 14 cannot capture structured bindings
  detail::check_same(op, a, b);
  if (!(a.shape() == b.shape())) shape_error(op, "a and b must have one shape", a.shape(), b.shape());
  if (!(p >= 0.0 && p < 1.0)) throw Error(fmt::format("{}: dropout probability must be in [0, 1), got {}", op, p));
  Tensor sum = empty(a.shape(), a.dtype(), a.device()), out = empty(a.shape(), a.dtype(), a.device());
  const Tensor mean = rms ? Tensor() : empty({N}, detail::compute_dtype(a.dtype()), a.device());
  const Tensor rstd = empty({N}, detail::compute_dtype(a.dtype()), a.device());
  dispatch_storage(a.dtype(), op, [&]<class T>() {
    const AddNormForward<T> c{.sum = sum.data<T>(),
                              .out = out.data<T>(),
                              .mean = ptr<compute_t<T>>(mean),
                              .rstd = ptr<compute_t<T>>(rstd),
                              .a = a.data<T>(),
                              .b = b.data<T>(),
                              .weight = weight.data<T>(),
                              .bias = ptr<T>(bias),
                              .N = N,
                              .C = C,
                              .eps = compute_t<T>(eps),
                              .p = float(p),
                              .seed = seed};
    launch(rms ? kernels::add_rmsnorm_forward<T> : kernels::add_layernorm_forward<T>, a.device(), c);
  });
  // Two nodes, as the two ops would record: the sum's gradient (from its other readers and from the norm) reaches a
  // and b once it is complete; b's through the dropout's mask when there is one.
  sum = record(
      "add", sum, {a, b},
      [=](const Tensor& dout, std::span<const Tensor>, std::span<Tensor> grads) {
        for (size_t i = 0; i < grads.size(); ++i) {
          Tensor& g = grads[i];
          if (i == 1 && p > 0.0 && g.defined()) {
            dispatch_storage(dout.dtype(), "add_layer_norm", [&]<class T>() {
              launch(kernels::dropout_backward<T>, dout.device(), g.data<T>(), dout.data<T>(), dout.numel(), float(p),
                     seed);
            });
          } else if (detail::unwritten(g)) {
            g.copy_(dout);
          } else if (g.defined()) {
            accumulate_into(g, dout);
          }
        }
      },
      /*writes_unwritten=*/p > 0.0 ? 1u : 3u);
  return {sum, record_norm(out, sum, weight, bias, mean, rstd, N, C, rms)};
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  return norm("layer_norm", x, weight, bias, eps, false);
}

std::pair<Tensor, Tensor> add_layer_norm(const Tensor& a, const Tensor& b, const Tensor& weight, const Tensor& bias,
                                         double eps, double p, DropoutSeed seed) {
  return add_norm("add_layer_norm", a, b, weight, bias, eps, p, seed, false);
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  return norm("rms_norm", x, weight, Tensor(), eps, true);
}

std::pair<Tensor, Tensor> add_rms_norm(const Tensor& a, const Tensor& b, const Tensor& weight, double eps, double p,
                                       DropoutSeed seed) {
  return add_norm("add_rms_norm", a, b, weight, Tensor(), eps, p, seed, true);
}

Tensor swiglu(const Tensor& x) {
  detail::check_storage("swiglu", x);
  if (x.ndim() < 1 || x.size(-1) % 2 != 0) {
    throw Error(
        fmt::format("swiglu: the last dimension must be even (gate and up side by side), got {}", x.shape().str()));
  }
  const int64_t H = x.size(-1) / 2, N = H == 0 ? 0 : x.numel() / (2 * H);
  std::vector<int64_t> shape = x.shape().vec();
  shape.back() = H;
  Tensor out = empty(Shape(shape), x.dtype(), x.device());
  dispatch_storage(x.dtype(), "swiglu", [&]<class T>() {
    launch(kernels::swiglu_forward<T>, x.device(), out.data<T>(), x.data<T>(), N, H);
  });
  return record(
      "swiglu", std::move(out), {x},
      [=](const Tensor& dout, std::span<const Tensor> in, std::span<Tensor> grads) {
        dispatch_storage(dout.dtype(), "swiglu", [&]<class T>() {
          launch(kernels::swiglu_backward<T>, dout.device(), grads[0].data<T>(), dout.data<T>(), in[0].data<T>(), N, H,
                 detail::unwritten(grads[0]));
        });
      },
      /*writes_unwritten=*/1u);
}

Tensor embedding(const Tensor& ids, const Tensor& weight) {
  detail::check_storage("embedding", weight, "weight");
  if (weight.ndim() != 2) shape_error("embedding", "weight must be (V, C)", ids.shape(), weight.shape());
  if (ids.device() != weight.device()) throw Error("embedding: ids and weight are on different devices");
  const int64_t V = weight.size(0), C = weight.size(1), N = ids.numel();
  check_ids("embedding", "id", ids, V);
  std::vector<int64_t> dims = ids.shape().vec();
  dims.push_back(C);
  Tensor out = empty(Shape(dims), weight.dtype(), weight.device());
  dispatch_storage(weight.dtype(), "embedding", [&]<class T>() {
    launch(kernels::embedding_forward<T>, weight.device(), out.data<T>(), ids.data<int32_t>(), weight.data<T>(), N, C);
  });
  return record("embedding", out, {ids, weight},
                [=](const Tensor& dout, std::span<const Tensor> in, std::span<Tensor> grads) {
                  dispatch_storage(dout.dtype(), "embedding", [&]<class T>() {
                    launch(kernels::embedding_backward<T>, dout.device(), grads[1].data<T>(), dout.data<T>(),
                           in[0].data<int32_t>(), cuda::capturing() ? nullptr : in[0].host_copy(), N, in[1].size(0), C);
                  });
                });
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int32_t ignore_index) {
  detail::check_storage("cross_entropy", logits, "logits");
  const auto [N_, V_] = rows_cols(logits);
  const int64_t N = N_, V = V_;  // plain variables: clang 14 cannot capture structured bindings
  if (logits.ndim() < 1 || targets.numel() != N ||
      !std::equal(targets.shape().begin(), targets.shape().end(), logits.shape().begin(), logits.shape().end() - 1)) {
    shape_error("cross_entropy", "logits (..., V) need targets (...)", logits.shape(), targets.shape());
  }
  if (targets.device() != logits.device()) throw Error("cross_entropy: logits and targets are on different devices");
  check_ids("cross_entropy", "target", targets, V, ignore_index);
  int64_t count = 0;
  for (int32_t t : targets.to_vector<int32_t>()) count += t != ignore_index;
  // The losses, the log-sum-exp and the loss are f32 for bf16 logits (compute_dtype).
  const DType loss_dtype = detail::compute_dtype(logits.dtype());
  const Tensor losses = empty({N}, loss_dtype, logits.device());
  const Tensor lse = empty({N}, loss_dtype, logits.device());
  const double inv_count = count > 0 ? 1.0 / double(count) : 0.0;
  // Training (a gradient will be asked for): the fused classifier writes the logits' gradient for a loss gradient of
  // 1 in the pass that computes the loss, so backward reads the logits again only when the loss gradient is not 1.
  const bool fused = grad_enabled() && logits.requires_grad();
  const Tensor dlogits = fused ? empty(logits.shape(), logits.dtype(), logits.device()) : Tensor();
  const auto handed_out = std::make_shared<bool>(false);  // dlogits went to a slot (and may since have changed)
  dispatch_storage(logits.dtype(), "cross_entropy", [&]<class T>() {
    if (fused) {
      launch(kernels::crossentropy_fused<T>, logits.device(), ptr<compute_t<T>>(losses), ptr<compute_t<T>>(lse),
             ptr<T>(dlogits), logits.data<T>(), targets.data<int32_t>(), compute_t<T>(inv_count), N, V, ignore_index);
    } else {
      launch(kernels::crossentropy_forward<T>, logits.device(), ptr<compute_t<T>>(losses), ptr<compute_t<T>>(lse),
             logits.data<T>(), targets.data<int32_t>(), N, V, ignore_index);
    }
  });
  Tensor out;
  {
    NoGradGuard no_grad;
    out = count > 0 ? scale(sum(losses), inv_count) : zeros({}, loss_dtype, logits.device());
  }
  return record(
      "cross_entropy", out, {logits, targets},
      [=](const Tensor& dout, std::span<const Tensor> in, std::span<Tensor> grads) {
        // A slot no op has written takes the fused gradient (rewritten below unless dout is 1); one
        // already written gets the gradient added, from the logits. dlogits is handed out once: a second
        // backward (retain_graph) finds it taken, and the slot is zeroed and added to.
        const bool adopt = detail::unwritten(grads[0]) && !*handed_out;
        if (adopt) {
          grads[0] = dlogits;
          *handed_out = true;
        } else if (detail::unwritten(grads[0])) {
          grads[0].zero_();
        }
        if (count == 0) return;
        dispatch_storage(in[0].dtype(), "cross_entropy", [&]<class T>() {
          launch(kernels::crossentropy_backward<T>, dout.device(), grads[0].data<T>(), dout.data<compute_t<T>>(),
                 compute_t<T>(inv_count), in[0].data<T>(), lse.data<compute_t<T>>(), in[1].data<int32_t>(), N, V,
                 ignore_index, adopt);
        });
      },
      /*writes_unwritten=*/1u);
}

Tensor rope(const Tensor& x, int64_t head_dim, int64_t rotated_heads, int64_t pos0, RopeFreqs freqs) {
  detail::check_storage("rope", x);
  if (x.ndim() != 3 || head_dim <= 0 || head_dim % 2 != 0 || x.size(2) % head_dim != 0) {
    throw Error(
        fmt::format("rope: x must be (B, L, NH * E) with an even head_dim E dividing the last dim; got shape {} "
                    "and head_dim {}",
                    x.shape().str(), head_dim));
  }
  const int64_t B = x.size(0), L = x.size(1), E = head_dim, NH = x.size(2) / E;
  if (rotated_heads < 0 || rotated_heads > NH) {
    throw Error(fmt::format("rope: cannot rotate {} of {} heads", rotated_heads, NH));
  }
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  dispatch_storage(x.dtype(), "rope", [&]<class T>() {
    launch(kernels::rope_forward<T>, x.device(), out.data<T>(), x.data<T>(), B, L, NH, E, rotated_heads, pos0, freqs);
  });
  return record("rope", out, {x}, [=](const Tensor& dout, std::span<const Tensor>, std::span<Tensor> grads) {
    dispatch_storage(dout.dtype(), "rope", [&]<class T>() {
      launch(kernels::rope_backward<T>, dout.device(), grads[0].data<T>(), dout.data<T>(), B, L, NH, E, rotated_heads,
             pos0, freqs);
    });
  });
}

Tensor dropout(const Tensor& x, double p, DropoutSeed seed) {
  detail::check_storage("dropout", x);
  if (!(p >= 0.0 && p <= 1.0)) throw Error(fmt::format("dropout: probability must be in [0, 1], got {}", p));
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  dispatch_storage(x.dtype(), "dropout", [&]<class T>() {
    launch(kernels::dropout_forward<T>, x.device(), out.data<T>(), x.data<T>(), x.numel(), float(p), seed);
  });
  return record("dropout", out, {x}, [=](const Tensor& dout, std::span<const Tensor>, std::span<Tensor> grads) {
    dispatch_storage(dout.dtype(), "dropout", [&]<class T>() {
      launch(kernels::dropout_backward<T>, dout.device(), grads[0].data<T>(), dout.data<T>(), dout.numel(), float(p),
             seed);
    });
  });
}

Tensor dropout(const Tensor& x, double p, Generator& gen, bool training) {
  if (!training || p == 0.0) return x;
  return dropout(x, p, gen.dropout_seed());
}

}  // namespace tinygpt

// Elementwise ops (unary maps, broadcast binary ops) and reductions.
#include <algorithm>

#include "autograd/op_helpers.h"
#include "autograd/ops.h"

namespace tinygpt {
namespace detail {

void check_float(const char* op, const Tensor& t, const char* what) {
  if (!t.defined()) throw Error(fmt::format("{}: {} is undefined", op, what));
  if (t.dtype() != DType::F32 && t.dtype() != DType::F64) {
    throw Error(fmt::format("{}: {} must be f32 or f64, got {}", op, what, dtype_name(t.dtype())));
  }
}

void check_storage(const char* op, const Tensor& t, const char* what) {
  if (!t.defined()) throw Error(fmt::format("{}: {} is undefined", op, what));
  if (t.dtype() != DType::F32 && t.dtype() != DType::F64 && t.dtype() != DType::BF16) {
    throw Error(fmt::format("{}: {} must be f32, f64 or bf16, got {}", op, what, dtype_name(t.dtype())));
  }
}

void check_same(const char* op, const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype()) {
    throw Error(fmt::format("{}: dtypes differ ({} and {})", op, dtype_name(a.dtype()), dtype_name(b.dtype())));
  }
  if (a.device() != b.device()) {
    throw Error(fmt::format("{}: tensors are on different devices ({} and {})", op, device_name(a.device()),
                            device_name(b.device())));
  }
}

int64_t dims_product(const Shape& shape, int begin, int end) {
  int64_t n = 1;
  for (int d = begin; d < end; ++d) n *= shape[d];
  return n;
}

}  // namespace detail

using detail::ptr;

namespace {

/// Broadcast shape and strides of a op b (NumPy rules), or a shape error naming the op.
BroadcastGeom broadcast_geom(const char* op, const Shape& a, const Shape& b, Shape& out_shape) {
  const int nd = std::max(a.ndim(), b.ndim());
  const auto pa = a.padded(), pb = b.padded();
  BroadcastGeom g{};
  int64_t sa = 1, sb = 1;
  for (int d = kMaxDims - 1; d >= 0; --d) {
    const int64_t da = pa[size_t(d)], db = pb[size_t(d)];
    if (da != db && da != 1 && db != 1) shape_error(op, "not broadcastable", a, b);
    g.out[d] = std::max(da, db);
    if (da == 0 || db == 0) g.out[d] = 0;
    g.a_stride[d] = da == 1 ? 0 : sa;
    g.b_stride[d] = db == 1 ? 0 : sb;
    sa *= da;
    sb *= db;
  }
  g.same_shape = a == b;
  std::vector<int64_t> dims(g.out + kMaxDims - nd, g.out + kMaxDims);
  out_shape = Shape(dims);
  return g;
}

Tensor binary(const char* name, BinaryOp op, const Tensor& a, const Tensor& b) {
  detail::check_storage(name, a, "first operand");
  detail::check_storage(name, b, "second operand");
  detail::check_same(name, a, b);
  Shape out_shape;
  const BroadcastGeom g = broadcast_geom(name, a.shape(), b.shape(), out_shape);
  Tensor out = empty(out_shape, a.dtype(), a.device());
  dispatch_storage(a.dtype(), name, [&]<class T>() {
    launch(kernels::binary_forward<T>, a.device(), out.data<T>(), a.data<T>(), b.data<T>(), g, op);
  });
  return record(name, out, {a, b},
                [g, op, name](const Tensor& dout, std::span<const Tensor> in, std::span<Tensor> grads) {
                  dispatch_storage(dout.dtype(), name, [&]<class T>() {
                    launch(kernels::binary_backward<T>, dout.device(), ptr<T>(grads[0]), ptr<T>(grads[1]),
                           dout.data<T>(), in[0].data<T>(), in[1].data<T>(), g, op);
                  });
                });
}

Tensor unary(const char* name, UnaryOp op, const Tensor& x, double alpha = 0.0) {
  detail::check_storage(name, x);
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  dispatch_storage(x.dtype(), name, [&]<class T>() {
    launch(kernels::unary_forward<T>, x.device(), out.data<T>(), x.data<T>(), x.numel(), op, compute_t<T>(alpha));
  });
  // exp, tanh and sqrt differentiate through their output; a detached alias keeps the node off its own output.
  const Tensor saved = (op == UnaryOp::Exp || op == UnaryOp::Tanh || op == UnaryOp::Sqrt) ? out.detach() : Tensor();
  return record(
      name, out, {x},
      [=](const Tensor& dout, std::span<const Tensor> in, std::span<Tensor> grads) {
        dispatch_storage(dout.dtype(), name, [&]<class T>() {
          launch(kernels::unary_backward<T>, dout.device(), grads[0].data<T>(), dout.data<T>(), in[0].data<T>(),
                 ptr<T>(saved), dout.numel(), op, compute_t<T>(alpha), detail::unwritten(grads[0]));
        });
      },
      /*writes_unwritten=*/1u);
}

/// alpha * sum over dim (or over everything when all == true).
Tensor reduce_sum(const char* name, const Tensor& x, int dim, bool keepdim, bool all, bool average) {
  detail::check_float(name, x);
  int64_t outer = 1, D = x.numel(), inner = 1;
  Shape out_shape;
  if (!all) {
    const int d = x.shape().normalize_dim(dim);
    outer = detail::dims_product(x.shape(), 0, d);
    D = x.shape()[d];
    inner = detail::dims_product(x.shape(), d + 1, x.ndim());
    std::vector<int64_t> dims = x.shape().vec();
    if (keepdim) {
      dims[size_t(d)] = 1;
    } else {
      dims.erase(dims.begin() + d);
    }
    out_shape = Shape(dims);
  }
  const double alpha = average ? 1.0 / double(std::max<int64_t>(D, 1)) : 1.0;
  Tensor out = empty(out_shape, x.dtype(), x.device());
  dispatch_float(x.dtype(), name, [&]<class T>() {
    launch(kernels::sum_forward<T>, x.device(), out.data<T>(), x.data<T>(), outer, D, inner, T(alpha));
  });
  return record(name, out, {x}, [=](const Tensor& dout, std::span<const Tensor>, std::span<Tensor> grads) {
    dispatch_float(dout.dtype(), name, [&]<class T>() {
      launch(kernels::sum_backward<T>, dout.device(), grads[0].data<T>(), dout.data<T>(), outer, D, inner, T(alpha));
    });
  });
}

}  // namespace

Tensor cast(const Tensor& x, DType dtype) {
  detail::check_storage("cast", x);
  if (dtype != DType::F32 && dtype != DType::F64 && dtype != DType::BF16) {
    throw Error(fmt::format("cast: to {}: only f32, f64 and bf16 carry gradients", dtype_name(dtype)));
  }
  if (dtype == x.dtype()) return x;
  const DType from = x.dtype();
  return record("cast", x.to(dtype), {x}, [from](const Tensor& dout, std::span<const Tensor>, std::span<Tensor> grads) {
    if (from == DType::F32 && dout.dtype() == DType::BF16) {
      launch(kernels::accumulate_bf16, dout.device(), grads[0].data<float>(), dout.data<bf16>(), dout.numel());
    } else {
      accumulate_into(grads[0], dout.to(from));
    }
  });
}

void write_bf16_copy(const Tensor& p) {
  if (p.dtype() != DType::F32)
    throw Error(fmt::format("write_bf16_copy: the parameter must be f32, got {}", dtype_name(p.dtype())));
  TensorImpl& impl = p.impl();
  if (!impl.bf16_copy || impl.bf16_copy->storage->device != p.device() || !(impl.bf16_copy->shape == p.shape())) {
    impl.bf16_copy = empty(p.shape(), DType::BF16, p.device()).impl_ptr();
  }
  launch(kernels::round_to_bf16, p.device(), static_cast<bf16*>(impl.bf16_copy->storage->data), p.data<float>(),
         p.numel());
}

Tensor working_copy(const Tensor& p) {
  if (p.dtype() == DType::BF16) return p;
  const auto& copy = p.impl().bf16_copy;
  if (!copy || !(copy->shape == p.shape()) || copy->storage->device != p.device()) return cast(p, DType::BF16);
  // A new handle on the copy's storage, so the node below belongs to this use only.
  const Tensor out(std::make_shared<TensorImpl>(copy->storage, copy->shape, DType::BF16));
  return record("cast", out, {p}, [](const Tensor& dout, std::span<const Tensor>, std::span<Tensor> grads) {
    launch(kernels::accumulate_bf16, dout.device(), grads[0].data<float>(), dout.data<bf16>(), dout.numel());
  });
}

Tensor add(const Tensor& a, const Tensor& b) { return binary("add", BinaryOp::Add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary("sub", BinaryOp::Sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary("mul", BinaryOp::Mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary("div", BinaryOp::Div, a, b); }

Tensor scale(const Tensor& x, double alpha) { return unary("scale", UnaryOp::Scale, x, alpha); }
Tensor neg(const Tensor& x) { return unary("neg", UnaryOp::Neg, x); }
Tensor exp(const Tensor& x) { return unary("exp", UnaryOp::Exp, x); }
Tensor log(const Tensor& x) { return unary("log", UnaryOp::Log, x); }
Tensor tanh(const Tensor& x) { return unary("tanh", UnaryOp::Tanh, x); }
Tensor relu(const Tensor& x) { return unary("relu", UnaryOp::Relu, x); }
Tensor sqrt(const Tensor& x) { return unary("sqrt", UnaryOp::Sqrt, x); }
Tensor gelu(const Tensor& x) { return unary("gelu", UnaryOp::Gelu, x); }

Tensor sum(const Tensor& x) { return reduce_sum("sum", x, 0, false, true, false); }
Tensor sum(const Tensor& x, int dim, bool keepdim) { return reduce_sum("sum", x, dim, keepdim, false, false); }
Tensor mean(const Tensor& x) { return reduce_sum("mean", x, 0, false, true, true); }

Tensor sum_squares(const Tensor& x) {
  detail::check_float("sum_squares", x);
  if (grad_enabled() && x.requires_grad()) {
    throw Error("sum_squares: records no gradient; use sum(x * x) to differentiate, or call it under NoGradGuard");
  }
  Tensor out = empty({}, x.dtype(), x.device());
  dispatch_float(x.dtype(), "sum_squares", [&]<class T>() {
    launch(kernels::sum_squares<T>, x.device(), out.data<T>(), x.data<T>(), x.numel());
  });
  return out;
}
Tensor mean(const Tensor& x, int dim, bool keepdim) { return reduce_sum("mean", x, dim, keepdim, false, true); }

}  // namespace tinygpt

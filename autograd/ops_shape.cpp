// Shape ops: reshape/view (shared storage), permute/transpose, narrow/slice/split, concat.
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>

#include "autograd/op_helpers.h"
#include "autograd/ops.h"

namespace tinygpt {
namespace {

/// Geometry of permuting a tensor of shape `in` by `perm` (output dim i = input dim perm[i]).
PermuteGeom permute_geom(const Shape& in, const std::vector<int>& perm) {
  int64_t in_stride[kMaxDims];
  const auto dims = in.vec();
  contiguous_strides(dims.data(), in_stride, in.ndim());
  PermuteGeom g{};
  const int pad = kMaxDims - in.ndim();
  for (int i = 0; i < kMaxDims; ++i) {
    g.out[i] = i < pad ? 1 : dims[size_t(perm[size_t(i - pad)])];
    g.inp_stride[i] = i < pad ? 0 : in_stride[perm[size_t(i - pad)]];
  }
  return g;
}

}  // namespace

Tensor reshape(const Tensor& x, std::vector<int64_t> dims) {
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == -1) {
      if (infer >= 0) throw Error(fmt::format("reshape: only one dimension may be -1, in ({})", fmt::join(dims, ", ")));
      infer = int(i);
    } else {
      known *= dims[i];
    }
  }
  if (infer >= 0) dims[size_t(infer)] = known == 0 ? 0 : x.numel() / known;
  const Shape shape(dims);
  if (shape.numel() != x.numel()) shape_error("reshape", "element counts differ", x.shape(), shape);
  Tensor out(std::make_shared<TensorImpl>(x.impl().storage, shape, x.dtype()));
  return record("reshape", out, {x}, [](const Tensor& dout, std::span<const Tensor>, std::span<Tensor> grads) {
    accumulate_into(grads[0], dout);
  });
}

Tensor permute(const Tensor& x, std::vector<int> perm) {
  detail::check_storage("permute", x);
  std::vector<int> sorted(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) sorted[i] = perm[i] < 0 ? perm[i] + x.ndim() : perm[i];
  perm = sorted;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int> identity(size_t(x.ndim()));
  std::iota(identity.begin(), identity.end(), 0);
  if (sorted != identity) {
    throw Error(fmt::format("permute: ({}) is not a permutation of the {} dims of shape {}", fmt::join(perm, ", "),
                            x.ndim(), x.shape().str()));
  }
  std::vector<int> inverse(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inverse[size_t(perm[i])] = int(i);
  const PermuteGeom g = permute_geom(x.shape(), perm);
  std::vector<int64_t> dims;
  for (int p : perm) dims.push_back(x.shape()[p]);
  Tensor out = empty(Shape(dims), x.dtype(), x.device());
  dispatch_storage(x.dtype(), "permute",
                   [&]<class T>() { launch(kernels::permute<T>, x.device(), out.data<T>(), x.data<T>(), g, false); });
  const PermuteGeom back = permute_geom(out.shape(), inverse);
  return record("permute", out, {x}, [back](const Tensor& dout, std::span<const Tensor>, std::span<Tensor> grads) {
    dispatch_storage(dout.dtype(), "permute", [&]<class T>() {
      launch(kernels::permute<T>, dout.device(), grads[0].data<T>(), dout.data<T>(), back, true);
    });
  });
}

Tensor transpose(const Tensor& x, int dim0, int dim1) {
  std::vector<int> perm(size_t(x.ndim()));
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[size_t(x.shape().normalize_dim(dim0))], perm[size_t(x.shape().normalize_dim(dim1))]);
  return permute(x, perm);
}

Tensor narrow(const Tensor& x, int dim, int64_t start, int64_t length) {
  detail::check_storage("narrow", x);
  const int d = x.shape().normalize_dim(dim);
  const int64_t D = x.shape()[d];
  if (start < 0 || length < 0 || start + length > D) {
    throw Error(fmt::format("narrow: [{}, {}) is outside dimension {} of size {} (shape {})", start, start + length, d,
                            D, x.shape().str()));
  }
  const int64_t outer = detail::dims_product(x.shape(), 0, d);
  const int64_t inner = detail::dims_product(x.shape(), d + 1, x.ndim());
  std::vector<int64_t> dims = x.shape().vec();
  dims[size_t(d)] = length;
  Tensor out = empty(Shape(dims), x.dtype(), x.device());
  dispatch_storage(x.dtype(), "narrow", [&]<class T>() {
    launch(kernels::copy_slice<T>, x.device(), out.data<T>(), x.data<T>(), outer, inner, length, int64_t(0), D, start,
           length, false);
  });
  return record("narrow", out, {x}, [=](const Tensor& dout, std::span<const Tensor>, std::span<Tensor> grads) {
    dispatch_storage(dout.dtype(), "narrow", [&]<class T>() {
      launch(kernels::copy_slice<T>, dout.device(), grads[0].data<T>(), dout.data<T>(), outer, inner, D, start, length,
             int64_t(0), length, true);
    });
  });
}

Tensor slice(const Tensor& x, int dim, int64_t start, int64_t end) {
  const int64_t D = x.shape()[dim];
  auto clamp = [D](int64_t i) { return std::clamp(i < 0 ? i + D : i, int64_t(0), D); };
  start = clamp(start);
  end = clamp(end);
  return narrow(x, dim, start, std::max<int64_t>(0, end - start));
}

std::vector<Tensor> split(const Tensor& x, int64_t size, int dim) {
  if (size <= 0) throw Error(fmt::format("split: piece size must be positive, got {}", size));
  const int64_t D = x.shape()[dim];
  std::vector<Tensor> pieces;
  for (int64_t start = 0; start < D; start += size) pieces.push_back(narrow(x, dim, start, std::min(size, D - start)));
  return pieces;
}

Tensor concat(const std::vector<Tensor>& xs, int dim) {
  if (xs.empty()) throw Error("concat: no tensors given");
  const Tensor& first = xs[0];
  detail::check_storage("concat", first);
  const int d = first.shape().normalize_dim(dim);
  std::vector<int64_t> offsets;
  int64_t total = 0;
  for (const Tensor& x : xs) {
    detail::check_same("concat", first, x);
    bool ok = x.ndim() == first.ndim();
    for (int i = 0; ok && i < x.ndim(); ++i) ok = i == d || x.shape()[i] == first.shape()[i];
    if (!ok) shape_error("concat", fmt::format("sizes must match except in dimension {}", d), first.shape(), x.shape());
    offsets.push_back(total);
    total += x.shape()[d];
  }
  const int64_t outer = detail::dims_product(first.shape(), 0, d);
  const int64_t inner = detail::dims_product(first.shape(), d + 1, first.ndim());
  std::vector<int64_t> dims = first.shape().vec();
  dims[size_t(d)] = total;
  Tensor out = empty(Shape(dims), first.dtype(), first.device());
  dispatch_storage(first.dtype(), "concat", [&]<class T>() {
    for (size_t i = 0; i < xs.size(); ++i) {
      const int64_t Di = xs[i].shape()[d];
      launch(kernels::copy_slice<T>, out.device(), out.data<T>(), xs[i].data<T>(), outer, inner, total, offsets[i], Di,
             int64_t(0), Di, false);
    }
  });
  return record("concat", out, xs, [=](const Tensor& dout, std::span<const Tensor> in, std::span<Tensor> grads) {
    dispatch_storage(dout.dtype(), "concat", [&]<class T>() {
      for (size_t i = 0; i < in.size(); ++i) {
        if (!grads[i].defined()) continue;
        const int64_t Di = in[i].shape()[d];
        launch(kernels::copy_slice<T>, dout.device(), grads[i].data<T>(), dout.data<T>(), outer, inner, Di, int64_t(0),
               total, offsets[i], Di, true);
      }
    });
  });
}

void write_slice(Tensor& dst, int dim, int64_t start, const Tensor& src) {
  detail::check_storage("write_slice", dst);
  detail::check_same("write_slice", dst, src);
  if (dst.requires_grad())
    throw Error("write_slice: the destination requires a gradient; write_slice is outside the graph");
  const int d = dst.shape().normalize_dim(dim);
  const int64_t D = dst.shape()[d];
  bool ok = src.ndim() == dst.ndim();
  for (int i = 0; ok && i < dst.ndim(); ++i) ok = i == d || src.shape()[i] == dst.shape()[i];
  if (!ok)
    shape_error("write_slice", fmt::format("sizes must match except in dimension {}", d), dst.shape(), src.shape());
  const int64_t n = src.shape()[d];
  if (start < 0 || start + n > D) {
    throw Error(fmt::format("write_slice: [{}, {}) is outside dimension {} of size {}", start, start + n, d, D));
  }
  const int64_t outer = detail::dims_product(dst.shape(), 0, d);
  const int64_t inner = detail::dims_product(dst.shape(), d + 1, dst.ndim());
  dispatch_storage(dst.dtype(), "write_slice", [&]<class T>() {
    launch(kernels::copy_slice<T>, dst.device(), dst.data<T>(), src.data<T>(), outer, inner, D, start, n, int64_t(0), n,
           false);
  });
}

}  // namespace tinygpt

// Checks and small utilities shared by the op implementations (not part of the public API).
#pragma once

#include <string>

#include "../kernels/kernels.h"
#include "autograd.h"
#include "tensor.h"

namespace tinygpt::detail {

/// Typed pointer, or nullptr for an undefined tensor (an input that needs no gradient).
template <class T>
T* ptr(const Tensor& t) {
  return t.defined() ? const_cast<Tensor&>(t).data<T>() : nullptr;
}

/// True when `grad` is a gradient slot no op has written yet: a backward recorded with writes_unwritten writes it
/// (=) instead of adding to it (Node::writes_unwritten).
inline bool unwritten(const Tensor& grad) { return grad.defined() && grad.impl().unwritten; }

/// Throws unless t is defined and of a floating dtype.
void check_float(const char* op, const Tensor& t, const char* what = "input");
/// Throws unless t is defined and of a dtype whose storage the op's kernels take: f32, f64 or bf16.
void check_storage(const char* op, const Tensor& t, const char* what = "input");
/// The dtype an op computes and keeps its statistics in for storage `dtype`: f32 for bf16, else dtype itself.
inline DType compute_dtype(DType dtype) { return dtype == DType::BF16 ? DType::F32 : dtype; }
/// Throws unless a and b share dtype and device.
void check_same(const char* op, const Tensor& a, const Tensor& b);
/// Product of the dims [begin, end) of shape.
int64_t dims_product(const Shape& shape, int begin, int end);

}  // namespace tinygpt::detail

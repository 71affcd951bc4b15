// Small plain structs that describe strided layouts to kernels, shared by the CPU and CUDA backends.
#pragma once

#include <cstdint>

namespace tinygpt {

inline constexpr int kMaxDims = 5;

/// Elementwise binary op over broadcast operands, padded on the left to kMaxDims dims.
/// a_stride/b_stride are element strides of each operand, 0 along broadcast dims.
struct BroadcastGeom {
  int64_t out[kMaxDims];
  int64_t a_stride[kMaxDims];
  int64_t b_stride[kMaxDims];
  bool same_shape;  // no broadcasting at all: a flat loop suffices
};

/// out = inp permuted: out dim i is inp dim perm[i]. Shapes padded on the left to kMaxDims.
struct PermuteGeom {
  int64_t out[kMaxDims];         // output shape
  int64_t inp_stride[kMaxDims];  // stride in inp of output dim i
};

/// Contiguous (row-major) strides of a shape with ndim dims.
inline void contiguous_strides(const int64_t* shape, int64_t* strides, int ndim) {
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    strides[d] = s;
    s *= shape[d];
  }
}

enum class UnaryOp : uint8_t { Neg, Scale, Exp, Log, Tanh, Relu, Gelu, Sqrt };
enum class BinaryOp : uint8_t { Add, Sub, Mul, Div };
/// The activation a linear layer's epilogue applies (the transformer MLP's): none, GELU (tanh approximation) or
/// ReLU squared.
enum class Activation : uint8_t { None, Gelu, ReluSquared };

}  // namespace tinygpt

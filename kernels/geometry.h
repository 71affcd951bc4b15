// Small plain structs that describe strided layouts to kernels, shared by the CPU and CUDA backends.
#pragma once

#include <cstdint>

#include "bf16.h"
#include "dropout_hash.h"
#include "numerics.h"

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

/// Where one AdamW launch updates: up to kMaxRuns runs of packed buffers, each with its own weight decay (matrices
/// decay; biases and norms do not). Run r is the upto[r] - upto[r - 1] elements from begin[r]; a kernel's threads
/// take the runs as one index space of upto[count - 1] elements, so a step over the whole model is one launch
/// (more runs than kMaxRuns take one launch per kMaxRuns). Passed by value to the CUDA kernel (about 1.3 KB).
struct AdamWRuns {
  static constexpr int kMaxRuns = 64;
  int count = 0;
  // bf16 storage: the parameters' bf16 working copies, at the parameters' indices, each written (rounded to nearest
  // even) in the same pass that updates its f32 master; null: none. f32 parameters only.
  bf16* copy = nullptr;
  int64_t begin[kMaxRuns];
  int64_t upto[kMaxRuns];  // elements of runs 0 .. r together
  float weight_decay[kMaxRuns];

  int64_t total() const { return count > 0 ? upto[count - 1] : 0; }
  int64_t length(int r) const { return upto[r] - (r > 0 ? upto[r - 1] : 0); }
  bool full() const { return count == kMaxRuns; }
  /// Appends a run of n elements from `first` (the caller checks full() first).
  void add(int64_t first, int64_t n, float decay) {
    begin[count] = first;
    upto[count] = total() + n;
    weight_decay[count] = decay;
    ++count;
  }
  /// One run: the n elements from 0.
  static AdamWRuns one(int64_t n, float decay) {
    AdamWRuns runs;
    runs.add(0, n, decay);
    return runs;
  }
};

/// A batched matrix product's shape: out (batch, M, N) = op(a) (batch_a, M, K) @ op(b) (batch_b, K, N), where op
/// transposes the operand stored transposed (trans_a: a is (batch_a, K, M); trans_b: b is (batch_b, N, K));
/// batch = max(batch_a, batch_b) and an operand of batch 1 is shared by every batch.
struct MatmulGeom {
  int64_t batch_a = 1, batch_b = 1;
  int64_t M = 0, K = 0, N = 0;
  bool trans_a = false, trans_b = false;
  MatmulMath math = MatmulMath::F32;
};

/// The arguments of the residual add + norm kernels (add_layernorm_forward, add_rmsnorm_forward), by name: sum = a + b
/// and out = norm(sum), rows of C; mean (N) and rstd (N) saved for the backward pass (f32 for bf16 storage). bias may
/// be null; RMSNorm reads neither mean nor bias. With p > 0, b enters dropped out: element i of b as
/// dropout_forward(b, p, seed) would make it (the same mask).
template <class T>
struct AddNormForward {
  T* sum = nullptr;
  T* out = nullptr;
  compute_t<T>* mean = nullptr;
  compute_t<T>* rstd = nullptr;
  const T* a = nullptr;
  const T* b = nullptr;
  const T* weight = nullptr;
  const T* bias = nullptr;
  int64_t N = 0, C = 0;
  compute_t<T> eps = compute_t<T>(1e-5);
  float p = 0.0f;
  DropoutSeed seed{};
};

enum class UnaryOp : uint8_t { Neg, Scale, Exp, Log, Tanh, Relu, Gelu, Sqrt };
enum class BinaryOp : uint8_t { Add, Sub, Mul, Div };
/// The activation a linear layer's epilogue applies (the transformer MLP's): none, GELU (tanh approximation) or
/// ReLU squared.
enum class Activation : uint8_t { None, Gelu, ReluSquared };

/// The arguments of a linear layer's forward kernel, as one struct (FlashAttention's params style) rather than a dozen
/// positional ones: out (N, OC) = inp (N, C) @ weight (OC, C)^T + bias (OC); bias may be null. With an activation,
/// act_out (N, OC) = act(out) too (out keeps the pre-activation).
/// inp16 (may be null; N * C bf16 bit patterns, 4-byte aligned): where the GPU keeps inp rounded to bf16 between the
/// two calls with bf16 math (the forward writes it, the backward reads it instead of rounding inp again). The CPU
/// rounds inside its GEMM and ignores it; the results are the same with it or without. GPU only, with bf16 math: an
/// inp that is null means inp16 already holds it (an act16 of the previous layer's), and act16 (may be null; N * OC
/// bf16 bit patterns, 4-byte aligned), with an activation, takes act(out) rounded to bf16 in place of act_out, which
/// is then not written: the next product's operand, without an f32 copy of it. The CPU ignores act16 (and always
/// needs inp and act_out).
template <class T>
struct LinearForward {
  T* out = nullptr;
  const T* inp = nullptr;
  const T* weight = nullptr;
  const T* bias = nullptr;
  int64_t N = 0, C = 0, OC = 0;
  MatmulMath math = MatmulMath::F32;
  Activation act = Activation::None;
  T* act_out = nullptr;
  uint16_t* inp16 = nullptr;
  uint16_t* act16 = nullptr;
  bool lt_epilogues = false;  // the GPU's f32 products take bias and GELU in cublasLt's epilogue (Numerics)
};

/// The arguments of its backward: dinp, dweight and dbias (any may be null) get the gradients of dout (N, OC), added
/// (+=), but dinp written (=) with overwrite_dinp. With an activation (and overwrite_dinp), dinp is the gradient
/// through the activation that made inp: (dout @ weight) * act'(act_of), act_of (N, C). inp16: the forward's.
template <class T>
struct LinearBackward {
  T* dinp = nullptr;
  T* dweight = nullptr;
  T* dbias = nullptr;
  const T* dout = nullptr;
  const T* inp = nullptr;
  const T* weight = nullptr;
  int64_t N = 0, C = 0, OC = 0;
  MatmulMath math = MatmulMath::F32;
  bool overwrite_dinp = false;
  Activation act = Activation::None;
  const T* act_of = nullptr;
  const uint16_t* inp16 = nullptr;
  bool lt_epilogues = false;
};

}  // namespace tinygpt

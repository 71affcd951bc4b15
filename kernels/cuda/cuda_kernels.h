// CUDA kernels with the same signatures and semantics as their CPU twins in kernels/cpu/cpu_kernels.h (see there for
// what each computes). They run on the default stream and return without waiting. Defined in kernels/cuda/*.cu when
// the CUDA backend is built; the kernel tables in kernels/kernels.h leave the cuda slots empty otherwise, so nothing
// here is referenced by a CPU-only build. The plain functions are f32; the templates take the storage types their
// kernels/kernels.h line lists other than f64 (f32 and bf16: bf16 in and out, f32 arithmetic inside, compute_t<T>),
// each instantiated in its .cu file.
#pragma once

#include <cstdint>

#include "../attention.h"
#include "../bf16.h"
#include "../geometry.h"

namespace tinygpt::cuda {

/// What cublasLt does to a product in its epilogue (fused_gemm in kernels/cuda/runtime.cuh, and its stand-in in
/// tests/emulated_cuda.h): add the bias; GELU (tanh form) with the value before it written to aux; both; or, for a
/// gradient, multiply by GELU's derivative at aux.
enum class Epilogue : uint8_t { Bias, Gelu, GeluBias, DGelu };

void fill(float* out, float value, int64_t n);
void round_to_bf16(bf16* out, const float* inp, int64_t n);
void widen_bf16(float* out, const bf16* inp, int64_t n);
void accumulate_bf16(float* y, const bf16* x, int64_t n);
template <class T> void axpy(T* y, const T* x, compute_t<T> alpha, int64_t n);
void axpby(float* y, const float* x, float alpha, float beta, int64_t n);
void axpby_indirect(float* y, const float* x, int64_t n, double alpha, double beta, const float* coef, const float* stats, double max_norm);
template <class T> void unary_forward(T* out, const T* inp, int64_t n, UnaryOp op, compute_t<T> alpha);
template <class T> void unary_backward(T* dinp, const T* dout, const T* inp, const T* out, int64_t n, UnaryOp op, compute_t<T> alpha, bool overwrite);
template <class T> void binary_forward(T* out, const T* a, const T* b, const BroadcastGeom& g, BinaryOp op);
template <class T> void binary_backward(T* da, T* db, const T* dout, const T* a, const T* b, const BroadcastGeom& g, BinaryOp op);
void sum_forward(float* out, const float* inp, int64_t outer, int64_t D, int64_t inner, float alpha);
void sum_squares(float* out, const float* inp, int64_t n);
void sum_backward(float* dinp, const float* dout, int64_t outer, int64_t D, int64_t inner, float alpha);
void softmax_forward(float* out, const float* inp, int64_t N, int64_t C);
void softmax_backward(float* dinp, const float* dout, const float* out, int64_t N, int64_t C);
void log_softmax_forward(float* out, const float* inp, int64_t N, int64_t C);
void log_softmax_backward(float* dinp, const float* dout, const float* out, int64_t N, int64_t C);
template <class T> void layernorm_forward(T* out, compute_t<T>* mean, compute_t<T>* rstd, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C, compute_t<T> eps);
/// dweight/dbias: per-block partial sums added in a fixed order by a second kernel (deterministic).
template <class T> void add_layernorm_forward(T* sum, T* out, compute_t<T>* mean, compute_t<T>* rstd, const T* a, const T* b, const T* weight, const T* bias, int64_t N, int64_t C, compute_t<T> eps, float p, DropoutSeed seed);
template <class T> void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, const compute_t<T>* mean, const compute_t<T>* rstd, int64_t N, int64_t C, bool overwrite_dinp);
template <class T> void embedding_forward(T* out, const int32_t* ids, const T* weight, int64_t N, int64_t C);
/// Deterministic, no float atomics: each (token id, channel) of dweight sums its rows in chunks of rows, in row order
/// within a chunk and chunk order after (with host_ids, a host pass sorts the rows by id with a stable counting sort
/// and a block sums each id's rows within a chunk; without, blocks scan the device ids a chunk each; a second pass
/// adds the chunks).
template <class T> void embedding_backward(T* dweight, const T* dout, const int32_t* ids, const int32_t* host_ids, int64_t N, int64_t V, int64_t C);
template <class T> void crossentropy_forward(compute_t<T>* losses, compute_t<T>* lse, const T* logits, const int32_t* targets, int64_t N, int64_t V, int32_t ignore_index);
template <class T> void crossentropy_backward(T* dlogits, const compute_t<T>* dloss, compute_t<T> scale, const T* logits, const compute_t<T>* lse, const int32_t* targets, int64_t N, int64_t V, int32_t ignore_index, bool fused);
template <class T> void crossentropy_fused(compute_t<T>* losses, compute_t<T>* lse, T* dlogits, const T* logits, const int32_t* targets, compute_t<T> scale, int64_t N, int64_t V, int32_t ignore_index);
template <class T> void dropout_forward(T* out, const T* inp, int64_t n, float p, DropoutSeed seed);
template <class T> void dropout_backward(T* dinp, const T* dout, int64_t n, float p, DropoutSeed seed);
template <class T> void permute(T* out, const T* inp, const PermuteGeom& g, bool accumulate);
template <class T> void copy_slice(T* dst, const T* src, int64_t outer, int64_t inner, int64_t dst_D, int64_t dst_start, int64_t src_D, int64_t src_start, int64_t len, bool accumulate);
/// cuBLAS (strided batched sgemm); TF32 tensor cores when tf32.
template <class T> void matmul_forward(T* out, const T* a, const T* b, int64_t batch_a, int64_t batch_b, int64_t M, int64_t K, int64_t N, bool trans_a, bool trans_b, MatmulMath math);
template <class T> void matmul_backward(T* da, T* db, const T* dout, const T* a, const T* b, int64_t batch_a, int64_t batch_b, int64_t M, int64_t K, int64_t N, bool trans_a, bool trans_b, MatmulMath math);
/// The product by cuBLAS, then the bias and activation by our kernel (in cublasLt's epilogue with TINYGPT_CUBLASLT_EPILOGUES=1, f32).
template <class T> void linear_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C, int64_t OC, MatmulMath math, Activation act, T* act_out, uint16_t* inp16, uint16_t* act16);
template <class T> void linear_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int64_t N, int64_t C, int64_t OC, MatmulMath math, bool overwrite_dinp, Activation act, const T* act_of, const uint16_t* inp16);
void adamw_update_indirect(float* param, const float* grad, float* m, float* v, const AdamWRuns& runs, const float* sched, const float* stats, double max_norm, float beta1, float beta2, float eps);
void adamw_update(float* param, const float* grad, float* m, float* v, const AdamWRuns& runs, float lr, float beta1, float beta2, float eps, int64_t step, double grad_scale);
/// out (n) = the rows of parts (rows, n) added in row order: the owner's step of the fixed-order all-reduce
/// (nccl.cu), as the MPI one adds on the host (train/comm.cpp).
void sum_rows_in_order(float* out, const float* parts, int64_t rows, int64_t n);
void rope_forward(float* out, const float* inp, int64_t B, int64_t L, int64_t NH, int64_t E, int64_t n_rot, int64_t pos0, double base);
void rope_backward(float* dinp, const float* dout, int64_t B, int64_t L, int64_t NH, int64_t E, int64_t n_rot, int64_t pos0, double base);
void attention_naive_forward(float* out, float* weights, float* lse, const float* q, const float* k, const float* v, const float* mask, const uint8_t* key_padding, const AttentionGeom& g);
void attention_naive_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k, const float* v, const float* out, const float* lse, const float* mask, const uint8_t* key_padding, const AttentionGeom& g);
/// Flash attention, head dims up to 128: f32 on CUDA cores, or TF32/BF16 operands on tensor cores (g.math). Backward: D = rowsum(dO * O) first, then one
/// pass over key tiles for dK and dV and a separate pass over query tiles for dQ, so no gradient needs
/// atomics and the result is deterministic.
void attention_flash_forward(float* out, float* lse, const float* q, const float* k, const float* v, const float* mask, const uint8_t* key_padding, const AttentionGeom& g);
/// Flash forward on bf16 storage (flash_bf16.cuh): bf16 q, k, v and out, f32 lse; the calls flash_bf16_takes accepts.
void attention_flash_forward_bf16(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const AttentionGeom& g);
void attention_flash_backward_bf16(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k, const bf16* v, const bf16* out, const float* lse, const AttentionGeom& g);
void attention_flash_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k, const float* v, const float* out, const float* lse, const float* mask, const uint8_t* key_padding, const AttentionGeom& g);

}  // namespace tinygpt::cuda

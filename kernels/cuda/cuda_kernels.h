// CUDA kernels, f32, with the same signatures and semantics as their CPU twins in kernels/cpu/cpu_kernels.h
// (see there for what each computes). They run on the default stream and return without waiting. Defined in
// kernels/cuda/*.cu when the CUDA backend is built; the kernel tables in kernels/kernels.h leave the cuda slots
// empty otherwise, so nothing here is referenced by a CPU-only build.
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
void axpy(float* y, const float* x, float alpha, int64_t n);
void axpby(float* y, const float* x, float alpha, float beta, int64_t n);
void axpby_indirect(float* y, const float* x, int64_t n, double alpha, double beta, const float* coef, const float* stats, double max_norm);
void unary_forward(float* out, const float* inp, int64_t n, UnaryOp op, float alpha);
void unary_backward(float* dinp, const float* dout, const float* inp, const float* out, int64_t n, UnaryOp op, float alpha, bool overwrite);
void binary_forward(float* out, const float* a, const float* b, const BroadcastGeom& g, BinaryOp op);
void binary_backward(float* da, float* db, const float* dout, const float* a, const float* b, const BroadcastGeom& g, BinaryOp op);
void sum_forward(float* out, const float* inp, int64_t outer, int64_t D, int64_t inner, float alpha);
void sum_squares(float* out, const float* inp, int64_t n);
void sum_backward(float* dinp, const float* dout, int64_t outer, int64_t D, int64_t inner, float alpha);
void softmax_forward(float* out, const float* inp, int64_t N, int64_t C);
void softmax_backward(float* dinp, const float* dout, const float* out, int64_t N, int64_t C);
void log_softmax_forward(float* out, const float* inp, int64_t N, int64_t C);
void log_softmax_backward(float* dinp, const float* dout, const float* out, int64_t N, int64_t C);
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias, int64_t N, int64_t C, float eps);
/// dweight/dbias: per-block partial sums added in a fixed order by a second kernel (deterministic).
void add_layernorm_forward(float* sum, float* out, float* mean, float* rstd, const float* a, const float* b, const float* weight, const float* bias, int64_t N, int64_t C, float eps, float p, uint64_t seed);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C, bool overwrite_dinp);
void embedding_forward(float* out, const int32_t* ids, const float* weight, int64_t N, int64_t C);
/// Deterministic, no float atomics: each (token id, channel) of dweight sums its rows in chunks of rows, in row order
/// within a chunk and chunk order after (with host_ids, a host pass buckets the rows by id with a stable counting
/// sort; without, blocks scan the device ids a chunk each and a second pass adds the chunks).
void embedding_backward(float* dweight, const float* dout, const int32_t* ids, const int32_t* host_ids, int64_t N, int64_t V, int64_t C);
void crossentropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets, int64_t N, int64_t V, int32_t ignore_index);
void crossentropy_backward(float* dlogits, const float* dloss, float scale, const float* logits, const float* lse, const int32_t* targets, int64_t N, int64_t V, int32_t ignore_index);
void dropout_forward(float* out, const float* inp, int64_t n, float p, uint64_t seed);
void dropout_backward(float* dinp, const float* dout, int64_t n, float p, uint64_t seed);
void permute(float* out, const float* inp, const PermuteGeom& g, bool accumulate);
void copy_slice(float* dst, const float* src, int64_t outer, int64_t inner, int64_t dst_D, int64_t dst_start, int64_t src_D, int64_t src_start, int64_t len, bool accumulate);
/// cuBLAS (strided batched sgemm); TF32 tensor cores when tf32.
void matmul_forward(float* out, const float* a, const float* b, int64_t batch_a, int64_t batch_b, int64_t M, int64_t K, int64_t N, bool trans_a, bool trans_b, MatmulMath math);
void matmul_backward(float* da, float* db, const float* dout, const float* a, const float* b, int64_t batch_a, int64_t batch_b, int64_t M, int64_t K, int64_t N, bool trans_a, bool trans_b, MatmulMath math);
/// The product by cuBLAS, then the bias and activation by our kernel (in cublasLt's epilogue with TINYGPT_CUBLASLT_EPILOGUES=1, f32).
void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t N, int64_t C, int64_t OC, MatmulMath math, Activation act, float* act_out, uint16_t* inp16, uint16_t* act16);
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight, int64_t N, int64_t C, int64_t OC, MatmulMath math, bool overwrite_dinp, Activation act, const float* act_of, const uint16_t* inp16);
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

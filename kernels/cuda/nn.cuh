// The fused kernels of a GPT on the GPU: layernorm and RMSNorm, SwiGLU's gate, embedding lookup (cross-entropy:
// crossentropy.cuh). Twins of kernels/cpu/nn.cpp; every gradient is summed in a fixed order (no float atomics), so runs
// repeat exactly. Compiled by nvcc in nn.cu and under tests/emulated_cuda.h (see launch.cuh).
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cuda/launch.cuh"
#include "kernels/scalar_math.h"  // dropout_scale, DropoutStream

TINYGPT_CUDA_BEGIN
namespace {

// The layer norms take f32 or bf16 storage; statistics and sums in f32. A warp a row, lane l taking the groups of
// eight columns starting at 8l, 8l + 256, ... (load_group: 16-byte vectors when vec, which the launchers set when
// the rows and the weights are 16-byte aligned and C is a multiple of 8).

/// Runs f(c, k) for the groups of the row a lane takes: columns c .. c + k - 1.
template <class F>
__device__ __forceinline__ void for_lane_groups(int64_t C, int lane, F f) {
  for (int64_t c = 8 * int64_t(lane); c < C; c += 256) f(c, int(min(int64_t(8), C - c)));
}

// RMSNorm runs the same kernels with no mean (a null `mean`: taken as 0, neither computed nor saved, nor differentiated
// through) and no bias.

/// One warp normalizes a row x into y; lane 0 writes mean (where not null) and rstd.
template <class T>
__device__ void layernorm_row(T* y, float* mean, float* rstd, const T* x, const T* weight, const T* bias, int64_t C,
                              float eps, int lane, bool vec) {
  float m = 0.0f;
  if (mean) {
    float s = 0.0f;
    for_lane_groups(C, lane, [&](int64_t c, int) {
      float v[8];
      load_group(v, x, c, C, vec);
      for (int j = 0; j < 8; ++j) s += v[j];  // the missing ones are zero
    });
    m = warp_sum(s) / float(C);
  }
  float var = 0.0f;
  for_lane_groups(C, lane, [&](int64_t c, int k) {
    float v[8];
    load_group(v, x, c, C, vec);
    for (int j = 0; j < 8; ++j) var += j < k ? (v[j] - m) * (v[j] - m) : 0.0f;
  });
  const float r = rsqrtf(warp_sum(var) / float(C) + eps);
  for_lane_groups(C, lane, [&](int64_t c, int) {
    float v[8], w[8], b[8] = {};
    load_group(v, x, c, C, vec);
    load_group(w, weight, c, C, vec);
    if (bias) load_group(b, bias, c, C, vec);
    for (int j = 0; j < 8; ++j) v[j] = (v[j] - m) * r * w[j] + b[j];
    store_group(y, v, c, C, vec);
  });
  if (lane == 0) {
    if (mean) *mean = m;
    *rstd = r;
  }
}

/// One warp per row.
template <class T>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias,
                                         int64_t N, int64_t C, float eps, bool vec) {
  const int64_t n = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (n >= N) return;
  layernorm_row(out + n * C, mean ? mean + n : mean, rstd + n, inp + n * C, weight, bias, C, eps, int(threadIdx.x % 32),
                vec);
}

/// sum = a + b (b dropped out as dropout_forward would when p > 0), then the layer norm of the sum as stored: each lane
/// reads back only the sums it wrote itself.
template <class T>
__global__ void add_layernorm_forward_kernel(T* sum, T* out, float* mean, float* rstd, const T* a, const T* b,
                                             const T* weight, const T* bias, int64_t N, int64_t C, float eps, float p,
                                             DropoutSeed seed, float scale, bool vec) {
  const int64_t n = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = int(threadIdx.x % 32);
  if (n >= N) return;
  T* s = sum + n * C;
  const DropoutStream stream(seed.value());
  for_lane_groups(C, lane, [&](int64_t c, int) {
    float x[8], y[8];
    load_group(x, a + n * C, c, C, vec);
    load_group(y, b + n * C, c, C, vec);
    for (int j = 0; j < 8; ++j) x[j] += p == 0.0f ? y[j] : stream.keep(n * C + c + j, p) ? y[j] * scale : 0.0f;
    store_group(s, x, c, C, vec);
  });
  layernorm_row(out + n * C, mean ? mean + n : mean, rstd + n, s, weight, bias, C, eps, lane, vec);
}

/// One row's dinp, by the row's warp (a lane its groups of columns); with sums, the lane also adds the row's
/// norm * dout and dout to sums[c] and sums[C + c] for its columns. rms: RMSNorm's (m is 0, no gradient through it).
template <class T>
__device__ void layernorm_backward_row(T* dx, const T* g, const T* x, const T* weight, float m, float s, int64_t C,
                                       int lane, bool overwrite, float* sums, bool vec, bool rms) {
  float dmean = 0.0f, dnorm_mean = 0.0f;
  for_lane_groups(C, lane, [&](int64_t c, int) {
    float gv[8], xv[8], w[8];
    load_group(gv, g, c, C, vec);
    load_group(xv, x, c, C, vec);
    load_group(w, weight, c, C, vec);
    for (int j = 0; j < 8; ++j) {
      const float dnorm = gv[j] * w[j];  // zero past the row's end
      dmean += dnorm;
      dnorm_mean += dnorm * (xv[j] - m) * s;
    }
  });
  dmean = rms ? 0.0f : warp_sum(dmean) / float(C);
  dnorm_mean = warp_sum(dnorm_mean) / float(C);
  for_lane_groups(C, lane, [&](int64_t c, int k) {
    float gv[8], xv[8], w[8], d[8] = {};
    load_group(gv, g, c, C, vec);
    load_group(xv, x, c, C, vec);
    load_group(w, weight, c, C, vec);
    if (!overwrite) load_group(d, dx, c, C, vec);
    for (int j = 0; j < 8; ++j) {
      const float norm = (xv[j] - m) * s;
      d[j] += (gv[j] * w[j] - dmean - norm * dnorm_mean) * s;
      if (sums && j < k) {
        sums[c + j] += norm * gv[j];
        sums[C + c + j] += gv[j];
      }
    }
    store_group(dx, d, c, C, vec);
  });
}

/// dinp, one warp per row.
template <class T>
__global__ void layernorm_backward_input_kernel(T* dinp, const T* dout, const T* inp, const T* weight,
                                                const float* mean, const float* rstd, int64_t N, int64_t C,
                                                bool overwrite, bool vec) {
  const int64_t n = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (n >= N) return;
  layernorm_backward_row(dinp + n * C, dout + n * C, inp + n * C, weight, mean ? mean[n] : 0.0f, rstd[n], C,
                         int(threadIdx.x % 32), overwrite, static_cast<float*>(nullptr), vec, mean == nullptr);
}

/// Block b sums rows [b * rows, (b + 1) * rows) of norm * dout and dout into partial[b] (2 * C floats).
template <class T>
__global__ void layernorm_backward_params_kernel(float* partial, const T* dout, const T* inp, const float* mean,
                                                 const float* rstd, int64_t N, int64_t C, int64_t rows) {
  const int64_t n0 = int64_t(blockIdx.x) * rows, n1 = min(N, n0 + rows);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float dw = 0.0f, db = 0.0f;
    for (int64_t n = n0; n < n1; ++n) {
      const float g = float(dout[n * C + c]);
      dw += (float(inp[n * C + c]) - (mean ? mean[n] : 0.0f)) * rstd[n] * g;
      db += g;
    }
    partial[2 * C * blockIdx.x + c] = dw;
    partial[2 * C * blockIdx.x + C + c] = db;
  }
}

/// The warps of a block of layernorm_backward_fused_kernel, and the widest row it takes: each warp keeps 2C floats
/// of partial sums in shared memory, 48 KiB in all at C = 768.
inline constexpr int kLayerNormWarps = 8;
inline constexpr int64_t kLayerNormFusedMaxC = 768;

/// layernorm_backward_input_kernel and layernorm_backward_params_kernel in one pass over dout and inp: block b takes
/// rows [b * rows, (b + 1) * rows), warp w its rows n0 + w, n0 + w + warps, ... in turn; each warp writes its rows'
/// dinp and adds their norm * dout and dout to its own 2C floats of shared memory (a lane its columns); the warps'
/// sums are then added in warp order into partial[b] (2C floats: weight sums, then bias sums).
template <class T>
__global__ void layernorm_backward_fused_kernel(T* dinp, float* partial, const T* dout, const T* inp, const T* weight,
                                                const float* mean, const float* rstd, int64_t N, int64_t C,
                                                int64_t rows, bool overwrite, bool vec) {
  TINYGPT_DYNAMIC_SMEM(float, sums);  // warp w: sums[w * 2C, (w + 1) * 2C)
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  float* mine = sums + int64_t(warp) * 2 * C;
  for (int64_t c = lane; c < 2 * C; c += 32) mine[c] = 0.0f;
  const int64_t n0 = int64_t(blockIdx.x) * rows, n1 = min(N, n0 + rows);
  for (int64_t n = n0 + warp; n < n1; n += warps) {
    layernorm_backward_row(dinp + n * C, dout + n * C, inp + n * C, weight, mean ? mean[n] : 0.0f, rstd[n], C, lane,
                           overwrite, mine, vec, mean == nullptr);
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < 2 * C; c += blockDim.x) {
    float total = 0.0f;
    for (int w = 0; w < warps; ++w) total += sums[int64_t(w) * 2 * C + c];
    partial[2 * C * blockIdx.x + c] = total;
  }
}

struct Exp {
  __host__ __device__ float operator()(float x) const { return expf(x); }
};

/// SwiGLU's gate, a thread an element of out (N, H).
template <class T>
__global__ void swiglu_forward_kernel(T* out, const T* inp, int64_t N, int64_t H) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * H) return;
  const int64_t n = i / H, h = i % H;
  out[i] = T(swiglu(float(inp[2 * n * H + h]), float(inp[2 * n * H + H + h]), Exp{}));
}

template <class T>
__global__ void swiglu_backward_kernel(T* dinp, const T* dout, const T* inp, int64_t N, int64_t H, bool overwrite) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * H) return;
  const int64_t g = 2 * (i / H) * H + i % H, u = g + H;
  float dg, du;
  swiglu_grad(float(inp[g]), float(inp[u]), float(dout[i]), dg, du, Exp{});
  dinp[g] = T(overwrite ? dg : float(dinp[g]) + dg);
  dinp[u] = T(overwrite ? du : float(dinp[u]) + du);
}

/// With vec (C a multiple of 8, rows aligned) a group of eight never crosses a row: one vector copy.
template <class T>
__global__ void embedding_forward_kernel(T* out, const int32_t* ids, const T* weight, int64_t N, int64_t C, bool vec) {
  map_elements(
      N * C, vec,
      [&](int64_t e) {
        *reinterpret_cast<uint4*>(out + e) = *reinterpret_cast<const uint4*>(weight + int64_t(ids[e / C]) * C + e % C);
        if constexpr (sizeof(T) == 4) {  // f32: eight elements are two vectors
          reinterpret_cast<uint4*>(out + e)[1] =
              reinterpret_cast<const uint4*>(weight + int64_t(ids[e / C]) * C + e % C)[1];
        }
      },
      [&](int64_t i) { out[i] = weight[int64_t(ids[i / C]) * C + i % C]; });
}

/// The rows of an embedding's gradient are summed in chunks of this many rows (by row index): each id's rows within a
/// chunk in row order, then the chunks' sums in chunk order. Both launchers below sum that way, so they agree bit for
/// bit; the chunks let the scan over device ids run on many blocks. Up to 64 chunks of at least 16 rows, fewer where
/// their partial sums (chunks x V x C floats) would pass 64 MiB, and one (no partial sums) where even two would.
inline int64_t embedding_chunk_rows(int64_t N, int64_t V, int64_t C) {
  const int64_t max_chunks = std::max<int64_t>(1, (int64_t(1) << 24) / std::max<int64_t>(1, V * C));
  const int64_t rows = std::max<int64_t>(16, (N + 63) / 64);
  return (N + rows - 1) / rows <= max_chunks ? rows : (N + max_chunks - 1) / max_chunks;
}

/// With the ids on the host, first pass: block (k, channel slice) sums segment k of the rows sorted by id, rows
/// order[seg[k] .. seg[k + 1]) (one id's rows in one chunk, in row order), into dweight's row seg_id[k] when it is
/// its id's only segment (seg_slot[k] < 0), else into partial[seg_slot[k]]. A segment holds at most a chunk's rows,
/// so a frequent id (a space: a sixth of the rows) is spread over many blocks instead of one.
template <class T>
__global__ void embedding_backward_segments_kernel(T* dweight, float* partial, const T* dout, const int32_t* order,
                                                   const int32_t* seg, const int32_t* seg_id, const int32_t* seg_slot,
                                                   int64_t C) {
  const int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int32_t first = seg[blockIdx.x], last = seg[blockIdx.x + 1];
  float acc = 0.0f;
#pragma unroll 4
  for (int32_t j = first; j < last; ++j) acc += float(dout[int64_t(order[j]) * C + c]);
  const int32_t slot = seg_slot[blockIdx.x];
  if (slot >= 0) {
    partial[int64_t(slot) * C + c] = acc;
  } else {
    T& w = dweight[int64_t(seg_id[blockIdx.x]) * C + c];
    w = float(w) + acc;
  }
}

/// Second pass: block (m, channel slice) adds to dweight's row ids[m] the sums of that id's segments,
/// partial[slot[m] .. slot[m + 1]), in chunk order.
template <class T>
__global__ void embedding_backward_gather_kernel(T* dweight, const float* partial, const int32_t* ids,
                                                 const int32_t* slot, int64_t C) {
  const int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float total = 0.0f;
  for (int32_t k = slot[blockIdx.x]; k < slot[blockIdx.x + 1]; ++k) total += partial[int64_t(k) * C + c];
  T& w = dweight[int64_t(ids[blockIdx.x]) * C + c];
  w = float(w) + total;
}

/// Without the ids on the host, first pass: block (v, channel slice, chunk s) scans the chunk's ids in order and sums
/// the rows of id v into partial[(s * V + v) * C + c], marking hit[s * V + v] when the chunk has any; with one chunk
/// (partial null) it adds them to dweight itself, which then needs no second pass. No host round trip (so it can be
/// captured in a graph); every id reads every row's id: cheap for characters, V times the ids for a large vocabulary.
template <class T>
__global__ void embedding_backward_scan_kernel(float* partial, int32_t* hit, T* dweight, const T* dout,
                                               const int32_t* ids, int64_t N, int64_t V, int64_t C,
                                               int64_t chunk_rows) {
  const int64_t v = blockIdx.x, c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x, s = blockIdx.z;
  const int64_t n0 = s * chunk_rows, n1 = min(N, n0 + chunk_rows);
  float acc = 0.0f;
  bool any = false;
  for (int64_t n = n0; n < n1; ++n) {
    if (ids[n] == v) {
      if (c < C) acc += float(dout[n * C + c]);
      any = true;
    }
  }
  if (!partial) {
    if (any && c < C) dweight[v * C + c] = float(dweight[v * C + c]) + acc;
    return;
  }
  if (c < C) partial[(s * V + v) * C + c] = acc;
  if (blockIdx.y == 0 && threadIdx.x == 0) hit[s * V + v] = any;
}

/// Second pass: dweight[v, c] += the sum of the chunks that have id v, in chunk order (untouched when none has it).
template <class T>
__global__ void embedding_backward_chunks_kernel(T* dweight, const float* partial, const int32_t* hit, int64_t V,
                                                 int64_t C, int64_t chunks) {
  TINYGPT_CUDA_LOOP(i, V * C) {
    const int64_t v = i / C, c = i % C;
    float total = 0.0f;
    bool any = false;
    for (int64_t s = 0; s < chunks; ++s) {
      if (hit[s * V + v]) {
        total += partial[(s * V + v) * C + c];
        any = true;
      }
    }
    if (any) dweight[i] = float(dweight[i]) + total;
  }
}

}  // namespace

namespace {

/// Whether a layer norm's rows (C elements each) and its parameters may be read as 16-byte vectors.
template <class... P>
bool rows_fit(int64_t C, const P*... p) {
  return C % 8 == 0 && vectors_fit(p...);
}

}  // namespace

template <class T>
void layernorm_forward(T* out, compute_t<T>* mean, compute_t<T>* rstd, const T* inp, const T* weight, const T* bias,
                       int64_t N, int64_t C, compute_t<T> eps) {
  if (N == 0) return;
  launch_kernel("layernorm_forward", layernorm_forward_kernel<T>, blocks_for(N * 32), kThreads, 0, out, mean, rstd, inp,
                weight, bias, N, C, eps, rows_fit(C, out, inp, weight, bias));
}

template <class T>
void add_layernorm_forward(const AddNormForward<T>& c) {
  if (c.N == 0) return;
  launch_kernel("add_layernorm_forward", add_layernorm_forward_kernel<T>, blocks_for(c.N * 32), kThreads, 0, c.sum,
                c.out, c.mean, c.rstd, c.a, c.b, c.weight, c.bias, c.N, c.C, c.eps, c.p, c.seed,
                dropout_scale<float>(c.p), rows_fit(c.C, c.sum, c.out, c.a, c.b, c.weight, c.bias));
}

template <class T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                        const compute_t<T>* mean, const compute_t<T>* rstd, int64_t N, int64_t C, bool overwrite_dinp) {
  if (N == 0) return;
  const bool vec = rows_fit(C, dinp, dout, inp, weight);
  // All three in one pass over dout and inp where the rows fit the fused kernel's shared memory.
  const bool fused = dinp && (dweight || dbias) && C <= kLayerNormFusedMaxC;
  if (dinp && !fused) {
    launch_kernel("layernorm_backward (input)", layernorm_backward_input_kernel<T>, blocks_for(N * 32), kThreads, 0,
                  dinp, dout, inp, weight, mean, rstd, N, C, overwrite_dinp, vec);
  }
  if (dweight || dbias) {
    const int64_t rows = rows_per_partial(N);
    const int64_t blocks = (N + rows - 1) / rows;
    Scratch partial(size_t(2 * C * blocks) * sizeof(float));  // block b: C weight sums, then C bias sums
    if (fused) {
      launch_kernel("layernorm_backward (input, weight and bias)", layernorm_backward_fused_kernel<T>, unsigned(blocks),
                    32 * kLayerNormWarps, size_t(kLayerNormWarps * 2 * C) * sizeof(float), dinp, partial.as<float>(),
                    dout, inp, weight, mean, rstd, N, C, rows, overwrite_dinp, vec);
    } else {
      launch_kernel("layernorm_backward (weight and bias)", layernorm_backward_params_kernel<T>, unsigned(blocks), 128,
                    0, partial.as<float>(), dout, inp, mean, rstd, N, C, rows);
    }
    const float* sums = partial.as<float>();
    if (dweight) add_partial_rows("layernorm_backward (weight sum)", dweight, sums, blocks, 2 * C, C);
    if (dbias) add_partial_rows("layernorm_backward (bias sum)", dbias, sums + C, blocks, 2 * C, C);
  }
}

template <class T>
void rmsnorm_forward(T* out, compute_t<T>* rstd, const T* inp, const T* weight, int64_t N, int64_t C,
                     compute_t<T> eps) {
  layernorm_forward(out, static_cast<float*>(nullptr), rstd, inp, weight, static_cast<const T*>(nullptr), N, C, eps);
}

template <class T>
void add_rmsnorm_forward(const AddNormForward<T>& c) {
  AddNormForward<T> rms = c;  // the layer norm's kernel without a mean or a bias
  rms.mean = nullptr;
  rms.bias = nullptr;
  add_layernorm_forward(rms);
}

template <class T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const compute_t<T>* rstd,
                      int64_t N, int64_t C, bool overwrite_dinp) {
  layernorm_backward(dinp, dweight, static_cast<T*>(nullptr), dout, inp, weight, static_cast<const float*>(nullptr),
                     rstd, N, C, overwrite_dinp);
}

template <class T>
void swiglu_forward(T* out, const T* inp, int64_t N, int64_t H) {
  if (N * H == 0) return;
  launch_kernel("swiglu_forward", swiglu_forward_kernel<T>, blocks_for(N * H), kThreads, 0, out, inp, N, H);
}

template <class T>
void swiglu_backward(T* dinp, const T* dout, const T* inp, int64_t N, int64_t H, bool overwrite) {
  if (N * H == 0) return;
  launch_kernel("swiglu_backward", swiglu_backward_kernel<T>, blocks_for(N * H), kThreads, 0, dinp, dout, inp, N, H,
                overwrite);
}

template <class T>
void embedding_forward(T* out, const int32_t* ids, const T* weight, int64_t N, int64_t C) {
  if (N * C == 0) return;
  const bool vec = rows_fit(C, out, weight);
  launch_kernel("embedding_forward", embedding_forward_kernel<T>, map_blocks(N * C, vec), kThreads, 0, out, ids, weight,
                N, C, vec);
}

template <class T>
void embedding_backward(T* dweight, const T* dout, const int32_t* ids, const int32_t* host_ids, int64_t N, int64_t V,
                        int64_t C) {
  if (N * C == 0) return;
  const int64_t chunk_rows = embedding_chunk_rows(N, V, C);
  if (host_ids == nullptr) {  // ids made on the device, or refilled in place: scanned there
    const int64_t chunks = (N + chunk_rows - 1) / chunk_rows;
    const int threads = int(std::min<int64_t>(256, (C + 31) / 32 * 32));
    const bool one = chunks == 1;  // (a large vocabulary) straight into dweight
    Scratch partial(one ? 0 : size_t(chunks * V * C) * sizeof(float)),
        hit(one ? 0 : size_t(chunks * V) * sizeof(int32_t));
    launch_kernel("embedding_backward (scan)", embedding_backward_scan_kernel<T>,
                  dim3(unsigned(V), unsigned((C + threads - 1) / threads), unsigned(chunks)), unsigned(threads), 0,
                  partial.as<float>(), hit.as<int32_t>(), dweight, dout, ids, N, V, C, chunk_rows);
    if (!one) {
      launch_kernel("embedding_backward (chunk sums)", embedding_backward_chunks_kernel<T>, blocks_for(V * C), kThreads,
                    0, dweight, partial.as<float>(), hit.as<int32_t>(), V, C, chunks);
    }
    return;
  }
  // Stable counting sort of the rows by token id, on the host (the ids' copy from their upload), then each id's rows
  // cut where their chunk changes: the segments the first pass sums.
  int32_t max_id = 0;
  for (int64_t n = 0; n < N; ++n) max_id = std::max(max_id, host_ids[n]);
  std::vector<int32_t> count(size_t(max_id) + 2, 0);
  for (int64_t n = 0; n < N; ++n) ++count[size_t(host_ids[n]) + 1];
  for (size_t v = 1; v < count.size(); ++v) count[v] += count[v - 1];  // count[v] = first slot of id v
  // One device upload: order (N), then the segments (starts, ids, slots) and the ids gathered from several.
  std::vector<int32_t> packed(static_cast<size_t>(N));
  {
    std::vector<int32_t> next(count.begin(), count.end() - 1);
    for (int64_t n = 0; n < N; ++n) packed[size_t(next[size_t(host_ids[n])]++)] = int32_t(n);
  }
  std::vector<int32_t> seg, seg_id, seg_slot, gather_id, gather_slot;
  int32_t slots = 0;
  for (int32_t v = 0; v <= max_id; ++v) {
    const int32_t first = count[size_t(v)], last = count[size_t(v) + 1];
    if (first == last) continue;
    const size_t first_seg = seg.size();
    for (int32_t i = first; i < last; ++i) {
      if (i == first || packed[size_t(i)] / chunk_rows != packed[size_t(i) - 1] / chunk_rows) {
        seg.push_back(i);
        seg_id.push_back(v);
      }
    }
    if (seg.size() - first_seg == 1) {
      seg_slot.push_back(-1);
      continue;
    }
    gather_id.push_back(v);
    gather_slot.push_back(slots);
    for (size_t k = first_seg; k < seg.size(); ++k) seg_slot.push_back(slots++);
  }
  const size_t segments = seg.size(), gathers = gather_id.size();
  seg.push_back(int32_t(N));
  gather_slot.push_back(slots);
  for (const auto* part : {&seg, &seg_id, &seg_slot, &gather_id, &gather_slot}) {  // one upload
    packed.insert(packed.end(), part->begin(), part->end());
  }
  Scratch dev(packed.size() * sizeof(int32_t)), partial(size_t(slots) * size_t(C) * sizeof(float));
  copy_to_device(dev.as<int32_t>(), packed.data(), packed.size() * sizeof(int32_t));
  const int32_t* order = dev.as<int32_t>();
  const int32_t* segs = order + N;
  const int32_t* gathered = segs + 3 * segments + 1;  // gather_id, then gather_slot
  const int threads = int(std::min<int64_t>(256, (C + 31) / 32 * 32));
  const unsigned slices = unsigned((C + threads - 1) / threads);
  launch_kernel("embedding_backward", embedding_backward_segments_kernel<T>, dim3(unsigned(segments), slices),
                unsigned(threads), 0, dweight, partial.as<float>(), dout, order, segs, segs + segments + 1,
                segs + 2 * segments + 1, C);
  if (gathers > 0) {
    launch_kernel("embedding_backward (chunk sums)", embedding_backward_gather_kernel<T>,
                  dim3(unsigned(gathers), slices), unsigned(threads), 0, dweight, partial.as<float>(), gathered,
                  gathered + gathers, C);
  }
}

TINYGPT_CUDA_END

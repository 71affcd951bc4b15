// Attention kernels: a naive reference and flash attention (forward and FlashAttention-2 backward).
//
// Flash tile products. Every product is one register-blocked micro-kernel, C (+)= A @ B with a kRows x kCols
// block of C in vector registers (6 x 16 floats in 12 AVX2 accumulators; 6 x 32 in 12 AVX-512 ones), A read
// through arbitrary strides and B by contiguous rows. Q, K, V and dO are therefore read in place through their strides; the only packing is
// a transposed copy of one operand per tile, chosen so that it is amortized over a whole task:
//   forward, parallel over (batch, head, query tile): Q^T is packed once; each key tile gives the key-major
//     score tile S^T = K Q^T (rows are keys, lanes are queries), the online softmax (running max m, running
//     sum l) runs on all query lanes at once, and O += P V reads P transposed out of S^T;
//   backward pass 1, parallel over (batch, kv head, key tile): K^T and V^T are packed once; for every head of
//     the group and every query tile that sees the key tile: S = Q K^T, dP = dO V^T (query-major),
//     P = exp(S * scale + mask - lse), dS = P * (dP - D) with D = rowsum(dO * O) precomputed,
//     dV += P^T dO, dK += dS^T Q;
//   backward pass 2, parallel over (batch, head, query tile): Q^T and dO^T are packed once; per key tile
//     S^T = K Q^T, dP^T = V dO^T (key-major), dS as above, dQ += dS K.
// Each gradient element is summed by exactly one task in a fixed order: no atomics, no per-thread copies, and
// the result does not depend on the number of threads. The price is that S and dP are computed in both
// passes (7 tile products per tile pair instead of 5).
//
// Tiles: Br = Bc = 64 for head dims up to 128 (measured on Zen 3: 32..128 all within noise, 64 x 64 never
// worse); beyond that 32 x 32 keeps the packed E x Br tile at 32 KiB. Causal with T <= 128: one register block
// (kCols: 16 with AVX2, 32 with AVX-512), as the diagonal tiles compute their masked half too (nanoGPT's CPU
// recipe, T = 64, E = 32, AVX2 vectors, forward + backward per training step: 64 x 64 6.3 ms, 32 x 32 5.3 ms,
// 16 x 16 5.1 ms). Per thread the scratch is a few tiles:
// O(Br * Bc + (Br + Bc) * (E + Ev)), no T x S buffer. Causal: key tiles entirely above the diagonal are never
// visited (forward and both backward passes); tiles crossing it are masked element by element.
//
// exp() is a vectorized polynomial for float (see exp_vec); the naive reference uses std::exp.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/attention_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/scalar_math.h"

namespace tinygpt::cpu {
namespace {

template <class T> constexpr T kNegInf = -std::numeric_limits<T>::infinity();

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
constexpr int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// Keys s < causal_end(g, t) (kernels/scalar_math.h) are visible to query t.

/// Index of attention element (b, h, t, s = 0) in the dropout hash (kernels/attention.h).
inline int64_t dropout_row(const AttentionGeom& g, int64_t b, int64_t h, int64_t t) { return ((b * g.NH + h) * g.T + t) * g.S; }

/// Row (i0, i1, i2) of a tensor read through three element strides (features contiguous).
template <class P> P at(P base, const int64_t* stride, int64_t i0, int64_t i1, int64_t i2) {
  return base + i0 * stride[0] + i1 * stride[1] + i2 * stride[2];
}

template <class T> T dot(const T* a, const T* b, int64_t n) {
  T acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

template <class T> void axpy_row(T* y, T alpha, const T* x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// ---------------------------------------------------------------------------------------------------------------
// Tile products.

/// SIMD vectors as GCC/Clang vector extensions: the micro-kernel's accumulators must live in registers, which
/// plain loops over an accumulator array do not guarantee. As wide as the target's registers (AVX-512: 64 bytes,
/// AVX: 32; CPU recipe, attention forward + backward per step: 5.3 ms with 32-byte vectors and 16 x 16 tiles,
/// 4.2 ms with 64-byte vectors and 32 x 32 tiles).
#if defined(__AVX512F__)
constexpr int kVecBytes = 64;
#elif defined(__AVX__)
constexpr int kVecBytes = 32;
#else
constexpr int kVecBytes = 16;
#endif
template <class T> struct Simd;
template <> struct Simd<float> { typedef float V __attribute__((vector_size(kVecBytes))); };
template <> struct Simd<double> { typedef double V __attribute__((vector_size(kVecBytes))); };
template <class T> using Vec = typename Simd<T>::V;
template <class T> constexpr int64_t kLanes = int64_t(sizeof(Vec<T>) / sizeof(T));

template <class T> inline Vec<T> load(const T* p) {
  Vec<T> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class T> inline void store(T* p, Vec<T> v) { std::memcpy(p, &v, sizeof v); }
template <class T> inline Vec<T> splat(T x) { return Vec<T>{} + x; }
template <class T> inline T hsum(Vec<T> v) {
  T sum = 0;
  for (int64_t i = 0; i < kLanes<T>; ++i) sum += v[i];
  return sum;
}

/// exp of every lane, written on vectors so that no branch can appear (plain loops calling a scalar exp with
/// clamps were turned into control flow by jump threading and not vectorized). float: Cephes' 2^n * exp(r),
/// |r| <= ln2/2, degree-6 polynomial (about 1 ulp), n rounded with the 1.5 * 2^23 trick and 2^n built from
/// exponent bits; n <= -127 (x below about -87.7, -inf included) gives exactly 0, NaN stays NaN.
/// double: std::exp per lane (the f64 kernels are for checking, not speed).
inline Vec<float> exp_vec(Vec<float> x) {
  typedef int32_t VI __attribute__((vector_size(kVecBytes)));
  const Vec<float> lo = splat(-100.0f), hi = splat(88.0f), shift = splat(12582912.0f);
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  const Vec<float> z = x * 1.44269504088896341f + shift;
  const Vec<float> n = z - shift;
  const Vec<float> r = x - n * 0.693359375f + n * 2.12194440e-4f;
  Vec<float> y = splat(1.9875691500e-4f);
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  VI ni;
  std::memcpy(&ni, &z, sizeof ni);
  ni -= 0x4B400000;  // the bits of shift: what is left is n
  ni = ni < -127 ? VI{} - 127 : ni;
  ni = (ni + 127) << 23;
  Vec<float> pow2n;
  std::memcpy(&pow2n, &ni, sizeof pow2n);
  return y * pow2n;
}
inline Vec<double> exp_vec(Vec<double> x) {
  for (int64_t i = 0; i < kLanes<double>; ++i) x[i] = std::exp(x[i]);
  return x;
}

/// Lanes [n, round_up(n, kLanes)) of a row set to -inf, so whole vectors can run past n and give exp() = 0 there.
template <class T> int64_t pad_row(T* row, int64_t n) {
  const int64_t n_pad = round_up(n, kLanes<T>);
  std::fill(row + n, row + n_pad, kNegInf<T>);
  return n_pad;
}

/// Columns per register block: two vectors.
template <class T> constexpr int64_t kCols = 2 * kLanes<T>;
constexpr int64_t kRows = 6;  // 12 accumulators + 2 B vectors + 1 broadcast: 15 of the 16 AVX2 registers
                              // (AVX-512, 12 rows in 24 of 32 registers: no faster on the CPU recipe)

/// C[r, 0:N] (+)= sum_k A[r * ars + k * aks] * B[k * ldb + 0:N] for r < R: an R x kCols block of C is held
/// in 2R vector registers while k runs.
template <class T, int R>
inline void matmul_rows(T* __restrict C, int64_t ldc, const T* __restrict A, int64_t ars, int64_t aks,
                        const T* __restrict B, int64_t ldb, int64_t K, int64_t N, bool accumulate) {
  constexpr int64_t L = kLanes<T>;
  int64_t n0 = 0;
  for (; n0 + 2 * L <= N; n0 += 2 * L) {
    Vec<T> c[R][2];
    for (int r = 0; r < R; ++r) {
      c[r][0] = accumulate ? load(C + r * ldc + n0) : Vec<T>{};
      c[r][1] = accumulate ? load(C + r * ldc + n0 + L) : Vec<T>{};
    }
    for (int64_t k = 0; k < K; ++k) {
      const Vec<T> b0 = load(B + k * ldb + n0), b1 = load(B + k * ldb + n0 + L);
      for (int r = 0; r < R; ++r) {
        const T a = A[r * ars + k * aks];
        c[r][0] += a * b0;
        c[r][1] += a * b1;
      }
    }
    for (int r = 0; r < R; ++r) {
      store(C + r * ldc + n0, c[r][0]);
      store(C + r * ldc + n0 + L, c[r][1]);
    }
  }
  if (n0 < N) {  // fewer than kCols columns left (head dims that are not a multiple of kCols)
    const int64_t nw = N - n0;
    for (int r = 0; r < R; ++r) {
      T* c = C + r * ldc + n0;
      if (!accumulate) std::fill_n(c, nw, T(0));
      for (int64_t k = 0; k < K; ++k) axpy_row(c, A[r * ars + k * aks], B + k * ldb + n0, nw);
    }
  }
}

/// C (M x N, row stride ldc) (+)= A (M x K, element (r, k) at A[r * ars + k * aks]) @ B (K x N, row stride ldb).
template <class T>
void matmul_tile(T* C, int64_t ldc, const T* A, int64_t ars, int64_t aks, const T* B, int64_t ldb, int64_t M, int64_t K,
                 int64_t N, bool accumulate) {
  int64_t r = 0;
  for (; r + kRows <= M; r += kRows) matmul_rows<T, kRows>(C + r * ldc, ldc, A + r * ars, ars, aks, B, ldb, K, N, accumulate);
  if (r + 4 <= M) matmul_rows<T, 4>(C + r * ldc, ldc, A + r * ars, ars, aks, B, ldb, K, N, accumulate), r += 4;
  if (r + 2 <= M) matmul_rows<T, 2>(C + r * ldc, ldc, A + r * ars, ars, aks, B, ldb, K, N, accumulate), r += 2;
  if (r < M) matmul_rows<T, 1>(C + r * ldc, ldc, A + r * ars, ars, aks, B, ldb, K, N, accumulate);
}

/// dst (D x ld) = rows [0, n) of src (row stride src_stride, D contiguous features) transposed; columns
/// [n, round_up(n, kCols)) are zeroed so the tile products can run whole register blocks.
template <class T>
void pack_transposed(T* dst, int64_t ld, const T* src, int64_t src_stride, int64_t n, int64_t D) {
  const int64_t n_pad = round_up(n, kCols<T>);
  for (int64_t s = 0; s < n; ++s) {
    const T* row = src + s * src_stride;
    for (int64_t d = 0; d < D; ++d) dst[d * ld + s] = row[d];
  }
  for (int64_t d = 0; d < D; ++d) std::fill(dst + d * ld + n, dst + d * ld + n_pad, T(0));
}

struct Tiles {
  int64_t Br, Bc;  // both multiples of kCols: query lanes and key columns are padded to whole register blocks
};

/// Tile sizes by head dim (see the header comment for the measurements).
inline Tiles flash_tiles(const AttentionGeom& g) {
  if (std::max(g.E, g.Ev) > 128) return Tiles{32, 32};
  return g.causal && g.T <= 128 ? Tiles{kCols<float>, kCols<float>} : Tiles{64, 64};
}

// ---------------------------------------------------------------------------------------------------------------
// Softmax pieces of one tile. Two orientations: key-major (rows are keys, lanes are queries: the forward pass and
// the dQ pass, which read K and V in place and pack Q^T once per query tile) and query-major (rows are queries:
// the dK/dV pass, which reads Q and dO in place and packs K^T and V^T once per key tile).

/// Key-major tile st (nc key rows of ld, lanes [0, n_pad) computed, queries [t0, t0 + nr) valid) of raw q.k
/// scores -> logits: times scale plus the additive mask, -inf where the key is masked (causal, padding).
template <class T>
void key_major_logits(T* st, int64_t ld, int64_t nc, int64_t nr, int64_t n_pad, int64_t b, int64_t h, int64_t t0,
                      int64_t s0, const T* mask, const uint8_t* kp, const AttentionGeom& g) {
  const T scale = T(g.scale);
  for (int64_t j = 0; j < nc; ++j) {
    T* row = st + j * ld;
    if (kp && kp[b * g.S + s0 + j]) {
      std::fill(row, row + n_pad, kNegInf<T>);
      continue;
    }
    for (int64_t i = 0; i < n_pad; ++i) row[i] *= scale;
    if (mask) {
      const T* m = at(mask, g.mask_stride, b, h, t0) + (s0 + j) * g.mask_stride[3];
      for (int64_t i = 0; i < nr; ++i) row[i] += m[i * g.mask_stride[2]];
    }
    if (g.causal) {  // key s0 + j is visible from query s0 + j - (S - T) on
      const int64_t first = std::clamp<int64_t>(s0 + j - (g.S - g.T) - t0, 0, n_pad);
      std::fill(row, row + first, kNegInf<T>);
    }
  }
}

/// Query-major tile of raw scores s and dO.v products dp, rows [t0, t0 + nr) of head (b, h), keys [s0, s0 + nc):
/// s becomes the dropped probabilities Pd and dp becomes dS * scale. Masked entries become 0.
template <class T>
void query_major_probs_and_ds(T* s, T* dp, int64_t ld, int64_t nr, int64_t nc, int64_t b, int64_t h, int64_t t0,
                              int64_t s0, const T* lse, const T* Drow, const T* mask, const uint8_t* kp,
                              const AttentionGeom& g) {
  const T scale = T(g.scale), keep_scale = dropout_scale<T>(g.dropout_p);
  const bool dropout = g.dropout_p > 0.0f;
  for (int64_t i = 0; i < nr; ++i) {
    const int64_t t = t0 + i, row = (b * g.NH + h) * g.T + t;
    T* sr = s + i * ld;
    T* dr = dp + i * ld;
    const T L = lse[row], D = Drow[row];
    const int64_t lim = L == kNegInf<T> ? 0 : std::clamp<int64_t>(causal_end(g, t) - s0, 0, nc);
    if (!mask && !kp) {
      for (int64_t j = 0; j < lim; ++j) sr[j] = sr[j] * scale - L;
    } else {
      const T* mr = mask ? at(mask, g.mask_stride, b, h, t) + s0 * g.mask_stride[3] : nullptr;
      const uint8_t* kpr = kp ? kp + b * g.S + s0 : nullptr;
      for (int64_t j = 0; j < lim; ++j) {
        T x = sr[j] * scale;
        if (mr) x += mr[j * g.mask_stride[3]];
        if (kpr && kpr[j]) x = kNegInf<T>;
        sr[j] = x - L;
      }
    }
    const int64_t lim_pad = pad_row(sr, lim);  // <= nc rounded up to whole vectors, within the row
    for (int64_t j = 0; j < lim_pad; j += kLanes<T>) {
      const Vec<T> p = exp_vec(load(sr + j));
      store(sr + j, p);
      if (!dropout) store(dr + j, p * (load(dr + j) - D) * scale);
    }
    if (dropout) {
      const int64_t drop0 = dropout_row(g, b, h, t) + s0;
      for (int64_t j = 0; j < lim; ++j) {
        const T f = dropout_keep(g.dropout_seed, drop0 + j, g.dropout_p) ? keep_scale : T(0);
        dr[j] = sr[j] * (dr[j] * f - D) * scale;
        sr[j] *= f;
      }
    }
    std::fill(sr + lim, sr + nc, T(0));
    std::fill(dr + lim, dr + nc, T(0));
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Naive reference.

template <class T>
void attention_naive_forward(T* out, T* weights, T* lse, const T* q, const T* k, const T* v, const T* mask,
                             const uint8_t* key_padding, const AttentionGeom& g) {
  const int64_t rows = g.B * g.NH * g.T, group = g.NH / g.NKV;
  const T scale = T(g.scale), keep_scale = dropout_scale<T>(g.dropout_p);
#pragma omp parallel if (rows * g.S * (g.E + g.Ev) >= kParallelGrain)
  {
    std::vector<T> scratch(weights ? 0 : size_t(g.S));
#pragma omp for schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t b = row / (g.NH * g.T), h = row / g.T % g.NH, t = row % g.T, kvh = h / group;
      T* p = weights ? weights + row * g.S : scratch.data();
      const T* qr = at(q, g.q_stride, b, h, t);
      const T* mr = mask ? at(mask, g.mask_stride, b, h, t) : nullptr;
      const int64_t end = causal_end(g, t);
      T mx = kNegInf<T>;
      for (int64_t s = 0; s < g.S; ++s) {
        T x = kNegInf<T>;
        if (s < end && !(key_padding && key_padding[b * g.S + s])) {
          x = scale * dot(qr, at(k, g.k_stride, b, kvh, s), g.E);
          if (mr) x += mr[s * g.mask_stride[3]];
        }
        p[s] = x;
        mx = std::max(mx, x);
      }
      T* o = at(out, g.o_stride, b, h, t);
      std::fill_n(o, g.Ev, T(0));
      if (mx == kNegInf<T>) {  // no visible key
        std::fill_n(p, g.S, T(0));
        lse[row] = kNegInf<T>;
        continue;
      }
      T sum = 0;
      for (int64_t s = 0; s < g.S; ++s) sum += p[s] = std::exp(p[s] - mx);
      for (int64_t s = 0; s < g.S; ++s) p[s] /= sum;
      lse[row] = mx + std::log(sum);
      for (int64_t s = 0; s < g.S; ++s) {
        T w = p[s];
        if (g.dropout_p > 0.0f) w = dropout_keep(g.dropout_seed, dropout_row(g, b, h, t) + s, g.dropout_p) ? w * keep_scale : T(0);
        if (w != T(0)) axpy_row(o, w, at(v, g.v_stride, b, kvh, s), g.Ev);
      }
    }
  }
}

template <class T>
void attention_naive_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                              const T* lse, const T* mask, const uint8_t* key_padding, const AttentionGeom& g) {
  const int64_t rows = g.B * g.NH * g.T, group = g.NH / g.NKV;
  const T scale = T(g.scale), keep_scale = dropout_scale<T>(g.dropout_p);
  const bool parallel = rows * g.S * (g.E + g.Ev) >= kParallelGrain;
  std::vector<T> D(static_cast<size_t>(rows));  // rowsum(dO * O)
#pragma omp parallel for if (parallel)
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t b = row / (g.NH * g.T), h = row / g.T % g.NH, t = row % g.T;
    D[row] = dot(at(dout, g.o_stride, b, h, t), at(out, g.o_stride, b, h, t), g.Ev);
  }
  // P, dP and dS of element (b, h, t, s); false when the key is invisible to the query.
  auto element = [&](int64_t b, int64_t h, int64_t t, int64_t s, T& pd, T& ds) {
    const int64_t row = (b * g.NH + h) * g.T + t, kvh = h / group;
    if (lse[row] == kNegInf<T> || s >= causal_end(g, t) || (key_padding && key_padding[b * g.S + s])) return false;
    T x = scale * dot(at(q, g.q_stride, b, h, t), at(k, g.k_stride, b, kvh, s), g.E);
    if (mask) x += at(mask, g.mask_stride, b, h, t)[s * g.mask_stride[3]];
    const T p = std::exp(x - lse[row]);
    T f = 1;
    if (g.dropout_p > 0.0f) f = dropout_keep(g.dropout_seed, dropout_row(g, b, h, t) + s, g.dropout_p) ? keep_scale : T(0);
    const T dp = dot(at(dout, g.o_stride, b, h, t), at(v, g.v_stride, b, kvh, s), g.Ev) * f;
    pd = p * f;
    ds = p * (dp - D[row]) * scale;
    return true;
  };
  if (dq) {
#pragma omp parallel for if (parallel)
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t b = row / (g.NH * g.T), h = row / g.T % g.NH, t = row % g.T, kvh = h / group;
      T* dqr = at(dq, g.q_stride, b, h, t);
      for (int64_t s = 0; s < g.S; ++s) {
        T pd, ds;
        if (element(b, h, t, s, pd, ds)) axpy_row(dqr, ds, at(k, g.k_stride, b, kvh, s), g.E);
      }
    }
  }
  if (dk || dv) {
    // One task per (batch, kv head, key): it owns dk and dv of that key and sums over the group's heads.
    const int64_t keys = g.B * g.NKV * g.S;
#pragma omp parallel for if (parallel)
    for (int64_t key = 0; key < keys; ++key) {
      const int64_t b = key / (g.NKV * g.S), kvh = key / g.S % g.NKV, s = key % g.S;
      T* dkr = dk ? at(dk, g.k_stride, b, kvh, s) : nullptr;
      T* dvr = dv ? at(dv, g.v_stride, b, kvh, s) : nullptr;
      for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        for (int64_t t = 0; t < g.T; ++t) {
          T pd, ds;
          if (!element(b, h, t, s, pd, ds)) continue;
          if (dvr) axpy_row(dvr, pd, at(dout, g.o_stride, b, h, t), g.Ev);
          if (dkr) axpy_row(dkr, ds, at(q, g.q_stride, b, h, t), g.E);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Flash attention.

template <class T>
void attention_flash_forward(T* out, T* lse, const T* q, const T* k, const T* v, const T* mask,
                             const uint8_t* key_padding, const AttentionGeom& g) {
  const Tiles tiles = flash_tiles(g);
  const int64_t Br = tiles.Br, Bc = tiles.Bc;  // plain variables: clang 14 cannot capture structured bindings
  const int64_t group = g.NH / g.NKV, n_qtiles = ceil_div(g.T, Br), tasks = g.B * g.NH * n_qtiles;
  const T keep_scale = dropout_scale<T>(g.dropout_p);
  const bool dropout = g.dropout_p > 0.0f;
  constexpr int64_t L = kLanes<T>;
#pragma omp parallel if (g.B * g.NH * g.T * g.S * (g.E + g.Ev) >= kParallelGrain)
  {
    // Per thread: Q^T tile, key-major score tile, output accumulator, and per-query m, l, exp(m_old - m_new).
    std::vector<T> qt(size_t(g.E * Br)), st(size_t(Bc * Br)), o(size_t(Br * g.Ev));
    std::vector<T> m(static_cast<size_t>(Br)), l(static_cast<size_t>(Br)), m_sub(static_cast<size_t>(Br)),
        alpha(static_cast<size_t>(Br)), sums(static_cast<size_t>(Br));
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      // Last query tiles first: under a causal mask they see the most keys, so the dynamic schedule ends evenly.
      const int64_t b = task / (g.NH * n_qtiles), h = task / n_qtiles % g.NH;
      const int64_t t0 = (n_qtiles - 1 - task % n_qtiles) * Br;
      const int64_t kvh = h / group, nr = std::min(Br, g.T - t0), n_pad = round_up(nr, kCols<T>);
      pack_transposed(qt.data(), Br, at(q, g.q_stride, b, h, t0), g.q_stride[2], nr, g.E);
      std::fill(o.begin(), o.end(), T(0));
      std::fill(m.begin(), m.end(), kNegInf<T>);
      std::fill(l.begin(), l.end(), T(0));
      const int64_t s_end = causal_end(g, t0 + nr - 1);  // key tiles past the last row's diagonal are skipped
      for (int64_t s0 = 0; s0 < s_end; s0 += Bc) {
        const int64_t nc = std::min(Bc, s_end - s0);
        matmul_tile(st.data(), Br, at(k, g.k_stride, b, kvh, s0), g.k_stride[2], int64_t(1), qt.data(), Br, nc, g.E,
                    n_pad, false);
        key_major_logits(st.data(), Br, nc, nr, n_pad, b, h, t0, s0, mask, key_padding, g);
        // Online softmax, every query lane at once: new running max, rescale factor, exponentials, row sums.
        std::copy(m.begin(), m.end(), m_sub.begin());
        for (int64_t j = 0; j < nc; ++j) {
          const T* row = st.data() + j * Br;
          for (int64_t i = 0; i < n_pad; ++i) m_sub[i] = std::max(m_sub[i], row[i]);
        }
        for (int64_t i = 0; i < n_pad; ++i) {
          const T m_new = m_sub[i];
          m_sub[i] = m_new == kNegInf<T> ? T(0) : m_new;  // a query that sees nothing yet: exp(-inf - 0) = 0
          alpha[i] = m[i] - m_sub[i];
          m[i] = m_new;
          sums[i] = 0;
        }
        for (int64_t i = 0; i < n_pad; i += L) store(alpha.data() + i, exp_vec(load(alpha.data() + i)));
        for (int64_t j = 0; j < nc; ++j) {
          T* row = st.data() + j * Br;
          for (int64_t i = 0; i < n_pad; i += L) {
            const Vec<T> p = exp_vec(load(row + i) - load(m_sub.data() + i));
            store(row + i, p);
            store(sums.data() + i, load(sums.data() + i) + p);
          }
        }
        for (int64_t i = 0; i < nr; ++i) {
          l[i] = l[i] * alpha[i] + sums[i];
          if (alpha[i] != T(1)) {
            T* orow = o.data() + i * g.Ev;
            for (int64_t e = 0; e < g.Ev; ++e) orow[e] *= alpha[i];
          }
        }
        if (dropout) {
          for (int64_t j = 0; j < nc; ++j) {
            T* row = st.data() + j * Br;
            for (int64_t i = 0; i < nr; ++i) {
              const bool keep = dropout_keep(g.dropout_seed, dropout_row(g, b, h, t0 + i) + s0 + j, g.dropout_p);
              row[i] = keep ? row[i] * keep_scale : T(0);
            }
          }
        }
        // O += P V, P read transposed out of the key-major tile.
        matmul_tile(o.data(), g.Ev, st.data(), int64_t(1), Br, at(v, g.v_stride, b, kvh, s0), g.v_stride[2], nr, nc,
                    g.Ev, true);
      }
      for (int64_t i = 0; i < nr; ++i) {
        T* orow = at(out, g.o_stride, b, h, t0 + i);
        T& lse_i = lse[(b * g.NH + h) * g.T + t0 + i];
        if (l[i] > T(0)) {
          const T inv = T(1) / l[i];
          for (int64_t e = 0; e < g.Ev; ++e) orow[e] = o[size_t(i * g.Ev + e)] * inv;
          lse_i = m[i] + std::log(l[i]);
        } else {
          std::fill_n(orow, g.Ev, T(0));
          lse_i = kNegInf<T>;
        }
      }
    }
  }
}

template <class T>
void attention_flash_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                              const T* lse, const T* mask, const uint8_t* key_padding, const AttentionGeom& g) {
  const Tiles tiles = flash_tiles(g);
  const int64_t Br = tiles.Br, Bc = tiles.Bc;  // plain variables: clang 14 cannot capture structured bindings
  const int64_t rows = g.B * g.NH * g.T, group = g.NH / g.NKV;
  const bool parallel = rows * g.S * (g.E + g.Ev) >= kParallelGrain;
  std::vector<T> D(static_cast<size_t>(rows));  // rowsum(dO * O), (B, NH, T)
#pragma omp parallel for if (parallel)
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t b = row / (g.NH * g.T), h = row / g.T % g.NH, t = row % g.T;
    D[size_t(row)] = dot(at(dout, g.o_stride, b, h, t), at(out, g.o_stride, b, h, t), g.Ev);
  }
  const int64_t os = g.o_stride[2], qs = g.q_stride[2], ks = g.k_stride[2], vs = g.v_stride[2];

  if (dk || dv) {  // pass 1: dK, dV per (batch, kv head, key tile), query-major tiles
    const int64_t n_ktiles = ceil_div(g.S, Bc), tasks = g.B * g.NKV * n_ktiles;
#pragma omp parallel if (parallel)
    {
      std::vector<T> kt(size_t(g.E * Bc)), vt(size_t(g.Ev * Bc)), s(size_t(Br * Bc)), dp(size_t(Br * Bc));
      std::vector<T> dk_acc(size_t(Bc * g.E)), dv_acc(size_t(Bc * g.Ev));
#pragma omp for schedule(dynamic, 1)
      for (int64_t task = 0; task < tasks; ++task) {
        const int64_t b = task / (g.NKV * n_ktiles), kvh = task / n_ktiles % g.NKV, s0 = task % n_ktiles * Bc;
        const int64_t nc = std::min(Bc, g.S - s0), nc_pad = round_up(nc, kCols<T>);
        // First query that sees key s0 (causal: s0 <= t + S - T); earlier query tiles are skipped.
        const int64_t t_first = g.causal ? std::max<int64_t>(0, s0 - (g.S - g.T)) : 0;
        if (t_first >= g.T) continue;
        pack_transposed(kt.data(), Bc, at(k, g.k_stride, b, kvh, s0), ks, nc, g.E);
        pack_transposed(vt.data(), Bc, at(v, g.v_stride, b, kvh, s0), vs, nc, g.Ev);
        std::fill(dk_acc.begin(), dk_acc.end(), T(0));
        std::fill(dv_acc.begin(), dv_acc.end(), T(0));
        for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
          for (int64_t t0 = t_first / Br * Br; t0 < g.T; t0 += Br) {
            const int64_t nr = std::min(Br, g.T - t0);
            const T* q0 = at(q, g.q_stride, b, h, t0);
            const T* do0 = at(dout, g.o_stride, b, h, t0);
            matmul_tile(s.data(), Bc, q0, qs, int64_t(1), kt.data(), Bc, nr, g.E, nc_pad, false);
            matmul_tile(dp.data(), Bc, do0, os, int64_t(1), vt.data(), Bc, nr, g.Ev, nc_pad, false);
            query_major_probs_and_ds(s.data(), dp.data(), Bc, nr, nc, b, h, t0, s0, lse, D.data(), mask, key_padding, g);
            // dV += Pd^T dO and dK += dS^T Q: the tiles read transposed.
            if (dv) matmul_tile(dv_acc.data(), g.Ev, s.data(), int64_t(1), Bc, do0, os, nc, nr, g.Ev, true);
            if (dk) matmul_tile(dk_acc.data(), g.E, dp.data(), int64_t(1), Bc, q0, qs, nc, nr, g.E, true);
          }
        }
        for (int64_t j = 0; j < nc; ++j) {
          if (dk) axpy_row(at(dk, g.k_stride, b, kvh, s0 + j), T(1), dk_acc.data() + j * g.E, g.E);
          if (dv) axpy_row(at(dv, g.v_stride, b, kvh, s0 + j), T(1), dv_acc.data() + j * g.Ev, g.Ev);
        }
      }
    }
  }

  if (dq) {  // pass 2: dQ per (batch, head, query tile), key-major tiles
    const int64_t n_qtiles = ceil_div(g.T, Br), tasks = g.B * g.NH * n_qtiles;
    const T scale = T(g.scale), keep_scale = dropout_scale<T>(g.dropout_p);
    const bool dropout = g.dropout_p > 0.0f;
    constexpr int64_t L = kLanes<T>;
#pragma omp parallel if (parallel)
    {
      std::vector<T> qt(size_t(g.E * Br)), dot_(size_t(g.Ev * Br)), st(size_t(Bc * Br)), dpt(size_t(Bc * Br));
      std::vector<T> dq_acc(size_t(Br * g.E)), lse_t(static_cast<size_t>(Br)), D_t(static_cast<size_t>(Br));
#pragma omp for schedule(dynamic, 1)
      for (int64_t task = 0; task < tasks; ++task) {
        const int64_t b = task / (g.NH * n_qtiles), h = task / n_qtiles % g.NH;
        const int64_t t0 = (n_qtiles - 1 - task % n_qtiles) * Br;  // heaviest first, as in the forward pass
        const int64_t kvh = h / group, nr = std::min(Br, g.T - t0), n_pad = round_up(nr, kCols<T>);
        const int64_t s_end = causal_end(g, t0 + nr - 1);
        if (s_end == 0) continue;
        pack_transposed(qt.data(), Br, at(q, g.q_stride, b, h, t0), qs, nr, g.E);
        pack_transposed(dot_.data(), Br, at(dout, g.o_stride, b, h, t0), os, nr, g.Ev);
        for (int64_t i = 0; i < n_pad; ++i) {
          // +inf for a query with no visible key (and for padding lanes): exp(x - inf) = 0 whatever x is.
          const T L_i = i < nr ? lse[(b * g.NH + h) * g.T + t0 + i] : kNegInf<T>;
          lse_t[size_t(i)] = L_i == kNegInf<T> ? std::numeric_limits<T>::infinity() : L_i;
          D_t[size_t(i)] = i < nr ? D[size_t((b * g.NH + h) * g.T + t0 + i)] : T(0);
        }
        std::fill(dq_acc.begin(), dq_acc.end(), T(0));
        for (int64_t s0 = 0; s0 < s_end; s0 += Bc) {
          const int64_t nc = std::min(Bc, s_end - s0);
          const T* k0 = at(k, g.k_stride, b, kvh, s0);
          matmul_tile(st.data(), Br, k0, ks, int64_t(1), qt.data(), Br, nc, g.E, n_pad, false);
          matmul_tile(dpt.data(), Br, at(v, g.v_stride, b, kvh, s0), vs, int64_t(1), dot_.data(), Br, nc, g.Ev, n_pad, false);
          key_major_logits(st.data(), Br, nc, nr, n_pad, b, h, t0, s0, mask, key_padding, g);
          for (int64_t j = 0; j < nc; ++j) {
            T* row = st.data() + j * Br;
            T* drow = dpt.data() + j * Br;
            for (int64_t i = 0; i < n_pad; i += L) {
              const Vec<T> p = exp_vec(load(row + i) - load(lse_t.data() + i));
              store(row + i, p);
              if (!dropout) store(drow + i, p * (load(drow + i) - load(D_t.data() + i)) * scale);
            }
            if (dropout) {
              for (int64_t i = 0; i < nr; ++i) {
                const bool keep = dropout_keep(g.dropout_seed, dropout_row(g, b, h, t0 + i) + s0 + j, g.dropout_p);
                drow[i] = row[i] * (drow[i] * (keep ? keep_scale : T(0)) - D_t[size_t(i)]) * scale;
              }
            }
          }
          // dQ += dS K, dS read transposed out of the key-major tile.
          matmul_tile(dq_acc.data(), g.E, dpt.data(), int64_t(1), Br, k0, ks, nr, nc, g.E, true);
        }
        for (int64_t i = 0; i < nr; ++i) axpy_row(at(dq, g.q_stride, b, h, t0 + i), T(1), dq_acc.data() + i * g.E, g.E);
      }
    }
  }
}

#define TINYGPT_INSTANTIATE(T)                                                                                        \
  template void attention_naive_forward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const uint8_t*,       \
                                           const AttentionGeom&);                                                     \
  template void attention_naive_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, const T*,  \
                                            const T*, const uint8_t*, const AttentionGeom&);                          \
  template void attention_flash_forward<T>(T*, T*, const T*, const T*, const T*, const T*, const uint8_t*,           \
                                           const AttentionGeom&);                                                     \
  template void attention_flash_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, const T*,  \
                                            const T*, const uint8_t*, const AttentionGeom&);
TINYGPT_INSTANTIATE(float)
TINYGPT_INSTANTIATE(double)
#undef TINYGPT_INSTANTIATE

}  // namespace tinygpt::cpu

// The attention test matrix shared by the CPU kernel tests and the CUDA-vs-CPU tests: problem configurations
// (shapes, strided layouts, masks, dropout), their inputs in double, a direct double-precision reference, and
// runs of the CPU kernels.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/device.h"
#include "kernels/dropout_hash.h"

namespace tinygpt::test::attention {

using cpu::attention_flash_backward;
using cpu::attention_flash_forward;
using cpu::attention_naive_backward;
using cpu::attention_naive_forward;

constexpr double kInf = std::numeric_limits<double>::infinity();

enum class Layout { Contiguous, SeqMajor, Fused };
enum class MaskKind { None, Full, BroadcastTS, PerKey };  // (B, NH, T, S); (T, S) over B and NH; (B, S) over NH and T

struct Config {
  int64_t B = 1, NH = 1, NKV = 1, T = 4, S = 4, E = 8, Ev = 8;
  bool causal = false, key_padding = false;
  MaskKind mask = MaskKind::None;
  float dropout = 0;
  Layout layout = Layout::Contiguous;
  bool masked_row = false;    // some query rows see no key at all
  int64_t padded_prefix = 0;  // keys [0, padded_prefix) of batch 0 padded: whole leading key tiles invisible
  uint32_t seed = 1;
};

inline std::string describe(const Config& c) {
  static const char* layouts[] = {"contiguous", "seq-major", "fused"};
  static const char* masks[] = {"none", "full", "broadcast(T,S)", "per-key"};
  return "B=" + std::to_string(c.B) + " NH=" + std::to_string(c.NH) + " NKV=" + std::to_string(c.NKV) +
         " T=" + std::to_string(c.T) + " S=" + std::to_string(c.S) + " E=" + std::to_string(c.E) +
         " Ev=" + std::to_string(c.Ev) + " causal=" + std::to_string(c.causal) +
         " key_padding=" + std::to_string(c.key_padding) + " mask=" + masks[int(c.mask)] +
         " dropout=" + std::to_string(c.dropout) + " layout=" + layouts[int(c.layout)] +
         " masked_row=" + std::to_string(c.masked_row) + " padded_prefix=" + std::to_string(c.padded_prefix);
}

/// Inputs in double. q, k and v live in one storage buffer (separate regions, or interleaved when fused); the
/// gradients use a buffer of the same size at the same offsets, so fused gradients interleave too.
struct Problem {
  AttentionGeom g{};
  std::vector<double> qkv;
  int64_t q_off = 0, k_off = 0, v_off = 0, out_size = 0;
  std::vector<double> mask;  // empty: no mask
  std::vector<uint8_t> kp;   // empty: no key padding
  std::vector<double> dout;  // upstream gradient, output layout
};

inline void set3(int64_t* s, int64_t a, int64_t b, int64_t c) { s[0] = a, s[1] = b, s[2] = c; }

inline int64_t extent(const int64_t* stride, int64_t d0, int64_t d1, int64_t d2, int64_t D) {
  return (d0 - 1) * stride[0] + (d1 - 1) * stride[1] + (d2 - 1) * stride[2] + D;
}

/// Storage indices of every element of a (d0, d1, d2, D) tensor read through strides, in row-major order.
inline std::vector<int64_t> elements(int64_t off, const int64_t* stride, int64_t d0, int64_t d1, int64_t d2,
                                     int64_t D) {
  std::vector<int64_t> idx;
  for (int64_t a = 0; a < d0; ++a)
    for (int64_t b = 0; b < d1; ++b)
      for (int64_t c = 0; c < d2; ++c)
        for (int64_t e = 0; e < D; ++e) idx.push_back(off + a * stride[0] + b * stride[1] + c * stride[2] + e);
  return idx;
}

inline std::vector<int64_t> q_elements(const Problem& p) {
  return elements(p.q_off, p.g.q_stride, p.g.B, p.g.NH, p.g.T, p.g.E);
}
inline std::vector<int64_t> k_elements(const Problem& p) {
  return elements(p.k_off, p.g.k_stride, p.g.B, p.g.NKV, p.g.S, p.g.E);
}
inline std::vector<int64_t> v_elements(const Problem& p) {
  return elements(p.v_off, p.g.v_stride, p.g.B, p.g.NKV, p.g.S, p.g.Ev);
}
inline std::vector<int64_t> o_elements(const Problem& p) {
  return elements(0, p.g.o_stride, p.g.B, p.g.NH, p.g.T, p.g.Ev);
}

/// After a flash backward with AttentionGeom::grads_unwritten into a dqkv buffer that started as NaN: the elements
/// of no view (a layout's gaps, which no kernel writes) set to 0; returns how many elements of the views are NaN
/// still (each should have been written).
template <class T>
int64_t settle_unwritten(std::vector<T>& dqkv, const Problem& p) {
  std::vector<bool> in_view(dqkv.size(), false);
  for (const auto& view : {q_elements(p), k_elements(p), v_elements(p)}) {
    for (const int64_t i : view) in_view[size_t(i)] = true;
  }
  int64_t nan = 0;
  for (size_t i = 0; i < dqkv.size(); ++i) {
    if (!in_view[i]) dqkv[i] = T(0);
    nan += std::isnan(dqkv[i]);
  }
  return nan;
}

template <class T>
std::vector<double> gather(const std::vector<T>& buf, const std::vector<int64_t>& idx) {
  std::vector<double> r;
  for (int64_t i : idx) r.push_back(double(buf[size_t(i)]));
  return r;
}

inline Problem make_problem(const Config& c) {
  Problem p;
  AttentionGeom& g = p.g;
  g.B = c.B, g.NH = c.NH, g.NKV = c.NKV, g.T = c.T, g.S = c.S, g.E = c.E, g.Ev = c.Ev;
  g.scale = 1.0 / std::sqrt(double(c.E));
  g.causal = c.causal;
  g.dropout_p = c.dropout;
  g.dropout_seed = 1000 + c.seed;
  int64_t size = 0;
  switch (c.layout) {
    case Layout::Contiguous:  // (B, NH, T, E) etc., one after the other
      set3(g.q_stride, c.NH * c.T * c.E, c.T * c.E, c.E);
      set3(g.k_stride, c.NKV * c.S * c.E, c.S * c.E, c.E);
      set3(g.v_stride, c.NKV * c.S * c.Ev, c.S * c.Ev, c.Ev);
      set3(g.o_stride, c.NH * c.T * c.Ev, c.T * c.Ev, c.Ev);
      p.k_off = c.B * c.NH * c.T * c.E;
      p.v_off = p.k_off + c.B * c.NKV * c.S * c.E;
      size = p.v_off + c.B * c.NKV * c.S * c.Ev;
      break;
    case Layout::SeqMajor: {  // (B, T, NH, E) with 3 unused elements after each time step
      const int64_t pad = 3;
      set3(g.q_stride, c.T * (c.NH * c.E + pad), c.E, c.NH * c.E + pad);
      set3(g.k_stride, c.S * (c.NKV * c.E + pad), c.E, c.NKV * c.E + pad);
      set3(g.v_stride, c.S * (c.NKV * c.Ev + pad), c.Ev, c.NKV * c.Ev + pad);
      set3(g.o_stride, c.T * (c.NH * c.Ev + pad), c.Ev, c.NH * c.Ev + pad);
      p.k_off = c.B * g.q_stride[0];
      p.v_off = p.k_off + c.B * g.k_stride[0];
      size = p.v_off + c.B * g.v_stride[0];
      break;
    }
    case Layout::Fused: {  // one (B, T, NH + 2 NKV, E) projection output; out (B, T, NH, E)
      REQUIRE((c.T == c.S && c.E == c.Ev));
      const int64_t row = (c.NH + 2 * c.NKV) * c.E;
      set3(g.q_stride, c.T * row, c.E, row);
      set3(g.k_stride, c.T * row, c.E, row);
      set3(g.v_stride, c.T * row, c.E, row);
      set3(g.o_stride, c.T * c.NH * c.E, c.E, c.NH * c.E);
      p.k_off = c.NH * c.E;
      p.v_off = (c.NH + c.NKV) * c.E;
      size = c.B * c.T * row;
      break;
    }
  }
  p.out_size = extent(g.o_stride, c.B, c.NH, c.T, c.Ev);

  std::mt19937 rng(c.seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> unif(0.0, 1.0);
  p.qkv.resize(size_t(size));
  for (auto& x : p.qkv) x = normal(rng);
  p.dout.resize(size_t(p.out_size));
  for (auto& x : p.dout) x = normal(rng);

  MaskKind mk = c.mask;
  if (c.masked_row && mk == MaskKind::None) mk = MaskKind::BroadcastTS;
  if (mk != MaskKind::None) {
    int64_t n = 0;
    int64_t* ms = g.mask_stride;
    if (mk == MaskKind::Full)
      ms[0] = c.NH * c.T * c.S, ms[1] = c.T * c.S, ms[2] = c.S, ms[3] = 1, n = c.B * c.NH * c.T * c.S;
    if (mk == MaskKind::BroadcastTS) ms[0] = 0, ms[1] = 0, ms[2] = c.S, ms[3] = 1, n = c.T * c.S;
    if (mk == MaskKind::PerKey) ms[0] = c.S, ms[1] = 0, ms[2] = 0, ms[3] = 1, n = c.B * c.S;
    p.mask.resize(size_t(n));
    for (auto& x : p.mask) x = unif(rng) < 0.1 ? -kInf : 0.5 * normal(rng);
    if (c.masked_row) {
      if (mk == MaskKind::PerKey) {
        std::fill_n(p.mask.begin(), c.S, -kInf);  // every key of batch 0 removed: all its rows are empty
      } else {
        std::fill_n(p.mask.begin() + (c.T / 2) * c.S, c.S, -kInf);  // row T/2 (of (b, h) = (0, 0) when Full)
      }
    }
  }
  if (c.key_padding || c.padded_prefix > 0) {
    p.kp.resize(size_t(c.B * c.S));
    for (auto& x : p.kp) x = c.key_padding && unif(rng) < 0.2;
    std::fill_n(p.kp.begin(), c.padded_prefix, 1);
  }
  return p;
}

/// Direct double-precision attention: out and weights (before dropout) contiguous, lse (B, NH, T).
struct Reference {
  std::vector<double> out, lse, weights;
};

inline Reference reference_forward(const Problem& p) {
  const AttentionGeom& g = p.g;
  Reference r;
  r.out.assign(size_t(g.B * g.NH * g.T * g.Ev), 0.0);
  r.lse.assign(size_t(g.B * g.NH * g.T), -kInf);
  r.weights.assign(size_t(g.B * g.NH * g.T * g.S), 0.0);
  const double keep_scale = 1.0 / (1.0 - g.dropout_p);
  for (int64_t b = 0; b < g.B; ++b) {
    for (int64_t h = 0; h < g.NH; ++h) {
      const int64_t kvh = h / (g.NH / g.NKV);
      for (int64_t t = 0; t < g.T; ++t) {
        std::vector<double> score(size_t(g.S));
        double mx = -kInf;
        for (int64_t s = 0; s < g.S; ++s) {
          double x = 0;
          for (int64_t e = 0; e < g.E; ++e) {
            x += p.qkv[size_t(p.q_off + b * g.q_stride[0] + h * g.q_stride[1] + t * g.q_stride[2] + e)] *
                 p.qkv[size_t(p.k_off + b * g.k_stride[0] + kvh * g.k_stride[1] + s * g.k_stride[2] + e)];
          }
          x *= g.scale;
          if (!p.mask.empty()) {
            x += p.mask[size_t(b * g.mask_stride[0] + h * g.mask_stride[1] + t * g.mask_stride[2] +
                               s * g.mask_stride[3])];
          }
          if (g.causal && s > t + g.S - g.T) x = -kInf;
          if (!p.kp.empty() && p.kp[size_t(b * g.S + s)]) x = -kInf;
          score[size_t(s)] = x;
          mx = std::max(mx, x);
        }
        const int64_t row = (b * g.NH + h) * g.T + t;
        if (mx == -kInf) continue;
        double sum = 0;
        for (double x : score) sum += std::exp(x - mx);
        r.lse[size_t(row)] = mx + std::log(sum);
        for (int64_t s = 0; s < g.S; ++s) {
          const double w = std::exp(score[size_t(s)] - mx) / sum;
          r.weights[size_t(row * g.S + s)] = w;
          const bool keep = g.dropout_p == 0 || dropout_keep(g.dropout_seed.value(), row * g.S + s, g.dropout_p);
          if (!keep) continue;
          for (int64_t e = 0; e < g.Ev; ++e) {
            r.out[size_t(row * g.Ev + e)] +=
                w * keep_scale *
                p.qkv[size_t(p.v_off + b * g.v_stride[0] + kvh * g.v_stride[1] + s * g.v_stride[2] + e)];
          }
        }
      }
    }
  }
  return r;
}

/// Results of one kernel pair in precision T. Output buffers start as NaN so unwritten elements show.
template <class T>
struct Run {
  std::vector<T> out, lse, weights, dqkv;
};

template <class T>
std::vector<double> to_double(const std::vector<T>& x) {
  return std::vector<double>(x.begin(), x.end());
}

template <class T>
std::vector<T> convert(const std::vector<double>& x) {
  return std::vector<T>(x.begin(), x.end());
}

/// p's inputs in precision T on the host, with the kernels' pointer arguments (nullptr for an absent mask).
template <class T>
struct HostInputs {
  explicit HostInputs(const Problem& p)
      : qkv(convert<T>(p.qkv)),
        mask(convert<T>(p.mask)),
        dout(convert<T>(p.dout)),
        q(qkv.data() + p.q_off),
        k(qkv.data() + p.k_off),
        v(qkv.data() + p.v_off),
        m(mask.empty() ? nullptr : mask.data()),
        kp(p.kp.empty() ? nullptr : p.kp.data()) {}
  HostInputs(const HostInputs&) = delete;  // the pointers point into this object
  HostInputs& operator=(const HostInputs&) = delete;
  const std::vector<T> qkv, mask, dout;
  const T *q, *k, *v, *m;
  const uint8_t* kp;
};

template <class T>
Run<T> run(const Problem& p, bool flash, bool backward) {
  const AttentionGeom& g = p.g;
  const HostInputs<T> in(p);
  const T *q = in.q, *k = in.k, *v = in.v, *m = in.m;
  const uint8_t* kp = in.kp;
  const T nan = std::numeric_limits<T>::quiet_NaN();
  Run<T> r;
  r.out.assign(size_t(p.out_size), nan);
  r.lse.assign(size_t(g.B * g.NH * g.T), nan);
  if (flash) {
    attention_flash_forward(r.out.data(), r.lse.data(), q, k, v, m, kp, g);
  } else {
    r.weights.assign(size_t(g.B * g.NH * g.T * g.S), nan);
    attention_naive_forward(r.out.data(), r.weights.data(), r.lse.data(), q, k, v, m, kp, g);
  }
  if (backward) {
    r.dqkv.assign(in.qkv.size(), T(0));
    T* d = r.dqkv.data();
    auto bwd = flash ? attention_flash_backward<T> : attention_naive_backward<T>;
    bwd(d + p.q_off, d + p.k_off, d + p.v_off, in.dout.data(), q, k, v, r.out.data(), r.lse.data(), m, kp, g);
  }
  return r;
}

/// Every element within atol + rtol * |expected|; infinities must match exactly, NaN never passes.
template <class T>
void check_close(const std::vector<T>& got, const std::vector<double>& expected, double atol, double rtol,
                 const char* what) {
  REQUIRE(got.size() == expected.size());
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double x = double(got[i]), y = expected[i];
    const bool ok = std::isinf(y) ? x == y : std::abs(x - y) <= atol + rtol * std::abs(y);
    if (!ok && bad++ == 0) first = int64_t(i);
  }
  INFO(what << ": " << bad << " of " << got.size() << " elements differ; first at " << first << ": got "
            << (first >= 0 ? double(got[size_t(first)]) : 0.0) << ", expected "
            << (first >= 0 ? expected[size_t(first)] : 0.0));
  CHECK(bad == 0);
}

/// x rounded to the operand format of the tensor-core kernels: bf16 (7-bit mantissa, nearest, ties to even) or
/// tf32 (10-bit mantissa, nearest, ties away from zero), as their loads round it.
inline double round_operand(double x, AttentionMath format) {
  const float f = float(x);
  if (!std::isfinite(f) || format == AttentionMath::F32) return f;
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  u = format == AttentionMath::BF16 ? (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u : (u + 0x1000u) & 0xffffe000u;
  float r;
  std::memcpy(&r, &u, sizeof r);
  return r;
}

/// p with q, k, v and dout rounded to the operand format: a double-precision reference on it differs from the
/// tensor-core kernels only by their rounding of P and dS and by f32 accumulation.
inline Problem rounded_to(Problem p, AttentionMath format) {
  for (auto& x : p.qkv) x = round_operand(x, format);
  for (auto& x : p.dout) x = round_operand(x, format);
  return p;
}

/// The tensor-core kernels' tolerance: the root-mean-square error relative to the tensor's root mean square, and the
/// largest error of any element relative to the tensor's largest magnitude, within 1e-2 and 1.5e-2 for bf16
/// operands, 2e-3 and 3e-3 for tf32; infinities must match exactly and NaN never passes. The inputs are of order 1,
/// so both scales are floored at 0.05: a gradient that is zero but for rounding (one key, say: dS = P (dP - D)
/// cancels exactly) is measured against that, not against its own rounding noise.
template <class T>
void check_rounded_close(const std::vector<T>& got, const std::vector<double>& expected, AttentionMath format,
                         const char* what) {
  REQUIRE(got.size() == expected.size());
  const bool bf16 = format == AttentionMath::BF16;
  const double rel_tol = bf16 ? 1e-2 : 2e-3, max_tol = bf16 ? 1.5e-2 : 3e-3;
  double err2 = 0, ref2 = 0, max_err = 0, max_ref = 0;
  int64_t bad_inf = 0, first_inf = -1, worst = -1, finite = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double x = double(got[i]), y = expected[i];
    if (!std::isfinite(x) || !std::isfinite(y)) {
      if (!(x == y) && bad_inf++ == 0) first_inf = int64_t(i);
      continue;
    }
    err2 += (x - y) * (x - y);
    ref2 += y * y;
    ++finite;
    max_ref = std::max(max_ref, std::abs(y));
    if (std::abs(x - y) > max_err) max_err = std::abs(x - y), worst = int64_t(i);
  }
  constexpr double kFloor = 0.05;
  const double n = double(std::max<int64_t>(finite, 1));
  const double rel = std::sqrt(err2 / n) / std::max(std::sqrt(ref2 / n), kFloor);
  const auto show = [&](int64_t i) {
    return i < 0 ? std::string("-")
                 : "got " + std::to_string(double(got[size_t(i)])) + ", expected " +
                       std::to_string(expected[size_t(i)]) + " at " + std::to_string(i);
  };
  INFO(what << " (" << std::string(attention_math_name(format)) << "): relative RMS error " << rel << ", largest error "
            << max_err << " (largest |expected| " << max_ref << "; " << show(worst) << "), " << bad_inf
            << " infinite/NaN mismatches (first: " << show(first_inf) << ")");
  CHECK(bad_inf == 0);
  CHECK(rel <= rel_tol);
  CHECK(max_err <= max_tol * std::max(max_ref, kFloor));
}

/// A run of the tensor-core kernels against the double reference `ref` on the same (rounded) problem p.
template <class T>
void check_rounded_run(const Problem& p, const Run<double>& ref, AttentionMath format, const std::vector<T>& out,
                       const std::vector<T>& lse, const std::vector<T>& dqkv) {
  const std::vector<int64_t> outs = o_elements(p);
  check_rounded_close(gather(out, outs), gather(ref.out, outs), format, "out");
  check_close(lse, ref.lse, 1e-3, 1e-4, "lse");
  check_rounded_close(gather(dqkv, q_elements(p)), gather(ref.dqkv, q_elements(p)), format, "dq");
  check_rounded_close(gather(dqkv, k_elements(p)), gather(ref.dqkv, k_elements(p)), format, "dk");
  check_rounded_close(gather(dqkv, v_elements(p)), gather(ref.dqkv, v_elements(p)), format, "dv");
  check_rounded_close(dqkv, ref.dqkv, format, "gradient buffer, gaps included");
}

inline std::vector<Config> forward_cases() {
  std::vector<Config> cs;
  cs.push_back({.B = 2, .NH = 2, .NKV = 2, .T = 5, .S = 5, .E = 8, .Ev = 8});
  cs.push_back({.B = 1, .NH = 4, .NKV = 2, .T = 6, .S = 9, .E = 8, .Ev = 5, .layout = Layout::SeqMajor});  // GQA
  cs.push_back({.B = 2, .NH = 2, .NKV = 1, .T = 3, .S = 7, .E = 4, .Ev = 4, .causal = true});              // T < S
  cs.push_back({.B = 1, .NH = 2, .NKV = 2, .T = 7, .S = 3, .E = 4, .Ev = 6, .causal = true});  // T > S: empty rows
  cs.push_back({.B = 2, .NH = 2, .NKV = 2, .T = 4, .S = 6, .E = 8, .Ev = 8, .key_padding = true, .seed = 2});
  cs.push_back({.B = 2, .NH = 2, .NKV = 1, .T = 5, .S = 6, .E = 8, .Ev = 8, .mask = MaskKind::Full, .seed = 3});
  cs.push_back({.B = 1, .NH = 2, .NKV = 2, .T = 5, .S = 5, .E = 8, .Ev = 8, .causal = true, .masked_row = true});
  cs.push_back(
      {.B = 2, .NH = 2, .NKV = 2, .T = 5, .S = 6, .E = 8, .Ev = 8, .mask = MaskKind::PerKey, .masked_row = true});
  cs.push_back({.B = 2,
                .NH = 2,
                .NKV = 2,
                .T = 6,
                .S = 6,
                .E = 8,
                .Ev = 8,
                .causal = true,
                .dropout = 0.3f,
                .layout = Layout::Fused,
                .seed = 4});
  return cs;
}

/// A seeded random matrix of shapes plus the corners a random draw may miss.
inline std::vector<Config> flash_cases() {
  std::vector<Config> cs;
  cs.push_back(
      {.B = 2, .NH = 4, .NKV = 2, .T = 64, .S = 64, .E = 64, .Ev = 64, .causal = true, .layout = Layout::Fused});
  cs.push_back({.B = 1,
                .NH = 4,
                .NKV = 4,
                .T = 100,
                .S = 100,
                .E = 32,
                .Ev = 32,
                .causal = true,
                .key_padding = true,
                .mask = MaskKind::BroadcastTS,
                .dropout = 0.1f,
                .layout = Layout::Fused,
                .masked_row = true});
  cs.push_back({.B = 1, .NH = 4, .NKV = 1, .T = 1, .S = 100, .E = 128, .Ev = 128, .causal = true});
  cs.push_back(
      {.B = 2, .NH = 4, .NKV = 2, .T = 1, .S = 37, .E = 16, .Ev = 32, .key_padding = true, .mask = MaskKind::Full});
  cs.push_back(
      {.B = 2, .NH = 4, .NKV = 2, .T = 130, .S = 200, .E = 64, .Ev = 64, .causal = true, .layout = Layout::SeqMajor});
  cs.push_back(
      {.B = 1, .NH = 4, .NKV = 2, .T = 100, .S = 33, .E = 80, .Ev = 48, .causal = true, .mask = MaskKind::Full});
  cs.push_back({.B = 2, .NH = 4, .NKV = 4, .T = 33, .S = 7, .E = 5, .Ev = 3, .key_padding = true, .dropout = 0.5f});
  cs.push_back(
      {.B = 2, .NH = 4, .NKV = 2, .T = 40, .S = 150, .E = 32, .Ev = 32, .key_padding = true, .padded_prefix = 140});
  cs.push_back({.B = 2,
                .NH = 4,
                .NKV = 1,
                .T = 150,
                .S = 150,
                .E = 16,
                .Ev = 16,
                .causal = true,
                .dropout = 0.1f,
                .padded_prefix = 100});
  // 32 and more (batch, kv head) pairs: the flash backward's one pass (dQ summed beside dK and dV, no pass 2).
  cs.push_back({.B = 8,
                .NH = 4,
                .NKV = 4,
                .T = 33,
                .S = 33,
                .E = 16,
                .Ev = 16,
                .causal = true,
                .key_padding = true,
                .mask = MaskKind::Full,
                .dropout = 0.1f});
  cs.push_back(
      {.B = 16, .NH = 4, .NKV = 2, .T = 70, .S = 70, .E = 32, .Ev = 32, .causal = true, .layout = Layout::Fused});
  cs.push_back({.B = 8,
                .NH = 8,
                .NKV = 4,
                .T = 100,
                .S = 64,
                .E = 16,
                .Ev = 24,
                .mask = MaskKind::BroadcastTS,
                .layout = Layout::SeqMajor,
                .masked_row = true});
  cs.push_back({.B = 32,
                .NH = 2,
                .NKV = 1,
                .T = 130,
                .S = 130,
                .E = 8,
                .Ev = 8,
                .causal = true,
                .dropout = 0.2f,
                .padded_prefix = 60});
  std::mt19937 rng(2024);
  auto pick = [&](auto... xs) {
    const int64_t v[] = {int64_t(xs)...};
    return v[std::uniform_int_distribution<size_t>(0, sizeof...(xs) - 1)(rng)];
  };
  for (int i = 0; i < 120; ++i) {
    Config c;
    c.B = pick(1, 2);
    c.NH = 4;
    c.NKV = pick(4, 2, 1);
    c.T = pick(1, 7, 33, 64, 100);
    c.S = i % 3 == 0 ? c.T : pick(1, 7, 33, 64, 100);
    c.E = pick(16, 32, 64, 80, 128);
    c.Ev = i % 4 == 1 ? pick(16, 32, 64, 80, 128) : c.E;
    c.causal = pick(0, 1);
    c.key_padding = pick(0, 1);
    c.mask = MaskKind(pick(0, 1, 2, 3));
    c.dropout = pick(0, 0, 1) ? 0.2f : 0.0f;
    c.layout = c.T == c.S && c.E == c.Ev && pick(0, 1) ? Layout::Fused : Layout(pick(0, 1));
    c.masked_row = pick(0, 0, 0, 1);
    c.seed = uint32_t(100 + i);
    cs.push_back(c);
  }
  return cs;
}

}  // namespace tinygpt::test::attention

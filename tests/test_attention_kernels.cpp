// Attention kernels: naive against a direct double-precision computation and against central differences,
// flash against naive (forward and backward, float and double) over a matrix of shapes, layouts and masks.
#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/attention_kernels.h"
#include "kernels/dropout_hash.h"

namespace tinygpt::cpu {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

enum class Layout { Contiguous, SeqMajor, Fused };
enum class MaskKind { None, Full, BroadcastTS, PerKey };  // (B, NH, T, S); (T, S) over B and NH; (B, S) over NH and T

struct Config {
  int64_t B = 1, NH = 1, NKV = 1, T = 4, S = 4, E = 8, Ev = 8;
  bool causal = false, key_padding = false;
  MaskKind mask = MaskKind::None;
  float dropout = 0;
  Layout layout = Layout::Contiguous;
  bool masked_row = false;     // some query rows see no key at all
  int64_t padded_prefix = 0;   // keys [0, padded_prefix) of batch 0 padded: whole leading key tiles invisible
  uint32_t seed = 1;
};

std::string describe(const Config& c) {
  static const char* layouts[] = {"contiguous", "seq-major", "fused"};
  static const char* masks[] = {"none", "full", "broadcast(T,S)", "per-key"};
  return "B=" + std::to_string(c.B) + " NH=" + std::to_string(c.NH) + " NKV=" + std::to_string(c.NKV) +
         " T=" + std::to_string(c.T) + " S=" + std::to_string(c.S) + " E=" + std::to_string(c.E) +
         " Ev=" + std::to_string(c.Ev) + " causal=" + std::to_string(c.causal) + " key_padding=" +
         std::to_string(c.key_padding) + " mask=" + masks[int(c.mask)] + " dropout=" + std::to_string(c.dropout) +
         " layout=" + layouts[int(c.layout)] + " masked_row=" + std::to_string(c.masked_row) +
         " padded_prefix=" + std::to_string(c.padded_prefix);
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

void set3(int64_t* s, int64_t a, int64_t b, int64_t c) { s[0] = a, s[1] = b, s[2] = c; }

int64_t extent(const int64_t* stride, int64_t d0, int64_t d1, int64_t d2, int64_t D) {
  return (d0 - 1) * stride[0] + (d1 - 1) * stride[1] + (d2 - 1) * stride[2] + D;
}

/// Storage indices of every element of a (d0, d1, d2, D) tensor read through strides, in row-major order.
std::vector<int64_t> elements(int64_t off, const int64_t* stride, int64_t d0, int64_t d1, int64_t d2, int64_t D) {
  std::vector<int64_t> idx;
  for (int64_t a = 0; a < d0; ++a)
    for (int64_t b = 0; b < d1; ++b)
      for (int64_t c = 0; c < d2; ++c)
        for (int64_t e = 0; e < D; ++e) idx.push_back(off + a * stride[0] + b * stride[1] + c * stride[2] + e);
  return idx;
}

std::vector<int64_t> q_elements(const Problem& p) { return elements(p.q_off, p.g.q_stride, p.g.B, p.g.NH, p.g.T, p.g.E); }
std::vector<int64_t> k_elements(const Problem& p) { return elements(p.k_off, p.g.k_stride, p.g.B, p.g.NKV, p.g.S, p.g.E); }
std::vector<int64_t> v_elements(const Problem& p) { return elements(p.v_off, p.g.v_stride, p.g.B, p.g.NKV, p.g.S, p.g.Ev); }
std::vector<int64_t> o_elements(const Problem& p) { return elements(0, p.g.o_stride, p.g.B, p.g.NH, p.g.T, p.g.Ev); }

template <class T>
std::vector<double> gather(const std::vector<T>& buf, const std::vector<int64_t>& idx) {
  std::vector<double> r;
  for (int64_t i : idx) r.push_back(double(buf[size_t(i)]));
  return r;
}

Problem make_problem(const Config& c) {
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
    if (mk == MaskKind::Full) ms[0] = c.NH * c.T * c.S, ms[1] = c.T * c.S, ms[2] = c.S, ms[3] = 1, n = c.B * c.NH * c.T * c.S;
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

Reference reference_forward(const Problem& p) {
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
            x += p.mask[size_t(b * g.mask_stride[0] + h * g.mask_stride[1] + t * g.mask_stride[2] + s * g.mask_stride[3])];
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
          const bool keep = g.dropout_p == 0 || dropout_keep(g.dropout_seed, row * g.S + s, g.dropout_p);
          if (!keep) continue;
          for (int64_t e = 0; e < g.Ev; ++e) {
            r.out[size_t(row * g.Ev + e)] +=
                w * keep_scale * p.qkv[size_t(p.v_off + b * g.v_stride[0] + kvh * g.v_stride[1] + s * g.v_stride[2] + e)];
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

template <class T>
Run<T> run(const Problem& p, bool flash, bool backward) {
  const AttentionGeom& g = p.g;
  const std::vector<T> qkv = convert<T>(p.qkv), mask = convert<T>(p.mask), dout = convert<T>(p.dout);
  const T* q = qkv.data() + p.q_off;
  const T* k = qkv.data() + p.k_off;
  const T* v = qkv.data() + p.v_off;
  const T* m = mask.empty() ? nullptr : mask.data();
  const uint8_t* kp = p.kp.empty() ? nullptr : p.kp.data();
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
    r.dqkv.assign(qkv.size(), T(0));
    T* d = r.dqkv.data();
    auto bwd = flash ? attention_flash_backward<T> : attention_naive_backward<T>;
    bwd(d + p.q_off, d + p.k_off, d + p.v_off, dout.data(), q, k, v, r.out.data(), r.lse.data(), m, kp, g);
  }
  return r;
}

/// Every element within atol + rtol * |expected|; infinities must match exactly, NaN never passes.
template <class T>
void check_close(const std::vector<T>& got, const std::vector<double>& expected, double atol, double rtol, const char* what) {
  REQUIRE(got.size() == expected.size());
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double x = double(got[i]), y = expected[i];
    const bool ok = std::isinf(y) ? x == y : std::abs(x - y) <= atol + rtol * std::abs(y);
    if (!ok && bad++ == 0) first = int64_t(i);
  }
  INFO(what << ": " << bad << " of " << got.size() << " elements differ; first at " << first << ": got "
            << (first >= 0 ? double(got[size_t(first)]) : 0.0) << ", expected " << (first >= 0 ? expected[size_t(first)] : 0.0));
  CHECK(bad == 0);
}

template <class T>
void check_naive_forward(const Config& c, double atol, double rtol) {
  INFO(describe(c));
  const Problem p = make_problem(c);
  const Reference ref = reference_forward(p);
  const Run<T> r = run<T>(p, false, false);
  check_close(gather(r.out, o_elements(p)), ref.out, atol, rtol, "out");
  check_close(r.lse, ref.lse, atol, rtol, "lse");
  check_close(r.weights, ref.weights, atol, rtol, "weights");
}

std::vector<Config> forward_cases() {
  std::vector<Config> cs;
  cs.push_back({.B = 2, .NH = 2, .NKV = 2, .T = 5, .S = 5, .E = 8, .Ev = 8});
  cs.push_back({.B = 1, .NH = 4, .NKV = 2, .T = 6, .S = 9, .E = 8, .Ev = 5, .layout = Layout::SeqMajor});  // GQA
  cs.push_back({.B = 2, .NH = 2, .NKV = 1, .T = 3, .S = 7, .E = 4, .Ev = 4, .causal = true});             // T < S
  cs.push_back({.B = 1, .NH = 2, .NKV = 2, .T = 7, .S = 3, .E = 4, .Ev = 6, .causal = true});             // T > S: empty rows
  cs.push_back({.B = 2, .NH = 2, .NKV = 2, .T = 4, .S = 6, .E = 8, .Ev = 8, .key_padding = true, .seed = 2});
  cs.push_back({.B = 2, .NH = 2, .NKV = 1, .T = 5, .S = 6, .E = 8, .Ev = 8, .mask = MaskKind::Full, .seed = 3});
  cs.push_back({.B = 1, .NH = 2, .NKV = 2, .T = 5, .S = 5, .E = 8, .Ev = 8, .causal = true, .masked_row = true});
  cs.push_back({.B = 2, .NH = 2, .NKV = 2, .T = 5, .S = 6, .E = 8, .Ev = 8, .mask = MaskKind::PerKey, .masked_row = true});
  cs.push_back({.B = 2, .NH = 2, .NKV = 2, .T = 6, .S = 6, .E = 8, .Ev = 8, .causal = true, .dropout = 0.3f,
                .layout = Layout::Fused, .seed = 4});
  return cs;
}

TEST_CASE("attention_naive_forward matches a direct double-precision computation") {
  for (const Config& c : forward_cases()) {
    check_naive_forward<double>(c, 1e-12, 1e-12);
    check_naive_forward<float>(c, 1e-5, 1e-5);
  }
}

TEST_CASE("attention kernels: a row with no visible key gives zeros, lse -inf and zero gradients, never NaN") {
  // Causal with T > S: rows t < T - S see nothing; row T/2 has an all -inf mask; batch 1 pads every key.
  const Config c{.B = 2, .NH = 2, .NKV = 1, .T = 9, .S = 5, .E = 16, .Ev = 16, .causal = true, .dropout = 0.2f,
                 .masked_row = true};
  Problem p = make_problem(c);
  p.kp.assign(size_t(c.B * c.S), 0);
  std::fill_n(p.kp.begin() + c.S, c.S, 1);
  const AttentionGeom& g = p.g;
  for (bool flash : {false, true}) {
    INFO("flash=" << flash);
    const Run<float> r = run<float>(p, flash, true);
    int64_t empty_rows = 0;
    for (int64_t b = 0; b < c.B; ++b) {
      for (int64_t h = 0; h < c.NH; ++h) {
        for (int64_t t = 0; t < c.T; ++t) {
          const float lse = r.lse[size_t((b * c.NH + h) * c.T + t)];
          CHECK(!std::isnan(lse));
          if (!(b == 1 || t < c.T - c.S || t == c.T / 2)) continue;
          ++empty_rows;
          CHECK(lse == -std::numeric_limits<float>::infinity());
          for (int64_t e = 0; e < c.Ev; ++e) CHECK(r.out[size_t(b * g.o_stride[0] + h * g.o_stride[1] + t * g.o_stride[2] + e)] == 0.0f);
          for (int64_t e = 0; e < c.E; ++e) {
            CHECK(r.dqkv[size_t(p.q_off + b * g.q_stride[0] + h * g.q_stride[1] + t * g.q_stride[2] + e)] == 0.0f);
          }
        }
      }
    }
    CHECK(empty_rows == c.NH * c.T + c.NH * (c.T - c.S + 1));
    for (int64_t i : k_elements(p)) {  // batch 1 keys are all padded
      if (i >= p.k_off + g.k_stride[0]) CHECK(r.dqkv[size_t(i)] == 0.0f);
    }
    for (float x : r.dqkv) CHECK(!std::isnan(x));
    for (int64_t i : o_elements(p)) CHECK(!std::isnan(r.out[size_t(i)]));
  }
}

// Central differences of f = sum(out * R) with R = p.dout, in double, against the naive backward.
void check_naive_backward(const Config& c) {
  INFO(describe(c));
  Problem p = make_problem(c);
  const Run<double> r = run<double>(p, false, true);
  const std::vector<int64_t> outs = o_elements(p);
  auto objective = [&] {
    const Run<double> f = run<double>(p, false, false);
    double sum = 0;
    for (int64_t i : outs) sum += f.out[size_t(i)] * p.dout[size_t(i)];
    return sum;
  };
  const double h = 1e-5;
  for (const auto& [name, idx] : {std::pair{"dq", q_elements(p)}, {"dk", k_elements(p)}, {"dv", v_elements(p)}}) {
    std::vector<double> numeric;
    for (int64_t i : idx) {
      const double x0 = p.qkv[size_t(i)];
      p.qkv[size_t(i)] = x0 + h;
      const double fp = objective();
      p.qkv[size_t(i)] = x0 - h;
      const double fm = objective();
      p.qkv[size_t(i)] = x0;
      numeric.push_back((fp - fm) / (2 * h));
    }
    check_close(gather(r.dqkv, idx), numeric, 1e-7, 1e-6, name);
  }
}

TEST_CASE("attention_naive_backward matches central differences") {
  check_naive_backward({.B = 2, .NH = 2, .NKV = 2, .T = 4, .S = 5, .E = 4, .Ev = 3});
  check_naive_backward({.B = 1, .NH = 4, .NKV = 2, .T = 5, .S = 4, .E = 4, .Ev = 4, .causal = true, .layout = Layout::SeqMajor});
  check_naive_backward({.B = 2, .NH = 2, .NKV = 1, .T = 3, .S = 6, .E = 3, .Ev = 5, .causal = true, .key_padding = true,
                        .mask = MaskKind::Full, .seed = 5});
  check_naive_backward({.B = 1, .NH = 2, .NKV = 2, .T = 5, .S = 5, .E = 4, .Ev = 4, .mask = MaskKind::BroadcastTS,
                        .masked_row = true, .seed = 6});
  check_naive_backward({.B = 2, .NH = 2, .NKV = 1, .T = 5, .S = 5, .E = 4, .Ev = 4, .causal = true, .dropout = 0.25f,
                        .layout = Layout::Fused, .seed = 7});
}

/// Flash forward and backward against naive in the same precision.
template <class T>
void check_flash(const Config& c) {
  INFO(describe(c));
  // Gradients get a larger float atol: dS = P * (dP - D) cancels (exactly, when S = 1), and dK sums up to
  // group * T such terms, so both kernels carry rounding noise of about eps * |dO| |V| * sqrt(terms) ~ 1e-5
  // where the exact gradient is 0.
  const bool f32 = std::is_same_v<T, float>;
  const double atol = f32 ? 1e-5 : 1e-11, grad_atol = f32 ? 5e-5 : 1e-10, rtol = f32 ? 1e-4 : 1e-9;
  const Problem p = make_problem(c);
  const Run<T> naive = run<T>(p, false, true), flash = run<T>(p, true, true);
  const std::vector<int64_t> outs = o_elements(p);
  const std::vector<double> out = gather(flash.out, outs);
  CHECK(std::none_of(out.begin(), out.end(), [](double x) { return std::isnan(x); }));
  check_close(out, gather(naive.out, outs), atol, rtol, "out");
  check_close(flash.lse, to_double(naive.lse), atol, rtol, "lse");
  check_close(gather(flash.dqkv, q_elements(p)), gather(naive.dqkv, q_elements(p)), grad_atol, rtol, "dq");
  check_close(gather(flash.dqkv, k_elements(p)), gather(naive.dqkv, k_elements(p)), grad_atol, rtol, "dk");
  check_close(gather(flash.dqkv, v_elements(p)), gather(naive.dqkv, v_elements(p)), grad_atol, rtol, "dv");
  check_close(flash.dqkv, to_double(naive.dqkv), grad_atol, rtol, "gradient buffer, gaps included");
}

/// A seeded random matrix of shapes plus the corners a random draw may miss.
std::vector<Config> flash_cases() {
  std::vector<Config> cs;
  cs.push_back({.B = 2, .NH = 4, .NKV = 2, .T = 64, .S = 64, .E = 64, .Ev = 64, .causal = true, .layout = Layout::Fused});
  cs.push_back({.B = 1, .NH = 4, .NKV = 4, .T = 100, .S = 100, .E = 32, .Ev = 32, .causal = true, .key_padding = true,
                .mask = MaskKind::BroadcastTS, .dropout = 0.1f, .layout = Layout::Fused, .masked_row = true});
  cs.push_back({.B = 1, .NH = 4, .NKV = 1, .T = 1, .S = 100, .E = 128, .Ev = 128, .causal = true});
  cs.push_back({.B = 2, .NH = 4, .NKV = 2, .T = 130, .S = 200, .E = 64, .Ev = 64, .causal = true, .layout = Layout::SeqMajor});
  cs.push_back({.B = 1, .NH = 4, .NKV = 2, .T = 100, .S = 33, .E = 80, .Ev = 48, .causal = true, .mask = MaskKind::Full});
  cs.push_back({.B = 2, .NH = 4, .NKV = 4, .T = 33, .S = 7, .E = 5, .Ev = 3, .key_padding = true, .dropout = 0.5f});
  cs.push_back({.B = 2, .NH = 4, .NKV = 2, .T = 40, .S = 150, .E = 32, .Ev = 32, .key_padding = true, .padded_prefix = 140});
  cs.push_back({.B = 2, .NH = 4, .NKV = 1, .T = 150, .S = 150, .E = 16, .Ev = 16, .causal = true, .dropout = 0.1f,
                .padded_prefix = 100});
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

TEST_CASE("attention_flash matches attention_naive, forward and backward") {
  for (const Config& c : flash_cases()) {
    check_flash<float>(c);
    check_flash<double>(c);
  }
}

TEST_CASE("attention backward kernels accumulate into their gradients") {
  const Config c{.B = 2, .NH = 4, .NKV = 2, .T = 70, .S = 70, .E = 32, .Ev = 32, .causal = true, .mask = MaskKind::Full,
                 .dropout = 0.1f, .layout = Layout::Fused};
  const Problem p = make_problem(c);
  for (bool flash : {false, true}) {
    INFO("flash=" << flash);
    const Run<double> once = run<double>(p, flash, true);
    std::vector<double> grad(p.qkv.size());
    std::mt19937 rng(9);
    std::normal_distribution<double> normal;
    for (auto& x : grad) x = normal(rng);
    const std::vector<double> start = grad;
    auto bwd = flash ? attention_flash_backward<double> : attention_naive_backward<double>;
    const double* q = p.qkv.data() + p.q_off;
    const double* k = p.qkv.data() + p.k_off;
    const double* v = p.qkv.data() + p.v_off;
    for (int call = 0; call < 2; ++call) {
      bwd(grad.data() + p.q_off, grad.data() + p.k_off, grad.data() + p.v_off, p.dout.data(), q, k, v, once.out.data(),
          once.lse.data(), p.mask.data(), nullptr, p.g);
    }
    std::vector<double> expected(grad.size());
    for (size_t i = 0; i < grad.size(); ++i) expected[i] = start[i] + 2 * once.dqkv[i];
    check_close(grad, expected, 1e-12, 1e-12, "start + 2 * gradient");
    // Null gradients are skipped; the one asked for is unchanged.
    std::vector<double> dv_only(p.qkv.size(), 0.0);
    bwd(nullptr, nullptr, dv_only.data() + p.v_off, p.dout.data(), q, k, v, once.out.data(), once.lse.data(),
        p.mask.data(), nullptr, p.g);
    const std::vector<int64_t> vs = v_elements(p);
    check_close(gather(dv_only, vs), gather(once.dqkv, vs), 1e-12, 1e-12, "dv alone");
  }
}

TEST_CASE("attention_flash results do not depend on the number of threads") {
  const Config c{.B = 1, .NH = 4, .NKV = 1, .T = 150, .S = 150, .E = 64, .Ev = 64, .causal = true, .key_padding = true};
  const Problem p = make_problem(c);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const Run<float> one = run<float>(p, true, true);
  omp_set_num_threads(3);
  const Run<float> three = run<float>(p, true, true);
  omp_set_num_threads(threads);
  CHECK(one.lse == three.lse);
  CHECK(gather(one.out, o_elements(p)) == gather(three.out, o_elements(p)));
  CHECK(one.dqkv == three.dqkv);
}

}  // namespace
}  // namespace tinygpt::cpu

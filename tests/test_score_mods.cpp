// Score modifiers (relative positions, ALiBi, T5 bias, window, documents, soft-cap): the kernels against the same
// attention composed from basic ops with every bias and mask materialized (T x S), which is written here from the
// papers' definitions; flash and naive, values and every gradient (q, k, v and the learned tables), f64 and f32;
// and central-difference gradient checks.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>

#include "autograd/attention.h"
#include "kernels/scalar_math.h"
#include "test_util.h"

using namespace tinygpt;
using tinygpt::test::check_close;
using tinygpt::test::expect_gradcheck;
using Inputs = std::vector<Tensor>;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST_CASE("ALiBi slopes are the paper's geometric sequence, for any head count") {
  // Press et al.'s get_slopes(n): 8 heads: 2^-1 .. 2^-8; 6 heads: the 4-head slopes 2^-2, 2^-4, 2^-6, 2^-8, then
  // every other slope of 8 heads from the first: 2^-1, 2^-3.
  for (int64_t h = 0; h < 8; ++h) CHECK(alibi_slope(h, 8) == std::ldexp(1.0, -int(h + 1)));
  const double six[] = {0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125};
  for (int64_t h = 0; h < 6; ++h) CHECK(alibi_slope(h, 6) == six[h]);
  CHECK(alibi_slope(0, 1) == std::ldexp(1.0, -8));
  // 12 heads: 8-head slopes, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5.
  CHECK(alibi_slope(8, 12) == doctest::Approx(std::pow(2.0, -0.5)));
  CHECK(alibi_slope(11, 12) == doctest::Approx(std::pow(2.0, -3.5)));
}

TEST_CASE("T5 buckets: exact below half the buckets, log-spaced up to max_distance, future keys by direction") {
  // Causal, 32 buckets, max distance 128 (T5's defaults): distance n into the past -> n below 16, then
  // 16 + floor(log(n / 16) / log(8) * 16): 32 -> 21, 64 -> 26, 127 -> 31, and everything further -> 31.
  auto causal = [](int64_t d) { return t5_bucket(d, 32, 128, false); };
  CHECK(causal(0) == 0);
  CHECK(causal(5) == 0);  // a future key shares bucket 0
  CHECK(causal(-1) == 1);
  CHECK(causal(-15) == 15);
  CHECK(causal(-16) == 16);
  CHECK(causal(-32) == 21);
  CHECK(causal(-64) == 26);
  CHECK(causal(-127) == 31);
  CHECK(causal(-100000) == 31);
  // Bidirectional: 16 buckets a side, 8 exact: past n -> n below 8, future n -> 16 + n; 8 + floor(log(n/8)/log(16)*8).
  auto both = [](int64_t d) { return t5_bucket(d, 32, 128, true); };
  CHECK(both(-3) == 3);
  CHECK(both(3) == 19);
  CHECK(both(-16) == 10);      // 8 + floor(0.25 * 8)
  CHECK(both(32) == 16 + 12);  // 8 + floor(0.5 * 8), future
  CHECK(both(-1000) == 15);
}

/// What one case turns on.
struct Mods {
  int64_t B = 2, NH = 4, NKV = 2, T = 7, S = 7, E = 8, Ev = 6;
  bool causal = true, padding = false, dropout = false;
  int64_t window = 0, max_rel = 0;
  bool rel_value = false, alibi = false, t5 = false, t5_bidir = false, docs = false;
  double softcap = 0;

  std::string str() const {
    return "B=" + std::to_string(B) + " NH=" + std::to_string(NH) + " NKV=" + std::to_string(NKV) +
           " T=" + std::to_string(T) + " S=" + std::to_string(S) + " causal=" + std::to_string(causal) +
           " padding=" + std::to_string(padding) + " dropout=" + std::to_string(dropout) +
           " window=" + std::to_string(window) + " max_rel=" + std::to_string(max_rel) +
           " rel_value=" + std::to_string(rel_value) + " alibi=" + std::to_string(alibi) + " t5=" + std::to_string(t5) +
           (t5_bidir ? "(bidirectional)" : "") + " docs=" + std::to_string(docs) +
           " softcap=" + std::to_string(softcap);
  }
};

/// The inputs of a case: q, k, v, then the tables that are on (relative key, relative value, T5 bias), f64 leaves.
struct Problem {
  Inputs inputs;
  std::vector<int32_t> q_doc, k_doc;
  std::vector<uint8_t> pad;
};

Problem make(const Mods& c, uint64_t seed) {
  Generator gen(seed);
  Problem p;
  p.inputs = {test::leaf({c.B, c.NH, c.T, c.E}, gen), test::leaf({c.B, c.NKV, c.S, c.E}, gen),
              test::leaf({c.B, c.NKV, c.S, c.Ev}, gen)};
  if (c.max_rel > 0) {
    p.inputs.push_back(test::leaf({2 * c.max_rel + 1, c.E}, gen, 0.5));
    if (c.rel_value) p.inputs.push_back(test::leaf({2 * c.max_rel + 1, c.Ev}, gen, 0.5));
  }
  if (c.t5) p.inputs.push_back(test::leaf({c.NH, 8}, gen, 0.5));
  if (c.docs) {  // packed documents: batch 0 has three, batch 1 one long and one short
    for (int64_t b = 0; b < c.B; ++b) {
      for (int64_t t = 0; t < c.T; ++t) p.q_doc.push_back(int32_t(b == 0 ? t * 3 / c.T : (t < c.T - 2 ? 0 : 1)));
      for (int64_t s = 0; s < c.S; ++s)
        p.k_doc.push_back(int32_t(b == 0 ? (s + c.T - c.S) * 3 / c.T : (s + c.T - c.S < c.T - 2 ? 0 : 1)));
    }
  }
  if (c.padding) {
    p.pad.assign(size_t(c.B * c.S), 0);
    for (int64_t s = 1; s < c.S; s += 3) p.pad[size_t(s)] = 1;
  }
  return p;
}

AttentionOptions options(const Mods& c, const Problem& p, const Inputs& in, AttentionImpl impl) {
  AttentionOptions o;
  o.impl = impl;
  o.is_causal = c.causal;
  if (c.dropout) o.dropout_p = 0.25, o.dropout_seed = 99;
  if (c.padding) o.key_padding_mask = from_vector(p.pad, {c.B, c.S});
  ScoreModOptions& m = o.mods;
  m.window = c.window;
  m.softcap = c.softcap;
  m.alibi = c.alibi;
  size_t next = 3;
  if (c.max_rel > 0) {
    m.relative_key = in[next++];
    if (c.rel_value) m.relative_value = in[next++];
  }
  if (c.t5) {
    m.t5_bias = in[next++];
    m.t5_bidirectional = c.t5_bidir;
    m.t5_max_distance = 12;
  }
  if (c.docs) {
    m.doc_ids = from_vector(p.q_doc, {c.B, c.T});
    m.key_doc_ids = from_vector(p.k_doc, {c.B, c.S});
  }
  return o;
}

/// The attention composed from basic ops, every term of kernels/score_mods.h written out over the full (T, S)
/// grid: one-hot matrices gather Shaw's tables and T5's buckets by distance, and one additive mask holds the
/// causal, window, document and padding rules.
Tensor reference(const Mods& c, const Problem& p, const Inputs& in) {
  const int64_t B = c.B, NH = c.NH, NKV = c.NKV, T = c.T, S = c.S, G = NH / NKV, W = 2 * c.max_rel + 1;
  const Tensor &q = in[0], &k = in[1], &v = in[2];
  size_t next = 3;
  auto distance = [&](int64_t t, int64_t s) { return s - (t + S - T); };
  auto onehot = [&](int64_t width, auto column) {  // (T, S, width): 1 at column(d)
    std::vector<double> m(size_t(T * S * width), 0.0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t s = 0; s < S; ++s) m[size_t((t * S + s) * width + column(distance(t, s)))] = 1.0;
    return from_vector(m, {T, S, width});
  };
  auto clip = [&](int64_t d) { return std::clamp<int64_t>(d, -c.max_rel, c.max_rel) + c.max_rel; };
  Tensor scores = reshape(matmul(reshape(q, {B, NKV, G * T, c.E}), k, false, true), {B, NH, T, S});
  Tensor rel_onehot;
  if (c.max_rel > 0) {
    rel_onehot = onehot(W, clip);
    const Tensor R = matmul(q, in[next++], false, true);  // (B, NH, T, W) = q . A_K
    scores = scores + sum(reshape(R, {B, NH, T, 1, W}) * rel_onehot, 4);
  }
  scores = scores * (1.0 / std::sqrt(double(c.E)));
  if (c.softcap > 0) scores = tanh(scores * (1.0 / c.softcap)) * c.softcap;
  std::vector<double> add(size_t(B * NH * T * S), 0.0);  // biases and masks, (B, NH, T, S)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t s = 0; s < S; ++s) {
          const int64_t d = distance(t, s);
          double x = c.alibi ? -alibi_slope(h, NH) * double(std::abs(d)) : 0.0;
          const bool hidden = (c.causal && d > 0) || (c.window > 0 && std::abs(d) >= c.window) ||
                              (c.docs && p.q_doc[size_t(b * T + t)] != p.k_doc[size_t(b * S + s)]) ||
                              (c.padding && p.pad[size_t(b * S + s)]);
          add[size_t(((b * NH + h) * T + t) * S + s)] = hidden ? -kInf : x;
        }
  scores = scores + from_vector(add, {B, NH, T, S});
  Tensor rel_v;
  if (c.rel_value) rel_v = in[next++];
  if (c.t5) {
    const Tensor& table = in[next++];
    const Tensor buckets = reshape(onehot(8, [&](int64_t d) { return t5_bucket(d, 8, 12, c.t5_bidir); }), {T * S, 8});
    scores = scores + reshape(matmul(table, buckets, false, true), {NH, T, S});
  }
  Tensor weights = softmax(scores);
  if (c.dropout) weights = dropout(weights, 0.25, 99);
  Tensor out = reshape(matmul(reshape(weights, {B, NKV, G * T, S}), v), {B, NH, T, c.Ev});
  if (rel_v.defined()) {
    const Tensor pbar = sum(reshape(weights, {B, NH, T, S, 1}) * rel_onehot, 3);  // (B, NH, T, W)
    out = out + reshape(matmul(reshape(pbar, {B * NH * T, W}), rel_v), {B, NH, T, c.Ev});
  }
  return out;
}

/// Output and the gradients of every input of sum(f(inputs) * proj), on fresh copies of `values` of `dtype`.
std::vector<Tensor> run(const std::function<Tensor(const Inputs&)>& f, const Inputs& values, DType dtype) {
  Inputs in;
  for (const Tensor& x : values) {
    Tensor y = x.detach().to(dtype).clone();
    y.requires_grad_();
    in.push_back(y);
  }
  const Tensor out = f(in);
  Generator gen(7);
  const Tensor proj = randn(out.shape(), gen, dtype);
  sum(out * proj).backward();
  std::vector<Tensor> result{out.detach()};
  for (const Tensor& x : in) result.push_back(x.grad());
  return result;
}

void check_case(const Mods& c) {
  INFO(c.str());
  const Problem p = make(c, 1234);
  const auto ref = run([&](const Inputs& in) { return reference(c, p, in); }, p.inputs, DType::F64);
  const char* names[] = {"out", "dq", "dk", "dv", "table 1", "table 2", "table 3"};
  for (AttentionImpl impl : {AttentionImpl::Flash, AttentionImpl::Naive}) {
    for (DType dtype : {DType::F64, DType::F32}) {
      INFO((impl == AttentionImpl::Flash ? "flash " : "naive ") << std::string(dtype_name(dtype)));
      const auto got = run(
          [&](const Inputs& in) {
            return scaled_dot_product_attention(in[0], in[1], in[2], options(c, p, in, impl)).out;
          },
          p.inputs, dtype);
      const double tol = dtype == DType::F64 ? 1e-10 : 2e-5;
      for (size_t i = 0; i < ref.size(); ++i) {
        INFO(std::string(names[i]));
        check_close(got[i], ref[i], tol, tol);
      }
    }
  }
}

TEST_CASE("score modifiers: flash and naive kernels equal the attention composed from ops, values and gradients") {
  std::vector<Mods> cases;
  auto with = [&](auto change) {
    Mods c;
    change(c);
    cases.push_back(c);
  };
  with([](Mods& c) { c.max_rel = 2; });                    // T > m: clipped distances
  with([](Mods& c) { c.max_rel = 9, c.causal = false; });  // T < m: nothing clipped, both directions
  with([](Mods& c) { c.max_rel = 3, c.rel_value = true; });
  with([](Mods& c) { c.max_rel = 2, c.rel_value = true, c.causal = false, c.T = 5, c.S = 9, c.padding = true; });
  with([](Mods& c) { c.alibi = true; });
  with([](Mods& c) { c.alibi = true, c.NH = 6, c.NKV = 3, c.causal = false; });  // 6 heads: non-power-of-two slopes
  with([](Mods& c) { c.t5 = true; });
  with([](Mods& c) { c.t5 = true, c.t5_bidir = true, c.causal = false, c.T = 9, c.S = 13; });
  with([](Mods& c) { c.window = 3; });
  with([](Mods& c) { c.window = 2, c.causal = false, c.T = 6, c.S = 10; });
  with([](Mods& c) { c.docs = true; });
  with([](Mods& c) { c.docs = true, c.causal = false, c.padding = true; });
  with([](Mods& c) { c.softcap = 1.5; });
  with([](Mods& c) { c.softcap = 2.0, c.dropout = true; });
  with([](Mods& c) {  // everything at once
    c.max_rel = 2, c.rel_value = true, c.alibi = true, c.t5 = true, c.window = 4, c.docs = true, c.softcap = 3.0;
    c.padding = true, c.dropout = true, c.T = 9, c.S = 11, c.NH = 4, c.NKV = 1;
  });
  // 32 (batch, kv head) pairs: the backward's one pass, which sums Shaw's dR in its query-major tiles (T5's table
  // gradient keeps two passes)
  with([](Mods& c) { c.B = 16, c.max_rel = 2, c.T = 9, c.S = 9; });
  with([](Mods& c) {
    c.B = 16, c.max_rel = 3, c.rel_value = true, c.window = 6, c.docs = true, c.softcap = 3.0, c.padding = true;
    c.dropout = true, c.alibi = true, c.causal = false, c.T = 9, c.S = 11;
  });
  for (const Mods& c : cases) check_case(c);
}

TEST_CASE("score modifiers: flash attention over many tiles (window and documents skip tiles) equals naive") {
  // Long enough for several 64-wide tiles, so the skipped tiles and the tile edges are exercised.
  Mods c;
  c.B = 1, c.NH = 2, c.NKV = 1, c.T = 150, c.S = 150, c.E = 16, c.Ev = 16;
  c.window = 40, c.docs = true, c.max_rel = 5, c.rel_value = true, c.t5 = true, c.softcap = 5.0, c.alibi = true;
  for (bool causal : {true, false}) {
    c.causal = causal;
    INFO("causal=" << causal);
    const Problem p = make(c, 5);
    auto attend = [&](AttentionImpl impl) {
      return [&c, &p, impl](const Inputs& in) {
        return scaled_dot_product_attention(in[0], in[1], in[2], options(c, p, in, impl)).out;
      };
    };
    const auto naive = run(attend(AttentionImpl::Naive), p.inputs, DType::F64);
    const auto flash = run(attend(AttentionImpl::Flash), p.inputs, DType::F64);
    for (size_t i = 0; i < naive.size(); ++i) {
      INFO("output/gradient " << i);
      check_close(flash[i], naive[i], 1e-10, 1e-10);
    }
  }
  // The backward's one pass over several tiles: 32 (batch, kv head) pairs, Shaw's tables without T5's.
  c = Mods{};
  c.B = 32, c.NH = 2, c.NKV = 1, c.T = 130, c.S = 130, c.E = 8, c.Ev = 8, c.max_rel = 5, c.rel_value = true;
  c.softcap = 5.0;
  const Problem p = make(c, 6);
  auto attend = [&](AttentionImpl impl) {
    return [&c, &p, impl](const Inputs& in) {
      return scaled_dot_product_attention(in[0], in[1], in[2], options(c, p, in, impl)).out;
    };
  };
  const auto naive = run(attend(AttentionImpl::Naive), p.inputs, DType::F64);
  const auto flash = run(attend(AttentionImpl::Flash), p.inputs, DType::F64);
  for (size_t i = 0; i < naive.size(); ++i) {
    INFO("one pass: output/gradient " << i);
    check_close(flash[i], naive[i], 1e-10, 1e-10);
  }
}

TEST_CASE("score modifiers: central-difference gradient checks of flash attention and of its tables") {
  std::vector<Mods> cases;
  Mods all;
  all.B = 1, all.NH = 2, all.NKV = 1, all.T = 6, all.S = 6, all.E = 4, all.Ev = 3;
  all.max_rel = 2, all.rel_value = true, all.t5 = true, all.alibi = true, all.softcap = 2.0, all.window = 4;
  cases.push_back(all);
  Mods cross = all;
  cross.causal = false, cross.T = 4, cross.S = 7, cross.max_rel = 8, cross.t5_bidir = true, cross.docs = true;
  cases.push_back(cross);
  for (const Mods& c : cases) {
    INFO(c.str());
    const Problem p = make(c, 3);
    expect_gradcheck(
        [&](const Inputs& in) {
          return scaled_dot_product_attention(in[0], in[1], in[2], options(c, p, in, AttentionImpl::Flash)).out;
        },
        p.inputs);
  }
}

TEST_CASE("score modifiers: bad tables, ids and values are refused with a message") {
  Generator gen(1);
  const Tensor q = randn({1, 2, 4, 8}, gen, DType::F64), k = randn({1, 2, 4, 8}, gen, DType::F64);
  auto attempt = [&](auto set) {
    AttentionOptions o;
    set(o.mods);
    scaled_dot_product_attention(q, k, k, o);
  };
  CHECK_THROWS_WITH_AS(attempt([&](ScoreModOptions& m) {
                         m.relative_key = randn({4, 8}, gen, DType::F64);
                       }),
                       doctest::Contains("2m + 1 rows"), Error);
  CHECK_THROWS_WITH_AS(attempt([&](ScoreModOptions& m) {
                         m.relative_key = randn({5, 7}, gen, DType::F64);
                       }),
                       doctest::Contains("relative_key must be (2m + 1, E)"), Error);
  CHECK_THROWS_WITH_AS(attempt([&](ScoreModOptions& m) {
                         m.t5_bias = randn({3, 8}, gen, DType::F64);
                       }),
                       doctest::Contains("t5_bias must be (NH, buckets)"), Error);
  CHECK_THROWS_AS(attempt([&](ScoreModOptions& m) { m.t5_bias = randn({2, 8}, gen, DType::F32); }), Error);
  CHECK_THROWS_WITH_AS(attempt([&](ScoreModOptions& m) {
                         m.doc_ids = from_vector(std::vector<int32_t>{0, 0, 1}, {1, 3});
                       }),
                       doctest::Contains("doc_ids must be an i32 (B, T)"), Error);
  CHECK_THROWS_WITH_AS(attempt([&](ScoreModOptions& m) { m.window = -1; }), doctest::Contains("window must be >= 0"),
                       Error);
  CHECK_THROWS_WITH_AS(attempt([&](ScoreModOptions& m) { m.softcap = -2; }), doctest::Contains("softcap"), Error);
  // The settings the tables size must agree with them.
  CHECK_THROWS_WITH_AS(attempt([&](ScoreModOptions& m) { m.t5_buckets = 8; }), doctest::Contains("no t5_bias"), Error);
  CHECK_THROWS_WITH_AS(attempt([&](ScoreModOptions& m) {
                         m.t5_buckets = 4, m.t5_bias = randn({2, 8}, gen, DType::F64);
                       }),
                       doctest::Contains("t5_buckets is 4 but"), Error);
  CHECK_THROWS_WITH_AS(attempt([&](ScoreModOptions& m) {
                         m.max_rel = 3, m.relative_key = randn({5, 8}, gen, DType::F64);
                       }),
                       doctest::Contains("max_rel is 3 but"), Error);
  CHECK_THROWS_WITH_AS(attempt([&](ScoreModOptions& m) {
                         m.t5_max_distance = 2, m.t5_bias = randn({2, 8}, gen, DType::F64);
                       }),
                       doctest::Contains("t5_max_distance above"), Error);
}

TEST_CASE("score modifiers: bf16 tensors are refused bad settings as f32 ones are, on the lean path too") {
  Generator gen(2);
  const Tensor q = cast(randn({1, 2, 4, 8}, gen, DType::F32), DType::BF16);
  auto attempt = [&](auto set) {
    AttentionOptions o;
    set(o.mods);
    scaled_dot_product_attention(q, q, q, o);
  };
  CHECK_NOTHROW(attempt([](ScoreModOptions&) {}));
  CHECK_THROWS_WITH_AS(attempt([](ScoreModOptions& m) { m.window = -1; }), doctest::Contains("window must be >= 0"),
                       Error);
  CHECK_THROWS_WITH_AS(attempt([](ScoreModOptions& m) { m.softcap = std::nan(""); }), doctest::Contains("softcap"),
                       Error);
  CHECK_THROWS_WITH_AS(attempt([](ScoreModOptions& m) {
                         m.key_doc_ids = from_vector(std::vector<int32_t>{0, 0, 1, 1}, {1, 4});
                       }),
                       doctest::Contains("key_doc_ids needs doc_ids"), Error);
}

}  // namespace

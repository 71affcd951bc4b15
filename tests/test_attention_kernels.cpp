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

#include "kernels/cpu/gemm.h"
#include "tests/attention_cases.h"

namespace tinygpt::cpu {
namespace {

using namespace tinygpt::test::attention;

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

TEST_CASE("attention_naive_forward matches a direct double-precision computation") {
  for (const Config& c : forward_cases()) {
    check_naive_forward<double>(c, 1e-12, 1e-12);
    check_naive_forward<float>(c, 1e-5, 1e-5);
  }
}

TEST_CASE("attention kernels: a row with no visible key gives zeros, lse -inf and zero gradients, never NaN") {
  // Causal with T > S: rows t < T - S see nothing; row T/2 has an all -inf mask; batch 1 pads every key.
  const Config c{.B = 2,
                 .NH = 2,
                 .NKV = 1,
                 .T = 9,
                 .S = 5,
                 .E = 16,
                 .Ev = 16,
                 .causal = true,
                 .dropout = 0.2f,
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
          for (int64_t e = 0; e < c.Ev; ++e)
            CHECK(r.out[size_t(b * g.o_stride[0] + h * g.o_stride[1] + t * g.o_stride[2] + e)] == 0.0f);
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
  check_naive_backward(
      {.B = 1, .NH = 4, .NKV = 2, .T = 5, .S = 4, .E = 4, .Ev = 4, .causal = true, .layout = Layout::SeqMajor});
  check_naive_backward({.B = 2,
                        .NH = 2,
                        .NKV = 1,
                        .T = 3,
                        .S = 6,
                        .E = 3,
                        .Ev = 5,
                        .causal = true,
                        .key_padding = true,
                        .mask = MaskKind::Full,
                        .seed = 5});
  check_naive_backward({.B = 1,
                        .NH = 2,
                        .NKV = 2,
                        .T = 5,
                        .S = 5,
                        .E = 4,
                        .Ev = 4,
                        .mask = MaskKind::BroadcastTS,
                        .masked_row = true,
                        .seed = 6});
  check_naive_backward({.B = 2,
                        .NH = 2,
                        .NKV = 1,
                        .T = 5,
                        .S = 5,
                        .E = 4,
                        .Ev = 4,
                        .causal = true,
                        .dropout = 0.25f,
                        .layout = Layout::Fused,
                        .seed = 7});
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

TEST_CASE("attention_flash matches attention_naive, forward and backward") {
  for (const Config& c : flash_cases()) {
    check_flash<float>(c);
    check_flash<double>(c);
  }
}

TEST_CASE("attention backward kernels accumulate into their gradients") {
  const Config c{.B = 2,
                 .NH = 4,
                 .NKV = 2,
                 .T = 70,
                 .S = 70,
                 .E = 32,
                 .Ev = 32,
                 .causal = true,
                 .mask = MaskKind::Full,
                 .dropout = 0.1f,
                 .layout = Layout::Fused};
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

/// Flash with bf16 operands (AttentionMath::BF16: Q, K, V, dO, P and dS rounded to bf16 for the tile products, sums
/// in f32) against naive in double on the same problem with Q, K, V and dO rounded: what is left is the rounding of P
/// and dS, a relative 2^-9 per term, hence the tolerances. It must also differ from the f32 kernel (the operands were
/// rounded). The products themselves are checked exactly in test_gemm ("Bf16Tiles"); this runs whichever path
/// bf16_kernel() picks (ctest runs it again with TINYGPT_CPU_BF16=f32 for the rounded f32-units path).
TEST_CASE("attention_flash with bf16 operands matches naive on rounded operands, forward and backward") {
  MESSAGE("bf16 kernel: " << std::string(bf16_kernel_name(bf16_kernel())));
  const std::vector<Config> cases = {
      {.B = 2,
       .NH = 4,
       .NKV = 2,
       .T = 70,
       .S = 70,
       .E = 32,
       .Ev = 32,
       .causal = true,
       .dropout = 0.1f,
       .layout = Layout::Fused},
      {.B = 1, .NH = 2, .NKV = 2, .T = 150, .S = 140, .E = 64, .Ev = 64, .mask = MaskKind::Full},
      {.B = 2, .NH = 2, .NKV = 1, .T = 33, .S = 47, .E = 24, .Ev = 40, .key_padding = true, .layout = Layout::SeqMajor},
      {.B = 1, .NH = 1, .NKV = 1, .T = 40, .S = 40, .E = 130, .Ev = 20, .causal = true},
      // decoding's one query row (K and V read in place): grouped heads, padding, a mask, both layouts
      {.B = 2,
       .NH = 6,
       .NKV = 2,
       .T = 1,
       .S = 77,
       .E = 64,
       .Ev = 32,
       .causal = true,
       .key_padding = true,
       .layout = Layout::SeqMajor},
      {.B = 1, .NH = 2, .NKV = 2, .T = 1, .S = 40, .E = 32, .Ev = 32, .mask = MaskKind::Full},
      // the backward's one pass (32 (batch, kv head) pairs)
      {.B = 16,
       .NH = 4,
       .NKV = 2,
       .T = 70,
       .S = 70,
       .E = 32,
       .Ev = 32,
       .causal = true,
       .dropout = 0.1f,
       .layout = Layout::Fused},
  };
  for (const Config& c : cases) {
    INFO(describe(c));
    Problem p = make_problem(c), rounded = p;
    for (double& x : rounded.qkv) x = round_operand(x, AttentionMath::BF16);
    for (double& x : rounded.dout) x = round_operand(x, AttentionMath::BF16);
    const Run<double> ref = run<double>(rounded, false, true);
    const Run<float> f32 = run<float>(p, true, true);
    p.g.math = AttentionMath::BF16;
    const Run<float> bf = run<float>(p, true, true);
    const std::vector<int64_t> outs = o_elements(p);
    check_close(gather(bf.out, outs), gather(ref.out, outs), 1e-2, 1e-2, "out");
    check_close(bf.lse, ref.lse, 1e-4, 1e-4, "lse");
    check_close(gather(bf.dqkv, q_elements(p)), gather(ref.dqkv, q_elements(p)), 2e-2, 2e-2, "dq");
    check_close(gather(bf.dqkv, k_elements(p)), gather(ref.dqkv, k_elements(p)), 2e-2, 2e-2, "dk");
    check_close(gather(bf.dqkv, v_elements(p)), gather(ref.dqkv, v_elements(p)), 2e-2, 2e-2, "dv");
    double moved = 0;
    for (int64_t i : outs) moved = std::max(moved, std::abs(double(bf.out[size_t(i)]) - double(f32.out[size_t(i)])));
    CHECK(moved > 1e-4);
  }
}

}  // namespace
}  // namespace tinygpt::cpu

#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu/bf16_rows.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/tile_bf16.h"
#include "kernels/cpu/vec_math.h"

using tinygpt::Activation;
using tinygpt::cpu::bf16_kernel_name;
using tinygpt::cpu::bf16_kernels_available;
using tinygpt::cpu::Bf16Kernel;
using tinygpt::cpu::gemm;
using tinygpt::cpu::gemm_bf16;

namespace {

/// A product's shape (op(A) M x K, op(B) K x N) and extra elements on every leading dimension.
struct Shape3 {
  int64_t M, N, K, pad;
};

/// f(sh, ta, tb, lda, ldb, ldc) for every shape and every transpose of A and B, the case captured for failures.
template <class F>
void for_each_transpose(std::initializer_list<Shape3> shapes, F f) {
  for (const Shape3 sh : shapes) {
    for (const int t : {0, 1, 2, 3}) {
      const bool ta = t & 1, tb = t & 2;
      CAPTURE(sh.M);
      CAPTURE(sh.N);
      CAPTURE(sh.K);
      CAPTURE(t);
      f(sh, ta, tb, (ta ? sh.M : sh.K) + sh.pad, (tb ? sh.K : sh.N) + sh.pad, sh.N + sh.pad);
    }
  }
}

struct Case {
  bool ta, tb;
  int64_t M, N, K;
  double alpha, beta;
  int64_t pad_a = 0, pad_b = 0, pad_c = 0;  // leading dimension = row length + pad
  bool nan_c = false;                       // fill C with NaN (only meaningful with beta == 0)
  bool bf16 = false;                        // operands rounded to bfloat16 (gemm's bf16 argument)
  std::optional<Bf16Kernel> kernel{};       // bf16 on this kernel (gemm_bf16), float only
  bool bias = false;                        // gemm's bias epilogue: C[i, j] += bias[j]
  Activation act = Activation::None;        // the activation epilogue: act_out = act(C), or with
  bool act_grad = false;                    // act_grad, C *= act'(act_of)
};

/// act(x) and act'(x) in double, from the formulas (not the kernels' code).
double act_ref(Activation act, double x) {
  if (act == Activation::Gelu) return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  return act == Activation::ReluSquared ? (x > 0 ? x * x : 0.0) : x;
}
double act_grad_ref(Activation act, double x) {
  if (act == Activation::ReluSquared) return x > 0 ? 2 * x : 0.0;
  const double s = std::sqrt(2 / M_PI), t = std::tanh(s * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * s * (1 + 3 * 0.044715 * x * x);
}

/// x rounded to bfloat16's 8 significant bits, nearest with ties to even, computed from frexp (not from the bits,
/// as gemm rounds): x = m 2^e with m in [0.5, 1), m * 256 rounded by nearbyint (ties to even by default).
double bf16_reference(double x) {
  if (x == 0 || !std::isfinite(x)) return x;
  int e = 0;
  const double m = std::frexp(double(float(x)), &e);
  return std::ldexp(std::nearbyint(m * 256.0) / 256.0, e);
}

// Runs gemm<T> on random data and compares with a double-precision triple loop. Per-element tolerance
// eps * K * (8 + 8 * |ref|): accumulation error grows with K; the atol term covers cancellation near zero.
template <class T>
void check(const Case& c, uint32_t seed = 1) {
  const int64_t a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
  const int64_t b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
  const int64_t lda = a_cols + c.pad_a, ldb = b_cols + c.pad_b, ldc = c.N + c.pad_c;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<T> A(size_t(a_rows * lda)), B(size_t(b_rows * ldb)), C(size_t(c.M * ldc));
  for (auto& v : A) v = T(dist(rng));
  for (auto& v : B) v = T(dist(rng));
  for (auto& v : C) v = c.nan_c ? std::numeric_limits<T>::quiet_NaN() : T(dist(rng));
  const std::vector<T> C0 = C;
  std::vector<T> bias(c.bias ? size_t(c.N) : 0);
  for (auto& v : bias) v = T(dist(rng));
  const T* const bias_ptr = c.bias ? bias.data() : nullptr;
  // The activation's output (starts at a sentinel, so padding can be checked), or what its derivative is taken of.
  std::vector<T> act_buf(c.act == Activation::None ? 0 : C.size(), T(7));
  if (c.act_grad)
    for (auto& v : act_buf) v = T(3 * dist(rng));
  tinygpt::cpu::Epilogue<T> ep{bias_ptr};
  if (c.act != Activation::None) {
    ep.act = c.act;
    if (c.act_grad) {
      ep.act_of = act_buf.data();
    } else {
      ep.act_out = act_buf.data();
    }
  }

  if constexpr (std::is_same_v<T, float>) {
    if (c.kernel) {
      gemm_bf16(*c.kernel, c.ta, c.tb, c.M, c.N, c.K, T(c.alpha), A.data(), lda, B.data(), ldb, T(c.beta), C.data(),
                ldc);
    } else {
      gemm<T>(c.ta, c.tb, c.M, c.N, c.K, T(c.alpha), A.data(), lda, B.data(), ldb, T(c.beta), C.data(), ldc, c.bf16,
              ep);
    }
  } else {
    gemm<T>(c.ta, c.tb, c.M, c.N, c.K, T(c.alpha), A.data(), lda, B.data(), ldb, T(c.beta), C.data(), ldc, c.bf16, ep);
  }

  // op(A) as M rows of K and op(B) as N rows of K, in double, rounded to bf16 where the product rounds its operands:
  // each element rounded once, not once a product (the reference's sums are the same, in the same order).
  const bool rounded = c.bf16 || c.kernel.has_value();
  std::vector<double> a_op(size_t(c.M * c.K)), b_op(size_t(c.N * c.K));
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t k = 0; k < c.K; ++k) {
      const double a = c.ta ? A[size_t(k * lda + i)] : A[size_t(i * lda + k)];
      a_op[size_t(i * c.K + k)] = rounded ? bf16_reference(a) : a;
    }
  }
  for (int64_t j = 0; j < c.N; ++j) {
    for (int64_t k = 0; k < c.K; ++k) {
      const double b = c.tb ? B[size_t(j * ldb + k)] : B[size_t(k * ldb + j)];
      b_op[size_t(j * c.K + k)] = rounded ? bf16_reference(b) : b;
    }
  }
  const double eps = std::numeric_limits<T>::epsilon();
  int64_t bad = 0;
  double worst = 0;
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const double got = C[size_t(i * ldc + j)];
      if (j >= c.N) {  // padding between rows must be untouched
        if (!(got == double(C0[size_t(i * ldc + j)]) || (std::isnan(got) && c.nan_c))) ++bad;
        if (c.act != Activation::None && !c.act_grad && act_buf[size_t(i * ldc + j)] != T(7)) ++bad;
        continue;
      }
      double acc = 0;
      const double* a_row = a_op.data() + i * c.K;
      const double* b_row = b_op.data() + j * c.K;
      for (int64_t k = 0; k < c.K; ++k) acc += a_row[k] * b_row[k];
      double ref = c.alpha * acc;
      if (c.beta != 0) ref += c.beta * double(C0[size_t(i * ldc + j)]);
      if (c.bias) ref += double(bias[size_t(j)]);
      double tol = eps * double(std::max<int64_t>(c.K, 1)) * (8 + 8 * std::abs(ref));
      if (c.act != Activation::None && !c.act_grad) {
        // C keeps the pre-activation; act_out = act(C), to C's tolerance times the slope, plus the float tanh's.
        const double a = act_buf[size_t(i * ldc + j)], want = act_ref(c.act, ref);
        const double act_tol = tol * (1.5 + 2 * std::abs(ref)) + 8 * eps * (1 + std::abs(want));
        if (!(std::abs(a - want) <= act_tol)) ++bad;
      } else if (c.act_grad) {
        const double g = act_grad_ref(c.act, double(act_buf[size_t(i * ldc + j)]));
        ref *= g;
        tol = tol * (1 + std::abs(g)) + 8 * eps * std::abs(ref);
      }
      const double err = std::abs(got - ref);
      if (!(err <= tol)) ++bad;  // also catches NaN
      if (!(err <= worst)) worst = err;
    }
  }
  INFO("ta=" << c.ta << " tb=" << c.tb << " M=" << c.M << " N=" << c.N << " K=" << c.K << " alpha=" << c.alpha
             << " beta=" << c.beta << " bf16=" << c.bf16 << " bias=" << c.bias << " act=" << int(c.act)
             << " act_grad=" << c.act_grad << " kernel=" << (c.kernel ? bf16_kernel_name(*c.kernel) : "-")
             << " pads=" << c.pad_a << "," << c.pad_b << "," << c.pad_c << " worst=" << worst);
  CHECK(bad == 0);
}

template <class T>
void check_all_trans(Case c, uint32_t seed = 1) {
  for (int t = 0; t < 4; ++t) {
    c.ta = t & 1;
    c.tb = t & 2;
    check<T>(c, seed);
  }
}

const int64_t kSizes[] = {1, 3, 17, 31, 65, 130};

}  // namespace

TEST_CASE_TEMPLATE("gemm matches naive: odd sizes, all transposes", T, float, double) {
  uint32_t seed = 0;
  for (int64_t M : kSizes)
    for (int64_t N : kSizes)
      for (int64_t K : kSizes) check_all_trans<T>({false, false, M, N, K, 1.0, 0.0}, ++seed);
}

TEST_CASE_TEMPLATE("gemm matches naive: alpha, beta and leading dimensions", T, float, double) {
  check_all_trans<T>({false, false, 7, 9, 5, 0.5, -1.25, 3, 5, 2});
  check_all_trans<T>({false, false, 65, 17, 130, -2.0, 0.5, 1, 7, 11});
  check_all_trans<T>({false, false, 31, 130, 33, 1.0, 1.0, 16, 0, 4});
  check_all_trans<T>({false, false, 130, 65, 300, 0.25, 2.0, 5, 5, 5});
  check_all_trans<T>({false, false, 1, 257, 64, 1.5, -1.0, 2, 1, 3});
  check_all_trans<T>({false, false, 200, 1, 77, 1.0, 0.5, 0, 3, 1});
  // A few rows (token-by-token decoding) take the unpacked path; 5 rows the packed one.
  check_all_trans<T>({false, false, 3, 300, 129, 0.5, 1.0, 1, 2, 3});
  check_all_trans<T>({false, false, 4, 33, 513, -1.0, 0.25, 0, 0, 0});
  check_all_trans<T>({false, false, 5, 33, 513, -1.0, 0.25, 0, 0, 0});
}

TEST_CASE_TEMPLATE("gemm's bias epilogue adds bias[j] to every row once, on every path", T, float, double) {
  // Blocked (several k blocks and k groups: the epilogue must run on the last only), few rows, an empty product,
  // beta 0 and 1, and with bf16 operands (the AMX kernel where the CPU has it).
  for (const bool bf16 : {false, true}) {
    Case c{false, false, 70, 130, 300, 1.0, 0.0};
    c.bias = true;
    c.bf16 = bf16;
    check_all_trans<T>(c, 301);
    check_all_trans<T>({false, false, 37, 1100, 2100, 0.5, 1.0, 0, 0, 0, false, bf16, {}, true}, 302);
    check_all_trans<T>({false, false, 3, 65, 31, 1.0, 1.0, 2, 1, 3, false, bf16, {}, true}, 303);
    check<T>({false, false, 9, 17, 0, 1.0, 0.5, 0, 0, 0, false, bf16, {}, true}, 304);
  }
}

TEST_CASE_TEMPLATE("gemm's activation epilogue: act(C) beside C, or C times act'(x), on every path", T, float, double) {
  // As the bias: blocked with several k blocks and k groups, few rows, an empty product, bf16 operands; beta 0 (the
  // epilogue's contract), NaN in C ignored.
  for (const Activation act : {Activation::Gelu, Activation::ReluSquared})
    for (const bool grad : {false, true})
      for (const bool bf16 : {false, true}) {
        const auto with = [&](Case c) {
          c.act = act;
          c.act_grad = grad;
          c.bf16 = bf16;
          return c;
        };
        check_all_trans<T>(with({false, false, 70, 130, 300, 1.0, 0.0, 0, 0, 5, true, false, {}, !grad}), 401);
        check<T>(with({false, true, 37, 1100, 2100, 0.5, 0.0, 0, 0, 3, false, false, {}, true}), 402);
        check_all_trans<T>(with({false, false, 3, 65, 31, 1.0, 0.0, 2, 1, 3}), 403);
        check<T>(with({false, false, 9, 17, 0, 1.0, 0.0, 0, 0, 0, false, false, {}, true}), 404);
      }
  std::vector<T> x(4), y(4);
  tinygpt::cpu::Epilogue<T> ep;
  ep.act = Activation::Gelu;
  CHECK_THROWS(gemm<T>(false, false, 2, 2, 1, T(1), x.data(), 1, x.data(), 2, T(0), y.data(), 2, false, ep));
  ep.act_out = x.data();
  CHECK_THROWS(gemm<T>(false, false, 2, 2, 1, T(1), x.data(), 1, x.data(), 2, T(1), y.data(), 2, false, ep));
}

TEST_CASE_TEMPLATE("gemm beta == 0 ignores NaN in C", T, float, double) {
  check_all_trans<T>({false, false, 13, 29, 41, 1.0, 0.0, 0, 0, 3, true});
  check_all_trans<T>({false, false, 2, 29, 41, 1.0, 0.0, 0, 0, 3, true});
  check_all_trans<T>({false, false, 130, 100, 600, -0.5, 0.0, 2, 0, 0, true});  // several K blocks
  check_all_trans<T>({false, false, 5, 7, 0, 1.0, 0.0, 0, 0, 1, true});         // K == 0 -> zeros
}

TEST_CASE_TEMPLATE("gemm degenerate scalars", T, float, double) {
  check_all_trans<T>({false, false, 17, 19, 23, 0.0, 0.75, 1, 1, 1});  // alpha == 0: C = beta * C
  check_all_trans<T>({false, false, 17, 19, 0, 2.0, -1.0, 0, 0, 0});   // K == 0
  check_all_trans<T>({false, false, 1, 1, 1, 3.0, 0.5});
}

TEST_CASE_TEMPLATE("gemm large: multiple cache blocks and threads", T, float, double) {
  // Multiple row blocks per thread and K blocks in one group.
  check_all_trans<T>({false, false, 517, 300, 700, 1.0, 0.5, 3, 0, 1});
  // N beyond one column block, few rows (threads split columns).
  check<T>({false, true, 7, 4200, 40, 1.0, 0.0});
  check<T>({true, false, 40, 4105, 19, -1.0, 1.0, 2, 2, 2});
  // Packed op(B) too large for one slab: K is processed in several groups.
  check<T>({false, true, 37, 1100, 2100, 1.0, 1.0});
  check<T>({true, false, 37, 1100, 2100, 0.5, 0.0, 0, 0, 0, true});
}

TEST_CASE_TEMPLATE("gemm with bf16 operands matches naive products of the rounded operands", T, float, double) {
  // The sums stay in T, so the tolerance is T's: an operand truncated instead of rounded, or one left unrounded,
  // is off by up to 2^-8 of itself, far beyond it. A few rows, which skip the packing in f32, round as well.
  uint32_t seed = 100;
  for (int64_t M : {1, 3, 17, 65})
    for (int64_t N : {1, 17, 130})
      for (int64_t K : {3, 31, 130})
        check_all_trans<T>({false, false, M, N, K, 1.0, 0.0, 0, 0, 0, false, true}, ++seed);
  check_all_trans<T>({false, false, 130, 65, 300, 0.25, 2.0, 5, 5, 5, false, true});
  check<T>({false, true, 37, 1100, 2100, 1.0, 1.0, 0, 0, 0, false, true});  // K in several groups
}

TEST_CASE("every bf16 kernel this CPU has matches naive products of the rounded operands") {
  // The packing of the AVX512-BF16 and AMX kernels (bf16 pairs, k padded to 2 or 32) and their tiles (8 x 32,
  // 32 x 32) against the same reference: odd sizes and strides, every transpose, alpha/beta, NaN in C with beta = 0,
  // several K blocks and groups.
  for (const Bf16Kernel kernel : bf16_kernels_available()) {
    MESSAGE("bf16 kernel: " << std::string(bf16_kernel_name(kernel)));
    uint32_t seed = 200;
    for (int64_t M : {1, 9, 33, 70})
      for (int64_t N : {1, 17, 33, 130})
        for (int64_t K : {1, 3, 31, 33, 130}) {
          Case c{false, false, M, N, K, 1.0, 0.0, 0, 0, 0, false, false, kernel};
          check_all_trans<float>(c, ++seed);
        }
    check_all_trans<float>({false, false, 130, 65, 300, 0.25, 2.0, 5, 5, 5, false, false, kernel});
    check_all_trans<float>({false, false, 70, 50, 600, -0.5, 0.0, 2, 0, 1, true, false, kernel});
    check_all_trans<float>({false, false, 517, 300, 700, 1.0, 0.5, 3, 0, 1, false, false, kernel});
    check<float>({false, true, 37, 1100, 2100, 1.0, 1.0, 0, 0, 0, false, false, kernel});
    check<float>({true, false, 37, 1100, 2100, 0.5, 0.0, 0, 0, 0, true, false, kernel});
  }
}

TEST_CASE("gemm on bf16 storage: bit for bit gemm<float> with bf16 operands, on the kernel this CPU picks") {
  // The same products of the same bf16 values on the same blocking: the packing from bf16 storage (a load of the
  // pairs as they lie, or pairs gathered across rows) must give the packed words that rounding the f32 copies gives.
  // Odd sizes and strides (edge tiles, k padded to 2 or 32), every transpose, alpha/beta, and the epilogue; rows a
  // multiple of 8 with K even, where AVX512-BF16 reads op(A) in place (odd strides too: pairs off 4-byte boundaries;
  // K over one k block).
  MESSAGE("bf16 kernel: " << std::string(bf16_kernel_name(tinygpt::cpu::bf16_kernel())));
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for_each_transpose({{1, 1, 1, 0},
                      {9, 17, 31, 3},
                      {33, 130, 33, 0},
                      {70, 65, 300, 5},
                      {130, 300, 384, 1},
                      {64, 70, 130, 0},
                      {48, 96, 40, 3},
                      {136, 33, 1030, 1}},
                     [&](const Shape3& sh, bool ta, bool tb, int64_t lda, int64_t ldb, int64_t ldc) {
                       const int64_t a_rows = ta ? sh.K : sh.M, b_rows = tb ? sh.N : sh.K;
                       std::vector<float> a(size_t(a_rows * lda)), b(size_t(b_rows * ldb)), bias(size_t(sh.N));
                       for (float& x : a) x = tinygpt::round_bf16(dist(rng));
                       for (float& x : b) x = tinygpt::round_bf16(dist(rng));
                       for (float& x : bias) x = dist(rng);
                       std::vector<tinygpt::bf16> a16(a.begin(), a.end()), b16(b.begin(), b.end());
                       for (const bool epilogue : {false, true}) {
                         std::vector<float> c_ref(size_t(sh.M * ldc)), c(size_t(sh.M * ldc));
                         for (size_t i = 0; i < c.size(); ++i) c[i] = c_ref[i] = dist(rng);
                         std::vector<float> act_ref(c.size()), act(c.size());
                         tinygpt::cpu::Epilogue<float> ep_ref, ep;
                         if (epilogue) {
                           ep_ref = {bias.data(), Activation::Gelu, act_ref.data(), nullptr};
                           ep = {bias.data(), Activation::Gelu, act.data(), nullptr};
                         }
                         const float beta = epilogue ? 0.0f : 0.5f;
                         gemm<float>(ta, tb, sh.M, sh.N, sh.K, 1.5f, a.data(), lda, b.data(), ldb, beta, c_ref.data(),
                                     ldc, true, ep_ref);
                         gemm(ta, tb, sh.M, sh.N, sh.K, 1.5f, a16.data(), lda, b16.data(), ldb, beta, c.data(), ldc,
                              ep);
                         CHECK(c == c_ref);
                         if (epilogue) CHECK(act == act_ref);
                       }
                     });
}

TEST_CASE("gemm on bf16 storage stored in bf16 (Bf16Out): the f32 result and its epilogue, rounded once, bit for bit") {
  // Against the product in f32 on the same kernel with the epilogue done by hand in the order Bf16Out promises: few
  // rows (no blocks), edge tiles, K past the op(B) slab for N columns (K = 2100: in narrower column blocks; K = 4500:
  // in several groups through f32), every transpose; forward (bias,
  // GELU beside the pre-activation) and backward (act' scaling, added to what the output held).
  using tinygpt::bf16;
  using tinygpt::cpu::Bf16Out;
  MESSAGE("bf16 kernel: " << std::string(bf16_kernel_name(tinygpt::cpu::bf16_kernel())));
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for_each_transpose(
      {{3, 40, 50, 1}, {70, 65, 300, 5}, {130, 300, 384, 0}, {40, 1100, 2100, 0}, {20, 700, 4500, 0}},
      [&](const Shape3& sh, bool ta, bool tb, int64_t lda, int64_t ldb, int64_t ld) {
        std::vector<bf16> a(size_t((ta ? sh.K : sh.M) * lda)), b(size_t((tb ? sh.N : sh.K) * ldb));
        std::vector<float> bias(size_t(sh.N));
        for (bf16& x : a) x = dist(rng);
        for (bf16& x : b) x = dist(rng);
        for (float& x : bias) x = dist(rng);
        std::vector<float> c(size_t(sh.M * ld));
        gemm(ta, tb, sh.M, sh.N, sh.K, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), ld);
        std::vector<bf16> held(c.size()), of(c.size());
        for (size_t i = 0; i < c.size(); ++i) held[i] = dist(rng), of[i] = dist(rng);
        for (const int mode : {0, 1, 2}) {  // plain; forward with bias and GELU; backward through GELU, accumulating
          CAPTURE(mode);
          std::vector<bf16> out = held, act(c.size(), bf16(0.0f)), want = held, want_act = act;
          Bf16Out o{out.data(), ld, mode == 2};
          tinygpt::cpu::Epilogue<float> ep;
          if (mode == 1) ep.bias = bias.data(), ep.act = Activation::Gelu, o.act_out = act.data();
          if (mode == 2) ep.act = Activation::Gelu, o.act_of = of.data();
          ep.out16 = &o;
          gemm(ta, tb, sh.M, sh.N, sh.K, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, nullptr, ld, ep);
          // Each step a pass of its own, so no multiply-add is fused across steps (the kernel's passes are separate).
          std::vector<float> x = c;
          for (int64_t i = 0; i < sh.M && mode == 1; ++i)
            for (int64_t j = 0; j < sh.N; ++j) x[size_t(i * ld + j)] += bias[size_t(j)];
          for (size_t i = 0; i < x.size() && mode == 2; ++i)
            x[i] *= tinygpt::cpu::activation_grad_of(Activation::Gelu, float(of[i]));
          for (size_t i = 0; i < x.size() && mode == 2; ++i) x[i] += float(held[i]);
          for (int64_t i = 0; i < sh.M; ++i) {
            for (int64_t j = 0; j < sh.N; ++j) {
              const size_t at = size_t(i * ld + j);
              want[at] = x[at];
              if (mode == 1) want_act[at] = tinygpt::cpu::activation_of(Activation::Gelu, x[at]);
            }
          }
          bool same = true;
          for (size_t i = 0; i < out.size(); ++i)
            same = same && out[i].bits == want[i].bits && act[i].bits == want_act[i].bits;
          CHECK(same);
        }
      });
}

/// The bf16 units this CPU has for tile products (AMX-BF16, AVX512-BF16): none on an AVX2 CPU.
std::vector<Bf16Kernel> tile_units() {
  std::vector<Bf16Kernel> units;
  for (const Bf16Kernel k : bf16_kernels_available())
    if (k != Bf16Kernel::F32Units) units.push_back(k);
  return units;
}

// Reported as skipped (doctest's count), not passed, on a CPU without AMX-BF16 or AVX512-BF16.
TEST_CASE("Bf16Tiles: the flash kernels' bf16 tile products match naive products of the rounded operands" *
          doctest::skip(tile_units().empty())) {
  for (const Bf16Kernel kernel : tile_units()) {
    CAPTURE(bf16_kernel_name(kernel));
    tinygpt::cpu::Bf16Tiles tiles(kernel);
    std::mt19937 rng(7);
    std::uniform_real_distribution<double> dist(-1.0, 1.0);
    for (const bool k_contig : {true, false})
      for (int64_t M : {1, 16, 33, 64})
        for (int64_t K : {1, 20, 32, 64, 130})
          for (int64_t N : {3, 32, 64, 70})
            for (const bool accumulate : {false, true}) {
              CAPTURE(k_contig);
              CAPTURE(M);
              CAPTURE(K);
              CAPTURE(N);
              CAPTURE(accumulate);
              // A (r, k) at A[r * ars + k * aks] with a gap after each row or column; C with 3 spare columns.
              const int64_t ars = k_contig ? K + 2 : 1, aks = k_contig ? 1 : M + 5, ldb = N + 1, ldc = N + 3;
              std::vector<float> A(size_t(k_contig ? M * ars : K * aks)), B(size_t(K * ldb)), C(size_t(M * ldc));
              for (auto& x : A) x = float(dist(rng));
              for (auto& x : B) x = float(dist(rng));
              for (auto& x : C) x = float(dist(rng));
              const std::vector<float> C0 = C;
              tiles.product(C.data(), ldc, A.data(), ars, aks, B.data(), ldb, M, K, N, accumulate);
              std::vector<double> Ar(A.size()), Br(B.size());  // the operands rounded once, not once a product
              for (size_t k = 0; k < A.size(); ++k) Ar[k] = bf16_reference(A[k]);
              for (size_t k = 0; k < B.size(); ++k) Br[k] = bf16_reference(B[k]);
              int64_t bad = 0;
              for (int64_t i = 0; i < M; ++i) {
                for (int64_t j = 0; j < ldc; ++j) {
                  const double got = C[size_t(i * ldc + j)];
                  if (j >= N) {
                    bad += got != double(C0[size_t(i * ldc + j)]);
                    continue;
                  }
                  double ref = accumulate ? double(C0[size_t(i * ldc + j)]) : 0.0;
                  for (int64_t k = 0; k < K; ++k) ref += Ar[size_t(i * ars + k * aks)] * Br[size_t(k * ldb + j)];
                  bad += !(std::abs(got - ref) <= 1e-6 * double(K + 1) * (1 + std::abs(ref)));
                }
              }
              CHECK(bad == 0);
            }
  }
}

// The flash kernels on bf16 storage pack A and B straight from bf16 rows, and hold B packed from its transpose (Q^T
// from Q's rows): the same rounded values as the f32 operands, so the products must agree bit for bit.
TEST_CASE(
    "Bf16Tiles: operands packed from bf16 storage, and B held from its transpose, give the f32 operands' products" *
    doctest::skip(tile_units().empty())) {
  using tinygpt::bf16;
  for (const Bf16Kernel kernel : tile_units()) {
    CAPTURE(bf16_kernel_name(kernel));
    tinygpt::cpu::Bf16Tiles tiles(kernel);
    std::mt19937 rng(11);
    std::uniform_real_distribution<double> dist(-1.0, 1.0);
    for (const bool k_contig : {true, false})
      for (int64_t M : {1, 16, 33, 64, 128})
        for (int64_t K : {1, 20, 32, 64, 130})
          for (int64_t N : {3, 32, 64, 70, 128}) {
            CAPTURE(k_contig);
            CAPTURE(M);
            CAPTURE(K);
            CAPTURE(N);
            const int64_t ars = k_contig ? K + 2 : 1, aks = k_contig ? 1 : M + 5, ldb = N + 1, ldt = K + 3, ldc = N + 3;
            std::vector<float> A(size_t(k_contig ? M * ars : K * aks)), B(size_t(K * ldb)), C0(size_t(M * ldc));
            for (auto& x : A) x = float(dist(rng));
            for (auto& x : B) x = float(dist(rng));
            for (auto& x : C0) x = float(dist(rng));
            // bf16 copies: A in its own layout, B as rows (k) and as its transpose (rows n of K values, ldt apart).
            std::vector<bf16> A16(A.begin(), A.end()), B16(B.begin(), B.end()), Bt16(size_t(N * ldt));
            for (int64_t k = 0; k < K; ++k)
              for (int64_t n = 0; n < N; ++n) Bt16[size_t(n * ldt + k)] = bf16(B[size_t(k * ldb + n)]);
            for (const bool accumulate : {false, true}) {
              CAPTURE(accumulate);
              std::vector<float> want = C0, rows = C0, held = C0;
              tiles.product(want.data(), ldc, A.data(), ars, aks, B.data(), ldb, M, K, N, accumulate);
              tiles.pack_b(0, Bt16.data(), 1, ldt, K, N);  // held first: the rows' product below must not disturb it
              tiles.pack_a(A16.data(), ars, aks, M, K);
              tiles.pack_b(1, B16.data(), ldb, 1, K, N);
              tiles.run(rows.data(), ldc, 1, M, K, N, accumulate);
              tiles.run(held.data(), ldc, 0, M, K, N, accumulate);
              int64_t bad_rows = 0, bad_held = 0;
              for (size_t i = 0; i < want.size(); ++i) {
                bad_rows += rows[i] != want[i];
                bad_held += held[i] != want[i];
              }
              CHECK(bad_rows == 0);
              CHECK(bad_held == 0);
            }
            // A product whose shape is not the packed operands' is refused, not read out of bounds.
            std::vector<float> C(C0);
            CHECK_THROWS_AS(tiles.run(C.data(), ldc, 0, M, K + 1, N, false), std::logic_error);
            CHECK_THROWS_AS(tiles.run(C.data(), ldc, 0, M + 32, K, N, false), std::logic_error);
          }
  }
}

// A causal band (the flash kernels' triangle): blocks that vanish are skipped, and what is computed is the whole
// product's value bit for bit. With on_k, A is zero outside the band, so skipping its k blocks changes no bit of C;
// without, C inside the band is the whole product's, and a block wholly outside is zero (or, accumulating, untouched).
TEST_CASE("Bf16Tiles: a band skips only what vanishes: bit for bit the whole product where it counts" *
          doctest::skip(tile_units().empty())) {
  using tinygpt::cpu::Band;
  for (const Bf16Kernel kernel : tile_units()) {
    CAPTURE(bf16_kernel_name(kernel));
    tinygpt::cpu::Bf16Tiles tiles(kernel);
    std::mt19937 rng(13);
    std::uniform_real_distribution<double> dist(-1.0, 1.0);
    for (const bool on_k : {true, false})
      for (const int64_t M : {33, 64, 128})
        for (const int64_t K : {64, 100, 128})
          for (const int64_t N : {64, 96, 128})
            for (const int64_t reach : {-70, -32, -1, 0, 5, 31, 64, 200})
              for (const bool keys_first : {false, true})
                for (const bool accumulate : {false, true}) {
                  CAPTURE(on_k);
                  CAPTURE(M);
                  CAPTURE(K);
                  CAPTURE(N);
                  CAPTURE(reach);
                  CAPTURE(keys_first);
                  CAPTURE(accumulate);
                  const Band band = keys_first ? Band{-reach, Band::kFar, on_k} : Band{-Band::kFar, reach, on_k};
                  auto inside = [&](int64_t first, int64_t second) {
                    return band.lo <= second - first && second - first <= band.hi;
                  };
                  const int64_t ldc = N + 3;
                  std::vector<float> A(size_t(M * K)), B(size_t(K * N)), C0(size_t(M * ldc));
                  for (int64_t r = 0; r < M; ++r)
                    for (int64_t k = 0; k < K; ++k)
                      A[size_t(r * K + k)] = on_k && !inside(r, k) ? 0.0f : float(dist(rng));
                  for (auto& x : B) x = float(dist(rng));
                  for (auto& x : C0) x = float(dist(rng));
                  // A as f32 (packed), or as bf16 rows (read in place where K is whole 32-k chunks).
                  const std::vector<tinygpt::bf16> A16(A.begin(), A.end());
                  for (const bool rows16 : {false, true}) {
                    CAPTURE(rows16);
                    std::vector<float> whole = C0, banded = C0;
                    if (rows16)
                      tiles.pack_a(A16.data(), K, 1, M, K);
                    else
                      tiles.pack_a(A.data(), K, 1, M, K);
                    tiles.pack_b(0, B.data(), N, 1, K, N);
                    tiles.run(whole.data(), ldc, 0, M, K, N, accumulate);
                    tiles.run(banded.data(), ldc, 0, M, K, N, accumulate, band);
                    int64_t bad = 0;
                    for (int64_t r = 0; r < M; ++r) {
                      for (int64_t c = 0; c < ldc; ++c) {
                        const size_t i = size_t(r * ldc + c);
                        const float skipped = accumulate ? C0[i] : 0.0f;
                        if (c >= N)
                          bad += banded[i] != C0[i];
                        else if (on_k || inside(r, c))
                          bad += banded[i] != whole[i];
                        else
                          bad += banded[i] != whole[i] && banded[i] != skipped;
                      }
                    }
                    CHECK(bad == 0);
                  }
                }
  }
}

// The rows the kernels round and widen go through vector loops (AVX-512 where the CPU has it) with a scalar tail: at
// every length and offset they must give what the scalar conversion (test_bf16's hand-checked roundings) gives.
TEST_CASE("round_range, round_scaled and widen_range match the scalar bf16 conversion bit for bit") {
  using tinygpt::bf16;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  std::vector<float> x(80);
  for (auto& v : x) v = dist(rng);
  x[3] = std::numeric_limits<float>::quiet_NaN(), x[20] = std::numeric_limits<float>::infinity(), x[41] = -0.0f;
  x[50] = std::bit_cast<float>(0x3f818000u);  // a tie: rounds to the even 0x3f82
  for (const int64_t off : {0, 1, 7})
    for (const int64_t n : {0, 1, 15, 16, 17, 33, 64, 72}) {
      CAPTURE(off);
      CAPTURE(n);
      for (const float scale : {1.0f, 0.37f}) {
        std::vector<bf16> got(size_t(n + off)), want(size_t(n + off));
        if (scale == 1.0f)
          tinygpt::cpu::round_range(got.data() + off, x.data() + off, n);
        else
          tinygpt::cpu::round_scaled(got.data() + off, x.data() + off, scale, n);
        int64_t bad = 0;
        for (int64_t i = off; i < off + n; ++i) {
          want[size_t(i)] = bf16(x[size_t(i)] * scale);
          const bool both_nan = std::isnan(float(got[size_t(i)])) && std::isnan(float(want[size_t(i)]));
          bad += !both_nan && got[size_t(i)].bits != want[size_t(i)].bits;
        }
        CHECK(bad == 0);
        std::vector<float> wide(size_t(n + off));
        tinygpt::cpu::widen_range(wide.data() + off, want.data() + off, n);
        int64_t bad_wide = 0;
        for (int64_t i = off; i < off + n; ++i) {
          const float w = float(want[size_t(i)]), v = wide[size_t(i)];
          bad_wide += !(std::isnan(w) ? std::isnan(v) : std::bit_cast<uint32_t>(v) == std::bit_cast<uint32_t>(w));
        }
        CHECK(bad_wide == 0);
      }
    }
}

TEST_CASE("every bf16 kernel propagates NaN and infinity from its operands") {
  const int64_t M = 40, N = 40, K = 40;
  for (const Bf16Kernel kernel : bf16_kernels_available()) {
    INFO("kernel " << bf16_kernel_name(kernel));
    std::vector<float> A(size_t(M * K), 0.5f), B(size_t(K * N), 0.25f), C(size_t(M * N), 0.0f);
    A[size_t(3 * K + 5)] = std::numeric_limits<float>::quiet_NaN();  // row 3 of C
    B[size_t(7 * N + 11)] = std::numeric_limits<float>::infinity();  // column 11 of C
    gemm_bf16(kernel, false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C.data(), N);
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t j = 0; j < N; ++j) {
        const float c = C[size_t(i * N + j)];
        if (i == 3)
          CHECK(std::isnan(c));
        else if (j == 11)
          CHECK(c == std::numeric_limits<float>::infinity());
        else
          CHECK(c == doctest::Approx(K * 0.125f));
      }
    }
  }
}

TEST_CASE("gemm with bf16 operands rounds to nearest, ties to even") {
  // 1 + 2^-8 lies halfway between bf16's 1 and 1 + 2^-7 (ties to 1, the even one), 1 + 3 * 2^-8 between 1 + 2^-7 and
  // 1 + 2^-6 (ties to 1 + 2^-6), and 1 + 2^-8 + 2^-20 is nearer 1 + 2^-7.
  const float one = 1.0f;
  const struct {
    float x, rounded;
  } cases[] = {{1.0f + 0x1p-8f, 1.0f},
               {1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-6f},
               {1.0f + 0x1p-8f + 0x1p-20f, 1.0f + 0x1p-7f},
               {-(1.0f + 3 * 0x1p-8f), -(1.0f + 0x1p-6f)}};
  for (const auto& c : cases) {
    float out = 0.0f;
    gemm<float>(false, false, 1, 1, 1, 1.0f, &c.x, 1, &one, 1, 0.0f, &out, 1, true);
    CHECK(out == c.rounded);
    gemm<float>(false, false, 1, 1, 1, 1.0f, &one, 1, &c.x, 1, 0.0f, &out, 1, true);
    CHECK(out == c.rounded);
    for (const Bf16Kernel kernel : bf16_kernels_available()) {
      INFO("kernel " << bf16_kernel_name(kernel));
      // Both operands through both packings (k contiguous or not): x times one, one times x, as 1 x 1 x 1 and as
      // a row of 40 (k padded) against a column.
      for (const bool ta : {false, true}) {
        gemm_bf16(kernel, ta, !ta, 1, 1, 1, 1.0f, &c.x, 1, &one, 1, 0.0f, &out, 1);
        CHECK(out == c.rounded);
        gemm_bf16(kernel, !ta, ta, 1, 1, 1, 1.0f, &one, 1, &c.x, 1, 0.0f, &out, 1);
        CHECK(out == c.rounded);
      }
      std::vector<float> xs(40, 0.0f), ones(40, 0.0f);
      xs[37] = c.x, ones[37] = 1.0f;
      gemm_bf16(kernel, false, false, 1, 1, 40, 1.0f, xs.data(), 40, ones.data(), 1, 0.0f, &out, 1);
      CHECK(out == c.rounded);
      gemm_bf16(kernel, true, true, 1, 1, 40, 1.0f, ones.data(), 1, xs.data(), 40, 0.0f, &out, 1);
      CHECK(out == c.rounded);
    }
  }
}

TEST_CASE("gemm result does not depend on the thread count") {
  const int64_t M = 300, N = 200, K = 700;  // several row blocks and K blocks
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> A(size_t(K * M)), B(size_t(K * N)), C0(size_t(M * N));
  for (auto& v : A) v = dist(rng);
  for (auto& v : B) v = dist(rng);
  for (auto& v : C0) v = dist(rng);
  std::vector<float> C1 = C0, Cn = C0;
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  gemm<float>(true, false, M, N, K, 0.5f, A.data(), M, B.data(), N, 1.0f, C1.data(), N);
  omp_set_num_threads(threads);
  gemm<float>(true, false, M, N, K, 0.5f, A.data(), M, B.data(), N, 1.0f, Cn.data(), N);
  CHECK(C1 == Cn);
}

TEST_CASE("gemm inside a parallel region runs per thread") {
  std::vector<int> failures(size_t(omp_get_max_threads()), 0);
  std::vector<int> ran(failures.size(), 0);
#pragma omp parallel
  {
    const int t = omp_get_thread_num();
    const int64_t M = 45 + t, N = 70, K = 90;
    std::vector<float> A(size_t(M * K)), B(size_t(K * N)), C(size_t(M * N));
    for (int64_t i = 0; i < M * K; ++i) A[size_t(i)] = float((i * 7 + t) % 13) - 6.0f;
    for (int64_t i = 0; i < K * N; ++i) B[size_t(i)] = float((i * 5) % 11) - 5.0f;
    gemm<float>(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C.data(), N);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        float ref = 0;  // small integers: exact in float
        for (int64_t k = 0; k < K; ++k) ref += A[size_t(i * K + k)] * B[size_t(k * N + j)];
        if (C[size_t(i * N + j)] != ref) ++failures[size_t(t)];
      }
    ran[size_t(t)] = 1;
  }
  for (size_t t = 0; t < failures.size(); ++t) {
    CHECK(failures[t] == 0);
    CHECK(ran[t] == 1);
  }
}

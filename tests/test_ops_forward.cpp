// Forward values against hand-computed or closed-form results.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "autograd/ops.h"
#include "kernels/dropout_hash.h"
#include "test_util.h"

using namespace tinygpt;
using tinygpt::test::check_close;

namespace {

Tensor vec(std::vector<double> v, const Shape& s) { return from_vector(v, s); }
Tensor fvec(std::vector<float> v, const Shape& s) { return from_vector(v, s); }

}  // namespace

TEST_CASE("forward: broadcast arithmetic") {
  const Tensor a = fvec({1, 2, 3, 4, 5, 6}, {2, 3});
  check_close(a + fvec({10, 20, 30}, {3}), {11, 22, 33, 14, 25, 36});
  check_close(a - fvec({1, 2}, {2, 1}), {0, 1, 2, 2, 3, 4});
  check_close(fvec({1, 2}, {2, 1}) * fvec({1, 10, 100}, {1, 3}), {1, 10, 100, 2, 20, 200});
  check_close(a / fvec({2}, {1}), {0.5, 1, 1.5, 2, 2.5, 3});
  check_close(a * 3.0, {3, 6, 9, 12, 15, 18});
  check_close(-a, {-1, -2, -3, -4, -5, -6});
  const Tensor big = ones({2, 1, 4, 1, 3});  // all five dims broadcast against a (2, 3)-shaped tail
  CHECK((big + zeros({4, 2, 3})).shape() == Shape{2, 1, 4, 2, 3});
}

TEST_CASE("forward: unary maps at known points") {
  const Tensor x = vec({-1.0, 0.5, 2.0}, {3});
  check_close(exp(x), {std::exp(-1.0), std::exp(0.5), std::exp(2.0)});
  check_close(log(vec({1.0, std::exp(2.0)}, {2})), {0.0, 2.0});
  check_close(tanh(x), {std::tanh(-1.0), std::tanh(0.5), std::tanh(2.0)});
  check_close(relu(x), {0.0, 0.5, 2.0});
  // GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), evaluated independently.
  check_close(gelu(x), {-0.15880800939172324, 0.34571400982514394, 1.954597694087775}, 1e-12);
}

TEST_CASE("forward: sum and mean, over everything and over a dim") {
  const Tensor a = fvec({1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(sum(a).item() == 21);
  CHECK(sum(a).ndim() == 0);
  CHECK(mean(a).item() == 3.5);
  check_close(sum(a, 0), {5, 7, 9});
  check_close(sum(a, -1), {6, 15});
  CHECK(sum(a, 1, true).shape() == Shape{2, 1});
  check_close(mean(a, 1), {2, 5});
  const Tensor b = arange(24).to(DType::F64);
  check_close(sum(reshape(b, {2, 3, 4}), 1), {12, 15, 18, 21, 48, 51, 54, 57});
  CHECK(sum_squares(a).item() == 91);  // 1 + 4 + 9 + 16 + 25 + 36
  CHECK(sum_squares(fvec({}, {0})).item() == 0);
  const Tensor w = fvec({1, 2}, {2}).requires_grad_();
  CHECK_THROWS_WITH_AS(sum_squares(w), doctest::Contains("records no gradient"), Error);
  NoGradGuard no_grad;
  CHECK(sum_squares(w).item() == 5);
}

TEST_CASE("forward: softmax and log-softmax") {
  const Tensor x = vec({1, 2, 3, 1000, 1000, 1000}, {2, 3});  // the second row would overflow exp
  // exp(i) / (e + e^2 + e^3)
  check_close(softmax(x), {0.09003057317038046, 0.24472847105479767, 0.6652409557748219, 1. / 3, 1. / 3, 1. / 3},
              1e-12);
  check_close(
      log_softmax(x),
      {-2.40760596444438, -1.4076059644443801, -0.4076059644443803, -std::log(3.0), -std::log(3.0), -std::log(3.0)},
      1e-12);
  // A row masked out entirely (every key hidden from a query) gives zeros, not NaN; -inf entries of a row that
  // has others get exactly zero.
  constexpr double kInf = std::numeric_limits<double>::infinity();
  check_close(softmax(vec({-kInf, -kInf, -kInf, 0, -kInf, 0}, {2, 3})), {0, 0, 0, 0.5, 0, 0.5}, 0);
}

TEST_CASE("forward: matmul, transposed operands, batches, linear") {
  const Tensor a = fvec({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor b = fvec({7, 8, 9, 10, 11, 12}, {3, 2});
  check_close(matmul(a, b), {58, 64, 139, 154});
  check_close(matmul(b, a, true, true), {58, 139, 64, 154});                             // (a b)^T = b^T a^T
  check_close(matmul(a, a, false, true), {14, 32, 32, 77});                              // a a^T
  check_close(matmul(a, a, true, false), {17, 22, 27, 22, 29, 36, 27, 36, 45});          // a^T a
  const Tensor batch = concat({reshape(a, {1, 2, 3}), reshape(a * 2.0, {1, 2, 3})}, 0);  // (2, 2, 3)
  check_close(matmul(batch, b), {58, 64, 139, 154, 116, 128, 278, 308});
  const Tensor bb = concat({reshape(b, {1, 3, 2}), reshape(b, {1, 3, 2})}, 0);
  check_close(matmul(batch, bb), {58, 64, 139, 154, 116, 128, 278, 308});
  check_close(matmul(a, bb), {58, 64, 139, 154, 58, 64, 139, 154});  // 2-D a shared by both batches
  // linear: x W^T + b with W (2, 3)
  check_close(linear(a, a, fvec({1, -1}, {2})), {15, 31, 33, 76});
  check_close(linear(reshape(a, {1, 2, 3}), a), {14, 32, 32, 77});
  CHECK_THROWS_AS(matmul(batch, concat({bb, bb}, 0)), Error);  // batch dims differ
}

TEST_CASE("mlp: the values and gradients of linear, activation, linear, in f32 and with bf16 products") {
  // The activation's epilogues compute what the unary ops do; the products are the same products.
  Generator gen(11);
  const Tensor x = randn({3, 5, 16}, gen), w1 = randn({40, 16}, gen), b1 = randn({40}, gen);
  const Tensor w2 = randn({12, 40}, gen), b2 = randn({12}, gen), dy = randn({3, 5, 12}, gen);
  for (const Activation act : {Activation::Gelu, Activation::ReluSquared}) {
    for (const bool bf16 : {false, true}) {
      CAPTURE(int(act));
      CAPTURE(bf16);
      Numerics num;
      num.bf16 = bf16;
      std::vector<std::vector<float>> got, want;
      for (const bool fused : {true, false}) {
        std::vector<Tensor> p = {x.detach(), w1.detach(), b1.detach(), w2.detach(), b2.detach()};
        for (Tensor& t : p) t.requires_grad_();
        Tensor y;
        if (fused) {
          y = mlp(p[0], p[1], p[2], p[3], p[4], act, num);
        } else {
          const Tensor h = linear(p[0], p[1], p[2], num);
          const Tensor r = relu(h);
          y = linear(act == Activation::Gelu ? gelu(h) : r * r, p[3], p[4], num);
        }
        sum(y * dy).backward();
        auto& out = fused ? got : want;
        out.push_back(y.to_vector<float>());
        for (const Tensor& t : p) out.push_back(t.grad().to_vector<float>());
      }
      for (size_t i = 0; i < got.size(); ++i) {
        CAPTURE(i);
        REQUIRE(got[i].size() == want[i].size());
        double worst = 0, scale = 0;
        for (size_t j = 0; j < got[i].size(); ++j) {
          worst = std::max(worst, double(std::abs(got[i][j] - want[i][j])));
          scale = std::max(scale, double(std::abs(want[i][j])));
        }
        CHECK(worst <= 1e-5 * (1 + scale));
      }
    }
  }
  CHECK_THROWS_WITH_AS(mlp(x, w1, b1, w2, b2, Activation::None), doctest::Contains("mlp"), Error);
  CHECK_THROWS_WITH_AS(mlp(x, w1, b1, randn({12, 39}, gen), b2, Activation::Gelu), doctest::Contains("mlp"), Error);
}

TEST_CASE("forward: layer norm") {
  const Tensor x = vec({1, 2, 3, 4, 2, 2, 2, 2}, {2, 4});
  // (x - 2.5) / sqrt(1.25 + 1e-5) for the first row; a constant row normalizes to 0.
  check_close(layer_norm(x, ones({4}, DType::F64), zeros({4}, DType::F64)),
              {-1.3416354199689269, -0.447211806656309, 0.447211806656309, 1.3416354199689269, 0, 0, 0, 0}, 1e-12);
  check_close(layer_norm(x, full({4}, 2.0, DType::F64), Tensor()),
              {-2.6832708399378538, -0.894423613312618, 0.894423613312618, 2.6832708399378538, 0, 0, 0, 0}, 1e-12);
  // Fused with a residual add: the same numbers as the add and the norm apart, bit for bit.
  Generator gen(3);
  const Tensor a = randn({5, 7}, gen), b = randn({5, 7}, gen), w = randn({7}, gen), bias = randn({7}, gen);
  const auto [sum, normed] = add_layer_norm(a, b, w, bias);
  CHECK(sum.to_vector<float>() == (a + b).to_vector<float>());
  CHECK(normed.to_vector<float>() == layer_norm(a + b, w, bias).to_vector<float>());
  CHECK_THROWS_WITH_AS(add_layer_norm(a, randn({5, 6}, gen), w, bias), doctest::Contains("add_layer_norm"), Error);
  CHECK_THROWS_WITH_AS(add_layer_norm(a, b, w, bias, 1e-5, 1.0, 7), doctest::Contains("[0, 1)"), Error);
  // With dropout on b: the add of dropout(b, p, seed) (the same mask), and the same gradients.
  const Tensor da = randn({5, 7}, gen), db = randn({5, 7}, gen);
  auto run = [&](bool fused) {
    const Tensor x = a.clone().requires_grad_(), y = b.clone().requires_grad_();
    const auto [s, n] =
        fused ? add_layer_norm(x, y, w, bias, 1e-5, 0.3, 11) : add_layer_norm(x, dropout(y, 0.3, 11), w, bias);
    (tinygpt::sum(s * da) + tinygpt::sum(n * db)).backward();
    return std::vector<Tensor>{s.detach(), n.detach(), x.grad(), y.grad()};
  };
  const std::vector<Tensor> fused = run(true), apart = run(false);
  for (size_t k = 0; k < fused.size(); ++k) check_close(fused[k], apart[k], 1e-6, 1e-5);
}

TEST_CASE("forward: embedding lookup") {
  const Tensor w = fvec({0, 1, 10, 11, 20, 21}, {3, 2});
  const Tensor ids = from_vector(std::vector<int32_t>{2, 0, 2, 1}, {2, 2});
  const Tensor e = embedding(ids, w);
  CHECK(e.shape() == Shape{2, 2, 2});
  check_close(e, {20, 21, 0, 1, 20, 21, 10, 11});
  CHECK_THROWS_WITH_AS(embedding(from_vector(std::vector<int32_t>{3}, {1}), w),
                       doctest::Contains("id 3 at position 0 is out of range [0, 3)"), Error);
}

TEST_CASE("forward: cross-entropy, with an ignore index") {
  const Tensor uniform = zeros({3, 5});
  const Tensor targets = from_vector(std::vector<int32_t>{0, 4, 2}, {3});
  CHECK(cross_entropy(uniform, targets).item() == doctest::Approx(std::log(5.0)));
  const Tensor logits = vec({0, 0, std::log(3.0), 5, 5, 5}, {2, 3});  // row 0: p(2) = 3/5
  CHECK(cross_entropy(logits, from_vector(std::vector<int32_t>{2, -1}, {2})).item() == doctest::Approx(-std::log(0.6)));
  CHECK(cross_entropy(logits, from_vector(std::vector<int32_t>{-1, -1}, {2})).item() == 0.0);
  CHECK_THROWS_WITH_AS(cross_entropy(logits, from_vector(std::vector<int32_t>{3, 0}, {2})),
                       doctest::Contains("target 3"), Error);
  CHECK_THROWS_AS(cross_entropy(logits, from_vector(std::vector<int32_t>{0, 0, 0}, {3})), Error);
}

TEST_CASE("forward: dropout keeps about 1-p of the elements, scaled, with a reproducible mask") {
  const Tensor x = ones({100000});
  const auto y = dropout(x, 0.25, 123).to_vector<float>();
  int64_t kept = 0;
  for (float v : y) {
    REQUIRE((v == 0.0f || std::abs(v - 1.0f / 0.75f) < 1e-6f));
    kept += v != 0.0f;
  }
  CHECK(std::abs(double(kept) / 1e5 - 0.75) < 0.01);
  CHECK(dropout(x, 0.25, 123).to_vector<float>() == y);
  CHECK(dropout(x, 0.25, 124).to_vector<float>() != y);
  check_close(dropout(fvec({1, 2}, {2}), 0.0, 5), {1, 2});
  check_close(dropout(fvec({1, 2}, {2}), 1.0, 5), {0, 0});
  Generator gen(3);
  CHECK(dropout(x, 0.5, gen, false).impl_ptr() == x.impl_ptr());  // eval mode: identity
  CHECK_THROWS_AS(dropout(x, 1.5, 1), Error);
}

TEST_CASE("dropout hash: the kernels' integer threshold keeps exactly the elements the float comparison keeps") {
  // Every 24-bit value b next to each threshold: (b >= dropout_threshold(p)) == (b 2^-24 >= p), for the p's training
  // uses, the edges of [0, 1], values one float step apart and ones that are not multiples of 2^-24.
  for (const float p : {0.0f, 1e-30f, 0x1.0p-24f, 0x1.0p-24f * 1.5f, 0.1f, 0.2f, 0.25f, 1.0f / 3.0f, 0.5f,
                        std::nextafter(0.5f, 0.0f), std::nextafter(0.5f, 1.0f), 0.9f, std::nextafter(1.0f, 0.0f), 1.0f,
                        1.5f, std::numeric_limits<float>::quiet_NaN()}) {
    INFO("p " << p);
    const int32_t t = dropout_threshold(p);
    CHECK(t >= 0);
    CHECK(t <= (int32_t(1) << 24));
    for (int64_t b = std::max<int64_t>(0, t - 3); b <= std::min<int64_t>((int64_t(1) << 24) - 1, t + 3); ++b) {
      CHECK((b >= t) == (float(b) * 0x1.0p-24f >= p));
    }
  }
}

TEST_CASE("dropout hash: row and stream forms agree with dropout_keep, across a 2^32 block; uniform, uncorrelated") {
  const uint64_t seed = 0x1234abcdULL;
  const float p = 0.3f;
  const int64_t block = int64_t(1) << 32;
  // A row that starts 100 elements before a block boundary: the row form switches keys there.
  for (int64_t i0 : {int64_t(0), int64_t(77) * 4096, block - 100, 5 * block - 1}) {
    const DropoutRow row(seed, i0);
    for (int64_t j = 0; j < 300; ++j) REQUIRE(row.keep(j, p) == dropout_keep(seed, i0 + j, p));
  }
  const DropoutStream stream(seed);
  for (int64_t i : {int64_t(0), int64_t(12345), block - 1, block, block + 7, 3 * block + 11}) {
    REQUIRE(stream.keep(i, p) == dropout_keep(seed, i, p));
  }
  // Elements i and i + 2^32 have different keys, so different masks.
  int64_t same = 0;
  for (int64_t i = 0; i < 10000; ++i) same += dropout_keep(seed, i, 0.5f) == dropout_keep(seed, i + block, 0.5f);
  CHECK(std::abs(double(same) / 10000 - 0.5) < 0.03);
  // Uniform: 16 bins of 2^20 draws within 2% of 1/16 (5 standard deviations); neighbours (rows of attention scores)
  // uncorrelated, and so are elements a row apart (S = 256).
  const int64_t n = int64_t(1) << 20;
  std::vector<double> u(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) u[size_t(i)] = hash_uniform(seed, i);
  std::vector<int64_t> bins(16);
  for (double x : u) ++bins[size_t(x * 16)];
  for (int64_t c : bins) CHECK(std::abs(double(c) / double(n) - 1.0 / 16) < 0.02 / 16);
  for (int64_t lag : {1, 2, 256}) {
    double cov = 0;
    for (int64_t i = 0; i + lag < n; ++i) cov += (u[size_t(i)] - 0.5) * (u[size_t(i + lag)] - 0.5);
    CHECK(std::abs(cov / double(n - lag) * 12) < 0.01);  // the correlation (variance 1/12)
  }
}

TEST_CASE("forward: reshape, permute, transpose") {
  const Tensor a = arange(6);
  const Tensor r = reshape(a, {2, -1});
  CHECK(r.shape() == Shape{2, 3});
  CHECK(r.raw_data() == a.raw_data());  // a view: same storage
  check_close(transpose(r, 0, 1), {0, 3, 1, 4, 2, 5});
  const Tensor c = reshape(arange(24), {2, 3, 4});
  const Tensor p = permute(c, {2, 0, 1});
  CHECK(p.shape() == Shape{4, 2, 3});
  // p[i, j, k] = c[j, k, i] = 12 j + 4 k + i
  std::vector<double> expected;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 3; ++k) expected.push_back(12 * j + 4 * k + i);
  check_close(p, expected);
  CHECK_THROWS_AS(permute(c, {0, 0, 1}), Error);
  CHECK_THROWS_AS(reshape(a, {-1, -1}), Error);
}

TEST_CASE("forward: narrow, slice, split, concat") {
  const Tensor c = reshape(arange(12), {3, 4});
  check_close(narrow(c, 1, 1, 2), {1, 2, 5, 6, 9, 10});
  check_close(slice(c, 0, -1, 3), {8, 9, 10, 11});
  check_close(slice(c, 1, 2, 100), {2, 3, 6, 7, 10, 11});
  const auto parts = split(c, 3, 1);
  REQUIRE(parts.size() == 2);
  CHECK(parts[1].shape() == Shape{3, 1});
  check_close(parts[1], {3, 7, 11});
  check_close(concat(parts, 1), c);
  check_close(concat({c, narrow(c, 0, 0, 1)}, 0), {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0, 1, 2, 3});
  CHECK_THROWS_AS(narrow(c, 1, 3, 2), Error);
  CHECK_THROWS_AS(concat({c, zeros({3, 3, 1})}, 0), Error);
}

TEST_CASE("forward: Llama 3's RoPE scaling keeps the fast pairs, slows the slow ones by its factor, blends between") {
  // One head of D = 8, base 10000: inv_freq 1, 0.1, 0.01, 0.001, wavelengths 2 pi / inv_freq = 6.3, 62.8, 628, 6283.
  // Original context 64, low_freq_factor 1, high_freq_factor 4: below 64 / 4 = 16 kept (pair 0), above 64 / 1 = 64
  // divided by the factor 8 (pairs 2, 3), between blended (pair 1) with smooth = (64 / wavelength - 1) / (4 - 1).
  const RopeFreqs freqs(10000.0,
                        RopeScaling{.factor = 8, .low_freq_factor = 1, .high_freq_factor = 4, .original_context = 64});
  const double pi = 3.14159265358979323846, smooth = (64.0 / (2 * pi / 0.1) - 1.0) / 3.0;
  const double inv[4] = {1.0, (1 - smooth) * 0.1 / 8 + smooth * 0.1, 0.01 / 8, 0.001 / 8};
  const Tensor x = vec({1, 2, 3, 4, 5, 6, 7, 8}, {1, 1, 8});
  const double pos = 5;  // pos0 = 5: the angles pos * inv_freq
  const auto y = rope(x, 8, 1, 5, freqs).to_vector<double>();
  std::vector<double> expected(8);
  for (int i = 0; i < 4; ++i) {
    const double a = pos * inv[i], c = std::cos(a), s = std::sin(a);
    expected[size_t(i)] = x.to_vector<double>()[size_t(i)] * c - x.to_vector<double>()[size_t(i + 4)] * s;
    expected[size_t(i + 4)] = x.to_vector<double>()[size_t(i)] * s + x.to_vector<double>()[size_t(i + 4)] * c;
  }
  check_close(y, expected, 1e-12);
  // Unscaled, pair 3 turns 8 times as fast: the scaling is not a no-op.
  CHECK(std::abs(rope(x, 8, 1, 5, 10000.0).to_vector<double>()[3] - y[3]) > 1e-3);
}

TEST_CASE("forward: rotary embedding rotates feature pairs by pos * base^(-2i/D)") {
  // One head of D = 4 at positions 0 and 1; pairs (0, 2) and (1, 3) with angles pos * 1 and pos * 100^(-1/2).
  const Tensor x = vec({1, 2, 3, 4, 1, 2, 3, 4}, {1, 2, 4});
  const double a0 = 1.0, a1 = 0.1;  // base 100: 100^(-2*1/4) = 0.1
  const auto y = rope(x, 4, 1, 0, 100.0).to_vector<double>();
  check_close(std::vector<double>(y.begin(), y.begin() + 4), {1, 2, 3, 4}, 1e-12);  // position 0: unchanged
  const std::vector<double> expected = {1 * std::cos(a0) - 3 * std::sin(a0), 2 * std::cos(a1) - 4 * std::sin(a1),
                                        1 * std::sin(a0) + 3 * std::cos(a0), 2 * std::sin(a1) + 4 * std::cos(a1)};
  check_close(std::vector<double>(y.begin() + 4, y.end()), expected, 1e-12);
  // pos0 shifts positions; heads past rotated_heads are copied; the norm is preserved.
  check_close(rope(narrow(x, 1, 1, 1), 4, 1, 1, 100.0), expected, 1e-12);
  check_close(rope(x, 2, 1, 0, 100.0),
              {1, 2, 3, 4, 1 * std::cos(1.0) - 2 * std::sin(1.0), 1 * std::sin(1.0) + 2 * std::cos(1.0), 3, 4}, 1e-12);
  CHECK_THROWS_AS(rope(x, 3, 1), Error);
}

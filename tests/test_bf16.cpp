// bf16 as a storage type: the rounding (checked against bit patterns worked out by hand from the format, not by the
// code under test), tensors of it, the ops that take it against their f32 twins, and the ops that refuse it.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "test_util.h"
#include "train/safetensors.h"

using namespace tinygpt;
using tinygpt::test::check_close;

namespace {

uint16_t bits_of(float x) { return bf16(x).bits; }
float from_bits32(uint32_t u) { return std::bit_cast<float>(u); }

// bf16 keeps 8 significant bits (7 stored and the implicit one): one rounding to nearest is off by at most half a
// unit in the last place, which is at most 2^-8 of the value (the unit roundoff). Tolerances below count these.
constexpr double kHalfUlp = 1.0 / 256;

/// f32 values that bf16 holds exactly (so the f32 twin starts from the same inputs), normal with stddev `scale`.
std::vector<float> representable(int64_t n, uint64_t seed, double scale = 1.0) {
  Generator gen(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = float(bf16(float(scale * gen.normal())));
  return v;
}

}  // namespace

TEST_CASE("bf16 rounds to nearest, ties to even, as PyTorch and the hardware do") {
  CHECK(bits_of(1.0f) == 0x3f80);
  CHECK(bits_of(-2.0f) == 0xc000);
  // 1 + 2^-8 lies halfway between 1 (0x3f80, even) and 1 + 2^-7 (0x3f81): to the even one.
  CHECK(bits_of(from_bits32(0x3f808000u)) == 0x3f80);
  // 1 + 3 * 2^-8 lies halfway between 0x3f81 (odd) and 0x3f82 (even): up. Truncation would give 0x3f81.
  CHECK(bits_of(from_bits32(0x3f818000u)) == 0x3f82);
  // Just above and below a tie.
  CHECK(bits_of(from_bits32(0x3f808001u)) == 0x3f81);
  CHECK(bits_of(from_bits32(0x3f817fffu)) == 0x3f81);
  CHECK(bits_of(from_bits32(0xbf818000u)) == 0xbf82);
  // Signed zero, infinities, and overflow: the largest f32 is past bf16's largest finite (0x7f7f) by more than half
  // an ulp, so it rounds to infinity.
  CHECK(bits_of(-0.0f) == 0x8000);
  CHECK(bits_of(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(bits_of(-std::numeric_limits<float>::infinity()) == 0xff80);
  CHECK(bits_of(std::numeric_limits<float>::max()) == 0x7f80);
  CHECK(bits_of(from_bits32(0x7f7f7fffu)) == 0x7f7f);
  // A NaN stays a NaN, even one whose payload lies only in the low half (truncation or a plain add would make it
  // an infinity).
  CHECK(std::isnan(float(bf16(from_bits32(0x7f800001u)))));
  CHECK(std::isnan(float(bf16(from_bits32(0xffc00000u)))));
  // The smallest f32 subnormal rounds to zero; widening is exact.
  CHECK(bits_of(from_bits32(0x00000001u)) == 0x0000);
  CHECK(float(bf16::from_bits(0x4049)) == 3.140625f);
  CHECK(float(bf16::from_bits(0x3c00)) == 0.0078125f);
  CHECK(round_bf16(3.14159265f) == 3.140625f);
}

TEST_CASE("bf16 tensors: factories, to(), item, printing, views and copies") {
  CHECK(dtype_size(DType::BF16) == 2);
  CHECK(std::string(dtype_name(DType::BF16)) == "bf16");
  const Tensor x =
      from_vector(std::vector<float>{1.0f, from_bits32(0x3f808000u), from_bits32(0x3f818000u), 3.14159265f}, {2, 2});
  const Tensor h = x.to(DType::BF16);
  CHECK(h.dtype() == DType::BF16);
  CHECK(h.shape() == Shape{2, 2});
  const std::vector<bf16> hb = h.to_vector<bf16>();
  CHECK(hb[0].bits == 0x3f80);
  CHECK(hb[1].bits == 0x3f80);
  CHECK(hb[2].bits == 0x3f82);
  CHECK(hb[3].bits == 0x4049);
  check_close(h, {1.0, 1.0, 1.0 + 2.0 / 128, 3.140625}, 0, 0);
  check_close(h.to(DType::F64), {1.0, 1.0, 1.0 + 2.0 / 128, 3.140625}, 0, 0);
  CHECK(h.to(DType::I32).to_vector<int32_t>() == std::vector<int32_t>{1, 1, 1, 3});
  CHECK(arange(3, DType::I32).to(DType::BF16).to_vector<bf16>()[2].bits == 0x4000);

  check_close(zeros({3}, DType::BF16), {0, 0, 0}, 0, 0);
  check_close(ones({2}, DType::BF16), {1, 1}, 0, 0);
  check_close(full({2}, 3.14159265, DType::BF16), {3.140625, 3.140625}, 0, 0);
  CHECK(full({1}, 3.14159265, DType::BF16).item() == 3.140625);
  Generator gen(3);
  const Tensor r = randn({4096}, gen, DType::BF16);
  double mean = 0;
  for (bf16 v : r.to_vector<bf16>()) mean += float(v);
  CHECK(std::abs(mean / 4096) < 0.05);

  const std::string printed = fmt::format("{}", h);
  CHECK(printed.find("dtype=bf16") != std::string::npos);
  CHECK(printed.find("3.1406") != std::string::npos);

  const Tensor copy = h.clone();
  CHECK(copy.to_vector<bf16>()[3].bits == 0x4049);
  const Tensor slice = buffer_slice(h, 2, {2});
  CHECK(slice.to_vector<bf16>()[1].bits == 0x4049);
  Tensor dst = zeros({2, 2}, DType::BF16);
  dst.copy_(h);
  CHECK(dst.to_vector<bf16>()[2].bits == 0x3f82);
  CHECK_THROWS_AS(dst.copy_(x), Error);  // f32 into bf16: dtypes must match

  // The conversion kernel over many elements (several threads' chunks, the vector loop and its tail) agrees with the
  // scalar rounding checked above, element by element.
  std::vector<float> many(100003);
  for (size_t i = 0; i < many.size(); ++i) many[i] = from_bits32(0x3f800000u + uint32_t(i) * 0x2f1u);
  const std::vector<bf16> rounded = from_vector(many, {int64_t(many.size())}).to(DType::BF16).to_vector<bf16>();
  size_t same = 0;
  for (size_t i = 0; i < many.size(); ++i) same += rounded[i].bits == bits_of(many[i]);
  CHECK(same == many.size());
}

TEST_CASE("bf16 tensors: safetensors stores them as BF16, two bytes each") {
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("tinygpt_test_bf16_{}", ::getpid());
  std::filesystem::create_directories(dir);
  const Tensor h = from_vector(std::vector<float>{1.0f, -2.0f, 3.14159265f}, {3}).to(DType::BF16);
  safetensors::save(dir / "t.safetensors", {{"h", h}}, {});
  std::ifstream f(dir / "t.safetensors", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  CHECK(bytes.find("\"BF16\"") != std::string::npos);
  // The last six bytes are the three values, little-endian: 0x3f80, 0xc000, 0x4049.
  CHECK(bytes.substr(bytes.size() - 6) == std::string("\x80\x3f\x00\xc0\x49\x40", 6));
  const Tensor back = safetensors::load(dir / "t.safetensors").find("h");
  CHECK(back.dtype() == DType::BF16);
  CHECK(back.to_vector<bf16>()[2].bits == 0x4049);
  std::filesystem::remove_all(dir);
}

TEST_CASE("bf16 ops: elementwise ops on bf16 storage match their f32 twins within one rounding") {
  const int64_t n = 3000;
  const std::vector<float> av = representable(n, 1), bv = representable(n, 2), dv = representable(n, 3);
  const Tensor a32 = from_vector(av, {30, 100}), b32 = from_vector(bv, {30, 100}), d32 = from_vector(dv, {30, 100});
  const Tensor row32 = from_vector(representable(100, 4), {100});
  using Fn = Tensor (*)(const Tensor&, const Tensor&);
  const std::vector<std::pair<const char*, Fn>> binaries = {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, add(mul(b, b), full({1}, 0.5, b.dtype()))); }},
      {"gelu", [](const Tensor& a, const Tensor&) { return gelu(a); }},
      {"tanh", [](const Tensor& a, const Tensor&) { return tanh(a); }},
      {"exp", [](const Tensor& a, const Tensor&) { return exp(a); }},
      {"relu", [](const Tensor& a, const Tensor&) { return relu(a); }},
      {"scale", [](const Tensor& a, const Tensor&) { return scale(a, 0.3); }},
  };
  for (const bool broadcast : {false, true}) {
    for (const auto& [name, f] : binaries) {
      const std::string op_name = name;
      CAPTURE(op_name);
      CAPTURE(broadcast);
      // f32 twin: the same inputs, gradients through the same graph; compared after one rounding of the output.
      Tensor a = a32.clone(), b = (broadcast ? row32 : b32).clone();
      a.requires_grad_();
      b.requires_grad_();
      Tensor y = f(a, b);
      y.backward(d32);
      Tensor a16 = a32.to(DType::BF16), b16 = (broadcast ? row32 : b32).to(DType::BF16);
      a16.requires_grad_();
      b16.requires_grad_();
      Tensor y16 = f(a16, b16);
      CHECK(y16.dtype() == DType::BF16);
      y16.backward(d32.to(DType::BF16));
      // div's denominator and its gradient pass through two more roundings (b * b + 0.5 is stored in bf16).
      const double ulps = std::string(name) == "div" ? 6 : 1;
      check_close(y16, y, 1e-6, ulps * kHalfUlp);
      // tanh differentiates through its stored output y: 1 - y^2 from a rounded y is off by up to 2 |y| of y's
      // rounding error (2^-8), times |dout| (below 4 here), however small 1 - y^2 is.
      const double atol = std::string(name) == "tanh" ? 8 * kHalfUlp : 1e-6;
      check_close(a16.grad(), a.grad(), atol, 2 * ulps * kHalfUlp);
      if (b.grad().defined()) {
        REQUIRE(b16.grad().defined());
        CHECK(b16.grad().dtype() == DType::BF16);
        // The broadcast gradient sums 30 products in f64 and rounds once; a single product rounds once too.
        check_close(b16.grad(), b.grad(), 1e-3, 2 * ulps * kHalfUlp);
      }
    }
  }
}

TEST_CASE("bf16 ops: matmul on bf16 storage matches its f32 twin within one rounding, batched and transposed") {
  // Products of bf16 values are exact in f32 and summed in f32 on both sides (in different orders): what differs is
  // the one rounding of each stored output and gradient, and f32's summation order (the atol).
  struct Case {
    Shape a, b;
    bool ta, tb;
  };
  for (const Case& c : {Case{{37, 70}, {70, 45}, false, false}, Case{{70, 37}, {45, 70}, true, true},
                        Case{{3, 20, 33}, {33, 17}, false, false}, Case{{3, 33, 20}, {3, 17, 33}, true, true},
                        Case{{2, 40, 300}, {2, 300, 64}, false, false}}) {
    CAPTURE(c.a);
    CAPTURE(c.b);
    Tensor a = from_vector(representable(c.a.numel(), 11), c.a), b = from_vector(representable(c.b.numel(), 12), c.b);
    a.requires_grad_();
    b.requires_grad_();
    Tensor y = matmul(a, b, c.ta, c.tb);
    const Tensor dy = from_vector(representable(y.numel(), 13), y.shape());
    y.backward(dy);
    Tensor a16 = a.detach().to(DType::BF16), b16 = b.detach().to(DType::BF16);
    a16.requires_grad_();
    b16.requires_grad_();
    Tensor y16 = matmul(a16, b16, c.ta, c.tb);
    CHECK(y16.dtype() == DType::BF16);
    y16.backward(dy.to(DType::BF16));
    check_close(y16, y, 1e-4, kHalfUlp);
    check_close(a16.grad(), a.grad(), 1e-4, kHalfUlp);
    check_close(b16.grad(), b.grad(), 1e-4, kHalfUlp);
  }
}

namespace {

/// An op run twice from the same bf16-representable inputs: on f32 leaves and on bf16 copies, each backward from the
/// same output gradient (representable too). What each run produced, for the caller to compare.
struct Twin {
  Tensor y32, y16;
  std::vector<Tensor> g32, g16;
};

template <class F>
Twin twin(const std::vector<Tensor>& inputs, F f, uint64_t seed = 21) {
  Twin t;
  std::vector<Tensor> in32, in16;
  for (const Tensor& x : inputs) {
    in32.push_back(x.clone());
    in16.push_back(x.to(DType::BF16));
    in32.back().requires_grad_();
    in16.back().requires_grad_();
  }
  t.y32 = f(in32);
  t.y16 = f(in16);
  const Tensor dy = t.y32.numel() == 1 ? Tensor() : from_vector(representable(t.y32.numel(), seed), t.y32.shape());
  if (dy.defined()) {
    t.y32.backward(dy);
    t.y16.backward(t.y16.dtype() == DType::BF16 ? dy.to(DType::BF16) : dy);
  } else {
    t.y32.backward();
    t.y16.backward();
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    t.g32.push_back(in32[i].grad());
    t.g16.push_back(in16[i].grad());
  }
  return t;
}

Tensor repr(const Shape& shape, uint64_t seed, double scale = 1.0) {
  return from_vector(representable(shape.numel(), seed, scale), shape);
}

}  // namespace

TEST_CASE("bf16 ops: layer norm, add + layer norm with dropout, dropout: f32 inside, statistics in f32") {
  // The f32 twin runs the same f32 arithmetic on the same values, so each stored bf16 element is the twin's rounded
  // once: within 2^-8 of it.
  const Tensor x = repr({24, 40}, 31), b = repr({24, 40}, 32), w = repr({40}, 33), bias = repr({40}, 34);
  const Twin ln = twin({x, w, bias}, [](const std::vector<Tensor>& v) { return layer_norm(v[0], v[1], v[2]); });
  CHECK(ln.y16.dtype() == DType::BF16);
  check_close(ln.y16, ln.y32, 1e-6, kHalfUlp);
  for (int i = 0; i < 3; ++i) {
    CAPTURE(i);
    CHECK(ln.g16[size_t(i)].dtype() == DType::BF16);
    check_close(ln.g16[size_t(i)], ln.g32[size_t(i)], 1e-5, kHalfUlp);
  }
  for (const double p : {0.0, 0.25}) {
    CAPTURE(p);
    // The sum is stored in bf16 (the twin keeps it in f32), so the norm reads values 2^-8 apart at most, which its
    // scale (1 / std, about 0.7 here) and weight carry into the output and the gradients: the absolute tolerance.
    const Twin fused = twin({x, b, w, bias}, [p](const std::vector<Tensor>& v) {
      auto [sum, out] = add_layer_norm(v[0], v[1], v[2], v[3], 1e-5, p, 99);
      return add(scale(sum, 0.5), out);
    });
    check_close(fused.y16, fused.y32, 0.05, 4 * kHalfUlp);
    for (int i = 0; i < 4; ++i) {
      CAPTURE(i);
      check_close(fused.g16[size_t(i)], fused.g32[size_t(i)], 0.05, 4 * kHalfUlp);
    }
    const Twin drop = twin({x}, [p](const std::vector<Tensor>& v) { return dropout(v[0], p, 7); });
    check_close(drop.y16, drop.y32, 1e-6, kHalfUlp);
    check_close(drop.g16[0], drop.g32[0], 1e-6, kHalfUlp);
  }
}

TEST_CASE("bf16 ops: embedding and cross-entropy: rows summed in f32, the loss in f32") {
  const Tensor ids = from_vector(std::vector<int32_t>{3, 1, 3, 3, 0, 2, 1, 3, 3, 4, 3, 3}, {3, 4});
  const Tensor table = repr({5, 16}, 41);
  const Twin emb = twin({table}, [&](const std::vector<Tensor>& v) { return embedding(ids, v[0]); });
  check_close(emb.y16, emb.y32, 0, 0);                  // a copy
  check_close(emb.g16[0], emb.g32[0], 1e-6, kHalfUlp);  // row 3 sums seven rows of the gradient, rounded once

  const Tensor logits = repr({6, 11}, 42, 3.0);
  const Tensor targets = from_vector(std::vector<int32_t>{0, 10, 5, -1, 3, 3}, {6});
  const Twin ce = twin({logits}, [&](const std::vector<Tensor>& v) { return cross_entropy(v[0], targets); });
  CHECK(ce.y16.dtype() == DType::F32);
  CHECK(ce.y16.item() == ce.y32.item());  // the same f32 arithmetic on the same logits
  CHECK(ce.g16[0].dtype() == DType::BF16);
  check_close(ce.g16[0], ce.g32[0], 1e-7, kHalfUlp);
}

TEST_CASE("bf16 ops: linear and the fused MLP on bf16 storage against their f32 twins") {
  const Tensor x = repr({2, 13, 48}, 51), w = repr({40, 48}, 52, 0.2), bias = repr({40}, 53);
  // Products of bf16 values are exact in f32; the sums differ from the twin's in order only (the atol), then each
  // stored element is rounded once.
  const Twin lin = twin({x, w, bias}, [](const std::vector<Tensor>& v) { return linear(v[0], v[1], v[2]); });
  CHECK(lin.y16.dtype() == DType::BF16);
  check_close(lin.y16, lin.y32, 1e-4, kHalfUlp);
  for (int i = 0; i < 3; ++i) {
    CAPTURE(i);
    check_close(lin.g16[size_t(i)], lin.g32[size_t(i)], 1e-4, kHalfUlp);
  }
  // The MLP keeps its hidden activation h = gelu(pre) in bf16: the second product reads h rounded, each of its H terms
  // off by up to 2^-8 of itself. So out may differ from the twin's by 2^-8 sum_j |w_proj[o, j] h[j]| (computed here
  // from the twin's values) on top of its own rounding.
  const Tensor w2 = repr({24, 40}, 54, 0.2), b2 = repr({24}, 55);
  const Twin m = twin({x, w, bias, w2, b2},
                      [](const std::vector<Tensor>& v) { return mlp(v[0], v[1], v[2], v[3], v[4], Activation::Gelu); });
  const std::vector<float> h = gelu(linear(x, w, bias)).to_vector<float>(), wp = w2.to_vector<float>();
  const std::vector<float> out32 = m.y32.to_vector<float>(), out16 = m.y16.to(DType::F32).to_vector<float>();
  size_t within = 0;
  for (int64_t n = 0; n < 26; ++n)
    for (int64_t o = 0; o < 24; ++o) {
      double bound = 0;
      for (int64_t j = 0; j < 40; ++j) bound += std::abs(double(wp[size_t(o * 40 + j)]) * h[size_t(n * 40 + j)]);
      const double ref = out32[size_t(n * 24 + o)];
      within += std::abs(out16[size_t(n * 24 + o)] - ref) <= kHalfUlp * (bound + std::abs(ref)) + 1e-4;
    }
  CHECK(within == out32.size());
  for (const size_t i : {2u, 4u}) {  // the biases' gradients: column sums of the output gradient and of dpre
    CAPTURE(i);
    CHECK(m.g16[i].dtype() == DType::BF16);
  }
  check_close(m.g16[4], m.g32[4], 1e-4, kHalfUlp);
}

TEST_CASE("bf16 ops: RoPE on bf16 storage is the f32 rotation of the same values, rounded once") {
  Generator gen(21);
  const Tensor x = randn({2, 3, 12}, gen, DType::BF16);  // heads of 4, the first two rotated
  const Tensor y = rope(x, 4, 2, 5, 10000.0);
  REQUIRE(y.dtype() == DType::BF16);
  const std::vector<bf16> got = y.to_vector<bf16>();
  const std::vector<bf16> want = cast(rope(x.to(DType::F32), 4, 2, 5, 10000.0), DType::BF16).to_vector<bf16>();
  bool same = got.size() == want.size();
  for (size_t i = 0; same && i < got.size(); ++i) same = got[i].bits == want[i].bits;
  CHECK(same);
}

TEST_CASE("bf16 ops: cast is differentiable both ways, and the ops without bf16 kernels refuse it by name") {
  Tensor x = from_vector(std::vector<float>{0.5f, -1.25f, from_bits32(0x3f818000u)}, {3});
  x.requires_grad_();
  Tensor h = cast(x, DType::BF16);
  CHECK(h.dtype() == DType::BF16);
  CHECK(h.to_vector<bf16>()[2].bits == 0x3f82);
  Tensor y = sum(mul(cast(gelu(h), DType::F32), from_vector(std::vector<float>{1, 2, 3}, {3})));
  y.backward();
  REQUIRE(x.grad().defined());
  CHECK(x.grad().dtype() == DType::F32);
  // d/dx of gelu at the rounded inputs, times 1, 2, 3, each rounded to bf16 once on its way back.
  Tensor xr = h.to(DType::F32);
  xr.requires_grad_();
  sum(mul(gelu(xr), from_vector(std::vector<float>{1, 2, 3}, {3}))).backward();
  check_close(x.grad(), xr.grad(), 1e-6, 2 * kHalfUlp);

  const Tensor b = ones({2, 3}, DType::BF16);
  for (const auto& [what, op] : std::vector<std::pair<std::string, std::function<Tensor()>>>{
           {"softmax", [&] { return softmax(b); }},
           {"sum", [&] { return sum(b); }},
           {"add",
            [&] {
              return add(b, ones({2, 3}));
            }},  // bf16 + f32: no implicit promotion
       }) {
    CAPTURE(what);
    try {
      op();
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find(what) != std::string::npos);
      CHECK((std::string(e.what()).find("bf16") != std::string::npos));
    }
  }
}

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>

#include "autograd/ops.h"
#include "kernels/device.h"
#include "test_util.h"

using namespace tinygpt;
using tinygpt::test::check_close;

TEST_CASE("shape: sizes, negative dims, printing, limits") {
  const Shape s{2, 3, 4};
  CHECK(s.ndim() == 3);
  CHECK(s.numel() == 24);
  CHECK(s[-1] == 4);
  CHECK(s[0] == 2);
  CHECK(s.str() == "(2, 3, 4)");
  CHECK(Shape{}.numel() == 1);
  CHECK_THROWS_AS(Shape({1, 2, 3, 4, 5, 6}), Error);
  CHECK_THROWS_AS(Shape({2, -1}), Error);
  CHECK_THROWS_AS(s[3], Error);
}

TEST_CASE("creation: zeros, ones, full, arange, from_vector") {
  check_close(zeros({2, 2}), {0, 0, 0, 0});
  check_close(ones({3}, DType::F64), {1, 1, 1});
  check_close(full({2}, 2.5), {2.5, 2.5});
  check_close(arange(4), {0, 1, 2, 3});
  CHECK(arange(3, DType::I32).to_vector<int32_t>() == std::vector<int32_t>{0, 1, 2});
  const Tensor t = from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(t.shape() == Shape{2, 3});
  CHECK(t.dtype() == DType::F32);
  check_close(t, {1, 2, 3, 4, 5, 6});
  CHECK_THROWS_AS(from_vector(std::vector<float>{1, 2, 3}, {2, 2}), Error);
}

TEST_CASE("random: seeded generators reproduce, and the moments are right") {
  Generator g1(42), g2(42), g3(43);
  const auto a = randn({1000}, g1).to_vector<float>();
  const auto b = randn({1000}, g2).to_vector<float>();
  const auto c = randn({1000}, g3).to_vector<float>();
  CHECK(a == b);
  CHECK(a != c);
  Generator g(7);
  const auto x = randn({100000}, g, DType::F64).to_vector<double>();
  double mean = 0, var = 0;
  for (double v : x) mean += v;
  mean /= double(x.size());
  for (double v : x) var += (v - mean) * (v - mean);
  var /= double(x.size());
  CHECK(std::abs(mean) < 0.02);
  CHECK(std::abs(var - 1.0) < 0.02);
  const auto u = rand({10000}, g, DType::F64, Device::CPU, -2.0, 3.0).to_vector<double>();
  for (double v : u) REQUIRE((v >= -2.0 && v < 3.0));
  // The generator state round-trips (checkpoints depend on it).
  const Generator::State st = g.state();
  const double next = g.normal();
  g.set_state(st);
  CHECK(g.normal() == next);
}

TEST_CASE("tensor: handles share storage; clone and detach") {
  Tensor a = from_vector(std::vector<float>{1, 2, 3}, {3});
  Tensor b = a;  // same tensor
  b.data<float>()[0] = 10;
  CHECK(a.data<float>()[0] == 10);
  Tensor c = a.clone();
  c.data<float>()[1] = 20;
  CHECK(a.data<float>()[1] == 2);
  Tensor d = a.detach();
  d.data<float>()[2] = 30;
  CHECK(a.data<float>()[2] == 30);
  CHECK_THROWS_AS(a.data<double>(), Error);
}

TEST_CASE("tensor: item, dtype conversion") {
  CHECK(full({1}, 3.5).item() == 3.5);
  CHECK(full({}, -2.0, DType::F64).item() == -2.0);
  CHECK_THROWS_WITH_AS(zeros({2}).item(), doctest::Contains("2 elements"), Error);
  const Tensor x = from_vector(std::vector<float>{1.5f, -2.5f}, {2});
  check_close(x.to(DType::F64), {1.5, -2.5});
  CHECK(x.to(DType::F64).dtype() == DType::F64);
  CHECK(x.to(DType::I32).to_vector<int32_t>() == std::vector<int32_t>{1, -2});
}

TEST_CASE("tensor: printing with fmt") {
  const Tensor t = from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2});
  CHECK(fmt::format("{}", t) == "tensor([[1.0000, 2.0000],\n[3.0000, 4.0000]], dtype=f32)");
  CHECK(fmt::format("{}", arange(3, DType::I32)) == "tensor([0, 1, 2], dtype=i32)");
  CHECK(fmt::format("{}", arange(10)) == "tensor([0.0000, 1.0000, 2.0000, ..., 7.0000, 8.0000, 9.0000], dtype=f32)");
  CHECK(fmt::format("{}", Shape{4, 5}) == "(4, 5)");
  CHECK(fmt::format("{}", from_vector(std::vector<uint8_t>{1, 0, 7}, {3})) ==
        "tensor([true, false, true], dtype=bool)");
  Tensor g = ones({1}, DType::F64);
  g.requires_grad_();
  CHECK(fmt::format("{}", g) == "tensor([1.0000], dtype=f64, requires_grad)");
}

TEST_CASE("tensor: shape errors name the op and both shapes") {
  const Tensor a = zeros({2, 3}), b = zeros({4, 3});
  CHECK_THROWS_WITH_AS(add(a, b), "add: not broadcastable: shapes (2, 3) and (4, 3)", Error);
  CHECK_THROWS_WITH_AS(matmul(a, b),
                       doctest::Contains("matmul: inner dimensions differ (3 vs 4): shapes (2, 3) and (4, 3)"), Error);
  CHECK_THROWS_WITH_AS(reshape(a, {4, 2}), "reshape: element counts differ: shapes (2, 3) and (4, 2)", Error);
  CHECK_THROWS_WITH_AS(add(a, zeros({2, 3}, DType::F64)), doctest::Contains("dtypes differ"), Error);
}

TEST_CASE("tensor: the CUDA device is refused with a clear message when no GPU is usable") {
  if (cuda::device_count() > 0) return;  // covered by test_cuda on a GPU machine
  CHECK_THROWS_AS(zeros({2}).to(Device::CUDA), Error);
  CHECK_THROWS_AS(zeros({2}, DType::F32, Device::CUDA), Error);
}

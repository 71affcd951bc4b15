// Every CUDA kernel's device code, run on the CPU: the kernel headers kernels/cuda/*.cuh compiled by the host
// compiler under tests/emulated_cuda.h (a fiber per CUDA thread, warp shuffles and block barriers
// emulated), each launcher called as the CUDA backend calls it, on small shapes that cover its branches (several
// blocks, partial warps and tiles, the chunked and broadcast paths), and compared with its CPU twin at
// atol + rtol * |cpu|. Backward outputs start from nonzero values, so a kernel that stores where it must add fails.
// The cuBLAS products are the exception: a loop stands in for cuBLAS (tests/emulated_cuda.h), so what is checked
// there is the arguments our launchers hand it and the kernels around it. tests/test_cuda.cpp runs the real
// backend on a GPU.
#include "tests/emulated_cuda.h"
// (the emulator first: it defines what device code needs)
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention_naive.cuh"
#include "kernels/cuda/crossentropy.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/matmul.cuh"
#include "kernels/cuda/nn.cuh"
#include "kernels/cuda/reduce.cuh"
// (then the CPU twins)
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "tests/attention_cases.h"
#include "tests/kernel_cases.h"

using namespace tinygpt;
namespace gpu = tinygpt::cuda::emulated;

// The emulated definitions have the CPU twins' signatures (kernels/kernels.h checks the CUDA declarations too).
#define TINYGPT_SAME_SIGNATURE(name)                                             \
  static_assert(std::is_same_v<decltype(gpu::name), decltype(cpu::name<float>)>, \
                "kernels/cuda: " #name " does not have the signature of cpu::" #name);
// The kernels that take bf16 storage too are templates on both sides.
#define TINYGPT_SAME_TEMPLATE_SIGNATURE(name)                                             \
  static_assert(std::is_same_v<decltype(gpu::name<float>), decltype(cpu::name<float>)> && \
                    std::is_same_v<decltype(gpu::name<bf16>), decltype(cpu::name<bf16>)>, \
                "kernels/cuda: " #name " does not have the signature of cpu::" #name);
TINYGPT_SAME_SIGNATURE(fill)
static_assert(std::is_same_v<decltype(gpu::round_to_bf16), decltype(cpu::round_to_bf16)> &&
              std::is_same_v<decltype(gpu::widen_bf16), decltype(cpu::widen_bf16)> &&
              std::is_same_v<decltype(gpu::accumulate_bf16), decltype(cpu::accumulate_bf16)>);
TINYGPT_SAME_TEMPLATE_SIGNATURE(axpy)
TINYGPT_SAME_SIGNATURE(axpby)
TINYGPT_SAME_TEMPLATE_SIGNATURE(unary_forward)
TINYGPT_SAME_TEMPLATE_SIGNATURE(unary_backward)
TINYGPT_SAME_TEMPLATE_SIGNATURE(binary_forward)
TINYGPT_SAME_TEMPLATE_SIGNATURE(binary_backward)
TINYGPT_SAME_SIGNATURE(sum_forward)
TINYGPT_SAME_SIGNATURE(sum_squares)
TINYGPT_SAME_SIGNATURE(sum_backward)
TINYGPT_SAME_SIGNATURE(softmax_forward)
TINYGPT_SAME_SIGNATURE(softmax_backward)
TINYGPT_SAME_SIGNATURE(log_softmax_forward)
TINYGPT_SAME_SIGNATURE(log_softmax_backward)
TINYGPT_SAME_TEMPLATE_SIGNATURE(layernorm_forward)
TINYGPT_SAME_TEMPLATE_SIGNATURE(add_layernorm_forward)
TINYGPT_SAME_TEMPLATE_SIGNATURE(layernorm_backward)
TINYGPT_SAME_TEMPLATE_SIGNATURE(rmsnorm_forward)
TINYGPT_SAME_TEMPLATE_SIGNATURE(add_rmsnorm_forward)
TINYGPT_SAME_TEMPLATE_SIGNATURE(rmsnorm_backward)
TINYGPT_SAME_TEMPLATE_SIGNATURE(swiglu_forward)
TINYGPT_SAME_TEMPLATE_SIGNATURE(swiglu_backward)
TINYGPT_SAME_TEMPLATE_SIGNATURE(embedding_forward)
TINYGPT_SAME_TEMPLATE_SIGNATURE(embedding_backward)
TINYGPT_SAME_TEMPLATE_SIGNATURE(crossentropy_forward)
TINYGPT_SAME_TEMPLATE_SIGNATURE(crossentropy_backward)
TINYGPT_SAME_TEMPLATE_SIGNATURE(crossentropy_fused)
TINYGPT_SAME_TEMPLATE_SIGNATURE(dropout_forward)
TINYGPT_SAME_TEMPLATE_SIGNATURE(dropout_backward)
TINYGPT_SAME_TEMPLATE_SIGNATURE(permute)
TINYGPT_SAME_TEMPLATE_SIGNATURE(copy_slice)
TINYGPT_SAME_TEMPLATE_SIGNATURE(matmul_forward)
TINYGPT_SAME_TEMPLATE_SIGNATURE(matmul_backward)
TINYGPT_SAME_TEMPLATE_SIGNATURE(linear_forward)
TINYGPT_SAME_TEMPLATE_SIGNATURE(linear_backward)
TINYGPT_SAME_SIGNATURE(adamw_update)
TINYGPT_SAME_TEMPLATE_SIGNATURE(rope_forward)
TINYGPT_SAME_TEMPLATE_SIGNATURE(rope_backward)
TINYGPT_SAME_SIGNATURE(attention_naive_forward)
TINYGPT_SAME_SIGNATURE(attention_naive_backward)
TINYGPT_SAME_SIGNATURE(attention_flash_forward)
TINYGPT_SAME_SIGNATURE(attention_flash_backward)
#undef TINYGPT_SAME_TEMPLATE_SIGNATURE
#undef TINYGPT_SAME_SIGNATURE

namespace {

using Vec = std::vector<float>;

/// `seed` as a captured CUDA graph's kernels get it: a part in the kernel's arguments, the rest in a word of (device)
/// memory the kernel reads (DropoutSeed::offset).
DropoutSeed through_offset(uint64_t seed) {
  static const uint64_t offset = 0x5eed5eed5eedULL;
  return DropoutSeed(seed - offset, &offset);
}

Vec random(size_t n, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

/// Every element within atol + rtol * |cpu|, infinities equal; NaN only where the CPU left NaN too (the gaps of a
/// strided output that neither writes). Reports the first mismatch and how many there are.
void check_same(const Vec& emulated, const Vec& cpu, const std::string& what, double atol = 1e-5, double rtol = 1e-4) {
  REQUIRE(emulated.size() == cpu.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double a = emulated[i], b = cpu[i];
    const bool ok =
        (std::isnan(a) && std::isnan(b)) || (std::isinf(b) && a == b) || std::abs(a - b) <= atol + rtol * std::abs(b);
    if (!ok && bad++ == 0) first = i;
  }
  INFO(what << ": " << bad << " of " << cpu.size() << " elements differ; first at " << first << ": emulated CUDA "
            << (bad ? emulated[first] : 0.0f) << ", CPU " << (bad ? cpu[first] : 0.0f));
  CHECK(bad == 0);
}

/// The largest |emulated - cpu| over `elements` (every element when empty), NaN where the CPU has NaN skipped.
double largest_difference(const Vec& emulated, const Vec& cpu, const std::vector<int64_t>& elements = {}) {
  double largest = 0;
  auto at = [&](size_t i) {
    if (!std::isnan(cpu[i])) largest = std::max(largest, double(std::abs(emulated[i] - cpu[i])));
  };
  if (elements.empty()) {
    for (size_t i = 0; i < cpu.size(); ++i) at(i);
  } else {
    for (const int64_t i : elements) at(size_t(i));
  }
  return largest;
}

/// A kernel run twice, into copies of the same starting buffers: f(buffers) on the emulated GPU and on the CPU.
template <class F>
void compare(const std::string& what, std::vector<Vec> start, F run, double atol = 1e-5, double rtol = 1e-4) {
  std::vector<Vec> emulated = start, cpu = start;
  run(emulated, true);
  run(cpu, false);
  for (size_t i = 0; i < start.size(); ++i)
    check_same(emulated[i], cpu[i], what + ", output " + std::to_string(i), atol, rtol);
}

const char* unary_name(UnaryOp op) {
  constexpr const char* names[] = {"neg", "scale", "exp", "log", "tanh", "relu", "gelu", "sqrt"};
  return names[int(op)];
}

/// out = broadcast of a (shape_a) and b (shape_b), shapes padded to kMaxDims.
BroadcastGeom broadcast(const int64_t (&a)[kMaxDims], const int64_t (&b)[kMaxDims]) {
  BroadcastGeom g{};
  int64_t sa[kMaxDims], sb[kMaxDims];
  contiguous_strides(a, sa, kMaxDims);
  contiguous_strides(b, sb, kMaxDims);
  g.same_shape = true;
  for (int d = 0; d < kMaxDims; ++d) {
    g.out[d] = std::max(a[d], b[d]);
    g.a_stride[d] = a[d] == 1 ? 0 : sa[d];
    g.b_stride[d] = b[d] == 1 ? 0 : sb[d];
    g.same_shape = g.same_shape && a[d] == b[d];
  }
  return g;
}

int64_t count(const int64_t (&shape)[kMaxDims]) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

}  // namespace

TEST_CASE("the emulator: one warp runs ahead of the others, so a missing barrier shows") {
  // Warp 0 writes a word of shared memory that warp 1 reads: with __syncthreads between, every block reads it; without,
  // the block where warp 1 runs first (the odd one) reads what was there before (the 0xff fill).
  for (const bool barrier : {true, false}) {
    std::vector<uint32_t> seen(2, 0);
    tinygpt::emu::launch(dim3(2), 64, 4, [&](unsigned char* smem) {
      uint32_t* word = reinterpret_cast<uint32_t*>(smem);
      if (threadIdx.x == 0) *word = blockIdx.x + 1;
      if (barrier) __syncthreads();
      if (threadIdx.x == 32) seen[blockIdx.x] = *word;
    });
    INFO("with __syncthreads: " << barrier);
    CHECK(seen[0] == 1);
    CHECK(seen[1] == (barrier ? 2u : 0xffffffffu));
  }
  // A cp.async that warp 1 reads after a barrier but before warp 0 waited for it: old contents where warp 1 runs
  // first and copies land late (block 1), the copy where they land early (block 3).
  std::vector<uint32_t> seen(4, 0);
  const uint32_t value = 7;
  tinygpt::emu::launch(dim3(4), 64, 4, [&](unsigned char* smem) {
    if (threadIdx.x == 0) tinygpt::cuda::cp_async4(smem, &value, 4);
    tinygpt::cuda::cp_async_commit();
    __syncthreads();
    if (threadIdx.x == 32) seen[blockIdx.x] = *reinterpret_cast<uint32_t*>(smem);
    tinygpt::cuda::cp_async_wait<0>();
  });
  CHECK(seen[1] == 0xffffffffu);
  CHECK(seen[3] == value);
}

TEST_CASE("emulated CUDA: fill, axpy, axpby") {
  const int64_t n = 700;  // 3 blocks of 256 threads, the last one partial
  compare("fill", {random(n, 1)},
          [&](std::vector<Vec>& b, bool g) { (g ? gpu::fill : cpu::fill<float>)(b[0].data(), 0.25f, n); });
  const Vec x = random(n, 2);
  compare("axpy", {random(n, 3)}, [&](std::vector<Vec>& b, bool g) {
    (g ? gpu::axpy<float> : cpu::axpy<float>)(b[0].data(), x.data(), -1.5f, n);
  });
  compare("axpby", {random(n, 3)}, [&](std::vector<Vec>& b, bool g) {
    (g ? gpu::axpby : cpu::axpby<float>)(b[0].data(), x.data(), n, -1.5, 0.75, nullptr, nullptr, 0.0);
  });
  for (const bool g : {true, false}) {  // beta 0 writes alpha x without reading what was there
    Vec y(size_t(n), NAN);
    (g ? gpu::axpby : cpu::axpby<float>)(y.data(), x.data(), n, 2.0, 0.0, nullptr, nullptr, 0.0);
    for (int64_t i = 0; i < n; ++i) REQUIRE(y[size_t(i)] == 2.0f * x[size_t(i)]);
  }
}

TEST_CASE("emulated CUDA: f32 <-> bf16 conversion, vector and element paths, bit for bit") {
  // 2053 elements: 256 groups of eight and a tail of 5. Offsets 0 (both pointers 16-byte aligned: the vector path)
  // and 1 (not aligned: an element at a time).
  const int64_t n = 2053;
  Vec x = random(size_t(n) + 1, 7, -3.0f, 3.0f);
  x[3] = NAN, x[4] = INFINITY, x[5] = -0.0f, x[6] = std::bit_cast<float>(0x3f818000u);  // a tie: rounds to even
  for (const int64_t off : {0, 1}) {
    CAPTURE(off);
    std::vector<bf16> h_gpu(size_t(n) + 8, bf16::from_bits(0xffff)), h_cpu = h_gpu;
    gpu::round_to_bf16(h_gpu.data() + off, x.data() + off, n);
    cpu::round_to_bf16(h_cpu.data() + off, x.data() + off, n);
    size_t same = 0;
    for (size_t i = 0; i < h_gpu.size(); ++i) same += h_gpu[i].bits == h_cpu[i].bits;
    CHECK(same == h_gpu.size());     // the elements past n untouched on both
    CHECK(h_gpu[6].bits == 0x3f82);  // h[off + i] is x[off + i] rounded
    Vec w_gpu(size_t(n) + 8, -7.0f), w_cpu = w_gpu;
    gpu::widen_bf16(w_gpu.data() + off, h_gpu.data() + off, n);
    cpu::widen_bf16(w_cpu.data() + off, h_cpu.data() + off, n);
    check_same(w_gpu, w_cpu, "widen_bf16", 0, 0);
    Vec y_gpu = random(size_t(n) + 8, 8), y_cpu = y_gpu;  // y += x, the elements past n untouched
    gpu::accumulate_bf16(y_gpu.data() + off, h_gpu.data() + off, n);
    cpu::accumulate_bf16(y_cpu.data() + off, h_cpu.data() + off, n);
    check_same(y_gpu, y_cpu, "accumulate_bf16", 0, 0);
  }
}

TEST_CASE("emulated CUDA: unary ops, forward and backward") {
  const int64_t n = 300;
  for (const UnaryOp op : {UnaryOp::Neg, UnaryOp::Scale, UnaryOp::Exp, UnaryOp::Log, UnaryOp::Tanh, UnaryOp::Relu,
                           UnaryOp::Gelu, UnaryOp::Sqrt}) {
    const bool positive = op == UnaryOp::Log || op == UnaryOp::Sqrt;
    const Vec x = positive ? random(n, 4, 0.1f, 3.0f) : random(n, 4, -3.0f, 3.0f);
    Vec y(static_cast<size_t>(n));
    cpu::unary_forward<float>(y.data(), x.data(), n, op, 0.7f);
    const Vec dy = random(n, 5);
    const std::string name = unary_name(op);
    compare(name + " forward", {Vec(size_t(n))}, [&](std::vector<Vec>& b, bool g) {
      (g ? gpu::unary_forward<float> : cpu::unary_forward<float>)(b[0].data(), x.data(), n, op, 0.7f);
    });
    // Accumulating into a gradient, and overwriting one that holds NaN (an unwritten slot: never read).
    for (const bool overwrite : {false, true}) {
      compare(name + (overwrite ? " backward, overwriting" : " backward"),
              {overwrite ? Vec(size_t(n), std::numeric_limits<float>::quiet_NaN()) : random(n, 6)},
              [&](std::vector<Vec>& b, bool g) {
                (g ? gpu::unary_backward<float> : cpu::unary_backward<float>)(b[0].data(), dy.data(), x.data(),
                                                                              y.data(), n, op, 0.7f, overwrite);
              });
    }
  }
}

TEST_CASE("emulated CUDA: binary ops over broadcast shapes, forward and backward") {
  struct Shapes {
    int64_t a[kMaxDims], b[kMaxDims];
  };
  const Shapes cases[] = {
      {{1, 1, 3, 4, 70}, {1, 1, 3, 4, 70}},  // same shape: the flat kernels
      {{1, 1, 3, 4, 70}, {1, 1, 1, 1, 70}},  // b broadcast over rows: a summed gradient per element of b
      {{1, 1, 3, 1, 5}, {1, 1, 1, 6, 1}},    // both broadcast
      {{1, 2, 1, 3, 1}, {1, 2, 5, 3, 4}},    // a broadcast over two dims, b full
      // Broadcast over leading dims only (row-block partial sums): a position embedding's shape, 80 rows (five
      // blocks of rows), and a broadcast over the leading dims of a
      {{1, 1, 5, 9, 7}, {1, 1, 1, 9, 7}},
      {{1, 1, 2, 40, 3}, {1, 1, 1, 1, 3}},
      {{1, 1, 1, 9, 7}, {1, 1, 5, 9, 7}},
  };
  for (const Shapes& s : cases) {
    const BroadcastGeom geom = broadcast(s.a, s.b);
    const int64_t na = count(s.a), nb = count(s.b), n = count(geom.out);
    const Vec a = random(size_t(na), 7), b = random(size_t(nb), 8, 0.5f, 2.0f), dout = random(size_t(n), 9);
    for (const BinaryOp op : {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div}) {
      const std::string name =
          "binary op " + std::to_string(int(op)) + " over " + std::to_string(na) + " and " + std::to_string(nb);
      compare(name + " forward", {Vec(size_t(n))}, [&](std::vector<Vec>& o, bool g) {
        (g ? gpu::binary_forward<float> : cpu::binary_forward<float>)(o[0].data(), a.data(), b.data(), geom, op);
      });
      compare(name + " backward", {random(size_t(na), 10), random(size_t(nb), 11)}, [&](std::vector<Vec>& o, bool g) {
        (g ? gpu::binary_backward<float> : cpu::binary_backward<float>)(o[0].data(), o[1].data(), dout.data(), a.data(),
                                                                        b.data(), geom, op);
      });
      compare(name + " backward, db only", {random(size_t(nb), 12)}, [&](std::vector<Vec>& o, bool g) {
        (g ? gpu::binary_backward<float> : cpu::binary_backward<float>)(nullptr, o[0].data(), dout.data(), a.data(),
                                                                        b.data(), geom, op);
      });
    }
  }
}

TEST_CASE("emulated CUDA: sums over a middle dim (strided) and over long rows (chunked), forward and backward") {
  struct Case {
    int64_t outer, D, inner;
  };
  for (const Case c : {Case{3, 7, 5}, Case{2, 300, 1}, Case{1, 50000, 1}}) {  // 50000: three chunks per row
    const std::string name =
        "sum (" + std::to_string(c.outer) + ", " + std::to_string(c.D) + ", " + std::to_string(c.inner) + ")";
    const Vec x = random(size_t(c.outer * c.D * c.inner), 13);
    compare(
        name + " forward", {Vec(size_t(c.outer * c.inner))},
        [&](std::vector<Vec>& o, bool g) {
          (g ? gpu::sum_forward : cpu::sum_forward<float>)(o[0].data(), x.data(), c.outer, c.D, c.inner, 0.5f);
        },
        1e-4, 1e-4);
    const Vec dout = random(size_t(c.outer * c.inner), 14);
    compare(name + " backward", {random(x.size(), 15)}, [&](std::vector<Vec>& o, bool g) {
      (g ? gpu::sum_backward : cpu::sum_backward<float>)(o[0].data(), dout.data(), c.outer, c.D, c.inner, 0.5f);
    });
  }
}

TEST_CASE("emulated CUDA: sum of squares (empty, one chunk, several chunks)") {
  for (const int64_t n : {int64_t(0), int64_t(300), int64_t(50000)}) {
    const Vec x = random(size_t(n), 13);
    compare(
        "sum_squares of " + std::to_string(n), {Vec(1)},
        [&](std::vector<Vec>& o, bool g) {
          (g ? gpu::sum_squares : cpu::sum_squares<float>)(o[0].data(), x.data(), n);
        },
        1e-4, 1e-4);
  }
}

TEST_CASE("emulated CUDA: softmax and log-softmax (rows wider than a warp, a fully masked row), forward and backward") {
  const int64_t N = 5, C = 70;
  Vec x = random(size_t(N * C), 16, -4.0f, 4.0f);
  for (int64_t c = 0; c < C; ++c) x[size_t(2 * C + c)] = -std::numeric_limits<float>::infinity();
  const Vec dout = random(size_t(N * C), 17);
  for (const bool log : {false, true}) {
    const std::string name = log ? "log_softmax" : "softmax";
    const Vec input = log ? random(size_t(N * C), 18, -4.0f, 4.0f) : x;
    Vec y(size_t(N * C));
    (log ? cpu::log_softmax_forward<float> : cpu::softmax_forward<float>)(y.data(), input.data(), N, C);
    compare(name + " forward", {Vec(size_t(N * C))}, [&](std::vector<Vec>& o, bool g) {
      const auto f = log ? (g ? gpu::log_softmax_forward : cpu::log_softmax_forward<float>)
                         : (g ? gpu::softmax_forward : cpu::softmax_forward<float>);
      f(o[0].data(), input.data(), N, C);
    });
    compare(name + " backward", {random(size_t(N * C), 19)}, [&](std::vector<Vec>& o, bool g) {
      const auto f = log ? (g ? gpu::log_softmax_backward : cpu::log_softmax_backward<float>)
                         : (g ? gpu::softmax_backward : cpu::softmax_backward<float>);
      f(o[0].data(), dout.data(), y.data(), N, C);
    });
  }
}

TEST_CASE("emulated CUDA: layernorm (several blocks of weight and bias partial sums), forward and backward") {
  // C = 45: an element at a time; 48: whole 16-byte groups (two float4s).
  for (const int64_t C : {int64_t(45), int64_t(48)}) {
    CAPTURE(C);
    const int64_t N = 530;  // 34 blocks of 16 rows: lanes of the partial sums' warps add two rows or one
    const Vec x = random(size_t(N * C), 20), w = random(size_t(C), 21), bias = random(size_t(C), 22);
    const Vec dout = random(size_t(N * C), 23), residual = random(size_t(N * C), 27);
    for (const bool with_bias : {true, false}) {
      const std::string name = with_bias ? "layernorm" : "layernorm without bias";
      compare(name + " forward", {Vec(size_t(N * C)), Vec(size_t(N)), Vec(size_t(N))},
              [&](std::vector<Vec>& o, bool g) {
                (g ? gpu::layernorm_forward<float>
                   : cpu::layernorm_forward<float>)(o[0].data(), o[1].data(), o[2].data(), x.data(), w.data(),
                                                    with_bias ? bias.data() : nullptr, N, C, 1e-5f);
              });
      for (const float p : {0.0f, 0.3f}) {  // the residual without and with dropout
        compare(name + " after a residual add, forward" + (p > 0 ? " (dropout)" : ""),
                {Vec(size_t(N * C)), Vec(size_t(N * C)), Vec(size_t(N)), Vec(size_t(N))},
                [&](std::vector<Vec>& o, bool g) {
                  (g ? gpu::add_layernorm_forward<float>
                     : cpu::add_layernorm_forward<float>)({.sum = o[0].data(),
                                                           .out = o[1].data(),
                                                           .mean = o[2].data(),
                                                           .rstd = o[3].data(),
                                                           .a = x.data(),
                                                           .b = residual.data(),
                                                           .weight = w.data(),
                                                           .bias = with_bias ? bias.data() : nullptr,
                                                           .N = N,
                                                           .C = C,
                                                           .eps = 1e-5f,
                                                           .p = p,
                                                           .seed = g ? through_offset(77) : DropoutSeed(77)});
                });
      }
      Vec y(static_cast<size_t>(N * C)), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
      cpu::layernorm_forward<float>(y.data(), mean.data(), rstd.data(), x.data(), w.data(), bias.data(), N, C, 1e-5f);
      for (const bool overwrite : {false, true}) {
        const Vec dinp =
            overwrite ? Vec(size_t(N * C), std::numeric_limits<float>::quiet_NaN()) : random(size_t(N * C), 24);
        compare(
            name + (overwrite ? " backward, overwriting dinp" : " backward"),
            {dinp, random(size_t(C), 25), random(size_t(C), 26)},
            [&](std::vector<Vec>& o, bool g) {
              (g ? gpu::layernorm_backward<float>
                 : cpu::layernorm_backward<float>)(o[0].data(), o[1].data(), with_bias ? o[2].data() : nullptr,
                                                   dout.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C,
                                                   overwrite);
            },
            1e-4, 1e-4);
      }
      compare(
          name + " backward, weight and bias only", {random(size_t(C), 25), random(size_t(C), 26)},
          [&](std::vector<Vec>& o, bool g) {
            (g ? gpu::layernorm_backward<float>
               : cpu::layernorm_backward<float>)(nullptr, o[0].data(), with_bias ? o[1].data() : nullptr, dout.data(),
                                                 x.data(), w.data(), mean.data(), rstd.data(), N, C, false);
          },
          1e-4, 1e-4);
    }
  }
  // Rows wider than the fused backward kernel's shared memory takes (C > 768): the input and parameter kernels.
  const int64_t N2 = 40, C2 = 800;
  const Vec x2 = random(size_t(N2 * C2), 30), w2 = random(size_t(C2), 31), dout2 = random(size_t(N2 * C2), 32);
  Vec y2(static_cast<size_t>(N2 * C2)), mean2(static_cast<size_t>(N2)), rstd2(static_cast<size_t>(N2));
  cpu::layernorm_forward<float>(y2.data(), mean2.data(), rstd2.data(), x2.data(), w2.data(), nullptr, N2, C2, 1e-5f);
  compare(
      "layernorm backward, wide rows", {random(size_t(N2 * C2), 33), random(size_t(C2), 34), random(size_t(C2), 35)},
      [&](std::vector<Vec>& o, bool g) {
        (g ? gpu::layernorm_backward<float>
           : cpu::layernorm_backward<float>)(o[0].data(), o[1].data(), o[2].data(), dout2.data(), x2.data(), w2.data(),
                                             mean2.data(), rstd2.data(), N2, C2, false);
      },
      1e-4, 1e-4);
}

TEST_CASE("emulated CUDA: RMSNorm (fused and wide rows) and SwiGLU, forward and backward") {
  // C = 45: an element at a time; 48: 16-byte groups; 800: wider than the fused backward kernel takes.
  for (const auto& [N, C] : {std::pair<int64_t, int64_t>{530, 45}, {530, 48}, {40, 800}}) {
    CAPTURE(C);
    const Vec x = random(size_t(N * C), 40), w = random(size_t(C), 41), dout = random(size_t(N * C), 42);
    const Vec residual = random(size_t(N * C), 43);
    compare("rmsnorm forward", {Vec(size_t(N * C)), Vec(size_t(N))}, [&](std::vector<Vec>& o, bool g) {
      (g ? gpu::rmsnorm_forward<float> : cpu::rmsnorm_forward<float>)(o[0].data(), o[1].data(), x.data(), w.data(), N,
                                                                      C, 1e-6f);
    });
    for (const float p : {0.0f, 0.3f}) {
      compare(std::string("rmsnorm after a residual add, forward") + (p > 0 ? " (dropout)" : ""),
              {Vec(size_t(N * C)), Vec(size_t(N * C)), Vec(size_t(N))}, [&](std::vector<Vec>& o, bool g) {
                (g ? gpu::add_rmsnorm_forward<float>
                   : cpu::add_rmsnorm_forward<float>)({.sum = o[0].data(),
                                                       .out = o[1].data(),
                                                       .rstd = o[2].data(),
                                                       .a = x.data(),
                                                       .b = residual.data(),
                                                       .weight = w.data(),
                                                       .N = N,
                                                       .C = C,
                                                       .eps = 1e-6f,
                                                       .p = p,
                                                       .seed = g ? through_offset(78) : DropoutSeed(78)});
              });
    }
    Vec y(static_cast<size_t>(N * C)), rstd(static_cast<size_t>(N));
    cpu::rmsnorm_forward<float>(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6f);
    for (const bool overwrite : {false, true}) {
      const Vec dinp =
          overwrite ? Vec(size_t(N * C), std::numeric_limits<float>::quiet_NaN()) : random(size_t(N * C), 44);
      compare(
          overwrite ? "rmsnorm backward, overwriting dinp" : "rmsnorm backward", {dinp, random(size_t(C), 45)},
          [&](std::vector<Vec>& o, bool g) {
            (g ? gpu::rmsnorm_backward<float> : cpu::rmsnorm_backward<float>)(o[0].data(), o[1].data(), dout.data(),
                                                                              x.data(), w.data(), rstd.data(), N, C,
                                                                              overwrite);
          },
          1e-4, 1e-4);
    }
    compare(
        "rmsnorm backward, weight only", {random(size_t(C), 45)},
        [&](std::vector<Vec>& o, bool g) {
          (g ? gpu::rmsnorm_backward<float> : cpu::rmsnorm_backward<float>)(nullptr, o[0].data(), dout.data(), x.data(),
                                                                            w.data(), rstd.data(), N, C, false);
        },
        1e-4, 1e-4);
  }
  const int64_t N = 37, H = 70;
  const Vec h = random(size_t(N * 2 * H), 46, -6.0f, 6.0f), dout = random(size_t(N * H), 47);
  compare(
      "swiglu forward", {Vec(size_t(N * H))},
      [&](std::vector<Vec>& o, bool g) {
        (g ? gpu::swiglu_forward<float> : cpu::swiglu_forward<float>)(o[0].data(), h.data(), N, H);
      },
      1e-6, 1e-5);
  for (const bool overwrite : {false, true}) {
    compare(
        overwrite ? "swiglu backward, overwriting" : "swiglu backward", {random(size_t(N * 2 * H), 48)},
        [&](std::vector<Vec>& o, bool g) {
          (g ? gpu::swiglu_backward<float> : cpu::swiglu_backward<float>)(o[0].data(), dout.data(), h.data(), N, H,
                                                                          overwrite);
        },
        1e-6, 1e-5);
  }
  // bf16 storage: the same f32 arithmetic, each result rounded once.
  std::vector<bf16> hb(h.size()), yc(size_t(N * H)), yg(size_t(N * H));
  for (size_t i = 0; i < h.size(); ++i) hb[i] = bf16(h[i]);
  cpu::swiglu_forward<bf16>(yc.data(), hb.data(), N, H);
  gpu::swiglu_forward<bf16>(yg.data(), hb.data(), N, H);
  // The CPU's exp and CUDA's expf differ in the last float bits, so a rounding may fall either side: one bf16 step.
  for (size_t i = 0; i < yc.size(); ++i)
    CHECK(std::abs(float(yc[i]) - float(yg[i])) <= std::abs(float(yc[i])) / 128 + 1e-30f);
}

TEST_CASE("emulated CUDA: embedding (repeated and unused ids), forward and backward") {
  // 50 rows: four chunks of rows in the backward's sums; 10: one, which the device scan adds straight into dweight;
  // 70 rows 300 wide: two slices of channels. Id 10 appears once (one segment beside ids of several); 9 and 11 never.
  for (const auto& [N, C] : {std::pair<int64_t, int64_t>{50, 40}, {10, 40}, {70, 300}}) {
    CAPTURE(N);
    CAPTURE(C);
    const int64_t V = 12;
    std::vector<int32_t> ids(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n) ids[size_t(n)] = int32_t((n * 7 + n / 3) % 9);
    ids[size_t(N / 2)] = 10;
    const Vec weight = random(size_t(V * C), 27), dout = random(size_t(N * C), 28);
    compare("embedding forward", {Vec(size_t(N * C))}, [&](std::vector<Vec>& o, bool g) {
      (g ? gpu::embedding_forward<float> : cpu::embedding_forward<float>)(o[0].data(), ids.data(), weight.data(), N, C);
    });
    // With the ids' host copy the launcher sorts them on the host; without it, it scans them on the device (no copy
    // back, nothing of this step's ids baked into a captured graph). Both sum each id's rows in chunks of rows, in row
    // order within a chunk and chunk order after: the same bits.
    std::vector<Vec> results;
    for (const int32_t* host_ids : {static_cast<const int32_t*>(nullptr), static_cast<const int32_t*>(ids.data())}) {
      const int64_t copies = gpu::host_copies;
      compare("embedding backward", {random(size_t(V * C), 29)}, [&](std::vector<Vec>& o, bool g) {
        (g ? gpu::embedding_backward<float> : cpu::embedding_backward<float>)(o[0].data(), dout.data(), ids.data(),
                                                                              host_ids, N, V, C);
        if (g) results.push_back(o[0]);
      });
      CHECK(gpu::host_copies == copies);
    }
    CHECK(results[0] == results[1]);
  }
}

TEST_CASE("emulated CUDA: dropout draws the CPU's mask, forward and backward") {
  const int64_t n = 600;
  const Vec x = random(size_t(n), 32), dout = random(size_t(n), 33);
  for (const float p : {0.0f, 0.3f, 1.0f}) {
    const std::string name = "dropout p=" + std::to_string(p);
    compare(
        name + " forward", {Vec(size_t(n))},
        [&](std::vector<Vec>& o, bool g) {
          (g ? gpu::dropout_forward<float> : cpu::dropout_forward<float>)(o[0].data(), x.data(), n, p, 99);
        },
        0.0, 0.0);
    // The GPU's seed through an offset in (device) memory, as a captured training step reads it: the same mask.
    compare(
        name + " forward, seed through an offset", {Vec(size_t(n))},
        [&](std::vector<Vec>& o, bool g) {
          (g ? gpu::dropout_forward<float> : cpu::dropout_forward<float>)(o[0].data(), x.data(), n, p,
                                                                          g ? through_offset(99) : DropoutSeed(99));
        },
        0.0, 0.0);
    compare(
        name + " backward", {random(size_t(n), 34)},
        [&](std::vector<Vec>& o, bool g) {
          (g ? gpu::dropout_backward<float> : cpu::dropout_backward<float>)(o[0].data(), dout.data(), n, p,
                                                                            g ? through_offset(99) : DropoutSeed(99));
        },
        0.0, 1e-7);
  }
}

TEST_CASE("emulated CUDA: permute and copy_slice, storing and accumulating") {
  // inp (2, 3, 4, 5) read as out (4, 2, 5, 3): out dim i is inp dim perm[i] = {2, 0, 3, 1}.
  PermuteGeom g{};
  const int64_t shape[kMaxDims] = {1, 2, 3, 4, 5};
  int64_t stride[kMaxDims];
  contiguous_strides(shape, stride, kMaxDims);
  const int perm[kMaxDims] = {0, 3, 1, 4, 2};
  for (int d = 0; d < kMaxDims; ++d) g.out[d] = shape[perm[d]], g.inp_stride[d] = stride[perm[d]];
  const Vec x = random(120, 35);
  for (const bool acc : {false, true}) {
    compare(
        std::string("permute") + (acc ? " accumulating" : ""), {random(120, 36)},
        [&](std::vector<Vec>& o, bool gp) {
          (gp ? gpu::permute<float> : cpu::permute<float>)(o[0].data(), x.data(), g, acc);
        },
        0.0, 1e-7);
    // src (3, 7, 4) rows 2..5 into dst (3, 9, 4) rows 4..7
    const Vec src = random(3 * 7 * 4, 37);
    compare(
        std::string("copy_slice") + (acc ? " accumulating" : ""), {random(3 * 9 * 4, 38)},
        [&](std::vector<Vec>& o, bool gp) {
          (gp ? gpu::copy_slice<float> : cpu::copy_slice<float>)(o[0].data(), src.data(), 3, 4, 9, 4, 7, 2, 4, acc);
        },
        0.0, 1e-7);
  }
}

namespace {

/// The linear launchers against their CPU twins, each bias and activation, x (70, C) and weight (OC, C), with
/// cublasLt's epilogues asked for (lt_epilogues; they are then used with f32 products); lt: whether the stand-in for
/// cublasLt finds an algorithm (when not, the launchers add the bias and activation themselves).
void check_linear_launchers(MatmulMath math, int64_t C, int64_t OC, bool lt) {
  const int64_t rows = 70;  // five blocks of bias-gradient partial sums
  gpu::fused_gemm_available = lt;
  const Vec x = random(size_t(rows * C), 44), w = random(size_t(OC * C), 45), bias = random(size_t(OC), 46);
  const Vec dout = random(size_t(rows * OC), 47);
  // The activation's input for backward: the pre-activation whose act(.) was inp (both signs, for ReLU squared).
  const Vec pre = random(x.size(), 51, -3.0f, 3.0f);
  // With bf16 products the GPU may keep inp rounded to bf16 from forward to backward (inp16): backward is then given
  // an inp of NaNs, which it must not read.
  const Vec nan_x(x.size(), std::numeric_limits<float>::quiet_NaN());
  for (const bool keep16 : {false, true}) {
    if (keep16 && math != MatmulMath::BF16) continue;
    std::vector<uint16_t> x16(x.size() + 1, 0xffff);
    for (const bool with_bias : {true, false}) {
      for (const Activation act : {Activation::None, Activation::Gelu, Activation::ReluSquared}) {
        const std::string name = std::string(with_bias ? "linear" : "linear without bias") +
                                 (act == Activation::Gelu          ? ", GELU"
                                  : act == Activation::ReluSquared ? ", ReLU^2"
                                                                   : "") +
                                 " C=" + std::to_string(C) + " OC=" + std::to_string(OC) +
                                 (lt ? "" : ", no cublasLt algorithm") + (keep16 ? ", inp kept in bf16" : "");
        // The forward's arguments; each call below changes what it must.
        const LinearForward<float> f{.inp = x.data(),
                                     .weight = w.data(),
                                     .bias = with_bias ? bias.data() : nullptr,
                                     .N = rows,
                                     .C = C,
                                     .OC = OC,
                                     .math = math,
                                     .act = act,
                                     .lt_epilogues = true};
        compare(name + " forward", {Vec(size_t(rows * OC)), Vec(size_t(rows * OC))}, [&](std::vector<Vec>& o, bool g) {
          LinearForward<float> c = f;
          c.out = o[0].data(), c.act_out = o[1].data();
          if (g) {
            c.inp16 = keep16 ? x16.data() : nullptr;
            gpu::linear_forward<float>(c);
          } else {
            cpu::linear_forward<float>(c);
          }
        });
        if (keep16) {
          bool rounded = true;
          for (size_t k = 0; k < x.size(); ++k) rounded = rounded && x16[k] == tinygpt::cuda::to_bf16_bits(x[k]);
          CHECK(rounded);
        }
        if (keep16 && act != Activation::None) {
          // The activation straight to bf16 (act16): out as before, act16 act(out) rounded, act_out not written;
          // then a product reading act16 in place of its input, bit for bit the one that rounds the f32 activation.
          Vec out(size_t(rows * OC)), act_out(out.size()), ref_out(out.size()), ref_act(out.size());
          std::vector<uint16_t> act16(out.size() + 1, 0xffff);
          Vec untouched(out.size(), -7.0f);
          Vec no_act = untouched;
          LinearForward<float> c = f, ref = f;
          c.out = out.data(), c.act_out = no_act.data(), c.inp16 = x16.data(), c.act16 = act16.data();
          ref.out = ref_out.data(), ref.act_out = ref_act.data();
          gpu::linear_forward<float>(c);
          gpu::linear_forward<float>(ref);
          CHECK(out == ref_out);
          CHECK(no_act == untouched);
          bool rounded = true;
          for (size_t k = 0; k < out.size(); ++k)
            rounded = rounded && act16[k] == tinygpt::cuda::to_bf16_bits(ref_act[k]);
          CHECK(rounded);
          const Vec w_next = random(size_t(5 * OC), 52);
          Vec next(size_t(rows * 5)), ref_next(next.size());
          gpu::linear_forward<float>({.out = next.data(),
                                      .inp = nullptr,
                                      .weight = w_next.data(),
                                      .N = rows,
                                      .C = OC,
                                      .OC = 5,
                                      .math = math,
                                      .inp16 = act16.data(),
                                      .lt_epilogues = true});
          gpu::linear_forward<float>({.out = ref_next.data(),
                                      .inp = ref_act.data(),
                                      .weight = w_next.data(),
                                      .N = rows,
                                      .C = OC,
                                      .OC = 5,
                                      .math = math,
                                      .lt_epilogues = true});
          CHECK(next == ref_next);
        }
        for (const bool overwrite : {false, true}) {
          if (act != Activation::None && !overwrite) continue;  // an activation's gradient overwrites dinp
          const Vec dinp = overwrite ? Vec(x.size(), std::numeric_limits<float>::quiet_NaN()) : random(x.size(), 48);
          compare(
              name + (overwrite ? " backward, overwriting dinp" : " backward"),
              {dinp, random(w.size(), 49), random(size_t(OC), 50)},
              [&](std::vector<Vec>& o, bool g) {
                LinearBackward<float> c{.dinp = o[0].data(),
                                        .dweight = o[1].data(),
                                        .dbias = with_bias ? o[2].data() : nullptr,
                                        .dout = dout.data(),
                                        .inp = x.data(),
                                        .weight = w.data(),
                                        .N = rows,
                                        .C = C,
                                        .OC = OC,
                                        .math = math,
                                        .overwrite_dinp = overwrite,
                                        .act = act,
                                        .act_of = pre.data(),
                                        .lt_epilogues = true};
                if (g) {
                  if (keep16) c.inp = nan_x.data(), c.inp16 = x16.data();
                  gpu::linear_backward<float>(c);
                } else {
                  cpu::linear_backward<float>(c);
                }
              },
              1e-4, 1e-4);
        }
      }
    }
  }
  gpu::fused_gemm_available = true;
}

}  // namespace

TEST_CASE("emulated CUDA: linear asks cublasLt for its epilogues only when the call asks for them, in f32") {
  // A GELU layer with a bias, forward and backward, widths cublasLt's aux accepts: the calls of fused_gemm counted.
  const int64_t rows = 8, C = 16, OC = 24;
  const Vec x = random(size_t(rows * C), 60), w = random(size_t(OC * C), 61), bias = random(size_t(OC), 62);
  const Vec dout = random(size_t(rows * OC), 63);
  const auto calls = [&](MatmulMath math, bool lt) {
    Vec out(size_t(rows * OC)), act_out(out.size()), dinp(x.size()), dw(w.size()), db(bias.size());
    gpu::fused_gemm_calls = 0;
    gpu::linear_forward<float>({.out = out.data(),
                                .inp = x.data(),
                                .weight = w.data(),
                                .bias = bias.data(),
                                .N = rows,
                                .C = C,
                                .OC = OC,
                                .math = math,
                                .act = Activation::Gelu,
                                .act_out = act_out.data(),
                                .lt_epilogues = lt});
    // backward as if x were GELU's output, of pre-activations x too
    gpu::linear_backward<float>({.dinp = dinp.data(),
                                 .dweight = dw.data(),
                                 .dbias = db.data(),
                                 .dout = dout.data(),
                                 .inp = x.data(),
                                 .weight = w.data(),
                                 .N = rows,
                                 .C = C,
                                 .OC = OC,
                                 .math = math,
                                 .overwrite_dinp = true,
                                 .act = Activation::Gelu,
                                 .act_of = x.data(),
                                 .lt_epilogues = lt});
    return gpu::fused_gemm_calls;
  };
  for (const MatmulMath math : {MatmulMath::F32, MatmulMath::TF32, MatmulMath::BF16}) CHECK(calls(math, false) == 0);
  CHECK(calls(MatmulMath::F32, true) == 2);  // the forward's bias and GELU, the backward's GELU derivative
  CHECK(calls(MatmulMath::TF32, true) == 2);
  CHECK(calls(MatmulMath::BF16, true) == 0);
}

TEST_CASE("emulated CUDA: matmul launchers (every transpose, shared and batched operands) and linear") {
  // Each in f32 and with bf16 operands (their rounded copies span every batch, row and transpose the product reads).
  for (const MatmulMath math : {MatmulMath::F32, MatmulMath::BF16}) {
    INFO(matmul_math_name(math));
    const int64_t M = 5, K = 7, N = 6;
    struct Batches {
      int64_t a, b;
    };
    for (const Batches bt : {Batches{3, 3}, Batches{3, 1}, Batches{1, 3}, Batches{1, 1}}) {
      for (const bool ta : {false, true}) {
        for (const bool tb : {false, true}) {
          const std::string name = "matmul batch " + std::to_string(bt.a) + "x" + std::to_string(bt.b) +
                                   (ta ? " trans_a" : "") + (tb ? " trans_b" : "");
          const int64_t batch = std::max(bt.a, bt.b);
          const Vec a = random(size_t(bt.a * M * K), 39), b = random(size_t(bt.b * K * N), 40);
          const Vec dout = random(size_t(batch * M * N), 41);
          const MatmulGeom geom{
              .batch_a = bt.a, .batch_b = bt.b, .M = M, .K = K, .N = N, .trans_a = ta, .trans_b = tb, .math = math};
          compare(name + " forward", {Vec(size_t(batch * M * N))}, [&](std::vector<Vec>& o, bool g) {
            (g ? gpu::matmul_forward<float> : cpu::matmul_forward<float>)(o[0].data(), a.data(), b.data(), geom);
          });
          compare(
              name + " backward", {random(a.size(), 42), random(b.size(), 43)},
              [&](std::vector<Vec>& o, bool g) {
                (g ? gpu::matmul_backward<float> : cpu::matmul_backward<float>)(o[0].data(), o[1].data(), dout.data(),
                                                                                a.data(), b.data(), geom);
              },
              1e-4, 1e-4);
        }
      }
    }
    // Widths of 9 and 11 leave GELU to the launchers' kernels (cublasLt's aux needs rows of a multiple of 8); 16 and
    // 24 put it in the product's epilogue, or in the launchers' kernels again when cublasLt has no algorithm.
    check_linear_launchers(math, 9, 11, true);
    check_linear_launchers(math, 16, 24, true);
    check_linear_launchers(math, 16, 24, false);
  }
}

TEST_CASE("emulated CUDA: matmul and linear pass the numerics (tf32, bf16) on to the product") {
  // The stand-ins for cuBLAS round the operands to TF32 or bf16 when asked: a launcher that dropped the request
  // would give the f32 result, one that invented it a rounded one.
  const int64_t M = 8, K = 64, N = 12;
  const Vec a = random(size_t(M * K), 60), b = random(size_t(K * N), 61), dout = random(size_t(M * N), 62);
  for (const MatmulMath math : {MatmulMath::F32, MatmulMath::TF32, MatmulMath::BF16}) {
    INFO(matmul_math_name(math));
    const bool rounded = math != MatmulMath::F32;
    Vec out(size_t(M * N)), ref(size_t(M * N));
    gpu::matmul_forward<float>(out.data(), a.data(), b.data(), MatmulGeom{.M = M, .K = K, .N = N, .math = math});
    cpu::matmul_forward<float>(ref.data(), a.data(), b.data(),
                               MatmulGeom{.M = M, .K = K, .N = N, .math = MatmulMath::F32});
    check_same(out, ref, "matmul forward", rounded ? 5e-2 : 1e-5, rounded ? 1e-2 : 1e-4);
    CHECK((largest_difference(out, ref) > 1e-4) == rounded);
    Vec da(a.size(), 0.0f), db(b.size(), 0.0f), ref_da = da, ref_db = db;
    gpu::matmul_backward<float>(da.data(), db.data(), dout.data(), a.data(), b.data(),
                                MatmulGeom{.M = M, .K = K, .N = N, .math = math});
    cpu::matmul_backward<float>(ref_da.data(), ref_db.data(), dout.data(), a.data(), b.data(),
                                MatmulGeom{.M = M, .K = K, .N = N, .math = MatmulMath::F32});
    CHECK((largest_difference(da, ref_da) > 1e-4) == rounded);
    CHECK((largest_difference(db, ref_db) > 1e-4) == rounded);
    Vec y(size_t(M * N)), ref_y(size_t(M * N));
    const Vec w = random(size_t(N * K), 63);
    const LinearForward<float> plain{.inp = a.data(), .weight = w.data(), .N = M, .C = K, .OC = N};
    LinearForward<float> c = plain, c_ref = plain;
    c.out = y.data(), c.math = math, c_ref.out = ref_y.data();
    gpu::linear_forward<float>(c);
    cpu::linear_forward<float>(c_ref);
    CHECK((largest_difference(y, ref_y) > 1e-4) == rounded);
    // And with GELU, the bias (a width of 16, a multiple of 8) and GELU's derivative: by the launchers' kernels after
    // the product, and in cublasLt's epilogues when asked for.
    const int64_t OC = 16;
    const Vec w2 = random(size_t(OC * K), 64), bias = random(size_t(OC), 65), dout2 = random(size_t(M * OC), 66);
    for (const bool lt : {false, true}) {
      INFO("cublasLt's epilogues " << (lt ? "asked for" : "not asked for"));
      Vec pre(size_t(M * OC)), act(pre.size()), ref_pre(pre.size()), ref_act(pre.size());
      const LinearForward<float> gelu{.inp = a.data(),
                                      .weight = w2.data(),
                                      .bias = bias.data(),
                                      .N = M,
                                      .C = K,
                                      .OC = OC,
                                      .act = Activation::Gelu,
                                      .lt_epilogues = lt};
      c = gelu, c_ref = gelu;
      c.out = pre.data(), c.act_out = act.data(), c.math = math;
      c_ref.out = ref_pre.data(), c_ref.act_out = ref_act.data();
      gpu::linear_forward<float>(c);
      cpu::linear_forward<float>(c_ref);
      CHECK((largest_difference(act, ref_act) > 1e-4) == rounded);
      Vec dx(a.size()), ref_dx(a.size());
      const LinearBackward<float> dgelu{.dout = dout2.data(),
                                        .inp = a.data(),
                                        .weight = w2.data(),
                                        .N = M,
                                        .C = K,
                                        .OC = OC,
                                        .overwrite_dinp = true,
                                        .act = Activation::Gelu,
                                        .act_of = b.data(),
                                        .lt_epilogues = lt};
      LinearBackward<float> cb = dgelu, refb = dgelu;
      cb.dinp = dx.data(), cb.math = math, refb.dinp = ref_dx.data();
      gpu::linear_backward<float>(cb);
      cpu::linear_backward<float>(refb);
      CHECK((largest_difference(dx, ref_dx) > 1e-4) == rounded);
    }
  }
}

// bf16 storage: each kernel that takes it on the GPU against its CPU twin on the same bf16 inputs. Where both compute
// the same single f32 operation per element (a sum, a product, a quotient, a scaled copy, a move) the stored bits must
// be equal (so a rounding that truncates instead of rounding to nearest even fails); elsewhere the f32 values differ
// by the order of sums, an FMA or the exp and tanh implementations, and one rounding may land on the next bf16 value:
// within one bf16 ulp (2^-7 relative: 8 bits of mantissa), plus what cancellation leaves near zero.

namespace {

using Bf = std::vector<bf16>;

constexpr double kBf16Ulp = 1.0 / 128;

template <class T>
Vec widened(const std::vector<T>& v) {
  Vec out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = float(v[i]);
  return out;
}

/// v stored as T.
template <class T>
std::vector<T> stored_as(const Vec& v) {
  return std::vector<T>(v.begin(), v.end());
}

Bf random_bf16(size_t n, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
  return stored_as<bf16>(random(n, seed, lo, hi));
}

/// compare() over buffers stored as T (f32 or bf16): run(buffers, on_gpu) into copies of the same start; compared
/// widened (exact when atol and rtol are 0: the same bits).
template <class T, class F>
void compare_stored(const std::string& what, const std::vector<std::vector<T>>& start, F run, double atol = 0,
                    double rtol = 0) {
  std::vector<std::vector<T>> emulated = start, cpu = start;
  run(emulated, true);
  run(cpu, false);
  for (size_t i = 0; i < start.size(); ++i) {
    check_same(widened(emulated[i]), widened(cpu[i]), what + ", output " + std::to_string(i), atol, rtol);
  }
}

template <class F>
void compare_bf16(const std::string& what, const std::vector<Bf>& start, F run, double atol = 0, double rtol = 0) {
  compare_stored(what, start, run, atol, rtol);
}

/// crossentropy_fused, then crossentropy_backward(fused), against crossentropy_backward into a zeroed slot, all on
/// one side (the emulated GPU's kernels, or the CPU's): the same bits, and the fused pass's losses and lse are that
/// side's forward's (losses, lse).
template <class T>
void check_fused_is_separate(bool on_gpu, const std::vector<T>& start, const std::vector<T>& logits,
                             const std::vector<int32_t>& targets, const Vec& losses, const Vec& lse, float scale,
                             float upstream, int64_t N, int64_t V) {
  const auto fused_fn = on_gpu ? gpu::crossentropy_fused<T> : cpu::crossentropy_fused<T>;
  const auto backward_fn = on_gpu ? gpu::crossentropy_backward<T> : cpu::crossentropy_backward<T>;
  std::vector<T> fused = start, plain(size_t(N * V), T(0.0f));
  Vec l(static_cast<size_t>(N)), s(static_cast<size_t>(N));
  fused_fn(l.data(), s.data(), fused.data(), logits.data(), targets.data(), scale, N, V, -100);
  CHECK(l == losses);
  CHECK(s == lse);
  backward_fn(fused.data(), &upstream, scale, logits.data(), s.data(), targets.data(), N, V, -100, true);
  backward_fn(plain.data(), &upstream, scale, logits.data(), lse.data(), targets.data(), N, V, -100, false);
  for (size_t i = 0; i < plain.size(); ++i) REQUIRE(float(fused[i]) == float(plain[i]));
}

}  // namespace

TEST_CASE("emulated CUDA: cross-entropy over f32 and bf16 logits (an ignored row), forward, backward and fused") {
  const int64_t N = 6, V = 70;
  const Vec logits32 = random(size_t(N * V), 30, -3.0f, 3.0f);
  const std::vector<int32_t> targets = {3, 69, -100, 0, 33, 64};
  const auto check = [&]<class T>(double atol, double rtol) {
    const std::vector<T> logits = stored_as<T>(logits32);
    // losses and lse are f32 for both storage types
    compare("crossentropy forward", {Vec(size_t(N)), Vec(size_t(N))}, [&](std::vector<Vec>& o, bool g) {
      (g ? gpu::crossentropy_forward<T> : cpu::crossentropy_forward<T>)(o[0].data(), o[1].data(), logits.data(),
                                                                        targets.data(), N, V, -100);
    });
    Vec losses(static_cast<size_t>(N)), lse(static_cast<size_t>(N));
    cpu::crossentropy_forward<T>(losses.data(), lse.data(), logits.data(), targets.data(), N, V, -100);
    const float dloss = 0.6f;  // the upstream gradient, read from (device) memory, times the scale
    compare_stored<T>(
        "crossentropy backward", {stored_as<T>(random(size_t(N * V), 31))},
        [&](std::vector<std::vector<T>>& o, bool g) {
          (g ? gpu::crossentropy_backward<T> : cpu::crossentropy_backward<T>)(o[0].data(), &dloss, 0.5f, logits.data(),
                                                                              lse.data(), targets.data(), N, V, -100,
                                                                              false);
        },
        atol, rtol);
    // The fused classifier: losses, lse and the gradient for a loss gradient of 1 (written over what was there; the
    // ignored row zeroed), then its backward: kept for 1, rewritten for 0.6.
    const std::vector<T> garbage = stored_as<T>(random(size_t(N * V), 32));
    for (const float upstream : {1.0f, 0.6f}) {
      CAPTURE(upstream);
      compare("crossentropy fused (losses, lse)", {Vec(size_t(N)), Vec(size_t(N))}, [&](std::vector<Vec>& o, bool g) {
        std::vector<T> d = garbage;
        (g ? gpu::crossentropy_fused<T> : cpu::crossentropy_fused<T>)(o[0].data(), o[1].data(), d.data(), logits.data(),
                                                                      targets.data(), 0.5f, N, V, -100);
      });
      compare_stored<T>(
          "crossentropy fused, then its backward", {garbage},
          [&](std::vector<std::vector<T>>& o, bool g) {
            Vec l(static_cast<size_t>(N)), s(static_cast<size_t>(N));
            (g ? gpu::crossentropy_fused<T> : cpu::crossentropy_fused<T>)(l.data(), s.data(), o[0].data(),
                                                                          logits.data(), targets.data(), 0.5f, N, V,
                                                                          -100);
            (g ? gpu::crossentropy_backward<T> : cpu::crossentropy_backward<T>)(o[0].data(), &upstream, 0.5f,
                                                                                logits.data(), s.data(), targets.data(),
                                                                                N, V, -100, true);
          },
          atol, rtol);
    }
    // On the CPU the fused gradient is, bit for bit, the unfused backward's into a zeroed slot (for 1 and for 0.6).
    for (const float upstream : {1.0f, 0.6f}) {
      CAPTURE(upstream);
      check_fused_is_separate<T>(false, garbage, logits, targets, losses, lse, 0.5f, upstream, N, V);
    }
  };
  check.operator()<float>(1e-5, 1e-4);
  check.operator()<bf16>(1e-5, kBf16Ulp);
}

TEST_CASE("emulated CUDA: cross-entropy over wide rows (a block a row, online softmax), forward, backward and fused") {
  // V >= kWideRow: 2056 columns (16-byte groups: the vector path) and 2051 (one element at a time); an ignored row.
  const int64_t N = 4;
  const std::vector<int32_t> targets = {5, -100, 2050, 0};
  for (const int64_t V : {int64_t(2056), int64_t(2051)}) {
    CAPTURE(V);
    const Vec logits32 = random(size_t(N * V), 33, -4.0f, 4.0f);
    const auto check = [&]<class T>(double atol, double rtol) {
      const std::vector<T> logits = stored_as<T>(logits32);
      compare("wide crossentropy forward", {Vec(size_t(N)), Vec(size_t(N))}, [&](std::vector<Vec>& o, bool g) {
        (g ? gpu::crossentropy_forward<T> : cpu::crossentropy_forward<T>)(o[0].data(), o[1].data(), logits.data(),
                                                                          targets.data(), N, V, -100);
      });
      Vec losses(static_cast<size_t>(N)), lse(static_cast<size_t>(N));
      gpu::crossentropy_forward<T>(losses.data(), lse.data(), logits.data(), targets.data(), N, V, -100);
      const float dloss = 0.6f;
      const std::vector<T> start = stored_as<T>(random(size_t(N * V), 34));
      compare_stored<T>(
          "wide crossentropy backward", {start},
          [&](std::vector<std::vector<T>>& o, bool g) {
            (g ? gpu::crossentropy_backward<T> : cpu::crossentropy_backward<T>)(o[0].data(), &dloss, 0.25f,
                                                                                logits.data(), lse.data(),
                                                                                targets.data(), N, V, -100, false);
          },
          atol, rtol);
      for (const float upstream : {1.0f, 0.6f}) {
        CAPTURE(upstream);
        compare_stored<T>(
            "wide crossentropy fused, then its backward", {start},
            [&](std::vector<std::vector<T>>& o, bool g) {
              Vec l(static_cast<size_t>(N)), s(static_cast<size_t>(N));
              (g ? gpu::crossentropy_fused<T> : cpu::crossentropy_fused<T>)(l.data(), s.data(), o[0].data(),
                                                                            logits.data(), targets.data(), 0.25f, N, V,
                                                                            -100);
              (g ? gpu::crossentropy_backward<T> : cpu::crossentropy_backward<T>)(o[0].data(), &upstream, 0.25f,
                                                                                  logits.data(), s.data(),
                                                                                  targets.data(), N, V, -100, true);
            },
            atol, rtol);
        // On the (emulated) GPU the fused path gives the separate one's bits: the same lse, the same element formula.
        check_fused_is_separate<T>(true, start, logits, targets, losses, lse, 0.25f, upstream, N, V);
      }
    };
    check.operator()<float>(1e-5, 1e-4);
    check.operator()<bf16>(1e-5, kBf16Ulp);
  }
}

TEST_CASE("emulated CUDA: bf16 storage, elementwise maps (16-byte groups and single elements)") {
  // 2053 elements: 256 groups of eight and a tail of 5. Offset 0: every pointer 16-byte aligned (the vector groups);
  // offset 1: an element a thread.
  const int64_t n = 2053;
  for (const int64_t off : {0, 1}) {
    CAPTURE(off);
    const Bf x = random_bf16(size_t(n + 1), 70), y = random_bf16(size_t(n + 1), 71, 0.5f, 2.0f);
    const Bf dout = random_bf16(size_t(n + 1), 72);
    const auto at = [off](const Bf& v) { return v.data() + off; };
    compare_bf16(
        "axpy", {random_bf16(size_t(n + 1), 73)},
        [&](std::vector<Bf>& o, bool g) {
          (g ? gpu::axpy<bf16> : cpu::axpy<bf16>)(o[0].data() + off, at(x), -1.5f, n);
        },
        1e-6, kBf16Ulp);
    for (const BinaryOp op : {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div}) {
      const std::string name = "binary op " + std::to_string(int(op));
      BroadcastGeom geom{};
      geom.same_shape = true;
      for (int d = 0; d < kMaxDims; ++d)
        geom.out[d] = d == kMaxDims - 1 ? n : 1, geom.a_stride[d] = geom.b_stride[d] = 1;
      compare_bf16(name + " forward", {Bf(size_t(n + 1))}, [&](std::vector<Bf>& o, bool g) {
        (g ? gpu::binary_forward<bf16> : cpu::binary_forward<bf16>)(o[0].data() + off, at(x), at(y), geom, op);
      });
      compare_bf16(
          name + " backward", {random_bf16(size_t(n + 1), 74), random_bf16(size_t(n + 1), 75)},
          [&](std::vector<Bf>& o, bool g) {
            (g ? gpu::binary_backward<bf16> : cpu::binary_backward<bf16>)(o[0].data() + off, o[1].data() + off,
                                                                          at(dout), at(x), at(y), geom, op);
          },
          1e-6, kBf16Ulp);
    }
    for (const UnaryOp op : {UnaryOp::Neg, UnaryOp::Scale, UnaryOp::Exp, UnaryOp::Log, UnaryOp::Tanh, UnaryOp::Relu,
                             UnaryOp::Gelu, UnaryOp::Sqrt}) {
      const std::string name = unary_name(op);
      const bool positive = op == UnaryOp::Log || op == UnaryOp::Sqrt;
      const Bf in = positive ? random_bf16(size_t(n + 1), 76, 0.1f, 3.0f) : random_bf16(size_t(n + 1), 76, -3.0f, 3.0f);
      Bf out(static_cast<size_t>(n + 1));
      cpu::unary_forward<bf16>(out.data() + off, at(in), n, op, 0.7f);
      compare_bf16(
          name + " forward", {Bf(size_t(n + 1))},
          [&](std::vector<Bf>& o, bool g) {
            (g ? gpu::unary_forward<bf16> : cpu::unary_forward<bf16>)(o[0].data() + off, at(in), n, op, 0.7f);
          },
          1e-6, kBf16Ulp);
      for (const bool overwrite : {false, true}) {
        compare_bf16(
            name + (overwrite ? " backward, overwriting" : " backward"), {random_bf16(size_t(n + 1), 77)},
            [&](std::vector<Bf>& o, bool g) {
              (g ? gpu::unary_backward<bf16> : cpu::unary_backward<bf16>)(o[0].data() + off, at(dout), at(in), at(out),
                                                                          n, op, 0.7f, overwrite);
            },
            1e-6, kBf16Ulp);
      }
    }
    for (const float p : {0.0f, 0.3f}) {
      compare_bf16("dropout forward", {Bf(size_t(n + 1))}, [&](std::vector<Bf>& o, bool g) {
        (g ? gpu::dropout_forward<bf16> : cpu::dropout_forward<bf16>)(o[0].data() + off, at(x), n, p, 99);
      });
      compare_bf16(
          "dropout backward", {random_bf16(size_t(n + 1), 78)},
          [&](std::vector<Bf>& o, bool g) {
            (g ? gpu::dropout_backward<bf16> : cpu::dropout_backward<bf16>)(o[0].data() + off, at(dout), n, p, 99);
          },
          1e-6, kBf16Ulp);
    }
  }
  // Broadcast operands (the warp-per-element, row-block and full kernels) and the layout moves.
  const int64_t a_shape[kMaxDims] = {1, 1, 5, 9, 8}, b_shape[kMaxDims] = {1, 1, 1, 9, 8},
                c_shape[kMaxDims] = {1, 1, 5, 1, 1};
  for (const auto* other : {&b_shape, &c_shape}) {
    const BroadcastGeom geom = broadcast(a_shape, *other);
    const int64_t na = count(a_shape), nb = count(*other);
    const Bf a = random_bf16(size_t(na), 79), b = random_bf16(size_t(nb), 80, 0.5f, 2.0f),
             d = random_bf16(size_t(na), 81);
    for (const BinaryOp op : {BinaryOp::Add, BinaryOp::Mul}) {
      compare_bf16("broadcast forward", {Bf(size_t(na))}, [&](std::vector<Bf>& o, bool g) {
        (g ? gpu::binary_forward<bf16> : cpu::binary_forward<bf16>)(o[0].data(), a.data(), b.data(), geom, op);
      });
      compare_bf16(
          "broadcast backward", {random_bf16(size_t(na), 82), random_bf16(size_t(nb), 83)},
          [&](std::vector<Bf>& o, bool g) {
            (g ? gpu::binary_backward<bf16> : cpu::binary_backward<bf16>)(o[0].data(), o[1].data(), d.data(), a.data(),
                                                                          b.data(), geom, op);
          },
          1e-5, kBf16Ulp);
    }
  }
  PermuteGeom g{};
  const int64_t shape[kMaxDims] = {1, 2, 3, 4, 5};
  int64_t stride[kMaxDims];
  contiguous_strides(shape, stride, kMaxDims);
  const int perm[kMaxDims] = {0, 3, 1, 4, 2};
  for (int d = 0; d < kMaxDims; ++d) g.out[d] = shape[perm[d]], g.inp_stride[d] = stride[perm[d]];
  const Bf x = random_bf16(120, 84), src = random_bf16(3 * 7 * 4, 85);
  for (const bool acc : {false, true}) {
    compare_bf16("permute", {random_bf16(120, 86)}, [&](std::vector<Bf>& o, bool gp) {
      (gp ? gpu::permute<bf16> : cpu::permute<bf16>)(o[0].data(), x.data(), g, acc);
    });
    compare_bf16("copy_slice", {random_bf16(3 * 9 * 4, 87)}, [&](std::vector<Bf>& o, bool gp) {
      (gp ? gpu::copy_slice<bf16> : cpu::copy_slice<bf16>)(o[0].data(), src.data(), 3, 4, 9, 4, 7, 2, 4, acc);
    });
  }
}

TEST_CASE("emulated CUDA: bf16 storage, layer norm and embedding") {
  // C = 48: rows of whole 16-byte groups (two per lane for some lanes: 6 groups); C = 45: an element at a time; N =
  // 530: 34 blocks of weight and bias partial sums.
  for (const int64_t C : {48, 45}) {
    CAPTURE(C);
    const int64_t N = 530;
    const Bf x = random_bf16(size_t(N * C), 90), w = random_bf16(size_t(C), 91), bias = random_bf16(size_t(C), 92);
    const Bf residual = random_bf16(size_t(N * C), 93), dout = random_bf16(size_t(N * C), 94);
    // The statistics are f32 (compared at f32 tolerances), the rows bf16.
    Bf y_cpu(static_cast<size_t>(N * C)), y_gpu(static_cast<size_t>(N * C));
    Vec mean_cpu(static_cast<size_t>(N)), rstd_cpu(static_cast<size_t>(N)), mean_gpu(static_cast<size_t>(N)),
        rstd_gpu(static_cast<size_t>(N));
    cpu::layernorm_forward<bf16>(y_cpu.data(), mean_cpu.data(), rstd_cpu.data(), x.data(), w.data(), bias.data(), N, C,
                                 1e-5f);
    gpu::layernorm_forward<bf16>(y_gpu.data(), mean_gpu.data(), rstd_gpu.data(), x.data(), w.data(), bias.data(), N, C,
                                 1e-5f);
    check_same(widened(y_gpu), widened(y_cpu), "layernorm forward", 1e-5, kBf16Ulp);
    check_same(mean_gpu, mean_cpu, "layernorm mean", 1e-6, 1e-5);
    check_same(rstd_gpu, rstd_cpu, "layernorm rstd", 1e-6, 1e-5);
    for (const float p : {0.0f, 0.3f}) {
      CAPTURE(p);
      Bf s_cpu(static_cast<size_t>(N * C)), s_gpu(static_cast<size_t>(N * C));
      const AddNormForward<bf16> on_cpu{.sum = s_cpu.data(),
                                        .out = y_cpu.data(),
                                        .mean = mean_cpu.data(),
                                        .rstd = rstd_cpu.data(),
                                        .a = x.data(),
                                        .b = residual.data(),
                                        .weight = w.data(),
                                        .N = N,
                                        .C = C,
                                        .eps = 1e-5f,
                                        .p = p,
                                        .seed = 77};
      AddNormForward<bf16> on_gpu = on_cpu;
      on_gpu.sum = s_gpu.data();
      on_gpu.out = y_gpu.data();
      on_gpu.mean = mean_gpu.data();
      on_gpu.rstd = rstd_gpu.data();
      cpu::add_layernorm_forward<bf16>(on_cpu);
      gpu::add_layernorm_forward<bf16>(on_gpu);
      check_same(widened(s_gpu), widened(s_cpu), "add_layernorm sum", 0, 0);  // a + b (dropped out): one rounding each
      check_same(widened(y_gpu), widened(y_cpu), "add_layernorm forward", 1e-5, kBf16Ulp);
      check_same(rstd_gpu, rstd_cpu, "add_layernorm rstd", 1e-6, 1e-5);
    }
    cpu::layernorm_forward<bf16>(y_cpu.data(), mean_cpu.data(), rstd_cpu.data(), x.data(), w.data(), bias.data(), N, C,
                                 1e-5f);
    for (const bool overwrite : {false, true}) {
      compare_bf16(
          std::string("layernorm backward") + (overwrite ? ", overwriting" : ""),
          {random_bf16(size_t(N * C), 95), random_bf16(size_t(C), 96), random_bf16(size_t(C), 97)},
          [&](std::vector<Bf>& o, bool g) {
            (g ? gpu::layernorm_backward<bf16>
               : cpu::layernorm_backward<bf16>)(o[0].data(), o[1].data(), o[2].data(), dout.data(), x.data(), w.data(),
                                                mean_cpu.data(), rstd_cpu.data(), N, C, overwrite);
          },
          1e-4, kBf16Ulp);
    }
  }
  {  // wider rows than the fused backward takes: the input and parameter kernels
    const int64_t N = 40, C = 800;
    const Bf x = random_bf16(size_t(N * C), 98), w = random_bf16(size_t(C), 99), dout = random_bf16(size_t(N * C), 100);
    Bf y(static_cast<size_t>(N * C));
    Vec mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
    cpu::layernorm_forward<bf16>(y.data(), mean.data(), rstd.data(), x.data(), w.data(), nullptr, N, C, 1e-5f);
    compare_bf16(
        "layernorm backward, wide rows",
        {random_bf16(size_t(N * C), 101), random_bf16(size_t(C), 102), random_bf16(size_t(C), 103)},
        [&](std::vector<Bf>& o, bool g) {
          (g ? gpu::layernorm_backward<bf16> : cpu::layernorm_backward<bf16>)(o[0].data(), o[1].data(), o[2].data(),
                                                                              dout.data(), x.data(), w.data(),
                                                                              mean.data(), rstd.data(), N, C, false);
        },
        1e-4, kBf16Ulp);
  }
  for (const int64_t C : {40, 37}) {  // embedding: whole groups of a row, and single elements
    CAPTURE(C);
    const int64_t N = 50, V = 12;
    std::vector<int32_t> ids(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n) ids[size_t(n)] = int32_t((n * 7 + n / 3) % 9);
    const Bf weight = random_bf16(size_t(V * C), 104), dout = random_bf16(size_t(N * C), 105);
    compare_bf16("embedding forward", {Bf(size_t(N * C))}, [&](std::vector<Bf>& o, bool g) {
      (g ? gpu::embedding_forward<bf16> : cpu::embedding_forward<bf16>)(o[0].data(), ids.data(), weight.data(), N, C);
    });
    for (const int32_t* host_ids : {static_cast<const int32_t*>(nullptr), static_cast<const int32_t*>(ids.data())}) {
      compare_bf16(
          "embedding backward", {random_bf16(size_t(V * C), 106)},
          [&](std::vector<Bf>& o, bool g) {
            (g ? gpu::embedding_backward<bf16> : cpu::embedding_backward<bf16>)(o[0].data(), dout.data(), ids.data(),
                                                                                host_ids, N, V, C);
          },
          1e-5, kBf16Ulp);
    }
  }
}

TEST_CASE("emulated CUDA: bf16 storage, matmul and linear (bf16 in and out, f32 sums)") {
  const int64_t M = 5, K = 7, N = 6;
  struct Batches {
    int64_t a, b;
  };
  for (const Batches bt : {Batches{3, 3}, Batches{3, 1}, Batches{1, 3}}) {
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        const std::string name = "matmul batch " + std::to_string(bt.a) + "x" + std::to_string(bt.b) +
                                 (ta ? " trans_a" : "") + (tb ? " trans_b" : "");
        const int64_t batch = std::max(bt.a, bt.b);
        const Bf a = random_bf16(size_t(bt.a * M * K), 110), b = random_bf16(size_t(bt.b * K * N), 111);
        const Bf dout = random_bf16(size_t(batch * M * N), 112);
        const MatmulGeom geom{.batch_a = bt.a,
                              .batch_b = bt.b,
                              .M = M,
                              .K = K,
                              .N = N,
                              .trans_a = ta,
                              .trans_b = tb,
                              .math = MatmulMath::BF16};
        compare_bf16(
            name + " forward", {Bf(size_t(batch * M * N))},
            [&](std::vector<Bf>& o, bool g) {
              (g ? gpu::matmul_forward<bf16> : cpu::matmul_forward<bf16>)(o[0].data(), a.data(), b.data(), geom);
            },
            1e-4, kBf16Ulp);
        compare_bf16(
            name + " backward", {random_bf16(a.size(), 113), random_bf16(b.size(), 114)},
            [&](std::vector<Bf>& o, bool g) {
              (g ? gpu::matmul_backward<bf16> : cpu::matmul_backward<bf16>)(o[0].data(), o[1].data(), dout.data(),
                                                                            a.data(), b.data(), geom);
            },
            1e-4, kBf16Ulp);
      }
    }
  }
  // Linear: rows of 16 and 24 (16-byte groups) and of 9 and 11 (single elements), each bias and activation.
  struct Widths {
    int64_t C, OC;
  };
  for (const Widths wd : {Widths{16, 24}, Widths{9, 11}}) {
    const int64_t rows = 70, C = wd.C, OC = wd.OC;
    const Bf x = random_bf16(size_t(rows * C), 115), w = random_bf16(size_t(OC * C), 116),
             bias = random_bf16(size_t(OC), 117);
    const Bf dout = random_bf16(size_t(rows * OC), 118), pre = random_bf16(x.size(), 119, -3.0f, 3.0f);
    for (const bool with_bias : {true, false}) {
      for (const Activation act : {Activation::None, Activation::Gelu, Activation::ReluSquared}) {
        const std::string name = "linear " + std::to_string(C) + "x" + std::to_string(OC) + (with_bias ? " bias" : "") +
                                 " act " + std::to_string(int(act));
        const bool has_act = act != Activation::None;
        compare_bf16(
            name + " forward", {Bf(size_t(rows * OC)), Bf(size_t(rows * OC))},
            [&](std::vector<Bf>& o, bool g) {
              (g ? gpu::linear_forward<bf16> : cpu::linear_forward<bf16>)({.out = o[0].data(),
                                                                           .inp = x.data(),
                                                                           .weight = w.data(),
                                                                           .bias = with_bias ? bias.data() : nullptr,
                                                                           .N = rows,
                                                                           .C = C,
                                                                           .OC = OC,
                                                                           .math = MatmulMath::BF16,
                                                                           .act = act,
                                                                           .act_out = has_act ? o[1].data() : nullptr});
            },
            1e-4, kBf16Ulp);
        for (const bool overwrite : {false, true}) {
          if (has_act && !overwrite) continue;  // a gradient through the activation overwrites dinp
          compare_bf16(
              name + " backward" + (overwrite ? ", overwriting" : ""),
              {random_bf16(x.size(), 120), random_bf16(w.size(), 121), random_bf16(size_t(OC), 122)},
              [&](std::vector<Bf>& o, bool g) {
                (g ? gpu::linear_backward<bf16>
                   : cpu::linear_backward<bf16>)({.dinp = o[0].data(),
                                                  .dweight = o[1].data(),
                                                  .dbias = with_bias ? o[2].data() : nullptr,
                                                  .dout = dout.data(),
                                                  .inp = x.data(),
                                                  .weight = w.data(),
                                                  .N = rows,
                                                  .C = C,
                                                  .OC = OC,
                                                  .math = MatmulMath::BF16,
                                                  .overwrite_dinp = overwrite,
                                                  .act = act,
                                                  .act_of = has_act ? pre.data() : nullptr});
              },
              1e-3, kBf16Ulp);
        }
      }
    }
  }
}

namespace {

/// Three runs of a 300-element buffer with their own decays, elements 100 .. 149 in none of them.
AdamWRuns three_runs() {
  AdamWRuns runs;
  runs.add(0, 100, 0.1f);
  runs.add(150, 70, 0.0f);
  runs.add(220, 80, 0.3f);
  return runs;
}

}  // namespace

TEST_CASE("emulated CUDA: AdamW step over runs of a packed buffer, each with its weight decay") {
  const int64_t n = 300;
  const AdamWRuns runs = three_runs();
  const Vec grad = random(size_t(n), 51);
  const std::vector<Vec> start = {random(size_t(n), 52), random(size_t(n), 53, -0.1f, 0.1f),
                                  random(size_t(n), 54, 0.0f, 0.1f)};
  // Step 3 at rate 1e-2; {loss, sum of squares}: norm 4, clipped to 3 (the gradient taken times about 0.75).
  const Vec sched = {1e-2f, float(adamw_correction(0.9f, 3)), float(adamw_correction(0.95f, 3))}, stats = {2.5f, 16.0f};
  compare("adamw", start, [&](std::vector<Vec>& o, bool g) {
    (g ? gpu::adamw_update : cpu::adamw_update<float>)(o[0].data(), grad.data(), o[1].data(), o[2].data(), runs,
                                                       sched.data(), stats.data(), 3.0, 0.9f, 0.95f, 1e-8f);
  });
  // The one launch against a launch per run, bit for bit; the elements in no run are left alone.
  std::vector<Vec> one = start, each = start;
  gpu::adamw_update(one[0].data(), grad.data(), one[1].data(), one[2].data(), runs, sched.data(), stats.data(), 3.0,
                    0.9f, 0.95f, 1e-8f);
  for (int r = 0; r < runs.count; ++r) {
    const int64_t at = runs.begin[r];
    gpu::adamw_update(each[0].data() + at, grad.data() + at, each[1].data() + at, each[2].data() + at,
                      AdamWRuns::one(runs.length(r), runs.weight_decay[r]), sched.data(), stats.data(), 3.0, 0.9f,
                      0.95f, 1e-8f);
  }
  for (size_t i = 0; i < 3; ++i) {
    CHECK(one[i] == each[i]);
    CHECK(Vec(one[i].begin() + 100, one[i].begin() + 150) == Vec(start[i].begin() + 100, start[i].begin() + 150));
  }
  // bf16 storage's working copies, written in the update's pass: each the new master rounded to nearest even, on
  // both backends; the elements in no run keep their copies.
  for (const bool g : {true, false}) {
    INFO((g ? "emulated CUDA" : "CPU"));
    const auto update = g ? gpu::adamw_update : cpu::adamw_update<float>;
    std::vector<Vec> o = start, plain = start;
    std::vector<bf16> copy(size_t(n), bf16(-7.0f));
    AdamWRuns with_copy = runs;
    with_copy.copy = copy.data();
    update(o[0].data(), grad.data(), o[1].data(), o[2].data(), with_copy, sched.data(), stats.data(), 3.0, 0.9f, 0.95f,
           1e-8f);
    update(plain[0].data(), grad.data(), plain[1].data(), plain[2].data(), runs, sched.data(), stats.data(), 3.0, 0.9f,
           0.95f, 1e-8f);
    CHECK(o == plain);  // the masters and moments as without copies
    for (int64_t i = 0; i < n; ++i) {
      const bool in_run = i < 100 || i >= 150;
      CHECK(copy[size_t(i)].bits == (in_run ? bf16(o[0][size_t(i)]) : bf16(-7.0f)).bits);
    }
  }
}

TEST_CASE("emulated CUDA: AdamW step clipped, unclipped, refused when not finite (its scalars in device memory)") {
  const int64_t n = 300;
  const Vec grad = random(size_t(n), 51);
  const Vec start = random(size_t(n), 52), m0 = random(size_t(n), 53, -0.1f, 0.1f),
            v0 = random(size_t(n), 54, 0.0f, 0.1f);
  const AdamWRuns runs = three_runs();
  const float c1 = float(adamw_correction(0.9f, 3)), c2 = float(adamw_correction(0.95f, 3));
  const Vec sched = {1e-2f, c1, c2};
  constexpr float kInf = std::numeric_limits<float>::infinity();
  // {loss, sum of squares}: norm 4 clipped to 1 (and not, with max_norm 0 or 5); a NaN loss; an infinite sum.
  for (const auto& [stats, max_norm] : std::vector<std::pair<Vec, double>>{{{2.5f, 16.0f}, 1.0},
                                                                           {{2.5f, 16.0f}, 0.0},
                                                                           {{2.5f, 16.0f}, 5.0},
                                                                           {{NAN, 16.0f}, 1.0},
                                                                           {{2.5f, kInf}, 1.0}}) {
    CAPTURE(stats[0]);
    CAPTURE(stats[1]);
    CAPTURE(max_norm);
    compare(
        "adamw", {start, m0, v0},
        [&](std::vector<Vec>& o, bool g) {
          (g ? gpu::adamw_update : cpu::adamw_update<float>)(o[0].data(), grad.data(), o[1].data(), o[2].data(), runs,
                                                             sched.data(), stats.data(), max_norm, 0.9f, 0.95f, 1e-8f);
        },
        0, 0);
    // Clipped: the unclipped update of the gradient taken times max_norm / (norm + 1e-6), bit for bit; unclipped at
    // or below max_norm (or with max_norm 0); nothing moves when the loss or the sum is not finite.
    const bool finite = std::isfinite(stats[0]) && std::isfinite(stats[1]);
    const double norm = std::sqrt(double(stats[1]));
    const auto factor = float(max_norm > 0 && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0);
    Vec scaled = grad;
    for (float& e : scaled) e *= factor;
    std::vector<Vec> expected = {start, m0, v0}, got = expected;
    if (finite) {
      gpu::adamw_update(expected[0].data(), scaled.data(), expected[1].data(), expected[2].data(), runs, sched.data(),
                        stats.data(), 0.0, 0.9f, 0.95f, 1e-8f);
    }
    gpu::adamw_update(got[0].data(), grad.data(), got[1].data(), got[2].data(), runs, sched.data(), stats.data(),
                      max_norm, 0.9f, 0.95f, 1e-8f);
    for (int i = 0; i < 3; ++i) CHECK(expected[size_t(i)] == got[size_t(i)]);
    CHECK((got[0] == start) == !finite);
  }
}

TEST_CASE("emulated CUDA: axpby with its factors in device memory (Muon's step form)") {
  const int64_t n = 300;
  const Vec x = random(size_t(n), 60), y0 = random(size_t(n), 61);
  const Vec coef = {-0.25f, 0.875f}, fine = {2.5f, 16.0f}, refused = {2.5f, NAN};
  for (const double beta : {0.95, 0.0}) {  // beta 0: y is not read
    CAPTURE(beta);
    compare("axpby, clipped", {y0}, [&](std::vector<Vec>& o, bool g) {
      (g ? gpu::axpby : cpu::axpby<float>)(o[0].data(), x.data(), n, 0.05, beta, nullptr, fine.data(), 1.0);
    });
  }
  compare("axpby, coefficients", {y0}, [&](std::vector<Vec>& o, bool g) {
    (g ? gpu::axpby : cpu::axpby<float>)(o[0].data(), x.data(), n, 0, 0, coef.data(), fine.data(), 1.0);
  });
  // What it computes without stats, given the factors clipping makes, bit for bit: alpha 0.05 * (1 / (4 + 1e-6)),
  // beta 0.95.
  Vec direct = y0, indirect = y0;
  gpu::axpby(direct.data(), x.data(), n, 0.05 * (1.0 / (4.0 + 1e-6)), 0.95, nullptr, nullptr, 0.0);
  gpu::axpby(indirect.data(), x.data(), n, 0.05, 0.95, nullptr, fine.data(), 1.0);
  CHECK(direct == indirect);
  Vec untouched = y0;
  gpu::axpby(untouched.data(), x.data(), n, 0, 0, coef.data(), refused.data(), 1.0);
  CHECK(untouched == y0);
}

TEST_CASE("emulated CUDA: the all-reduce's owner sums the ranks' parts in rank order, as the MPI one does") {
  const int64_t rows = 3, n = 1000;
  Vec parts = random(size_t(rows * n), 58);
  for (int64_t e = 0; e < n; e += 7) {  // where the order shows: (1e8 - 1e8) + 1 is 1 in f32, any other order gives 0
    parts[size_t(e)] = 1e8f, parts[size_t(n + e)] = -1e8f, parts[size_t(2 * n + e)] = 1.0f;
  }
  Vec out(size_t(n), -7.0f);
  gpu::sum_rows_in_order(out.data(), parts.data(), rows, n);
  for (int64_t e = 0; e < n; ++e) {
    const float in_order = (parts[size_t(e)] + parts[size_t(n + e)]) + parts[size_t(2 * n + e)];
    REQUIRE(out[size_t(e)] == in_order);
  }
  CHECK(out[0] == 1.0f);
}

TEST_CASE("emulated CUDA: RoPE (rotated and copied heads, an offset, Llama 3's scaling), forward and backward") {
  const int64_t B = 2, L = 5, NH = 3, E = 8, n_rot = 2, pos0 = 3;
  const Vec x = random(size_t(B * L * NH * E), 55), dout = random(size_t(B * L * NH * E), 56);
  // Llama 3's scaling with every band at E = 8: pair 0 kept, pair 1 blended, pairs 2 and 3 slowed.
  const RopeFreqs llama3(10000.0, RopeScaling{.factor = 8, .original_context = 64});
  for (const RopeFreqs& freqs : {RopeFreqs(10000.0), llama3}) {
    compare("rope forward", {Vec(x.size())}, [&](std::vector<Vec>& o, bool g) {
      (g ? gpu::rope_forward<float> : cpu::rope_forward<float>)(o[0].data(), x.data(), B, L, NH, E, n_rot, pos0, freqs);
    });
    compare("rope backward", {random(x.size(), 57)}, [&](std::vector<Vec>& o, bool g) {
      (g ? gpu::rope_backward<float> : cpu::rope_backward<float>)(o[0].data(), dout.data(), B, L, NH, E, n_rot, pos0,
                                                                  freqs);
    });
    // bf16 storage: rotated in f32, rounded once (backward: the sum with what the gradient held, rounded once).
    const Bf xb = random_bf16(x.size(), 58), db = random_bf16(x.size(), 59);
    compare_bf16(
        "rope forward, bf16", {Bf(x.size())},
        [&](std::vector<Bf>& o, bool g) {
          (g ? gpu::rope_forward<bf16> : cpu::rope_forward<bf16>)(o[0].data(), xb.data(), B, L, NH, E, n_rot, pos0,
                                                                  freqs);
        },
        1e-6, kBf16Ulp);
    compare_bf16(
        "rope backward, bf16", {random_bf16(x.size(), 60)},
        [&](std::vector<Bf>& o, bool g) {
          (g ? gpu::rope_backward<bf16> : cpu::rope_backward<bf16>)(o[0].data(), db.data(), B, L, NH, E, n_rot, pos0,
                                                                    freqs);
        },
        1e-6, kBf16Ulp);
  }
}

namespace {

using namespace tinygpt::test::attention;

/// The attention kernels of one implementation (naive or flash) on the emulated GPU and on the CPU, forward (out,
/// lse, the naive path's weights) and backward (dq, dk, dv accumulated into a buffer that starts at 1).
void check_attention(const Config& c, bool flash, AttentionMath math = AttentionMath::F32) {
  const std::string name =
      std::string(flash ? "flash" : "naive") + " attention (" + attention_math_name(math) + "), " + describe(c);
  INFO(name);
  Problem p = make_problem(c);
  p.g.math = math;
  const AttentionGeom& g = p.g;
  // The GPU reads its dropout seed through an offset in (device) memory, as a captured training step does: the same
  // masks as the CPU's from the whole seed.
  AttentionGeom g_dev = g;
  g_dev.dropout_seed = through_offset(g.dropout_seed.seed);
  const HostInputs<float> in(p);
  const size_t rows = size_t(g.B * g.NH * g.T);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Vec start_out(static_cast<size_t>(p.out_size), nan), start_lse(rows, nan),
      start_w(flash ? 0 : rows * size_t(g.S), nan);
  compare(
      name + " forward", {start_out, start_lse, start_w},
      [&](std::vector<Vec>& o, bool gp) {
        float* w = flash ? nullptr : o[2].data();
        if (flash) {
          (gp ? gpu::attention_flash_forward : cpu::attention_flash_forward<float>)(o[0].data(), o[1].data(), in.q,
                                                                                    in.k, in.v, in.m, in.kp,
                                                                                    gp ? g_dev : g);
        } else {
          (gp ? gpu::attention_naive_forward : cpu::attention_naive_forward<float>)(o[0].data(), w, o[1].data(), in.q,
                                                                                    in.k, in.v, in.m, in.kp,
                                                                                    gp ? g_dev : g);
        }
      },
      2e-5, 2e-4);
  Vec out(static_cast<size_t>(p.out_size), nan), lse(rows, nan);
  cpu::attention_flash_forward<float>(out.data(), lse.data(), in.q, in.k, in.v, in.m, in.kp, g);
  compare(
      name + " backward", {Vec(in.qkv.size(), 1.0f)},
      [&](std::vector<Vec>& o, bool gp) {
        float* d = o[0].data();
        const auto f = flash ? (gp ? gpu::attention_flash_backward : cpu::attention_flash_backward<float>)
                             : (gp ? gpu::attention_naive_backward : cpu::attention_naive_backward<float>);
        f(d + p.q_off, d + p.k_off, d + p.v_off, in.dout.data(), in.q, in.k, in.v, out.data(), lse.data(), in.m, in.kp,
          gp ? g_dev : g);
      },
      1e-4, 2e-4);
  if (!flash) return;
  // The flash backward into gradients no op has written (grads_unwritten): buffers of NaN, each element of q, k and
  // v's views written (=), on the GPU without a read, on the CPU after zeroing them.
  AttentionGeom gu = g, gu_dev = g_dev;
  gu.grads_unwritten = gu_dev.grads_unwritten = true;
  compare(
      name + " backward into unwritten gradients", {Vec(in.qkv.size(), nan)},
      [&](std::vector<Vec>& o, bool gp) {
        float* d = o[0].data();
        (gp ? gpu::attention_flash_backward
            : cpu::attention_flash_backward<float>)(d + p.q_off, d + p.k_off, d + p.v_off, in.dout.data(), in.q, in.k,
                                                    in.v, out.data(), lse.data(), in.m, in.kp, gp ? gu_dev : gu);
        CHECK(settle_unwritten(o[0], p) == 0);
      },
      1e-4, 2e-4);
}

/// Which score modifiers a case turns on (kernels/score_mods.h).
struct Mods {
  int64_t window = 0, max_rel = 0;
  bool rel_value = false, alibi = false, t5 = false, docs = false;
  double softcap = 0;
};

/// The attention kernels with score modifiers on the emulated GPU and on the CPU: out, lse, Pbar, then dq, dk, dv
/// and the tables' gradients from each side's own forward. Each side gets its own output buffers in g.mods.
void check_attention_mods(const Config& c, const Mods& mods, bool flash, AttentionMath math = AttentionMath::F32,
                          double tol = 0) {
  const std::string name = std::string(flash ? "flash" : "naive") + " attention with modifiers (" +
                           attention_math_name(math) + "), " + describe(c);
  INFO(name);
  Problem p = make_problem(c);
  p.g.math = math;
  const AttentionGeom& g0 = p.g;
  const HostInputs<float> in(p);
  const int64_t W = 2 * mods.max_rel + 1, rows = g0.B * g0.NH * g0.T;
  const Vec rel_k = random(size_t(W * g0.E), 31, -0.5f, 0.5f), rel_v = random(size_t(W * g0.Ev), 32, -0.5f, 0.5f);
  const Vec t5 = random(size_t(g0.NH * 8), 33, -1.0f, 1.0f);
  std::vector<int32_t> q_doc, k_doc;
  for (int64_t b = 0; b < g0.B; ++b) {
    for (int64_t t = 0; t < g0.T; ++t) q_doc.push_back(int32_t((t + g0.S - g0.T) / 23 + b));
    for (int64_t s = 0; s < g0.S; ++s) k_doc.push_back(int32_t(s / 23 + b));
  }
  struct Side {
    Vec out, lse, pbar, d, d_rel_k, d_rel_v, d_t5;
  };
  auto run = [&](bool gpu) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    Side r{Vec(size_t(p.out_size), nan), Vec(size_t(rows), nan),  Vec(size_t(rows * W), nan), Vec(in.qkv.size(), 1.0f),
           Vec(rel_k.size(), 0.0f),      Vec(rel_v.size(), 0.0f), Vec(t5.size(), 0.0f)};
    AttentionGeom g = g0;
    ScoreMods& m = g.mods;
    m.window = mods.window;
    m.softcap = mods.softcap;
    m.alibi = mods.alibi;
    if (mods.docs) m.q_doc = q_doc.data(), m.k_doc = k_doc.data();
    if (mods.t5) m.t5_bias = t5.data(), m.t5_buckets = 8, m.t5_max_distance = 20, m.d_t5_bias = r.d_t5.data();
    if (mods.max_rel > 0) {
      m.max_rel = mods.max_rel, m.rel_k = rel_k.data(), m.d_rel_k = r.d_rel_k.data();
      if (mods.rel_value) m.rel_v = rel_v.data(), m.rel_probs = r.pbar.data(), m.d_rel_v = r.d_rel_v.data();
    }
    if (flash) {
      (gpu ? gpu::attention_flash_forward : cpu::attention_flash_forward<float>)(r.out.data(), r.lse.data(), in.q, in.k,
                                                                                 in.v, in.m, in.kp, g);
    } else {
      (gpu ? gpu::attention_naive_forward : cpu::attention_naive_forward<float>)(r.out.data(), nullptr, r.lse.data(),
                                                                                 in.q, in.k, in.v, in.m, in.kp, g);
    }
    const auto backward = flash ? (gpu ? gpu::attention_flash_backward : cpu::attention_flash_backward<float>)
                                : (gpu ? gpu::attention_naive_backward : cpu::attention_naive_backward<float>);
    float* d = r.d.data();
    backward(d + p.q_off, d + p.k_off, d + p.v_off, in.dout.data(), in.q, in.k, in.v, r.out.data(), r.lse.data(), in.m,
             in.kp, g);
    return r;
  };
  const Side emulated = run(true), cpu = run(false);
  const double ft = tol > 0 ? tol : 2e-5, bt = tol > 0 ? 2 * tol : 2e-4;
  check_same(emulated.out, cpu.out, name + ": out", ft, 10 * ft);
  check_same(emulated.lse, cpu.lse, name + ": lse", ft, 10 * ft);
  if (mods.rel_value) check_same(emulated.pbar, cpu.pbar, name + ": Pbar", ft, 10 * ft);
  check_same(emulated.d, cpu.d, name + ": dq, dk, dv", bt, bt);
  check_same(emulated.d_rel_k, cpu.d_rel_k, name + ": relative key table gradient", bt, bt);
  check_same(emulated.d_rel_v, cpu.d_rel_v, name + ": relative value table gradient", bt, bt);
  check_same(emulated.d_t5, cpu.d_t5, name + ": T5 table gradient", bt, bt);
}

}  // namespace

TEST_CASE("emulated CUDA: naive attention (GQA, masks, padding, dropout, rows that see nothing)") {
  check_attention({.B = 2,
                   .NH = 4,
                   .NKV = 2,
                   .T = 9,
                   .S = 13,
                   .E = 8,
                   .Ev = 6,
                   .causal = true,
                   .key_padding = true,
                   .mask = MaskKind::BroadcastTS,
                   .dropout = 0.2f,
                   .seed = 3},
                  false);
  check_attention({.B = 1, .NH = 2, .NKV = 1, .T = 12, .S = 5, .E = 40, .Ev = 40, .causal = true, .seed = 4}, false);
  check_attention({.B = 2,
                   .NH = 3,
                   .NKV = 3,
                   .T = 10,
                   .S = 10,
                   .E = 16,
                   .Ev = 16,
                   .causal = true,
                   .layout = Layout::Fused,
                   .seed = 9},
                  false);
}

TEST_CASE("emulated CUDA: flash attention on CUDA cores (partial tiles, padded head dims, GQA, masks, dropout)") {
  check_attention({.B = 1, .NH = 2, .NKV = 1, .T = 70, .S = 100, .E = 40, .Ev = 24, .causal = true, .seed = 5}, true);
  check_attention({.B = 1,
                   .NH = 4,
                   .NKV = 2,
                   .T = 80,
                   .S = 80,
                   .E = 32,
                   .Ev = 32,
                   .causal = true,
                   .layout = Layout::Fused,
                   .seed = 10},
                  true);
  check_attention({.B = 2,
                   .NH = 2,
                   .NKV = 2,
                   .T = 33,
                   .S = 20,
                   .E = 64,
                   .Ev = 64,
                   .causal = true,
                   .key_padding = true,
                   .mask = MaskKind::Full,
                   .dropout = 0.3f,
                   .seed = 6},
                  true);
  check_attention({.B = 1,
                   .NH = 1,
                   .NKV = 1,
                   .T = 16,
                   .S = 70,
                   .E = 100,
                   .Ev = 128,
                   .mask = MaskKind::PerKey,
                   .layout = Layout::SeqMajor,
                   .seed = 7},
                  true);
}

TEST_CASE("emulated CUDA: flash attention's entry points pick the tensor-core kernels for tf32 and bf16 operands") {
  // The tensor-core kernels themselves are checked against a reference in the operand format by
  // test_flash_mma_emulated; here the launchers' choice, forward and backward: with rounded operands the results
  // are close to the f32 kernels' but visibly off them (the f32 kernels agree with the CPU to about 1e-6), which
  // shows the tensor-core path ran.
  struct Case {
    AttentionMath math;
    Config c;
  };
  const Case cases[] = {
      {AttentionMath::TF32,
       {.B = 1, .NH = 2, .NKV = 1, .T = 40, .S = 70, .E = 32, .Ev = 32, .causal = true, .seed = 8}},
      {AttentionMath::BF16,
       {.B = 1, .NH = 2, .NKV = 1, .T = 40, .S = 70, .E = 32, .Ev = 32, .causal = true, .seed = 8}},
      {AttentionMath::TF32, {.B = 1, .NH = 1, .NKV = 1, .T = 20, .S = 30, .E = 128, .Ev = 128, .seed = 9}},
      {AttentionMath::BF16, {.B = 1, .NH = 1, .NKV = 1, .T = 20, .S = 30, .E = 64, .Ev = 64, .seed = 10}},
  };
  for (const Case& k : cases) {
    const std::string name = std::string(attention_math_name(k.math)) + " operands, " + describe(k.c);
    INFO(name);
    CHECK(gpu::flash_tensor_cores(k.math, k.c.E));  // the attention op's path list asks this; the kernel follows it
    CHECK_FALSE(gpu::flash_tensor_cores(AttentionMath::F32, k.c.E));
    Problem p = make_problem(k.c);
    p.g.math = k.math;
    const HostInputs<float> in(p);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    Vec out(static_cast<size_t>(p.out_size), nan), lse(static_cast<size_t>(p.g.B * p.g.NH * p.g.T), nan);
    Vec ref_out = out, ref_lse = lse, d(in.qkv.size(), 0.0f), ref_d = d;
    AttentionGeom f32 = p.g;  // the reference: the CPU kernels with f32 operands (the CPU has bf16 ones too)
    f32.math = AttentionMath::F32;
    gpu::attention_flash_forward(out.data(), lse.data(), in.q, in.k, in.v, in.m, in.kp, p.g);
    cpu::attention_flash_forward<float>(ref_out.data(), ref_lse.data(), in.q, in.k, in.v, in.m, in.kp, f32);
    gpu::attention_flash_backward(d.data() + p.q_off, d.data() + p.k_off, d.data() + p.v_off, in.dout.data(), in.q,
                                  in.k, in.v, out.data(), lse.data(), in.m, in.kp, p.g);
    // The CPU's backward from the emulated forward's out and lse: the gradients then differ by the backward
    // kernels' own operand rounding alone.
    cpu::attention_flash_backward<float>(ref_d.data() + p.q_off, ref_d.data() + p.k_off, ref_d.data() + p.v_off,
                                         in.dout.data(), in.q, in.k, in.v, out.data(), lse.data(), in.m, in.kp, f32);
    const double tol = k.math == AttentionMath::BF16 ? 5e-2 : 5e-3;
    check_same(out, ref_out, "flash forward, " + name, tol, tol);
    check_same(d, ref_d, "flash backward, " + name, 2 * tol, 2 * tol);
    // Each of out, dq, dk and dv (their own kernels) visibly off the f32 result.
    for (const auto& [got, want, elements, what] :
         {std::tuple{&out, &ref_out, o_elements(p), "out"}, std::tuple{&d, &ref_d, q_elements(p), "dq"},
          std::tuple{&d, &ref_d, k_elements(p), "dk"}, std::tuple{&d, &ref_d, v_elements(p), "dv"}}) {
      const double largest = largest_difference(*got, *want, elements);
      INFO(std::string(what) << ": largest difference from the f32 kernels " << largest);
      CHECK(largest > 1e-4);
    }
  }
}

TEST_CASE("emulated CUDA: score modifiers in the naive and flash kernels, every table's gradient") {
  const Mods all{.window = 30, .max_rel = 4, .rel_value = true, .alibi = true, .t5 = true, .docs = true, .softcap = 5};
  // Naive, everything at once with padding, a mask and dropout.
  check_attention_mods(
      {.B = 2,
       .NH = 4,
       .NKV = 2,
       .T = 9,
       .S = 13,
       .E = 8,
       .Ev = 6,
       .causal = true,
       .key_padding = true,
       .mask = MaskKind::BroadcastTS,
       .dropout = 0.2f,
       .seed = 3},
      {.window = 5, .max_rel = 2, .rel_value = true, .alibi = true, .t5 = true, .docs = true, .softcap = 3}, false);
  // Flash on CUDA cores over several tiles: the window skips tiles, documents hide whole ones.
  check_attention_mods({.B = 1, .NH = 2, .NKV = 1, .T = 150, .S = 150, .E = 32, .Ev = 32, .causal = true, .seed = 11},
                       all, true);
  check_attention_mods({.B = 2,
                        .NH = 2,
                        .NKV = 2,
                        .T = 40,
                        .S = 90,
                        .E = 16,
                        .Ev = 24,
                        .key_padding = true,
                        .dropout = 0.1f,
                        .seed = 12},
                       {.window = 20, .max_rel = 30, .rel_value = true, .t5 = true, .softcap = 2}, true);
  // The tensor-core kernels apply the same terms (within their operand format's rounding of the f32 kernels), and the
  // same dropout in their build with the modifiers.
  check_attention_mods(
      {.B = 1, .NH = 2, .NKV = 1, .T = 100, .S = 100, .E = 32, .Ev = 32, .causal = true, .dropout = 0.15f, .seed = 13},
      {.window = 40, .max_rel = 3, .alibi = true, .t5 = true, .docs = true, .softcap = 4}, true, AttentionMath::TF32,
      5e-3);
  check_attention_mods({.B = 1, .NH = 2, .NKV = 1, .T = 100, .S = 100, .E = 32, .Ev = 32, .causal = true, .seed = 13},
                       {.window = 40, .max_rel = 3, .rel_value = true, .alibi = true, .softcap = 4}, true,
                       AttentionMath::BF16, 5e-2);
}

// Every kernel of kernels/kernel_list.h and the case above that compares its CUDA twin with the CPU's (the emulator's
// cases; a kernel added to the list without a row here fails to build this file: tests/kernel_cases.h).
constexpr std::string_view case_of(test::Kernel k) {
  using K = test::Kernel;
  switch (k) {
    case K::round_to_bf16:
    case K::widen_bf16:
    case K::accumulate_bf16:
      return "f32 <-> bf16 conversion, vector and element paths, bit for bit";
    case K::fill:
    case K::axpy:
      return "fill, axpy, axpby";
    case K::axpby:
      return "fill, axpy, axpby; axpby with its factors in device memory";
    case K::unary_forward:
    case K::unary_backward:
      return "unary ops, forward and backward; bf16 storage, elementwise maps";
    case K::binary_forward:
    case K::binary_backward:
      return "binary ops over broadcast shapes; bf16 storage, elementwise maps";
    case K::sum_forward:
    case K::sum_backward:
      return "sums over a middle dim (strided) and over long rows (chunked)";
    case K::sum_squares:
      return "sum of squares (empty, one chunk, several chunks)";
    case K::softmax_forward:
    case K::softmax_backward:
    case K::log_softmax_forward:
    case K::log_softmax_backward:
      return "softmax and log-softmax";
    case K::layernorm_forward:
    case K::add_layernorm_forward:
    case K::layernorm_backward:
      return "layernorm (several blocks of weight and bias partial sums); bf16 storage";
    case K::rmsnorm_forward:
    case K::add_rmsnorm_forward:
    case K::rmsnorm_backward:
    case K::swiglu_forward:
    case K::swiglu_backward:
      return "RMSNorm (fused and wide rows) and SwiGLU, forward and backward";
    case K::embedding_forward:
    case K::embedding_backward:
      return "embedding (repeated and unused ids); bf16 storage, layer norm and embedding";
    case K::crossentropy_forward:
    case K::crossentropy_backward:
    case K::crossentropy_fused:
      return "cross-entropy over f32 and bf16 logits; over wide rows";
    case K::dropout_forward:
    case K::dropout_backward:
      return "dropout draws the CPU's mask, forward and backward";
    case K::permute:
    case K::copy_slice:
      return "permute and copy_slice, storing and accumulating";
    case K::matmul_forward:
    case K::matmul_backward:
      return "matmul launchers (every transpose, shared and batched operands); bf16 storage";
    case K::linear_forward:
    case K::linear_backward:
      return "linear asks cublasLt for its epilogues only when asked; matmul and linear";
    case K::adamw_update:
      return "AdamW step over runs of a packed buffer; clipped, unclipped, refused";
    case K::rope_forward:
    case K::rope_backward:
      return "RoPE (rotated and copied heads, an offset, Llama 3's scaling)";
    case K::attention_naive_forward:
    case K::attention_naive_backward:
      return "naive attention (GQA, masks, padding, dropout); score modifiers";
    case K::attention_flash_forward:
    case K::attention_flash_backward:
      return "flash attention on CUDA cores; entry points; score modifiers";
    case K::attention_flash_forward_bf16:
    case K::attention_flash_backward_bf16:
      return "tests/test_flash_mma_emulated.cpp: flash on bf16 storage (emulated)";
  }
  return "";
}
TINYGPT_EVERY_KERNEL_HAS_A_CASE()

// GPU tests: every CUDA kernel against its CPU twin (through the ops, forward and gradients), flash and naive
// attention on the GPU against the CPU naive reference over the shared attention test matrix, and GPT training
// steps on the GPU against the same steps on the CPU. Without a GPU this binary prints why and exits 77, which
// CTest reports as skipped.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <fmt/core.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>

#include "autograd/attention.h"
#include "autograd/ops.h"
#include "kernels/device.h"
#include "kernels/kernels.h"
#include "kernels/scalar_math.h"
#include "nn/gpt.h"
#include "tests/attention_bf16_case.h"
#include "tests/attention_cases.h"
#include "tests/kernel_cases.h"
#include "train/adamw.h"
#include "train/generate.h"
#include "train/trainer.h"

using namespace tinygpt;

namespace {

/// Every element of the GPU result within atol + rtol*|cpu|; NaN never passes. Reports the worst element.
void check_matches(const Tensor& gpu, const Tensor& cpu, double atol, double rtol, const std::string& what) {
  REQUIRE(gpu.shape() == cpu.shape());
  const std::vector<float> a = gpu.to(Device::CPU).to_vector<float>(), b = cpu.to_vector<float>();
  int64_t bad = 0, worst = -1;
  double worst_excess = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double err = std::abs(double(a[i]) - double(b[i])), tol = atol + rtol * std::abs(double(b[i]));
    const bool ok = std::isinf(b[i]) ? a[i] == b[i] : err <= tol;
    if (!ok) {
      ++bad;
      if (worst < 0 || err - tol > worst_excess || std::isnan(a[i])) worst = int64_t(i), worst_excess = err - tol;
    }
  }
  INFO(what << ": " << bad << " of " << a.size() << " elements differ; worst at " << worst << ": gpu "
            << (worst >= 0 ? a[size_t(worst)] : 0.0f) << ", cpu " << (worst >= 0 ? b[size_t(worst)] : 0.0f));
  CHECK(bad == 0);
}

using OpFn = std::function<Tensor(const std::vector<Tensor>&)>;

/// Runs f on the CPU and on the GPU from the same inputs and compares the outputs and the gradients of every
/// float input. The loss calls f twice, so every backward kernel must accumulate into gradients already written.
void check_op(const std::string& name, const OpFn& f, const std::vector<Tensor>& inputs, double atol = 1e-5,
              double rtol = 1e-4) {
  INFO("op: " << name);
  struct Result {
    Tensor out;
    std::vector<Tensor> grads;
  };
  auto run = [&](Device d) {
    std::vector<Tensor> in;
    for (const Tensor& x : inputs) {
      Tensor t = x.clone().to(d);
      if (x.dtype() == DType::F32) t.requires_grad_();
      in.push_back(t);
    }
    Result r;
    r.out = f(in);
    Generator gen(7);
    const Tensor w = randn(r.out.shape(), gen).to(d);
    (sum(r.out * w) + sum(f(in) * w)).backward();
    for (const Tensor& t : in) r.grads.push_back(t.requires_grad() ? t.grad() : Tensor());
    return r;
  };
  const Result cpu = run(Device::CPU), gpu = run(Device::CUDA);
  CHECK(gpu.out.device() == Device::CUDA);
  check_matches(gpu.out, cpu.out, atol, rtol, name + " output");
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!cpu.grads[i].defined()) continue;
    REQUIRE(gpu.grads[i].defined());
    check_matches(gpu.grads[i], cpu.grads[i], atol, rtol, fmt::format("{} gradient of input {}", name, i));
  }
}

Tensor randn_f32(const Shape& s, uint64_t seed, double stddev = 1.0) {
  Generator gen(seed);
  return randn(s, gen, DType::F32, Device::CPU, stddev);
}

Tensor ids(const Shape& s, int32_t V, uint64_t seed) {
  Generator gen(seed);
  std::vector<int32_t> v(size_t(s.numel()));
  for (auto& x : v) x = int32_t(gen.uniform() * V) % V;
  return from_vector(v, s);
}

}  // namespace

TEST_CASE("cuda: tensors round-trip between host and device") {
  Generator gen(1);
  const Tensor x = randn({3, 5}, gen);
  const Tensor d = x.to(Device::CUDA);
  CHECK(d.device() == Device::CUDA);
  CHECK(d.to(Device::CPU).to_vector<float>() == x.to_vector<float>());
  CHECK(zeros({4}, DType::F32, Device::CUDA).to(Device::CPU).to_vector<float>() == std::vector<float>(4, 0.0f));
  CHECK(d.clone().to(Device::CPU).to_vector<float>() == x.to_vector<float>());
}

TEST_CASE("cuda: the caching allocator reuses freed blocks and counts bytes") {
  cuda::synchronize();
  const auto before = cuda::memory_stats();
  void* a = cuda::malloc(1000);
  const auto during = cuda::memory_stats();
  CHECK(during.allocated == before.allocated + 1024);  // rounded up to 512-byte granules
  cuda::free(a);
  void* b = cuda::malloc(900);  // same rounded size: the same block comes back
  CHECK(b == a);
  cuda::free(b);
  CHECK(cuda::memory_stats().allocated == before.allocated);
  CHECK_THROWS_WITH_AS(cuda::malloc(size_t(1) << 50), doctest::Contains("out of GPU memory: requested"), Error);
}

TEST_CASE("cuda: elementwise and broadcast ops match the CPU") {
  const Tensor a = randn_f32({4, 33, 40}, 1), b = randn_f32({4, 33, 40}, 2), row = randn_f32({40}, 3);
  const Tensor col = randn_f32({4, 1, 40}, 4), pos = scale(exp(randn_f32({4, 33, 40}, 5, 0.3)), 1.0);
  check_op("add", [](auto& x) { return x[0] + x[1]; }, {a, b});
  check_op("sub broadcast", [](auto& x) { return x[0] - x[1]; }, {a, row});
  check_op("mul broadcast both", [](auto& x) { return x[0] * x[1]; }, {col, row});
  check_op("div broadcast", [](auto& x) { return x[0] / x[1]; }, {a, pos});
  check_op(
      "div by broadcast", [](auto& x) { return x[1] / x[0]; }, {col, a}, 1e-4, 1e-4);
  check_op("scale", [](auto& x) { return scale(x[0], -0.7); }, {a});
  check_op("neg", [](auto& x) { return -x[0]; }, {a});
  check_op("exp", [](auto& x) { return exp(x[0]); }, {a});
  check_op("log", [](auto& x) { return log(x[0]); }, {pos});
  check_op("tanh", [](auto& x) { return tanh(x[0]); }, {a});
  check_op("relu", [](auto& x) { return relu(x[0]); }, {a});
  check_op("gelu", [](auto& x) { return gelu(x[0]); }, {a});
  check_op("dropout", [](auto& x) { return dropout(x[0], 0.3, 1234); }, {a});
}

TEST_CASE("cuda: reductions, softmax and layout ops match the CPU") {
  const Tensor a = randn_f32({6, 300, 17}, 1), wide = randn_f32({5, 1000}, 2);
  check_op(
      "sum", [](auto& x) { return sum(x[0]); }, {a}, 1e-3, 1e-4);
  check_op(
      "sum dim 1", [](auto& x) { return sum(x[0], 1); }, {a}, 1e-4, 1e-4);
  check_op(
      "sum last dim", [](auto& x) { return sum(x[0], -1, true); }, {wide}, 1e-4, 1e-4);
  check_op("mean dim 0", [](auto& x) { return mean(x[0], 0); }, {a});
  check_op("softmax", [](auto& x) { return softmax(x[0]); }, {a});
  check_op("softmax wide", [](auto& x) { return softmax(x[0]); }, {wide});
  check_op("log_softmax", [](auto& x) { return log_softmax(x[0]); }, {wide});
  check_op("permute", [](auto& x) { return permute(x[0], {2, 0, 1}); }, {a});
  check_op("transpose", [](auto& x) { return transpose(x[0], 0, 1); }, {a});
  check_op("narrow", [](auto& x) { return narrow(x[0], 1, 7, 100); }, {a});
  check_op("concat", [](auto& x) { return concat({x[0], x[1]}, 1); }, {a, randn_f32({6, 5, 17}, 3)});
  check_op("split", [](auto& x) { return split(x[0], 100, 1)[1] * 2.0; }, {a});
  check_op("reshape", [](auto& x) { return reshape(x[0], {17, 1800}); }, {a});
}

TEST_CASE("cuda: matmul and linear (cuBLAS, f32) match the CPU") {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const Tensor a = ta ? randn_f32({3, 40, 25}, 1) : randn_f32({3, 25, 40}, 1);
      const Tensor b = tb ? randn_f32({3, 30, 40}, 2) : randn_f32({3, 40, 30}, 2);
      const Tensor b1 = tb ? randn_f32({30, 40}, 3) : randn_f32({40, 30}, 3);
      const Tensor a1 = ta ? randn_f32({40, 25}, 4) : randn_f32({25, 40}, 4);
      const std::string t = fmt::format(" trans_a={} trans_b={}", ta, tb);
      check_op(
          "matmul batched" + t, [=](auto& x) { return matmul(x[0], x[1], ta, tb); }, {a, b}, 1e-4, 1e-4);
      check_op(
          "matmul shared b" + t, [=](auto& x) { return matmul(x[0], x[1], ta, tb); }, {a, b1}, 1e-4, 1e-4);
      check_op(
          "matmul shared a" + t, [=](auto& x) { return matmul(x[0], x[1], ta, tb); }, {a1, b}, 1e-4, 1e-4);
    }
  }
  const Tensor x = randn_f32({2, 70, 48}, 5), w = randn_f32({96, 48}, 6, 0.2), bias = randn_f32({96}, 7);
  check_op(
      "linear", [](auto& in) { return linear(in[0], in[1], in[2]); }, {x, w, bias}, 1e-4, 1e-4);
  check_op(
      "linear without bias", [](auto& in) { return linear(in[0], in[1]); }, {x, w}, 1e-4, 1e-4);
  check_op(
      "linear with many rows", [](auto& in) { return linear(in[0], in[1], in[2]); },
      {randn_f32({3000, 48}, 8), w, bias}, 1e-4, 1e-4);
}

TEST_CASE("cuda: bf16 matmuls (cuBLAS on bf16 copies) match the CPU's bf16 products") {
  // Both round the same operands to bf16 and sum exact products in f32: they differ only in summation order.
  const Numerics bf16{.bf16 = true};
  for (bool ta : {false, true}) {
    const Tensor a = ta ? randn_f32({3, 40, 25}, 1) : randn_f32({3, 25, 40}, 1);
    const Tensor b = randn_f32({40, 30}, 3);
    check_op(
        fmt::format("bf16 matmul shared b trans_a={}", ta),
        [=](auto& x) { return matmul(x[0], x[1], ta, false, bf16); }, {a, b}, 1e-4, 1e-4);
  }
  const Tensor x = randn_f32({2, 70, 48}, 5), w = randn_f32({96, 48}, 6, 0.2), bias = randn_f32({96}, 7);
  check_op(
      "bf16 linear", [=](auto& in) { return linear(in[0], in[1], in[2], bf16); }, {x, w, bias}, 1e-4, 1e-4);
}

TEST_CASE("cuda: the MLP with GELU and ReLU squared matches the CPU, with and without cublasLt's epilogues") {
  // Hidden width 96, a multiple of 8: with cublasLt's epilogues asked for (Numerics::lt_epilogues) and f32 products,
  // GELU (tanh form) and its derivative run in cublasLt's epilogues (with bf16 products, and by default, in our
  // kernels). cublasLt may evaluate tanh with the GPU's approximate instruction (relative error about 2^-11), hence
  // GELU's looser bound; a wrong operand in an epilogue is off by order one.
  const Tensor x = randn_f32({2, 70, 48}, 5), w_fc = randn_f32({96, 48}, 6, 0.2), b_fc = randn_f32({96}, 7);
  const Tensor w_proj = randn_f32({40, 96}, 8, 0.2), b_proj = randn_f32({40}, 9);
  for (const bool epilogues : {false, true}) {
    for (const bool bf16 : {false, true}) {
      const Numerics numerics{.bf16 = bf16, .lt_epilogues = epilogues};
      for (const Activation act : {Activation::Gelu, Activation::ReluSquared}) {
        // The looser bounds only where the two devices' GELU can differ: cublasLt's epilogue (f32 products with the
        // epilogues asked for), and bf16 products, where GELU's derivative (tanh, one ulp apart between the devices)
        // is rounded to bf16 before the products, so a rounding can flip: 2^-8 of one term of a gradient's sum (on an
        // H200, 2 to 5 elements of each gradient, at most 4e-4 off).
        const double tol = act != Activation::Gelu ? 1e-4 : epilogues && !bf16 ? 5e-3 : bf16 ? 2e-3 : 1e-4;
        check_op(
            fmt::format("mlp {}{}{}", act == Activation::Gelu ? "GELU" : "ReLU^2", bf16 ? " bf16" : "",
                        epilogues ? ", cublasLt's epilogues" : ""),
            [=](auto& in) { return mlp(in[0], in[1], in[2], in[3], in[4], act, numerics); },
            {x, w_fc, b_fc, w_proj, b_proj}, tol, tol);
      }
    }
  }
}

TEST_CASE("cuda: layernorm, embedding, cross-entropy and rope match the CPU") {
  const Tensor x = randn_f32({3, 50, 96}, 1), w = randn_f32({96}, 2), b = randn_f32({96}, 3);
  check_op(
      "layer_norm", [](auto& in) { return layer_norm(in[0], in[1], in[2]); }, {x, w, b}, 1e-4, 1e-4);
  check_op(
      "layer_norm many rows", [](auto& in) { return layer_norm(in[0], in[1], Tensor()); },
      {randn_f32({5000, 64}, 4), randn_f32({64}, 5)}, 1e-4, 1e-4);
  const Tensor table = randn_f32({65, 96}, 6), tokens = ids({8, 300}, 65, 7);
  check_op(
      "embedding", [](auto& in) { return embedding(in[1], in[0]); }, {table, tokens}, 1e-5, 1e-5);
  const Tensor logits = randn_f32({4, 70, 65}, 8, 2.0);
  Tensor targets = ids({4, 70}, 65, 9);
  {
    std::vector<int32_t> t = targets.to_vector<int32_t>();
    t[3] = t[100] = -1;  // ignored positions
    targets = from_vector(t, {4, 70});
  }
  check_op(
      "cross_entropy", [](auto& in) { return cross_entropy(in[0], in[1]); }, {logits, targets}, 1e-5, 1e-4);
  check_op(
      "rope", [](auto& in) { return rope(in[0], 16, 3, 5); }, {randn_f32({2, 9, 4 * 16}, 10)}, 1e-5, 1e-4);
}

TEST_CASE("cuda: RMSNorm and layer norm after a residual add, SwiGLU, bf16 casts and the loss alone match the CPU") {
  const Tensor x = randn_f32({3, 50, 96}, 1), r = randn_f32({3, 50, 96}, 2), w = randn_f32({96}, 3);
  check_op(
      "rms_norm", [](auto& in) { return rms_norm(in[0], in[1]); }, {x, w}, 1e-4, 1e-4);
  check_op(
      "rms_norm many rows", [](auto& in) { return rms_norm(in[0], in[1]); },
      {randn_f32({5000, 64}, 4), randn_f32({64}, 5)}, 1e-4, 1e-4);
  check_op(
      "add_rms_norm",
      [](auto& in) {
        const auto [sum, normed] = add_rms_norm(in[0], in[1], in[2]);
        return sum * 0.5 + normed;
      },
      {x, r, w}, 1e-4, 1e-4);
  check_op(
      "swiglu", [](auto& in) { return swiglu(in[0]); }, {randn_f32({4, 70, 2 * 48}, 6, 2.0)}, 1e-5, 1e-4);
  check_op(
      "add_layer_norm",
      [](auto& in) {
        const auto [sum, normed] = add_layer_norm(in[0], in[1], in[2], in[3]);
        return sum * 0.5 + normed;
      },
      {x, r, w, randn_f32({96}, 7)}, 1e-4, 1e-4);
  // f32 -> bf16 -> f32: the rounding (nearest, ties to even) is exact on both devices, and so is the gradient's way
  // back (a bf16 gradient added into the f32 one).
  check_op(
      "bf16 round trip", [](auto& in) { return cast(cast(in[0], DType::BF16), DType::F32); }, {x}, 0, 0);
  // The loss alone, as evaluation computes it (check_op's calls record gradients, so they take the fused kernel).
  NoGradGuard no_grad;
  const Tensor logits = randn_f32({4, 70, 65}, 8, 2.0), targets = ids({4, 70}, 65, 9);
  check_matches(cross_entropy(logits.to(Device::CUDA), targets.to(Device::CUDA)), cross_entropy(logits, targets), 1e-5,
                1e-5, "cross_entropy without gradients");
}

TEST_CASE("cuda: the optimizers' small kernels (fill, axpby, the sum of squares) match the CPU") {
  check_matches(full({1000}, 0.375, DType::F32, Device::CUDA), full({1000}, 0.375), 0, 0, "fill");
  const Tensor x = randn_f32({1000}, 1), y = randn_f32({1000}, 2);
  Tensor yc = y.clone(), yd = y.to(Device::CUDA);
  const Tensor xd = x.to(Device::CUDA);
  launch(kernels::axpby<float>, Device::CPU, yc.data<float>(), x.data<float>(), int64_t(1000), -0.3, 0.9, nullptr,
         nullptr, 0.0);
  launch(kernels::axpby<float>, Device::CUDA, yd.data<float>(), xd.data<float>(), int64_t(1000), -0.3, 0.9, nullptr,
         nullptr, 0.0);
  check_matches(yd, yc, 1e-6, 1e-6, "axpby");
  const Tensor big = randn_f32({3, 70001}, 3);
  check_matches(sum_squares(big.to(Device::CUDA)), sum_squares(big), 0, 1e-5, "sum_squares");
}

TEST_CASE("cuda: adamw_update matches the CPU") {
  Tensor p = randn_f32({1000}, 1), g = randn_f32({1000}, 2), m = randn_f32({1000}, 3, 0.1);
  Tensor v = scale(exp(randn_f32({1000}, 4)), 0.01);
  Tensor pd = p.to(Device::CUDA), gd = g.to(Device::CUDA), md = m.to(Device::CUDA), vd = v.to(Device::CUDA);
  AdamWRuns runs;  // three runs with their own decays, and elements 400 .. 499 in none of them
  runs.add(0, 400, 0.1f);
  runs.add(500, 300, 0.0f);
  runs.add(800, 200, 0.3f);
  const Tensor stats = from_vector(std::vector<float>{2.5f, 16.0f}, {2});  // norm 4, clipped to 2 below
  const Tensor stats_d = stats.to(Device::CUDA);
  for (int64_t step = 1; step <= 3; ++step) {
    const Tensor sched = from_vector(
        std::vector<float>{1e-3f, float(adamw_correction(0.9f, step)), float(adamw_correction(0.99f, step))}, {3});
    const Tensor sched_d = sched.to(Device::CUDA);
    launch(kernels::adamw_update<float>, Device::CPU, p.data<float>(), g.data<float>(), m.data<float>(),
           v.data<float>(), runs, sched.data<float>(), stats.data<float>(), 2.0, 0.9f, 0.99f, 1e-8f);
    launch(kernels::adamw_update<float>, Device::CUDA, pd.data<float>(), gd.data<float>(), md.data<float>(),
           vd.data<float>(), runs, sched_d.data<float>(), stats_d.data<float>(), 2.0, 0.9f, 0.99f, 1e-8f);
  }
  check_matches(pd, p, 1e-6, 1e-5, "param");
  check_matches(md, m, 1e-6, 1e-5, "exp_avg");
  check_matches(vd, v, 1e-6, 1e-5, "exp_avg_sq");
}

// --- attention: the CUDA kernels against the CPU naive kernels, over the CPU tests' matrix

namespace {

using namespace tinygpt::test::attention;

/// Device copy of a host vector (converted to T); freed with the object.
template <class T>
struct DeviceBuffer {
  explicit DeviceBuffer(const std::vector<T>& host) : n(host.size()) {
    ptr = static_cast<T*>(cuda::malloc(std::max<size_t>(n, 1) * sizeof(T)));
    if (n) cuda::copy_to_device(ptr, host.data(), n * sizeof(T));
  }
  ~DeviceBuffer() { cuda::free(ptr); }
  std::vector<T> host() const {
    std::vector<T> out(n);
    if (n) cuda::copy_to_host(out.data(), ptr, n * sizeof(T));
    return out;
  }
  T* ptr = nullptr;
  size_t n;
};

/// The CUDA kernels on p (f32), the backward pass `backward` times into the same gradient buffers; buffers
/// start as NaN so unwritten elements show.
Run<float> run_cuda(const Problem& p, bool flash, int backward) {
  const AttentionGeom& g = p.g;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  DeviceBuffer<float> qkv(convert<float>(p.qkv)), mask(convert<float>(p.mask)), dout(convert<float>(p.dout));
  DeviceBuffer<uint8_t> kp(p.kp);
  DeviceBuffer<float> out(std::vector<float>(size_t(p.out_size), nan)),
      lse(std::vector<float>(size_t(g.B * g.NH * g.T), nan));
  DeviceBuffer<float> weights(std::vector<float>(flash ? 0 : size_t(g.B * g.NH * g.T * g.S), nan));
  // Gradients start at zero, or as NaN where the backward is told they are unwritten (it must store each element).
  DeviceBuffer<float> dqkv(std::vector<float>(backward ? p.qkv.size() : 0, g.grads_unwritten ? nan : 0.0f));
  const float* q = qkv.ptr + p.q_off;
  const float* k = qkv.ptr + p.k_off;
  const float* v = qkv.ptr + p.v_off;
  const float* m = p.mask.empty() ? nullptr : mask.ptr;
  const uint8_t* kpp = p.kp.empty() ? nullptr : kp.ptr;
  // Through the kernel tables (not the cuda:: functions), so this file links in a CPU-only build too.
  if (flash) {
    launch(kernels::attention_flash_forward<float>, Device::CUDA, out.ptr, lse.ptr, q, k, v, m, kpp, g);
  } else {
    launch(kernels::attention_naive_forward<float>, Device::CUDA, out.ptr, weights.ptr, lse.ptr, q, k, v, m, kpp, g);
  }
  for (int i = 0; i < backward; ++i) {
    const auto& bwd = flash ? kernels::attention_flash_backward<float> : kernels::attention_naive_backward<float>;
    launch(bwd, Device::CUDA, dqkv.ptr + p.q_off, dqkv.ptr + p.k_off, dqkv.ptr + p.v_off, dout.ptr, q, k, v, out.ptr,
           lse.ptr, m, kpp, g);
  }
  cuda::synchronize();
  return {out.host(), lse.host(), weights.host(), dqkv.host()};
}

void check_against_cpu(const Config& c, bool flash) {
  INFO((flash ? "flash: " : "naive: ") << describe(c));
  const Problem p = make_problem(c);
  const Run<float> ref = run<float>(p, false, true), gpu = run_cuda(p, flash, 1);
  // As in the CPU flash-vs-naive test: dS = P * (dP - D) cancels, so gradients get a larger absolute tolerance.
  const double atol = 2e-5, grad_atol = 1e-4, rtol = 2e-4;
  const std::vector<int64_t> outs = o_elements(p);
  check_close(gather(gpu.out, outs), gather(ref.out, outs), atol, rtol, "out");
  check_close(gpu.lse, to_double(ref.lse), atol, rtol, "lse");
  if (!flash) check_close(gpu.weights, to_double(ref.weights), atol, rtol, "weights");
  check_close(gather(gpu.dqkv, q_elements(p)), gather(ref.dqkv, q_elements(p)), grad_atol, rtol, "dq");
  check_close(gather(gpu.dqkv, k_elements(p)), gather(ref.dqkv, k_elements(p)), grad_atol, rtol, "dk");
  check_close(gather(gpu.dqkv, v_elements(p)), gather(ref.dqkv, v_elements(p)), grad_atol, rtol, "dv");
  check_close(gpu.dqkv, to_double(ref.dqkv), grad_atol, rtol, "gradient buffer, gaps included");
}

/// The tensor-core kernels against a double-precision reference on the same inputs rounded to their format.
void check_tensor_cores_against_reference(const Config& c) {
  for (const auto format : {AttentionMath::TF32, AttentionMath::BF16}) {
    INFO(std::string(attention_math_name(format)) << " tensor-core flash: " << describe(c));
    const Problem p = rounded_to(make_problem(c), format);
    const Run<double> ref = run<double>(p, false, true);
    Problem in_format = p;
    in_format.g.math = format;
    const Run<float> gpu = run_cuda(in_format, true, 1);
    check_rounded_run(p, ref, format, gpu.out, gpu.lse, gpu.dqkv);
  }
}

}  // namespace

TEST_CASE("cuda: naive attention matches the CPU naive kernels, forward and backward") {
  for (const Config& c : forward_cases()) check_against_cpu(c, false);
  for (const Config& c : flash_cases()) {
    if (c.seed % 4 == 0) check_against_cpu(c, false);  // a quarter of the matrix: the naive GPU path is slow
  }
}

TEST_CASE("cuda: flash attention matches the CPU naive kernels over the whole test matrix") {
  for (const Config& c : forward_cases()) check_against_cpu(c, true);
  for (const Config& c : flash_cases()) check_against_cpu(c, true);
  // Longer sequences: many key tiles, causal tile skipping, head dims 64 and 128.
  check_against_cpu({.B = 2,
                     .NH = 4,
                     .NKV = 2,
                     .T = 300,
                     .S = 300,
                     .E = 64,
                     .Ev = 64,
                     .causal = true,
                     .key_padding = true,
                     .layout = Layout::Fused,
                     .seed = 11},
                    true);
  check_against_cpu({.B = 1,
                     .NH = 2,
                     .NKV = 2,
                     .T = 200,
                     .S = 257,
                     .E = 128,
                     .Ev = 128,
                     .causal = true,
                     .mask = MaskKind::Full,
                     .dropout = 0.1f,
                     .seed = 12},
                    true);
}

TEST_CASE("cuda: tensor-core flash attention (tf32, bf16) matches the double reference over the whole test matrix") {
  for (const Config& c : forward_cases()) check_tensor_cores_against_reference(c);
  for (const Config& c : flash_cases()) check_tensor_cores_against_reference(c);
  check_tensor_cores_against_reference({.B = 2,
                                        .NH = 4,
                                        .NKV = 2,
                                        .T = 300,
                                        .S = 300,
                                        .E = 64,
                                        .Ev = 64,
                                        .causal = true,
                                        .key_padding = true,
                                        .layout = Layout::Fused,
                                        .seed = 11});
  check_tensor_cores_against_reference({.B = 1,
                                        .NH = 2,
                                        .NKV = 2,
                                        .T = 200,
                                        .S = 257,
                                        .E = 128,
                                        .Ev = 128,
                                        .causal = true,
                                        .mask = MaskKind::Full,
                                        .dropout = 0.1f,
                                        .seed = 12});
  check_tensor_cores_against_reference({.B = 1,
                                        .NH = 4,
                                        .NKV = 4,
                                        .T = 1024,
                                        .S = 1024,
                                        .E = 128,
                                        .Ev = 128,
                                        .causal = true,
                                        .layout = Layout::Fused,
                                        .seed = 13});
}

/// The flash forward and backward on bf16 storage (bf16 q, k, v, out and gradients) against the double reference
/// on the same bf16 inputs; the output and the gradients start as NaN (the backward told they are unwritten), so an
/// element left unwritten shows.
void check_bf16_storage_on_gpu(const Config& c, FlashVariants flash = {}) {
  INFO("flash on bf16 storage: " << describe(c));
  Problem p = rounded_to(make_problem(c), AttentionMath::BF16);
  p.g.flash = flash;
  const Run<double> ref = run<double>(p, true, true);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  DeviceBuffer<bf16> qkv(std::vector<bf16>(p.qkv.begin(), p.qkv.end()));
  DeviceBuffer<bf16> out(std::vector<bf16>(size_t(p.out_size), bf16(nan)));
  DeviceBuffer<float> lse(std::vector<float>(size_t(p.g.B * p.g.NH * p.g.T), nan));
  const bf16 *q = qkv.ptr + p.q_off, *k = qkv.ptr + p.k_off, *v = qkv.ptr + p.v_off;
  REQUIRE(flash_bf16_takes(p.g, q, k, v, out.ptr));
  launch(kernels::attention_flash_forward_bf16, Device::CUDA, out.ptr, lse.ptr, q, k, v, p.g);
  cuda::synchronize();
  const std::vector<bf16> o = out.host();
  const std::vector<float> of(o.begin(), o.end());
  check_rounded_close(gather(of, o_elements(p)), gather(ref.out, o_elements(p)), AttentionMath::BF16, "out");
  check_close(lse.host(), ref.lse, 1e-3, 1e-4, "lse");
  DeviceBuffer<bf16> dout(std::vector<bf16>(p.dout.begin(), p.dout.end()));
  DeviceBuffer<bf16> grads(std::vector<bf16>(p.qkv.size(), bf16(nan)));
  AttentionGeom gb = p.g;
  gb.grads_unwritten = true;
  launch(kernels::attention_flash_backward_bf16, Device::CUDA, grads.ptr + p.q_off, grads.ptr + p.k_off,
         grads.ptr + p.v_off, dout.ptr, q, k, v, out.ptr, lse.ptr, gb);
  cuda::synchronize();
  const std::vector<bf16> gh = grads.host();
  const std::vector<float> gf(gh.begin(), gh.end());
  check_rounded_close(gather(gf, q_elements(p)), gather(ref.dqkv, q_elements(p)), AttentionMath::BF16, "dq");
  check_rounded_close(gather(gf, k_elements(p)), gather(ref.dqkv, k_elements(p)), AttentionMath::BF16, "dk");
  check_rounded_close(gather(gf, v_elements(p)), gather(ref.dqkv, v_elements(p)), AttentionMath::BF16, "dv");
}

/// The bf16-storage kernels' shapes on the GPU: many tiles causal (fused, GQA), head dim 128 with partial tiles and
/// long and not causal, few queries over many keys, the training shape's dropout.
void check_bf16_storage_shapes_on_gpu(FlashVariants flash = {}) {
  check_bf16_storage_on_gpu({.B = 2,
                             .NH = 4,
                             .NKV = 2,
                             .T = 300,
                             .S = 300,
                             .E = 64,
                             .Ev = 64,
                             .causal = true,
                             .layout = Layout::Fused,
                             .seed = 11},
                            flash);
  check_bf16_storage_on_gpu(
      {.B = 1, .NH = 2, .NKV = 2, .T = 200, .S = 257, .E = 128, .Ev = 128, .causal = true, .seed = 12}, flash);
  check_bf16_storage_on_gpu(
      {.B = 1, .NH = 4, .NKV = 4, .T = 1024, .S = 1024, .E = 128, .Ev = 128, .layout = Layout::Fused, .seed = 13},
      flash);
  check_bf16_storage_on_gpu({.B = 2, .NH = 2, .NKV = 1, .T = 100, .S = 1000, .E = 64, .Ev = 64, .seed = 14}, flash);
  check_bf16_storage_on_gpu(
      {.B = 2, .NH = 4, .NKV = 2, .T = 256, .S = 256, .E = 64, .Ev = 64, .causal = true, .dropout = 0.2f, .seed = 15},
      flash);
}

TEST_CASE("cuda: flash attention on bf16 storage matches the double reference; bf16 attention tracks f32") {
  check_bf16_storage_shapes_on_gpu();
  for (const int64_t E : {64, 128}) test::check_bf16_attention_tracks_f32(Device::CUDA, true, E);
  test::check_bf16_attention_tracks_f32(Device::CUDA, false, 64);
  test::check_bf16_attention_tracks_f32(Device::CUDA, true, 64, /*misaligned_dout=*/true);
}

TEST_CASE("cuda: the bf16-storage forward's 128-row blocks (FlashVariants::rows128) match the double reference") {
  check_bf16_storage_on_gpu(
      {.B = 2, .NH = 4, .NKV = 2, .T = 256, .S = 256, .E = 64, .Ev = 64, .causal = true, .dropout = 0.2f, .seed = 15},
      {.rows128 = true});
  check_bf16_storage_on_gpu(
      {.B = 1, .NH = 2, .NKV = 2, .T = 200, .S = 300, .E = 64, .Ev = 64, .causal = true, .seed = 16},
      {.rows128 = true});
  check_bf16_storage_on_gpu({.B = 2, .NH = 4, .NKV = 2, .T = 65, .S = 150, .E = 64, .Ev = 64, .seed = 17},
                            {.rows128 = true});
}

TEST_CASE(
    "cuda: the bf16-storage forward with Q from shared memory (FlashVariants::q_smem) matches the double reference") {
  check_bf16_storage_on_gpu(
      {.B = 1, .NH = 2, .NKV = 2, .T = 200, .S = 257, .E = 128, .Ev = 128, .causal = true, .seed = 12},
      {.q_smem = true});
  check_bf16_storage_on_gpu(
      {.B = 1, .NH = 4, .NKV = 4, .T = 1024, .S = 1024, .E = 128, .Ev = 128, .layout = Layout::Fused, .seed = 13},
      {.q_smem = true});
  check_bf16_storage_on_gpu(
      {.B = 2, .NH = 4, .NKV = 2, .T = 300, .S = 300, .E = 128, .Ev = 128, .causal = true, .dropout = 0.2f, .seed = 18},
      {.q_smem = true});
}

TEST_CASE("cuda: the one-pass bf16-storage backward (FlashVariants::dq_atomic) matches the double reference") {
  check_bf16_storage_shapes_on_gpu({.dq_atomic = true});
}

TEST_CASE("cuda: flash attention is deterministic, its backward accumulates or stores (f32, tf32 and bf16 kernels)") {
  const Config c{.B = 2,
                 .NH = 4,
                 .NKV = 2,
                 .T = 200,
                 .S = 200,
                 .E = 64,
                 .Ev = 64,
                 .causal = true,
                 .key_padding = true,
                 .dropout = 0.1f,
                 .layout = Layout::Fused,
                 .seed = 21};
  for (const AttentionMath format : {AttentionMath::F32, AttentionMath::TF32, AttentionMath::BF16}) {
    INFO("operands: " << std::string(attention_math_name(format)));
    Problem p = make_problem(c);
    p.g.math = format;
    const Run<float> a = run_cuda(p, true, 1), b = run_cuda(p, true, 1);
    CHECK(a.out == b.out);
    CHECK(a.lse == b.lse);
    CHECK(a.dqkv == b.dqkv);
    // Twice into the same buffers: exactly twice the gradient.
    const std::vector<float> twice = run_cuda(p, true, 2).dqkv;
    int64_t bad = 0;
    for (size_t i = 0; i < twice.size(); ++i) bad += twice[i] != 2.0f * a.dqkv[i];
    CHECK(bad == 0);
    // Into gradients no op has written (grads_unwritten: NaN buffers, stored rather than added to): the same
    // gradient bit for bit in every element of the views.
    Problem unwritten = p;
    unwritten.g.grads_unwritten = true;
    std::vector<float> stored = run_cuda(unwritten, true, 1).dqkv;
    CHECK(settle_unwritten(stored, p) == 0);
    CHECK(stored == a.dqkv);
  }
}

TEST_CASE("cuda: the attention op runs tf32 and bf16 operands on tensor cores, f32 on CUDA cores") {
  Tensor q = randn_f32({1, 2, 40, 64}, 1).to(Device::CUDA);
  q.requires_grad_();  // so that the output has a node, named by the path
  const Tensor k = randn_f32({1, 2, 40, 64}, 2).to(Device::CUDA), v = randn_f32({1, 2, 40, 64}, 3).to(Device::CUDA);
  const bool tensor_cores = cuda::compute_capability() >= 80;
  for (const AttentionMath math : {AttentionMath::F32, AttentionMath::TF32, AttentionMath::BF16}) {
    AttentionOptions o;
    o.is_causal = true;
    o.numerics.attention = math;
    INFO(attention_math_name(math));
    const bool tc = tensor_cores && math != AttentionMath::F32;
    CHECK(cuda::flash_tensor_cores(math, 64) == tc);
    CHECK(attention_path(q, k, v, o) == (tc ? "flash_tensor_cores" : "flash"));
    CHECK(std::string(scaled_dot_product_attention(q, k, v, o).out.op_name()) ==
          (tc ? "attention_flash_tensor_cores" : "attention_flash"));
  }
  CHECK_FALSE(cuda::flash_tensor_cores(AttentionMath::BF16, 256));  // head dims above 128: the GPU's flash has none
}

TEST_CASE("cuda: the attention op runs on the GPU through strided views of a fused projection") {
  const Tensor qkv = randn_f32({2, 100, 3 * 4 * 32}, 1);
  for (AttentionImpl impl : {AttentionImpl::Flash, AttentionImpl::Naive}) {
    check_op(
        impl == AttentionImpl::Flash ? "fused_self_attention (flash)" : "fused_self_attention (naive)",
        [impl](auto& in) {
          AttentionOptions o;
          o.is_causal = true;
          o.impl = impl;
          return fused_self_attention(in[0], 4, 4, o).out;
        },
        {qkv}, 1e-4, 1e-4);
  }
}

// --- training: the same model, data and steps on both devices

namespace {

/// Losses of 20 AdamW steps of a small GPT (bias, dropout 0.1) on `device`, from the same initial weights and
/// batches every call: random windows of a learnable stream, token i = (7 i + i / 5) mod 65.
std::vector<double> train_losses(Device device, Numerics numerics = {.tf32 = false}) {
  nn::GPTConfig cfg;
  cfg.vocab_size = 65;
  cfg.block_size = 64;
  cfg.n_layer = 2;
  cfg.n_head = 4;
  cfg.n_embd = 64;
  cfg.dropout = 0.1;
  cfg.bias = true;
  Generator gen(5);
  nn::GPT model(cfg, gen);
  model.set_numerics(numerics);
  model.to(device);
  CHECK(model.device() == device);
  AdamW opt(model.named_parameters(), {});
  std::vector<int32_t> stream(5000);
  for (size_t i = 0; i < stream.size(); ++i) stream[i] = int32_t((7 * i + i / 5) % 65);
  Generator pick(3);
  std::vector<double> losses;
  for (int step = 0; step < 20; ++step) {
    std::vector<int32_t> xs, ys;
    for (int b = 0; b < 8; ++b) {
      const auto start = int64_t(pick.uniform() * double(stream.size() - 65));
      xs.insert(xs.end(), stream.begin() + start, stream.begin() + start + 64);
      ys.insert(ys.end(), stream.begin() + start + 1, stream.begin() + start + 65);
    }
    const Tensor loss = model.forward(from_vector(xs, {8, 64}).to(device), from_vector(ys, {8, 64}).to(device)).loss;
    losses.push_back(loss.item());
    loss.backward();
    opt.step(3e-3);
    opt.zero_grad();
  }
  return losses;
}

/// Every loss of `got` within rtol of `want`'s at the same step.
void check_tracks(const std::vector<double>& got, const std::vector<double>& want, double rtol) {
  INFO("losses: " << fmt::format("{}", fmt::join(got, " ")));
  INFO("reference: " << fmt::format("{}", fmt::join(want, " ")));
  REQUIRE(got.size() == want.size());
  for (size_t step = 0; step < got.size(); ++step) CHECK(std::abs(got[step] - want[step]) <= rtol * want[step]);
}

}  // namespace

TEST_CASE("cuda: GPT training on the GPU tracks the CPU for 20 steps (f32, TF32 off)") {
  const std::vector<double> cpu = train_losses(Device::CPU), gpu = train_losses(Device::CUDA);
  CHECK(std::abs(gpu[0] - cpu[0]) <= 1e-5 * cpu[0]);
  check_tracks(gpu, cpu, 2e-3);
  CHECK(gpu.back() < gpu.front() - 0.3);  // it learns
}

TEST_CASE("cuda: GPT training with tensor-core attention (tf32, bf16) tracks f32 attention for 20 steps") {
  const std::vector<double> f32 = train_losses(Device::CUDA);
  for (const auto format : {AttentionMath::TF32, AttentionMath::BF16}) {
    INFO("attention operands: " << std::string(attention_math_name(format)));
    check_tracks(train_losses(Device::CUDA, {.tf32 = false, .attention = format}), f32,
                 format == AttentionMath::BF16 ? 1e-2 : 3e-3);
  }
}

TEST_CASE("cuda: GPT training on bf16 storage tracks the CPU's bf16 storage for 20 steps") {
  // Activations and their gradients in bf16 on both devices (the GPU's kernels on bf16 storage, cuBLAS with bf16 in
  // and out), the weights read through their bf16 working copies; the two sum in different orders, so a rounding
  // here and there lands on the next bf16 value.
  const Numerics bf16{.bf16 = true, .attention = AttentionMath::BF16, .bf16_storage = true};
  const std::vector<double> cpu = train_losses(Device::CPU, bf16), gpu = train_losses(Device::CUDA, bf16);
  check_tracks(gpu, cpu, 2e-2);
  CHECK(gpu.back() < gpu.front() - 0.3);                // it learns
  check_tracks(gpu, train_losses(Device::CUDA), 3e-2);  // and tracks f32 storage
}

namespace {

/// A fresh temporary directory `name` holding toy.txt, a small corpus to train on.
std::filesystem::path toy_corpus_dir(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream text(dir / "toy.txt");
  for (int i = 0; i < 400; ++i) text << (i % 2 ? "the cat sat on the mat. " : "a dog ran. ");
  return dir;
}

}  // namespace

TEST_CASE("cuda: a training step waits for the GPU once (the loss and the gradient norm, read together)") {
  namespace fs = std::filesystem;
  const fs::path dir = toy_corpus_dir("tinygpt_test_cuda_syncs");
  for (const char* optimizer : {"adamw", "muon"}) {
    for (const int64_t accum : {1, 3}) {
      INFO(optimizer << ", --grad-accum " << accum);
      TrainConfig c;
      c.data = {(dir / "toy.txt").string()};
      c.out = (dir / fmt::format("{}_{}", optimizer, accum)).string();
      c.device = "cuda";
      c.model.n_layer = 2, c.model.n_head = 2, c.model.n_embd = 32, c.model.block_size = 16;
      c.batch_size = 4, c.max_iters = 8, c.eval_interval = 100, c.eval_iters = 2, c.warmup_iters = 2;
      c.lr_decay_iters = 8, c.grad_accum = accum, c.optimizer = optimizer, c.quiet = true;
      const TrainResult r = train(c);
      CHECK(r.iters == 8);
      CHECK(r.max_step_syncs == 1);
    }
  }
  fs::remove_all(dir);
}

TEST_CASE("cuda: the training step as a CUDA graph gives the losses of the step queued op by op, bit for bit") {
  // With dropout too: each dropout seed reads the step's offset from device memory, so the replays draw new masks
  // every step, the same as the steps queued op by op. And on bf16 storage.
  namespace fs = std::filesystem;
  const fs::path dir = toy_corpus_dir("tinygpt_test_cuda_graphs");
  struct Numbers {
    const char* dtype;
    const char* storage;
  };
  for (const int64_t accum : {1, 2}) {
    for (const Numbers numbers : {Numbers{"fp32", ""}, Numbers{"bf16", "f32"}, Numbers{"bf16", "bf16"}}) {
      for (const double dropout : {0.0, 0.2}) {
        const std::string dtype = fmt::format("{}_{}_{}", numbers.dtype, numbers.storage, dropout);
        INFO("--grad-accum " << accum << ", --dtype " << numbers.dtype << " --storage " << numbers.storage
                             << " --dropout " << dropout);
        std::vector<TrainResult> runs;
        for (const bool graphs : {true, false}) {
          TrainConfig c;
          c.data = {(dir / "toy.txt").string()};
          c.out = (dir / fmt::format("{}_{}_{}", accum, dtype, graphs ? 1 : 0)).string();
          c.device = "cuda";
          c.dtype = numbers.dtype;
          c.storage = numbers.storage;
          c.model.n_layer = 2, c.model.n_head = 2, c.model.n_embd = 32, c.model.block_size = 16;
          c.batch_size = 4, c.max_iters = 12, c.eval_interval = 5, c.eval_iters = 2, c.warmup_iters = 2;
          c.lr_decay_iters = 12, c.grad_accum = accum, c.cuda_graphs = graphs, c.quiet = true;
          c.model.dropout = dropout;
          runs.push_back(train(c));
          CHECK(runs.back().max_step_syncs == 1);
        }
        CHECK(runs[0].graph_replays ==
              12 - 1);  // the first step queued; captured on the second, every later one replayed
        CHECK(runs[1].graph_replays == 0);
        CHECK(runs[0].last_val_loss == runs[1].last_val_loss);  // evaluations between replays: the same model
        CHECK(runs[0].best_val_loss == runs[1].best_val_loss);
        const auto losses = [&](const std::string& name) {
          std::vector<double> out;
          std::ifstream in(dir / name / "metrics.jsonl");
          for (std::string line; std::getline(in, line);) {
            const auto j = nlohmann::json::parse(line);
            if (j.contains("loss")) out.push_back(j["loss"].get<double>());
          }
          return out;
        };
        const auto a = losses(fmt::format("{}_{}_1", accum, dtype));
        const auto b = losses(fmt::format("{}_{}_0", accum, dtype));
        CHECK(a.size() == 12);
        CHECK(a == b);
      }
    }
  }
  fs::remove_all(dir);
}

TEST_CASE("cuda: generation on bf16 storage (--dtype bf16's default there), with and without the KV cache") {
  // What `sample --device cuda` runs for a bf16 checkpoint: bf16 logits read as f32 for sampling, the cache's rows in
  // bf16, past the block size both ways; greedy, so the GPU's tokens follow its own logits.
  nn::GPTConfig cfg;
  cfg.vocab_size = 11, cfg.block_size = 16, cfg.n_layer = 2, cfg.n_head = 2, cfg.n_embd = 32;
  Generator init(5);
  nn::GPT model(cfg, init);
  model.train(false);
  model.set_numerics(Numerics{.bf16 = true, .attention = AttentionMath::BF16, .bf16_storage = true});
  model.to(Device::CUDA);
  GenerateOptions o;
  o.max_new_tokens = 40;
  o.temperature = 0.0;
  for (const bool cache : {true, false}) {
    CAPTURE(cache);
    o.kv_cache = cache;
    Generator g(1);
    const std::vector<int32_t> out = generate(model, {1, 2, 3}, o, g);
    CHECK(out.size() == 40);
    CHECK(std::all_of(out.begin(), out.end(), [](int32_t t) { return t >= 0 && t < 11; }));
  }
}

int main(int argc, char** argv) {
  if (!cuda::built_with_cuda()) {
    fmt::print("test_cuda: SKIPPED: this build has no CUDA backend (nvcc was not found)\n");
    return 77;
  }
  if (cuda::device_count() == 0) {
    fmt::print("test_cuda: SKIPPED: no GPU is present\n");
    return 77;
  }
  fmt::print("test_cuda: on {}\n", cuda::device_description());
  doctest::Context context(argc, argv);
  return context.run();
}

// Every kernel of kernels/kernel_list.h and the case above that runs its CUDA side against the CPU's (a kernel added
// to the list without a row here fails to build this file: tests/kernel_cases.h).
constexpr std::string_view case_of(test::Kernel k) {
  using K = test::Kernel;
  switch (k) {
    case K::round_to_bf16:
    case K::widen_bf16:
    case K::accumulate_bf16:
    case K::add_layernorm_forward:
    case K::crossentropy_forward:
    case K::rmsnorm_forward:
    case K::add_rmsnorm_forward:
    case K::rmsnorm_backward:
    case K::swiglu_forward:
    case K::swiglu_backward:
      return "RMSNorm and layer norm after a residual add, SwiGLU, bf16 casts and the loss alone";
    case K::fill:
    case K::axpby:
    case K::sum_squares:
      return "the optimizers' small kernels (fill, axpby, the sum of squares)";
    case K::axpy:
      return "elementwise and broadcast ops (each gradient summed twice, by axpy)";
    case K::unary_forward:
    case K::unary_backward:
    case K::binary_forward:
    case K::binary_backward:
    case K::dropout_forward:
    case K::dropout_backward:
      return "elementwise and broadcast ops; GPT training on bf16 storage";
    case K::sum_forward:
    case K::sum_backward:
    case K::softmax_forward:
    case K::softmax_backward:
    case K::log_softmax_forward:
    case K::log_softmax_backward:
    case K::permute:
    case K::copy_slice:
      return "reductions, softmax and layout ops";
    case K::matmul_forward:
    case K::matmul_backward:
    case K::linear_forward:
    case K::linear_backward:
      return "matmul and linear (cuBLAS, f32); bf16 matmuls; the MLP";
    case K::layernorm_forward:
    case K::layernorm_backward:
    case K::embedding_forward:
    case K::embedding_backward:
    case K::crossentropy_fused:
    case K::crossentropy_backward:
    case K::rope_forward:
    case K::rope_backward:
      return "layernorm, embedding, cross-entropy and rope";
    case K::adamw_update:
      return "adamw_update matches the CPU";
    case K::attention_naive_forward:
    case K::attention_naive_backward:
      return "naive attention matches the CPU naive kernels";
    case K::attention_flash_forward:
    case K::attention_flash_backward:
      return "flash attention matches the CPU naive kernels over the whole test matrix";
    case K::attention_flash_forward_bf16:
    case K::attention_flash_backward_bf16:
      return "flash attention on bf16 storage matches the double reference";
  }
  return "";
}
TINYGPT_EVERY_KERNEL_HAS_A_CASE()

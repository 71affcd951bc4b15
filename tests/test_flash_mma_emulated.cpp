// The tensor-core flash attention kernels of kernels/cuda/flash_mma.cuh, bf16 and tf32 operands, run on the CPU
// under tests/emulated_cuda.h through the CUDA backend's own entry points (kernels/cuda/attention.cuh, with the
// operand format in AttentionGeom::math), against a double-precision reference on inputs rounded to the operand
// format: forward (out, lse) and all three gradients, over shapes that cover every padded head dim (32, 64, 128),
// several tiles, causal and not, GQA, strided and fused layouts, padding and additive masks, empty rows and
// dropout. This is what checks the fragment bookkeeping on machines without a GPU; tests/test_cuda.cpp runs the
// same kernels on a GPU.
#include "tests/emulated_cuda.h"
// (the emulator first: it defines what device code needs)
#include "kernels/cuda/attention.cuh"
#include "tests/attention_cases.h"

using namespace tinygpt;
using namespace tinygpt::test::attention;

namespace {

/// Gradient buffers start here, so a backward kernel that stores instead of accumulating fails.
constexpr float kGradStart = 1.0f;

struct EmulatedRun {
  std::vector<float> out, lse, dqkv;
};

/// Forward and backward through the emulated backend's flash entry points, in the operand format p.g.math; with
/// `unwritten`, the gradients start as NaN and the backward is told to write them (AttentionGeom::grads_unwritten).
EmulatedRun run_emulated(const Problem& p, bool unwritten) {
  const AttentionGeom& g = p.g;
  const HostInputs<float> in(p);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EmulatedRun r;
  r.out.assign(size_t(p.out_size), nan);
  r.lse.assign(size_t(g.B * g.NH * g.T), nan);
  r.dqkv.assign(in.qkv.size(), unwritten ? nan : kGradStart);
  cuda::emulated::attention_flash_forward(r.out.data(), r.lse.data(), in.q, in.k, in.v, in.m, in.kp, g);
  float* d = r.dqkv.data();
  AttentionGeom gb = g;
  gb.grads_unwritten = unwritten;
  cuda::emulated::attention_flash_backward(d + p.q_off, d + p.k_off, d + p.v_off, in.dout.data(), in.q, in.k, in.v,
                                           r.out.data(), r.lse.data(), in.m, in.kp, gb);
  if (unwritten) {
    CHECK(settle_unwritten(r.dqkv, p) == 0);
  } else {
    for (float& x : r.dqkv) x -= kGradStart;
  }
  return r;
}

void check_format(const Config& c, AttentionMath format, bool unwritten) {
  INFO("tensor-core flash (emulated, " << attention_math_name(format) << " operands" <<
       (unwritten ? ", into unwritten gradients" : "") << "): " << describe(c));
  Problem p = rounded_to(make_problem(c), format);
  const Run<double> ref = run<double>(p, false, true);
  p.g.math = format;
  const EmulatedRun got = run_emulated(p, unwritten);
  check_rounded_run(p, ref, format, got.out, got.lse, got.dqkv);
}

/// Both formats, in the kernels' default builds and in their pipelined ones (TINYGPT_FLASH_PIPELINE=1: cp.async
/// stages, which the emulator lands only when a thread waits for them); then bf16 into unwritten gradients.
void check_emulated(const Config& c) {
  for (const bool pipelined : {false, true}) {
    INFO("TINYGPT_FLASH_PIPELINE=" << pipelined);
    if (pipelined) setenv("TINYGPT_FLASH_PIPELINE", "1", 1);
    check_format(c, AttentionMath::BF16, false);
    check_format(c, AttentionMath::TF32, false);
    unsetenv("TINYGPT_FLASH_PIPELINE");
  }
  // Gradients no op has written yet (grads_unwritten: NaN buffers, stored rather than added to), in bf16.
  check_format(c, AttentionMath::BF16, true);
}

}  // namespace

TEST_CASE("tensor-core flash (emulated): two query and key tiles, causal, fused QKV, GQA, head dim 64") {
  check_emulated({.B = 1, .NH = 2, .NKV = 1, .T = 128, .S = 128, .E = 64, .Ev = 64, .causal = true, .layout = Layout::Fused});
}

TEST_CASE("tensor-core flash (emulated): partial tiles, T < S causal, head dim 128, strided") {
  check_emulated({.B = 1, .NH = 2, .NKV = 2, .T = 70, .S = 100, .E = 128, .Ev = 128, .causal = true,
                  .layout = Layout::SeqMajor, .seed = 5});
}

TEST_CASE("tensor-core flash (emulated): padding, additive mask, empty rows, dropout, head dim 32") {
  check_emulated({.B = 2, .NH = 2, .NKV = 2, .T = 40, .S = 90, .E = 32, .Ev = 32, .causal = false, .key_padding = true,
                  .mask = MaskKind::BroadcastTS, .dropout = 0.2f, .masked_row = true, .seed = 6});
}

TEST_CASE("tensor-core flash (emulated): unequal and odd head dims, T > S causal (rows that see nothing), MQA") {
  check_emulated({.B = 1, .NH = 2, .NKV = 1, .T = 75, .S = 20, .E = 80, .Ev = 48, .causal = true, .mask = MaskKind::Full,
                  .seed = 7});
  check_emulated({.B = 2, .NH = 2, .NKV = 2, .T = 33, .S = 7, .E = 5, .Ev = 3, .key_padding = true, .dropout = 0.5f,
                  .seed = 8});
}

TEST_CASE("tensor-core flash (emulated): whole leading key tiles padded away") {
  check_emulated({.B = 1, .NH = 2, .NKV = 2, .T = 40, .S = 150, .E = 16, .Ev = 16, .key_padding = true,
                  .padded_prefix = 140, .seed = 9});
}

// The whole attention test matrix (the CPU and GPU suites' flash cases): minutes under the emulator, so it runs
// only when asked for: test_flash_mma_emulated --no-skip --test-case='*whole matrix*'
TEST_CASE("tensor-core flash (emulated): the whole matrix" * doctest::skip()) {
  for (const Config& c : forward_cases()) check_emulated(c);
  for (const Config& c : flash_cases()) check_emulated(c);
}

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
  INFO("tensor-core flash (emulated, " << attention_math_name(format) << " operands"
                                       << (unwritten ? ", into unwritten gradients" : "") << "): " << describe(c));
  Problem p = rounded_to(make_problem(c), format);
  const Run<double> ref = run<double>(p, false, true);
  p.g.math = format;
  const EmulatedRun got = run_emulated(p, unwritten);
  check_rounded_run(p, ref, format, got.out, got.lse, got.dqkv);
}

/// Both formats; then bf16 into unwritten gradients.
void check_emulated(const Config& c) {
  check_format(c, AttentionMath::BF16, false);
  check_format(c, AttentionMath::TF32, false);
  // Gradients no op has written yet (grads_unwritten: NaN buffers, stored rather than added to), in bf16.
  check_format(c, AttentionMath::BF16, true);
}

}  // namespace

TEST_CASE("tensor-core flash (emulated): two query and key tiles, causal, fused QKV, GQA, head dim 64") {
  check_emulated(
      {.B = 1, .NH = 2, .NKV = 1, .T = 128, .S = 128, .E = 64, .Ev = 64, .causal = true, .layout = Layout::Fused});
}

TEST_CASE("tensor-core flash (emulated): partial tiles, T < S causal, head dim 128, strided") {
  check_emulated({.B = 1,
                  .NH = 2,
                  .NKV = 2,
                  .T = 70,
                  .S = 100,
                  .E = 128,
                  .Ev = 128,
                  .causal = true,
                  .layout = Layout::SeqMajor,
                  .seed = 5});
}

TEST_CASE("tensor-core flash (emulated): padding, additive mask, empty rows, dropout, head dim 32") {
  check_emulated({.B = 2,
                  .NH = 2,
                  .NKV = 2,
                  .T = 40,
                  .S = 90,
                  .E = 32,
                  .Ev = 32,
                  .causal = false,
                  .key_padding = true,
                  .mask = MaskKind::BroadcastTS,
                  .dropout = 0.2f,
                  .masked_row = true,
                  .seed = 6});
}

TEST_CASE("tensor-core flash (emulated): unequal and odd head dims, T > S causal (rows that see nothing), MQA") {
  check_emulated({.B = 1,
                  .NH = 2,
                  .NKV = 1,
                  .T = 75,
                  .S = 20,
                  .E = 80,
                  .Ev = 48,
                  .causal = true,
                  .mask = MaskKind::Full,
                  .seed = 7});
  check_emulated(
      {.B = 2, .NH = 2, .NKV = 2, .T = 33, .S = 7, .E = 5, .Ev = 3, .key_padding = true, .dropout = 0.5f, .seed = 8});
}

TEST_CASE("tensor-core flash (emulated): whole leading key tiles padded away") {
  check_emulated({.B = 1,
                  .NH = 2,
                  .NKV = 2,
                  .T = 40,
                  .S = 150,
                  .E = 16,
                  .Ev = 16,
                  .key_padding = true,
                  .padded_prefix = 140,
                  .seed = 9});
}

/// The flash kernels on bf16 storage (kernels/cuda/flash_bf16.cuh: ldmatrix fragments, cp.async double buffering),
/// emulated, and their CPU twins, against the double reference on the same bf16 inputs: out, lse, and dq, dk, dv.
/// The emulated run starts its buffers as NaN (the gradients told they are unwritten), so an element left unwritten
/// fails; then the emulated kernels and the twins again with gradients that start at 0.25 and are added to, the
/// other mode (the GPU's stores widen, add and round once).
void check_bf16_storage(const Config& c, FlashVariants flash = {}) {
  INFO("flash on bf16 storage: " << describe(c));
  Problem p = rounded_to(make_problem(c), AttentionMath::BF16);
  p.g.flash = flash;
  const Run<double> ref = run<double>(p, true, true);
  const std::vector<bf16> qkv(p.qkv.begin(), p.qkv.end());     // exact: the inputs are rounded to bf16 already
  const std::vector<bf16> dout(p.dout.begin(), p.dout.end());  // the upstream gradient as bf16 storage holds it
  const bf16 *q = qkv.data() + p.q_off, *k = qkv.data() + p.k_off, *v = qkv.data() + p.v_off;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const auto& [emulated, unwritten] : {std::pair{true, true}, {true, false}, {false, false}}) {
    INFO((emulated ? "the GPU kernels, emulated" : "their CPU twins")
         << (unwritten ? ", unwritten gradients" : ", added to"));
    const float start = unwritten ? nan : 0.25f;
    std::vector<bf16> out(size_t(p.out_size), bf16(nan)), grads(qkv.size(), bf16(start));
    std::vector<float> lse(size_t(p.g.B * p.g.NH * p.g.T), nan);
    REQUIRE(flash_bf16_takes(p.g, q, k, v, out.data()));
    (emulated ? cuda::emulated::attention_flash_forward_bf16 : cpu::attention_flash_forward_bf16)(
        out.data(), lse.data(), q, k, v, p.g);
    AttentionGeom gb = p.g;
    gb.grads_unwritten = unwritten;
    bf16* d = grads.data();
    (emulated ? cuda::emulated::attention_flash_backward_bf16 : cpu::attention_flash_backward_bf16)(
        d + p.q_off, d + p.k_off, d + p.v_off, dout.data(), q, k, v, out.data(), lse.data(), gb);
    const std::vector<float> outf(out.begin(), out.end());
    std::vector<float> gradf(grads.begin(), grads.end());
    if (!unwritten) {
      for (float& x : gradf) x -= 0.25f;
    }
    const std::vector<int64_t> outs = o_elements(p);
    check_rounded_close(gather(outf, outs), gather(ref.out, outs), AttentionMath::BF16, "out");
    check_close(lse, ref.lse, 1e-3, 1e-4, "lse");
    check_rounded_close(gather(gradf, q_elements(p)), gather(ref.dqkv, q_elements(p)), AttentionMath::BF16, "dq");
    check_rounded_close(gather(gradf, k_elements(p)), gather(ref.dqkv, k_elements(p)), AttentionMath::BF16, "dk");
    check_rounded_close(gather(gradf, v_elements(p)), gather(ref.dqkv, v_elements(p)), AttentionMath::BF16, "dv");
  }
}

TEST_CASE("flash on bf16 storage (emulated): causal, fused QKV, GQA, head dim 64, two tiles") {
  check_bf16_storage(
      {.B = 1, .NH = 2, .NKV = 1, .T = 128, .S = 128, .E = 64, .Ev = 64, .causal = true, .layout = Layout::Fused});
}

TEST_CASE("flash on bf16 storage (emulated): partial tiles, T < S causal, head dim 128") {
  check_bf16_storage({.B = 1, .NH = 2, .NKV = 2, .T = 70, .S = 100, .E = 128, .Ev = 128, .causal = true, .seed = 5});
  // Rows off 16-byte boundaries (3 elements of padding a time step), another head dim: not its calls. Dropout is.
  const auto takes = [](const Config& c) {
    const Problem p = make_problem(c);
    alignas(16) static bf16 buffer[8];
    return flash_bf16_takes(p.g, buffer, buffer, buffer, buffer);
  };
  CHECK(takes({.T = 8, .S = 8, .E = 64, .Ev = 64}));
  CHECK_FALSE(takes({.T = 8, .S = 8, .E = 64, .Ev = 64, .layout = Layout::SeqMajor}));
  CHECK_FALSE(takes({.T = 8, .S = 8, .E = 32, .Ev = 32}));
  CHECK(takes({.T = 8, .S = 8, .E = 64, .Ev = 64, .dropout = 0.1f}));
}

TEST_CASE("flash on bf16 storage (emulated): not causal, three key tiles, T > S causal (rows that see nothing)") {
  check_bf16_storage({.B = 2, .NH = 4, .NKV = 2, .T = 65, .S = 150, .E = 64, .Ev = 64, .seed = 10});
  check_bf16_storage({.B = 1, .NH = 2, .NKV = 2, .T = 75, .S = 20, .E = 64, .Ev = 64, .causal = true, .seed = 7});
}

TEST_CASE("flash on bf16 storage (emulated): dropout (causal GQA at head dim 64, head dim 128 with partial tiles)") {
  // The mask of kernels/dropout_hash.h on P after the row sums: P V forward, dP's factor in dS and dV's P backward
  // (the dK/dV pass keeps each step's query rows' dropout in shared memory), against the double reference's mask.
  check_bf16_storage(
      {.B = 1, .NH = 4, .NKV = 2, .T = 128, .S = 128, .E = 64, .Ev = 64, .causal = true, .dropout = 0.2f, .seed = 21});
  check_bf16_storage({.B = 1, .NH = 2, .NKV = 2, .T = 70, .S = 100, .E = 128, .Ev = 128, .dropout = 0.3f, .seed = 22});
}

TEST_CASE("flash on bf16 storage (emulated): head dim 128 not causal; GQA causal with T < S") {
  check_bf16_storage({.B = 1, .NH = 2, .NKV = 1, .T = 90, .S = 130, .E = 128, .Ev = 128, .seed = 15});
  check_bf16_storage({.B = 2, .NH = 4, .NKV = 2, .T = 50, .S = 140, .E = 64, .Ev = 64, .causal = true, .seed = 16});
}

TEST_CASE("flash on bf16 storage (emulated): the forward's 128-row blocks (FlashVariants::rows128, head dim 64)") {
  // Each warp two 16-row tiles (rows 16w and 64 + 16w): one block exactly; a second block cut short by T (rows past T,
  // and warps whose second tile is wholly past it) with a fused qkv; keys past the rows (T < S, GQA); rows that see
  // nothing (T > S); not causal over three key tiles with dropout; dropout on the training shape's pattern. The
  // backward is the default's.
  check_bf16_storage(
      {.B = 1, .NH = 2, .NKV = 1, .T = 128, .S = 128, .E = 64, .Ev = 64, .causal = true, .layout = Layout::Fused},
      {.rows128 = true});
  check_bf16_storage({.B = 1, .NH = 2, .NKV = 2, .T = 75, .S = 20, .E = 64, .Ev = 64, .causal = true, .seed = 33},
                     {.rows128 = true});
  check_bf16_storage(
      {.B = 1, .NH = 4, .NKV = 2, .T = 160, .S = 160, .E = 64, .Ev = 64, .causal = true, .dropout = 0.2f, .seed = 35},
      {.rows128 = true});
  check_bf16_storage({.B = 1,
                      .NH = 2,
                      .NKV = 1,
                      .T = 200,
                      .S = 200,
                      .E = 64,
                      .Ev = 64,
                      .causal = true,
                      .layout = Layout::Fused,
                      .seed = 31},
                     {.rows128 = true});
  check_bf16_storage({.B = 1, .NH = 4, .NKV = 2, .T = 50, .S = 140, .E = 64, .Ev = 64, .causal = true, .seed = 32},
                     {.rows128 = true});
  check_bf16_storage({.B = 1, .NH = 2, .NKV = 2, .T = 65, .S = 150, .E = 64, .Ev = 64, .dropout = 0.2f, .seed = 34},
                     {.rows128 = true});
}

TEST_CASE(
    "flash on bf16 storage (emulated): the head-dim-128 forward with Q from shared memory (FlashVariants::q_smem)") {
  // Q's fragments read at each k step instead of held in registers: partial tiles with T < S causal, not causal over
  // several key tiles with GQA, rows that see nothing, dropout.
  check_bf16_storage({.B = 1, .NH = 2, .NKV = 2, .T = 70, .S = 100, .E = 128, .Ev = 128, .causal = true, .seed = 5},
                     {.q_smem = true});
  check_bf16_storage({.B = 1, .NH = 2, .NKV = 1, .T = 90, .S = 130, .E = 128, .Ev = 128, .seed = 15}, {.q_smem = true});
  check_bf16_storage({.B = 1, .NH = 2, .NKV = 2, .T = 75, .S = 20, .E = 128, .Ev = 128, .causal = true, .seed = 7},
                     {.q_smem = true});
  check_bf16_storage({.B = 1, .NH = 2, .NKV = 2, .T = 70, .S = 100, .E = 128, .Ev = 128, .dropout = 0.3f, .seed = 22},
                     {.q_smem = true});
}

TEST_CASE("flash on bf16 storage (emulated): the one-pass backward, dQ by atomics (FlashVariants::dq_atomic)") {
  // dQ summed in the dK/dV pass: each step's dS^T through shared memory, a quarter of the step's dQ block a warp,
  // added to f32 sums zeroed by the D kernel, then scaled and rounded once. Head dim 64 (64 queries a step: four
  // row groups) and 128 (32 a step: two row groups, two feature halves), causal and not, GQA (several query heads
  // into one key tile's pass), rows past T, rows that see nothing, dropout, into unwritten gradients and added to.
  check_bf16_storage(
      {.B = 1, .NH = 2, .NKV = 1, .T = 128, .S = 128, .E = 64, .Ev = 64, .causal = true, .layout = Layout::Fused},
      {.dq_atomic = true});
  check_bf16_storage({.B = 1, .NH = 2, .NKV = 2, .T = 70, .S = 100, .E = 128, .Ev = 128, .causal = true, .seed = 5},
                     {.dq_atomic = true});
  check_bf16_storage({.B = 2, .NH = 4, .NKV = 2, .T = 65, .S = 150, .E = 64, .Ev = 64, .seed = 10},
                     {.dq_atomic = true});
  check_bf16_storage({.B = 1, .NH = 2, .NKV = 2, .T = 75, .S = 20, .E = 64, .Ev = 64, .causal = true, .seed = 7},
                     {.dq_atomic = true});
  check_bf16_storage(
      {.B = 1, .NH = 4, .NKV = 2, .T = 128, .S = 128, .E = 64, .Ev = 64, .causal = true, .dropout = 0.2f, .seed = 21},
      {.dq_atomic = true});
  check_bf16_storage({.B = 1, .NH = 2, .NKV = 1, .T = 90, .S = 130, .E = 128, .Ev = 128, .dropout = 0.3f, .seed = 15},
                     {.dq_atomic = true});
}

// The whole attention test matrix (the CPU and GPU suites' flash cases): about a minute under the emulator, so it
// is its own CTest entry (test_flash_mma_emulated_matrix: --no-skip --test-case='*whole matrix*'), left out of the
// sanitizer build, where it takes five times that.
TEST_CASE("tensor-core flash (emulated): the whole matrix" * doctest::skip()) {
  for (const Config& c : forward_cases()) check_emulated(c);
  for (const Config& c : flash_cases()) check_emulated(c);
}

// The tensor-core flash attention kernels of kernels/cuda/flash_mma.cuh, bf16 and tf32 operands, run on the CPU
// under tests/emulated_cuda.h, against a double-precision reference on inputs rounded to the operand format:
// forward (out, lse) and all three gradients, over shapes that cover every padded head dim (32, 64, 128),
// several tiles, causal and not, GQA, strided and fused layouts, padding and additive masks, empty rows and
// dropout. This is what checks the fragment bookkeeping on machines without a GPU; tests/test_cuda.cpp runs the
// same kernels on a GPU.
#include "tests/emulated_cuda.h"
// (the emulator first: it defines what device code needs)
#include "kernels/cuda/flash_mma.cuh"
#include "tests/attention_cases.h"

using namespace tinygpt;
using namespace tinygpt::test::attention;

namespace {

/// Gradient buffers start here, so a backward kernel that stores instead of accumulating fails.
constexpr float kGradStart = 1.0f;

struct EmulatedRun {
  std::vector<float> out, lse, dqkv;
};

/// Forward, D = rowsum(dO * O), then the dK/dV and dQ kernels, with the launch geometry of attention.cu.
template <class Op, int EP>
EmulatedRun run_emulated(const Problem& p) {
  namespace fm = cuda::flash_mma;
  const AttentionGeom& g = p.g;
  const HostInputs<float> in(p);
  const float *q = in.q, *k = in.k, *v = in.v, *m = in.m;
  const uint8_t* kp = in.kp;
  const std::vector<float>& dout = in.dout;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EmulatedRun r;
  r.out.assign(size_t(p.out_size), nan);
  r.lse.assign(size_t(g.B * g.NH * g.T), nan);
  r.dqkv.assign(in.qkv.size(), kGradStart);
  const unsigned q_tiles = unsigned((g.T + fm::kRows - 1) / fm::kRows), k_tiles = unsigned((g.S + fm::kRows - 1) / fm::kRows);
  emu::launch({unsigned(g.B * g.NH), q_tiles, 1}, fm::kThreads, fm::forward_smem_bytes<Op, EP>(), [&](unsigned char* smem) {
    fm::forward_body<Op, EP>(smem, r.out.data(), r.lse.data(), q, k, v, m, kp, g);
  });

  std::vector<float> D(size_t(g.B * g.NH * g.T));
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t h = 0; h < g.NH; ++h)
      for (int64_t t = 0; t < g.T; ++t) {
        const int64_t o = b * g.o_stride[0] + h * g.o_stride[1] + t * g.o_stride[2];
        float acc = 0.0f;
        for (int64_t e = 0; e < g.Ev; ++e) acc += dout[size_t(o + e)] * r.out[size_t(o + e)];
        D[size_t((b * g.NH + h) * g.T + t)] = acc;
      }
  float* d = r.dqkv.data();
  emu::launch({unsigned(g.B * g.NKV), k_tiles, 1}, fm::kThreads, fm::dkdv_smem_bytes<Op, EP>(), [&](unsigned char* smem) {
    fm::backward_dkdv_body<Op, EP>(smem, d + p.k_off, d + p.v_off, dout.data(), q, k, v, r.lse.data(), D.data(), m, kp, g);
  });
  emu::launch({unsigned(g.B * g.NH), q_tiles, 1}, fm::kThreads, fm::dq_smem_bytes<Op, EP>(), [&](unsigned char* smem) {
    fm::backward_dq_body<Op, EP>(smem, d + p.q_off, dout.data(), q, k, v, r.lse.data(), D.data(), m, kp, g);
  });
  for (float& x : r.dqkv) x -= kGradStart;
  return r;
}

template <class Op>
void check_format(const Config& c, AttentionMath format) {
  INFO("tensor-core flash (emulated, " << std::string(Op::kName) << " operands): " << describe(c));
  const Problem p = rounded_to(make_problem(c), format);
  const Run<double> ref = run<double>(p, false, true);
  const int64_t e = std::max(c.E, c.Ev);
  const EmulatedRun got = e <= 32   ? run_emulated<Op, 32>(p)
                          : e <= 64 ? run_emulated<Op, 64>(p)
                                    : run_emulated<Op, 128>(p);
  check_rounded_run(p, ref, format, got.out, got.lse, got.dqkv);
}

void check_emulated(const Config& c) {
  check_format<cuda::flash_mma::Bf16>(c, AttentionMath::BF16);
  check_format<cuda::flash_mma::Tf32>(c, AttentionMath::TF32);
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

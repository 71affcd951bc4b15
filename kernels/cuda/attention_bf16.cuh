// Flash attention on bf16 tensors (flash_bf16.cuh): the kernels and their entry points, attention_flash_forward_bf16
// and attention_flash_backward_bf16. Included at the end of attention.cuh, whose launch helpers they use; compiled
// with it by nvcc (attention.cu) and under tests/emulated_cuda.h.
#pragma once

#include "kernels/cuda/flash_bf16.cuh"

TINYGPT_CUDA_BEGIN
namespace {

static_assert(flash_bf16::kThreads == kFlashThreads && flash_bf16::kRows == kTile, "the f32 kernels' launch geometry");

template <int EP, int MT, bool kQRegs>
__global__ void __launch_bounds__(flash_bf16::kThreads)
    flash_bf16_forward_kernel(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, AttentionGeom g) {
  TINYGPT_DYNAMIC_SMEM(unsigned char, bf16_smem);
  flash_bf16::forward_body<EP, MT, kQRegs>(bf16_smem, out, lse, q, k, v, g);
}

template <int EP>
__global__ void __launch_bounds__(flash_bf16::kThreads)
    flash_bf16_dq_kernel(bf16* dq, float* D, float* dq_acc, const bf16* dout, const bf16* out, const bf16* q,
                         const bf16* k, const bf16* v, const float* lse, AttentionGeom g) {
  TINYGPT_DYNAMIC_SMEM(unsigned char, bf16_smem);
  flash_bf16::backward_dq_body<EP>(bf16_smem, dq, D, dq_acc, dout, out, q, k, v, lse, g);
}

template <int EP, bool kDq>
__global__ void __launch_bounds__(flash_bf16::kThreads)
    flash_bf16_dkdv_kernel(bf16* dk, bf16* dv, float* dq_acc, const bf16* dout, const bf16* q, const bf16* k,
                           const bf16* v, const float* lse, const float* D, AttentionGeom g) {
  TINYGPT_DYNAMIC_SMEM(unsigned char, bf16_smem);
  flash_bf16::backward_dkdv_body<EP, kDq>(bf16_smem, dk, dv, dq_acc, dout, q, k, v, lse, D, g);
}

template <int EP>
__global__ void flash_bf16_dq_from_acc_kernel(bf16* dq, const float* dq_acc, AttentionGeom g) {
  flash_bf16::dq_from_acc_body<EP>(dq, dq_acc, g);
}

}  // namespace

void attention_flash_forward_bf16(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                                  const AttentionGeom& g) {
  if (g.B * g.NH * g.T == 0) return;
  if (!flash_bf16_takes(g, q, k, v, out)) {
    throw Error(
        "attention_flash_forward_bf16: this call needs the general kernels (head dim 64 or 128, no score "
        "modifier, rows on 16-byte boundaries; kernels/attention.h, flash_bf16_takes)");
  }
  if (properties().major < 8) throw Error("bf16 flash attention needs tensor cores of compute capability 8.0 or newer");
  check_grid(g);
  const auto run = [&](auto dim, auto row_tiles, auto q_regs) {
    constexpr int EP = decltype(dim)::value, MT = decltype(row_tiles)::value;
    constexpr bool kQRegs = decltype(q_regs)::value;
    const dim3 grid(unsigned(g.B * g.NH), unsigned((g.T + MT * kTile - 1) / (MT * kTile)));
    launch_kernel(MT == 2  ? "attention_flash_forward (bf16 storage, 128 rows)"
                  : kQRegs ? "attention_flash_forward (bf16 storage)"
                           : "attention_flash_forward (bf16 storage, Q from shared memory)",
                  flash_bf16_forward_kernel<EP, MT, kQRegs>, grid, flash_bf16::kThreads,
                  size_t(flash_bf16::forward_smem_bytes<EP, MT>()), out, lse, q, k, v, g);
  };
  using One = std::integral_constant<int, 1>;
  // g.flash (kernels/numerics.h): rows128, blocks of 128 query rows at head dim 64; q_smem, Q's fragments read from
  // shared memory at head dim 128.
  if (g.E == 64 && g.flash.rows128) {
    return run(PaddedDim<64>{}, std::integral_constant<int, 2>{}, std::false_type{});
  }
  if (g.E == 64) return run(PaddedDim<64>{}, One{}, std::true_type{});
  if (g.flash.q_smem) return run(PaddedDim<128>{}, One{}, std::false_type{});
  return run(PaddedDim<128>{}, One{}, std::true_type{});
}

void attention_flash_backward_bf16(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k,
                                   const bf16* v, const bf16* out, const float* lse, const AttentionGeom& g) {
  if (g.B * g.NH * g.T == 0) return;
  if (!flash_bf16_takes(g, q, k, v, out) || reinterpret_cast<uintptr_t>(dout) % 16 != 0) {
    throw Error(
        "attention_flash_backward_bf16: this call needs the general kernels (head dim 64 or 128, no score "
        "modifier, rows on 16-byte boundaries; kernels/attention.h, flash_bf16_takes)");
  }
  if (properties().major < 8) throw Error("bf16 flash attention needs tensor cores of compute capability 8.0 or newer");
  check_grid(g);
  Scratch D(size_t(g.B * g.NH * g.T) * sizeof(float));
  // g.flash.dq_atomic: dQ in the dK/dV pass, added up in f32 with atomics (kernels/numerics.h).
  const bool one_pass = dq && (dk || dv) && g.S > 0 && g.flash.dq_atomic;
  const auto run = [&](auto dim) {
    constexpr int EP = decltype(dim)::value;
    Scratch dq_acc(one_pass ? size_t(g.B * g.NH * g.T * EP) * sizeof(float) : 0);
    float* acc = one_pass ? dq_acc.as<float>() : nullptr;
    // D first (and dQ, or the zeroed dQ sums of the one pass): the dK/dV pass reads D.
    launch_kernel(
        one_pass ? "attention_flash_backward (D; bf16 storage)" : "attention_flash_backward (dq; bf16 storage)",
        flash_bf16_dq_kernel<EP>, dim3(unsigned(g.B * g.NH), tiles(g.T)), flash_bf16::kThreads,
        size_t(one_pass ? 0 : flash_bf16::dq_smem_bytes<EP>()), one_pass ? nullptr : dq, D.as<float>(), acc, dout, out,
        q, k, v, lse, g);
    if (one_pass) {
      launch_kernel("attention_flash_backward (dk, dv, dq by atomics; bf16 storage)", flash_bf16_dkdv_kernel<EP, true>,
                    dim3(unsigned(g.B * g.NKV), tiles(g.S)), flash_bf16::kThreads,
                    size_t(flash_bf16::dkdv_smem_bytes<EP, true>()), dk, dv, acc, dout, q, k, v, lse, D.as<float>(), g);
      launch_kernel("attention_flash_backward (dq from its f32 sums; bf16 storage)", flash_bf16_dq_from_acc_kernel<EP>,
                    blocks_for(g.B * g.NH * g.T * (EP / 8)), kThreads, 0, dq, static_cast<const float*>(acc), g);
    } else if ((dk || dv) && g.S > 0) {
      launch_kernel("attention_flash_backward (dk, dv; bf16 storage)", flash_bf16_dkdv_kernel<EP, false>,
                    dim3(unsigned(g.B * g.NKV), tiles(g.S)), flash_bf16::kThreads,
                    size_t(flash_bf16::dkdv_smem_bytes<EP>()), dk, dv, nullptr, dout, q, k, v, lse, D.as<float>(), g);
    }
  };
  if (g.E == 64) return run(PaddedDim<64>{});
  return run(PaddedDim<128>{});
}

TINYGPT_CUDA_END

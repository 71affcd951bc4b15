// Flash attention on bf16 tensors (flash_bf16.cuh): the kernels and their entry points, attention_flash_forward_bf16
// and attention_flash_backward_bf16. Included at the end of attention.cuh, whose launch helpers they use; compiled
// with it by nvcc (attention.cu) and under tests/emulated_cuda.h.
#pragma once

#include "kernels/cuda/flash_bf16.cuh"

TINYGPT_CUDA_BEGIN
namespace {

static_assert(flash_bf16::kThreads == kFlashThreads && flash_bf16::kRows == kTile, "the f32 kernels' launch geometry");

template <int EP, int MT>
__global__ void __launch_bounds__(flash_bf16::kThreads) flash_bf16_forward_kernel(bf16* out, float* lse, const bf16* q,
                                                                                  const bf16* k, const bf16* v,
                                                                                  AttentionGeom g) {
  TINYGPT_DYNAMIC_SMEM(unsigned char, bf16_smem);
  flash_bf16::forward_body<EP, MT>(bf16_smem, out, lse, q, k, v, g);
}

template <int EP>
__global__ void __launch_bounds__(flash_bf16::kThreads) flash_bf16_dq_kernel(bf16* dq, float* D, const bf16* dout,
                                                                             const bf16* out, const bf16* q,
                                                                             const bf16* k, const bf16* v,
                                                                             const float* lse, AttentionGeom g) {
  TINYGPT_DYNAMIC_SMEM(unsigned char, bf16_smem);
  flash_bf16::backward_dq_body<EP>(bf16_smem, dq, D, dout, out, q, k, v, lse, g);
}

template <int EP>
__global__ void __launch_bounds__(flash_bf16::kThreads) flash_bf16_dkdv_kernel(bf16* dk, bf16* dv, const bf16* dout,
                                                                               const bf16* q, const bf16* k,
                                                                               const bf16* v, const float* lse,
                                                                               const float* D, AttentionGeom g) {
  TINYGPT_DYNAMIC_SMEM(unsigned char, bf16_smem);
  flash_bf16::backward_dkdv_body<EP>(bf16_smem, dk, dv, dout, q, k, v, lse, D, g);
}

}  // namespace

void attention_flash_forward_bf16(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                                  const AttentionGeom& g) {
  if (g.B * g.NH * g.T == 0) return;
  if (!flash_bf16_takes(g, q, k, v, out)) {
    throw Error("attention_flash_forward_bf16: this call needs the general kernels (head dim 64 or 128, no score "
                "modifier, rows on 16-byte boundaries; kernels/attention.h, flash_bf16_takes)");
  }
  if (properties().major < 8) throw Error("bf16 flash attention needs tensor cores of compute capability 8.0 or newer");
  check_grid(g);
  const auto run = [&](auto dim, auto row_tiles) {
    constexpr int EP = decltype(dim)::value, MT = decltype(row_tiles)::value;
    const dim3 grid(unsigned(g.B * g.NH), unsigned((g.T + MT * kTile - 1) / (MT * kTile)));
    launch_kernel(MT == 1 ? "attention_flash_forward (bf16 storage)" : "attention_flash_forward (bf16 storage, 128 rows)",
                  flash_bf16_forward_kernel<EP, MT>, grid, flash_bf16::kThreads,
                  size_t(flash_bf16::forward_smem_bytes<EP, MT>()), out, lse, q, k, v, g);
  };
  // TINYGPT_FLASH_ROWS=128: blocks of 128 query rows at head dim 64 (kernels/env.h).
  if (g.E == 64 && TINYGPT_ENV_IS("TINYGPT_FLASH_ROWS", "128")) return run(PaddedDim<64>{}, std::integral_constant<int, 2>{});
  if (g.E == 64) return run(PaddedDim<64>{}, std::integral_constant<int, 1>{});
  return run(PaddedDim<128>{}, std::integral_constant<int, 1>{});
}

void attention_flash_backward_bf16(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k,
                                   const bf16* v, const bf16* out, const float* lse, const AttentionGeom& g) {
  if (g.B * g.NH * g.T == 0) return;
  if (!flash_bf16_takes(g, q, k, v, out) || reinterpret_cast<uintptr_t>(dout) % 16 != 0) {
    throw Error("attention_flash_backward_bf16: this call needs the general kernels (head dim 64 or 128, no score "
                "modifier, rows on 16-byte boundaries; kernels/attention.h, flash_bf16_takes)");
  }
  if (properties().major < 8) throw Error("bf16 flash attention needs tensor cores of compute capability 8.0 or newer");
  check_grid(g);
  Scratch D(size_t(g.B * g.NH * g.T) * sizeof(float));
  const auto run = [&](auto dim) {
    constexpr int EP = decltype(dim)::value;
    // D (and dQ) first: the dK/dV pass reads D.
    launch_kernel("attention_flash_backward (dq; bf16 storage)", flash_bf16_dq_kernel<EP>,
                  dim3(unsigned(g.B * g.NH), tiles(g.T)), flash_bf16::kThreads, size_t(flash_bf16::dq_smem_bytes<EP>()),
                  dq, D.as<float>(), dout, out, q, k, v, lse, g);
    if ((dk || dv) && g.S > 0) {
      launch_kernel("attention_flash_backward (dk, dv; bf16 storage)", flash_bf16_dkdv_kernel<EP>,
                    dim3(unsigned(g.B * g.NKV), tiles(g.S)), flash_bf16::kThreads,
                    size_t(flash_bf16::dkdv_smem_bytes<EP>()), dk, dv, dout, q, k, v, lse, D.as<float>(), g);
    }
  };
  if (g.E == 64) return run(PaddedDim<64>{});
  return run(PaddedDim<128>{});
}

TINYGPT_CUDA_END

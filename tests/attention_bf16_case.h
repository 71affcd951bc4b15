// Attention on bf16 tensors against the same op on f32 tensors holding the same (bf16) values with bf16 operands:
// the output and the gradients of a fused qkv, on the CPU (tests/test_attention.cpp) and the GPU
// (tests/test_cuda.cpp). `lean` picks a call the flash kernels on bf16 storage take (kernels/cuda/flash_bf16.cuh, and
// on the CPU kernels/cpu/attention.cpp); otherwise key padding sends it through f32 as a graph (autograd/attention.cpp,
// attention_bf16).
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "autograd/attention.h"
#include "autograd/autograd.h"
#include "autograd/ops.h"
#include "kernels/device.h"

namespace tinygpt::test {

inline std::vector<float> host_floats(const Tensor& t) {
  const Tensor h = t.to(DType::F32).to(Device::CPU);
  return std::vector<float>(h.data<float>(), h.data<float>() + h.numel());
}

/// Relative RMS difference of a from b.
inline double relative_rms(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double err = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) err += (a[i] - b[i]) * double(a[i] - b[i]), ref += double(b[i]) * b[i];
  return std::sqrt(err / std::max(ref, 1e-30));
}

/// misaligned_dout: the output's gradient lies in a slice of a larger buffer, one element (2 bytes) off the
/// 16-byte boundary the GPU kernels load from. dropout: its probability (the same masks in both runs).
inline void check_bf16_attention_tracks_f32(Device device, bool lean, int64_t E, bool misaligned_dout = false,
                                            double dropout = 0.0) {
  INFO("attention on bf16 tensors, " << (lean ? "the bf16-storage flash forward" : "through f32 (key padding)")
                                     << ", head dim " << E << (misaligned_dout ? ", dout off a 16-byte boundary" : "")
                                     << ", dropout " << dropout);
  const int64_t B = 2, T = 80, NH = 4, NKV = 2;
  Generator gen(5);
  const Tensor qkv32 = randn({B, T, (NH + 2 * NKV) * E}, gen).to(device);
  const Tensor dout32 = randn({B, T, NH * E}, gen).to(device);
  AttentionOptions o;
  o.is_causal = true;
  o.numerics.attention = AttentionMath::BF16;
  o.dropout_p = dropout;
  o.dropout_seed = 77;
  if (!lean) {
    Tensor kp = zeros({B, T}, DType::Bool);
    kp.data<uint8_t>()[3] = 1;
    o.key_padding_mask = kp.to(device);
  }
  Tensor qkv_b = qkv32.to(DType::BF16);
  qkv_b.requires_grad_();
  const Tensor out_b = fused_self_attention(qkv_b, NH, NKV, o).out;
  CHECK(out_b.dtype() == DType::BF16);
  // Lean calls run the kernels on bf16 storage; the others cast their operands and output, the fused qkv once: the
  // f32 attention's q, k and v are views of one f32 copy.
  CHECK(std::string(out_b.op_name()) == (lean ? "attention_flash_bf16" : "cast"));
  if (!lean) {
    const auto& cast_node = out_b.impl_ptr()->grad_fn;
    REQUIRE(cast_node);
    const auto& attention_node = cast_node->inputs.at(0).impl_ptr()->grad_fn;
    REQUIRE(attention_node);
    // The flash kernels; on a GPU with tensor cores on them (the f32 copies keep the call's bf16 operands).
    const bool tensor_cores = device == Device::CUDA && cuda::compute_capability() >= 80;
    CHECK(std::string(attention_node->name) == (tensor_cores ? "attention_flash_tensor_cores" : "attention_flash"));
    CHECK(attention_node->inputs.at(0).impl_ptr() == attention_node->inputs.at(1).impl_ptr());
    CHECK(attention_node->inputs.at(0).impl_ptr() == attention_node->inputs.at(2).impl_ptr());
  }
  Tensor dout_b = dout32.to(DType::BF16);
  if (misaligned_dout) {
    const Tensor buffer = zeros({dout_b.numel() + 1}, DType::BF16, device);
    dout_b = buffer_slice(buffer, 1, dout_b.shape());
    dout_b.copy_(dout32.to(DType::BF16));
  }
  out_b.backward(dout_b);
  Tensor qkv_r = qkv_b.detach().to(DType::F32);  // the same values, in f32
  qkv_r.requires_grad_();
  const Tensor out_r = fused_self_attention(qkv_r, NH, NKV, o).out;
  out_r.backward(dout32.to(DType::BF16).to(DType::F32));
  REQUIRE(qkv_b.grad().dtype() == DType::BF16);
  // One bf16 rounding of each output and gradient element apart (2^-8 relative), and the operand roundings inside.
  CHECK(relative_rms(host_floats(out_b), host_floats(out_r)) < 1e-2);
  CHECK(relative_rms(host_floats(qkv_b.grad()), host_floats(qkv_r.grad())) < 2e-2);
}

}  // namespace tinygpt::test

// How the kernels compute, as a value that travels with each call (never a process-wide switch): a command builds
// one from its flags (train) or from the checkpoint it loads (eval, sample; their flags override it), the model
// hands it to its layers, the layers to the ops, the ops to the kernels. On the CPU only bf16 matmuls change
// anything (the CPU kernels otherwise compute every product in full f32/f64).
#pragma once

#include <cstdint>
#include <string_view>

namespace tinygpt {

/// The operands of flash attention's products; accumulation, softmax, logsumexp, inputs and outputs are f32 in every
/// case. F32: CUDA cores (the default). TF32, BF16: tensor cores (mma.sync, compute capability 8.0 or newer), Q, K,
/// V, dO, P and dS rounded to that format as they are loaded; TF32 falls back to F32 for head dims whose tiles do not
/// fit in the GPU's shared memory (128 on an A100). On the CPU, BF16 rounds the same operands for AMX-BF16 tiles (or
/// for the f32 units where the CPU has no AMX) and TF32 computes as F32.
enum class AttentionMath : uint8_t { F32, TF32, BF16 };

inline const char* attention_math_name(AttentionMath math) {
  return math == AttentionMath::BF16 ? "bf16" : math == AttentionMath::TF32 ? "tf32" : "f32";
}

/// The AttentionMath named "f32", "tf32" or "bf16"; false for any other name.
inline bool parse_attention_math(std::string_view name, AttentionMath& math) {
  for (const AttentionMath m : {AttentionMath::F32, AttentionMath::TF32, AttentionMath::BF16}) {
    if (name == attention_math_name(m)) {
      math = m;
      return true;
    }
  }
  return false;
}

/// The operands of a matmul's products; inputs, outputs and accumulation are f32 in every case. F32: full f32.
/// TF32 (GPU only; the CPU computes it as F32): tensor cores with 10-bit mantissas. BF16: each operand rounded to
/// bfloat16 (8-bit mantissa, round to nearest even) as it is read, its products summed in f32, as PyTorch's autocast
/// and the bf16 tensor cores or AVX512-BF16 compute them; on the GPU on tensor cores, on the CPU rounded by the packing
/// of the blocked GEMM (kernels/cpu/gemm.cpp), then multiplied on AMX-BF16 tiles where the CPU has them, else on the
/// f32 units at f32 speed (cpu::bf16_kernel).
enum class MatmulMath : uint8_t { F32, TF32, BF16 };

inline const char* matmul_math_name(MatmulMath math) {
  return math == MatmulMath::BF16 ? "bf16" : math == MatmulMath::TF32 ? "tf32" : "f32";
}

/// The GPU's bf16 flash kernels that wait for a GPU's measurement (scripts/gpu_check.sh times each against the
/// default), all off by default: fields of each call's numerics (AttentionGeom::flash), set where a command builds its
/// Numerics from the switches TINYGPT_FLASH_ROWS, TINYGPT_FLASH_Q and TINYGPT_FLASH_DQ (kernels/env.h,
/// env::flash_variants), never read from the environment inside a call; tests set them directly.
struct FlashVariants {
  bool rows128 = false;    // the forward at head dim 64 in blocks of 128 query rows (two 16-row tiles a warp)
  bool q_smem = false;     // the forward at head dim 128 reads Q's fragments from shared memory at every k step
  bool dq_atomic = false;  // the backward's dQ in the dK/dV pass, summed in f32 with atomics (one pass)
};

struct Numerics {
  bool tf32 = false;  // on the GPU, f32 matmuls on TF32 tensor cores (10-bit mantissa products, f32 accumulation)
  bool bf16 = false;  // --dtype bf16: matmul operands rounded to bf16 (on every device; before tf32)
  AttentionMath attention = AttentionMath::F32;
  // --dtype bf16 on the CPU: activations and their gradients stored in bf16 between ops, the layers reading their
  // weights through bf16 working copies of the f32 parameters (working_copy in autograd/ops.h); statistics, softmax,
  // the loss, the parameters, their gradients and the optimizer's state stay f32. Off: f32 tensors, bf16 products.
  bool bf16_storage = false;
  FlashVariants flash = {};  // the GPU's bf16 flash kernels not yet measured (not recorded in checkpoints)
  // The GPU's linear layers with f32 products take bias and GELU in cublasLt's epilogue instead of tinygpt's kernels
  // (never with bf16 products): TINYGPT_CUBLASLT_EPILOGUES=1, read where a command builds its Numerics.
  bool lt_epilogues = false;

  MatmulMath matmul() const { return bf16 ? MatmulMath::BF16 : tf32 ? MatmulMath::TF32 : MatmulMath::F32; }
};

}  // namespace tinygpt

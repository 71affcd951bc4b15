// The memory a run will need, estimated from the model config before anything is allocated, against what the
// machine has: an absurd size (`--n-layer 1000000 --n-embd 65536`) gets one clear refusal at once, instead of an
// allocation that swaps, hangs or is killed. The estimate is a lower bound in spirit: it counts what must be held
// (weights, gradients, AdamW moments, the activations backward needs, the logits), not allocator slack.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "../autograd/tensor.h"
#include "../nn/gpt.h"

namespace tinygpt {

struct MemoryNeed {
  double weights = 0;      // the parameters
  double optimizer = 0;    // gradients, AdamW's two moments and Muon's momentum (training only)
  double activations = 0;  // what a forward pass keeps for backward (training), or its transients and KV cache
  double total() const { return weights + optimizer + activations; }
};

/// Parameters of the GPT built from c (GPT::num_parameters without building it), as a double so that absurd
/// configs overflow nothing.
double gpt_parameter_count(const nn::GPTConfig& c);

/// Training at batch_size sequences of c.block_size tokens (one micro-batch's activations: accumulation frees them).
/// `muon`: --optimizer muon, which adds a momentum per parameter at most (AdamW's moments keep the whole buffer's
/// layout), counted as one more copy of the parameters.
/// `bf16_storage` (Numerics::bf16_storage): activations and their gradients in bf16, attention's f32 copies of q, k,
/// v and its output, and a bf16 working copy of every parameter beside its f32 master.
MemoryNeed training_memory(const nn::GPTConfig& c, int64_t batch_size, bool muon = false, bool bf16_storage = false);
/// Inference (eval, sampling) at batch_size sequences of `context` tokens (0: c.block_size), without a graph.
MemoryNeed inference_memory(const nn::GPTConfig& c, int64_t batch_size, int64_t context = 0);

/// Bytes this process can still allocate on `device`: for the CPU the smaller of the kernel's MemAvailable and
/// the room left under a cgroup memory limit (infinity when neither is readable); for CUDA the GPU's free memory.
double available_memory(Device device);

/// "1.2 GiB (weights 41 MiB, gradients and optimizer state 164 MiB, activations 1.0 GiB)".
std::string describe(const MemoryNeed& need);

/// Throws an Error naming the need, its parts, and what `device` has, when the need is larger. `what` names
/// the work ("training this model"), `advice` how to need less.
void require_memory(const MemoryNeed& need, Device device, const std::string& what, const std::string& advice);

/// Throws when reading `path` whole (a checkpoint) would take more host memory than is available.
void require_memory_to_read(const std::filesystem::path& path);

}  // namespace tinygpt

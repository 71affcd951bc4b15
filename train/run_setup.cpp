// A training run's set-up pieces that read or say something: see train/run_setup.h.
#include "train/run_setup.h"

#include <fmt/core.h>
#include <omp.h>

#include <algorithm>

#include "kernels/device.h"
#include "kernels/env.h"
#include "train/adamw.h"
#include "train/comm.h"
#include "train/muon.h"
#include "train/training_data.h"

namespace tinygpt {

namespace fs = std::filesystem;

namespace {

/// A checksum of every parameter's bytes (FNV-1a), to check that all ranks start from the same weights.
uint64_t weights_checksum(const std::vector<Tensor>& params) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const Tensor& p : params) {
    const Tensor t = p.to(Device::CPU);  // f32, or a frozen base's bf16
    const auto* bytes = static_cast<const unsigned char*>(t.raw_data());
    for (size_t i = 0; i < size_t(t.numel()) * dtype_size(t.dtype()); ++i) h = (h ^ bytes[i]) * 0x100000001b3ULL;
  }
  return h;
}

}  // namespace

Checkpoint resume_checkpoint(TrainConfig& cfg, const fs::path& out) {
  Checkpoint ckpt = load_checkpoint(out / kLatestCheckpoint, LoraLoad::Apart);
  check_resume_flags(cfg, ckpt);
  const double dropout = cfg.model.dropout;
  cfg.model = ckpt.config;
  cfg.model.dropout = dropout;
  cfg.lora = ckpt.config.lora;
  cfg.fine_tuned_from = fine_tuned_from(ckpt);  // kept in the run's record
  if (!cfg.optimizer_given && (ckpt.optimizer == "adamw" || ckpt.optimizer == "muon")) cfg.optimizer = ckpt.optimizer;
  // The run's numerics as saved, unless a flag (which then agrees) says so: a resumed run computes as it did.
  auto given = [&](const char* key) { return std::ranges::count(cfg.numerics_flags_given, key) > 0; };
  if (!given("dtype")) cfg.dtype = ckpt.numerics.bf16 ? "bf16" : "fp32";
  if (!given("attention_math") && (ckpt.numerics.attention != AttentionMath::TF32 || cfg.device == "cuda")) {
    cfg.attention_math = attention_math_name(ckpt.numerics.attention);
  }
  if (!given("storage") && !ckpt.storage.empty() && (ckpt.storage == "f32" || cfg.dtype == "bf16"))
    cfg.storage = ckpt.storage;
  if (!given("tf32") && cfg.device == "cuda") cfg.tf32 = ckpt.numerics.tf32;
  return ckpt;
}

Checkpoint init_checkpoint(TrainConfig& cfg) {
  Checkpoint ckpt = load_checkpoint(cfg.init_from);
  check_init_flags(cfg, ckpt.config);
  const double dropout = cfg.model.dropout;
  const int64_t block = cfg.model.block_size;
  const bool shorter = shorter_context(cfg, ckpt.config);
  cfg.model = ckpt.config;
  cfg.model.dropout = dropout;
  if (shorter) cfg.model.block_size = block;  // a shorter training context: no weight depends on it
  cfg.model.lora = cfg.lora;                  // adapters on the checkpoint's model, which becomes their frozen base
  return ckpt;
}

void check_ranks(const nn::GPT& model, Communicator& comm, Device device, const TrainConfig& cfg, Console& console) {
  uint64_t sum = weights_checksum(model.parameters()), first = sum;
  comm.broadcast(&first, sizeof(first), 0);
  if (sum != first) {
    throw Error(
        fmt::format("rank {}: its starting weights differ from rank 0's (checksum {:016x} vs {:016x}); every "
                    "rank must run the same binary with the same flags and checkpoint",
                    comm.rank(), sum, first));
  }
  const char* gradients = device == Device::CPU     ? ""
                          : cuda::built_with_nccl() ? ", gradients summed over NCCL, one GPU per rank"
                                                    : ", gradients summed through host memory (no NCCL in this build), "
                                                      "one GPU per rank";
  console.line(
      "data parallel: {} ranks ({}{}), {} micro-batch{} each per step: the same steps as one process with "
      "--grad-accum {}\n",
      comm.world_size(), comm.backend(), gradients, cfg.grad_accum, cfg.grad_accum == 1 ? "" : "es",
      cfg.grad_accum * comm.world_size());
}

std::unique_ptr<Optimizer> make_optimizer(const TrainConfig& cfg, FlatParameters& flat) {
  const AdamWConfig adamw{
      .lr = cfg.lr, .beta1 = cfg.beta1, .beta2 = cfg.beta2, .eps = 1e-8, .weight_decay = cfg.weight_decay};
  if (cfg.optimizer == "adamw") return std::make_unique<AdamW>(flat, adamw);
  const MuonConfig muon{.lr = cfg.muon_lr,
                        .momentum = cfg.muon_momentum,
                        .weight_decay = cfg.muon_weight_decay,
                        .scale = cfg.muon_scale == "match-adamw" ? MuonScale::MatchAdamW : MuonScale::Original,
                        .bf16 = cfg.dtype == "bf16"};
  return std::make_unique<Muon>(flat, muon, adamw);
}

namespace {

/// How the CPU computes bf16 matmuls, for the model line: the kernel, or why it is no faster than fp32.
std::string cpu_bf16_description(AttentionMath attention) {
  const cpu::Bf16Kernel kernel = cpu::bf16_kernel();
  if (kernel != cpu::Bf16Kernel::F32Units) {
    return fmt::format(", bf16 matmuls{} on {}", attention == AttentionMath::BF16 ? " and attention" : "",
                       cpu::bf16_kernel_name(kernel));
  }
  const bool has_unit = cpu::bf16_kernels_available().size() > 1;
  return has_unit ? ", bf16 matmul operands rounded for f32 units (TINYGPT_CPU_BF16=f32)"
                  : ", bf16 matmul operands rounded for f32 units: this CPU has no bf16 unit (AMX-BF16, AVX512-BF16), "
                    "so no faster than fp32";
}

}  // namespace

std::string describe_model(const nn::GPT& model, Device device) {
  const nn::GPTConfig& m = model.config();
  const Numerics& n = model.numerics();
  const std::string where =
      device == Device::CUDA
          ? fmt::format("on {}{}{}", cuda::device_description(),
                        n.bf16   ? ", bf16 matmuls"
                        : n.tf32 ? ", TF32 matmuls"
                                 : "",
                        n.attention != AttentionMath::F32
                            ? fmt::format(", {} tensor-core attention", attention_math_name(n.attention))
                            : "")
          : fmt::format("{} threads{}{}", omp_get_max_threads(), n.bf16 ? cpu_bf16_description(n.attention) : "",
                        n.bf16_storage ? ", bf16 activations" : "");
  const std::string switches = env::set_switches();  // kernels/env.h
  return fmt::format("model: {} layers, {} heads, {} wide, block {}, {:.2f}M parameters; {}{}\n", m.n_layer, m.n_head,
                     m.n_embd, m.block_size, double(model.num_parameters_non_embedding()) / 1e6, where,
                     switches.empty() ? "" : "; " + switches);
}

}  // namespace tinygpt

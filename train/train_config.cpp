#include "train/train_config.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>

#include "kernels/device.h"
#include "kernels/env.h"
#include "train/checkpoint.h"

namespace tinygpt {

void use_document_separator(nn::GPT& model, const data::Tokenizer& tokenizer) {
  const std::string& sep = model.config().doc_separator;
  if (sep.empty()) return;
  if (tokenizer.is_bpe()) {
    if (sep != data::kEndOfText || tokenizer.end_of_text() < 0) {
      throw Error(
          fmt::format("a BPE model's documents end with {}, not with another text ('{}')", data::kEndOfText, sep));
    }
    model.set_document_separator({tokenizer.end_of_text()});
    return;
  }
  const data::CharVocab& vocab = tokenizer.chars();
  std::vector<int32_t> ids;
  for (const char32_t c : data::decode_utf8(sep)) {
    if (vocab.id(c) < 0) {
      throw Error(
          fmt::format("--doc-sep: character '{}' (U+{:04X}) is not in the data's vocabulary, so no document "
                      "ever ends; give a separator that occurs in the text",
                      data::encode_utf8(std::u32string(1, c)), uint32_t(c)));
    }
    ids.push_back(vocab.id(c));
  }
  model.set_document_separator(std::move(ids));
}

namespace {

/// "n_embd 64 (flags) vs 32 (checkpoint), ..." for each model flag given that differs from the saved config, but the
/// keys in `free`.
std::string model_flag_diffs(const TrainConfig& cfg, const nn::GPTConfig& saved_config,
                             std::initializer_list<std::string_view> free = {}) {
  std::string diffs;
  const auto flags = to_json(cfg.model), saved = to_json(saved_config);
  for (const std::string& key : cfg.model_flags_given) {
    if (std::ranges::count(free, key) > 0) continue;
    if (saved.contains(key) && flags[key] != saved[key]) {
      diffs += fmt::format("{}{} {} (flags) vs {} (checkpoint)", diffs.empty() ? "" : ", ", key, flags[key].dump(),
                           saved[key].dump());
    }
  }
  return diffs;
}

}  // namespace

bool shorter_context(const TrainConfig& cfg, const nn::GPTConfig& saved_config) {
  return std::ranges::count(cfg.model_flags_given, "block_size") > 0 && saved_config.pos != nn::Positions::Learned &&
         cfg.model.block_size <= saved_config.block_size;
}

void check_init_flags(const TrainConfig& cfg, const nn::GPTConfig& saved_config) {
  const bool shorter = shorter_context(cfg, saved_config);
  if (const std::string diffs =
          shorter ? model_flag_diffs(cfg, saved_config, {"block_size"}) : model_flag_diffs(cfg, saved_config);
      !diffs.empty()) {
    throw UsageError(
        fmt::format("--init-from {}: the model flags contradict the checkpoint: {}; drop them (a fine-tuned "
                    "model is the checkpoint's model; --dropout may change, and --block-size may be shorter "
                    "for a model without a position table)",
                    cfg.init_from, diffs));
  }
  if (cfg.lora.enabled()) {  // the adapters fit the model (a gate needs SwiGLU, the rank its widths)
    nn::GPTConfig adapted = saved_config;
    adapted.lora = cfg.lora;
    try {
      adapted.validate();
    } catch (const Error& e) {
      throw UsageError(e.what());
    }
  }
}

void check_resume_flags(const TrainConfig& cfg, const Checkpoint& ckpt) {
  std::string diffs = model_flag_diffs(cfg, ckpt.config);
  if (cfg.lora.enabled() && cfg.lora != ckpt.config.lora) {
    const nn::LoraConfig& s = ckpt.config.lora;
    diffs += fmt::format(
        "{}LoRA rank {} alpha {:g} on {} (flags) vs {} (checkpoint)", diffs.empty() ? "" : ", ", cfg.lora.rank,
        cfg.lora.alpha, nn::lora_targets_name(cfg.lora.targets),
        s.enabled() ? fmt::format("rank {} alpha {:g} on {}", s.rank, s.alpha, nn::lora_targets_name(s.targets))
                    : std::string("no LoRA"));
  }
  auto differ = [&](const char* key, const std::string& flag, const std::string& flag_value, const std::string& saved) {
    if (std::ranges::count(cfg.numerics_flags_given, key) == 0 || flag_value == saved) return;
    diffs += fmt::format("{}{} {} (flags) vs {} (checkpoint)", diffs.empty() ? "" : ", ", flag, flag_value, saved);
  };
  differ("dtype", "--dtype", cfg.dtype, ckpt.numerics.bf16 ? "bf16" : "fp32");
  if (!cfg.attention_math.empty()) {
    differ("attention_math", "--attention-math", cfg.attention_math, attention_math_name(ckpt.numerics.attention));
  }
  if (!cfg.storage.empty() && !ckpt.storage.empty()) differ("storage", "--storage", cfg.storage, ckpt.storage);
  if (cfg.device == "cuda")
    differ("tf32", "TF32 (--no-tf32)", cfg.tf32 ? "on" : "off", ckpt.numerics.tf32 ? "on" : "off");
  if (!diffs.empty()) {
    throw UsageError(
        fmt::format("--resume: flags contradict the checkpoint: {}; drop them to resume as saved (or start a "
                    "new run in another --out)",
                    diffs));
  }
}

Device parse_device(const std::string& device) {
  if (device == "cpu") return Device::CPU;
  if (device != "cuda") throw Error(fmt::format("--device must be cpu or cuda, got '{}'", device));
  if (!cuda::built_with_cuda()) {
    throw Error(
        "--device cuda: this build has no CUDA backend (nvcc was not found when it was configured); use --device cpu");
  }
  if (cuda::device_count() == 0) throw Error("--device cuda: no CUDA GPU is visible; use --device cpu");
  return Device::CUDA;
}

void check_dtype_flag(const std::string& dtype) {
  if (dtype != "fp32" && dtype != "bf16") throw Error(fmt::format("--dtype must be fp32 or bf16, got '{}'", dtype));
}

AttentionMath parse_attention_math(const std::string& math) {
  AttentionMath m{};
  if (!tinygpt::parse_attention_math(math, m)) {
    throw Error(fmt::format("--attention-math must be f32, tf32 or bf16, got '{}'", math));
  }
  return m;
}

void check_attention_math_flag(const std::string& math, const std::string& device) {
  if (!math.empty() && parse_attention_math(math) == AttentionMath::TF32 && device != "cuda") {
    throw Error(
        "--attention-math tf32 runs attention on GPU tensor cores: it needs --device cuda (the CPU has f32 and bf16)");
  }
}

AttentionMath default_attention_math(bool bf16, bool tf32, bool cuda) {
  if (cuda) {
    // Without tensor cores only the f32 kernels run. (0: no GPU visible, as when numerics are worked out ahead of one.)
    const int capability = cuda::compute_capability();
    if (capability != 0 && capability < 80) return AttentionMath::F32;
    return bf16 ? AttentionMath::BF16 : tf32 ? AttentionMath::TF32 : AttentionMath::F32;
  }
  return bf16 && cpu::bf16_kernel() != cpu::Bf16Kernel::F32Units ? AttentionMath::BF16 : AttentionMath::F32;
}

Numerics numerics_of(const TrainConfig& c) {
  Numerics n;
  n.bf16 = c.dtype == "bf16";
  const bool cuda = c.device == "cuda";
  if (cuda) n.tf32 = c.tf32;
  n.attention =
      !c.attention_math.empty() ? parse_attention_math(c.attention_math) : default_attention_math(n.bf16, n.tf32, cuda);
  n.bf16_storage = bf16_storage_of(c.storage, n.bf16, cuda ? Device::CUDA : Device::CPU);
  n.flash = env::flash_variants();
  n.lt_epilogues = env::lt_epilogues();
  return n;
}

bool bf16_storage_of(const std::string& storage, bool bf16, Device device, Work work) {
  // The default with bf16 products on the GPU and on a CPU's bf16 unit (AMX-BF16, AVX512-BF16): half the
  // activations' bytes and a faster step there (docs/RESULTS.md, "One GPU" and "bf16 on the CPU"). On the f32 units
  // its attention would round operands for them, which costs more than f32 attention saves. Inference on a CPU with
  // AVX512-BF16 whose blocked products chose the f32 units: decoding reads the weights as stored on vdpbf16ps, half
  // the bytes of f32 weights rounded at every token.
  if (storage.empty()) {
    const bool decode_unit = work == Work::Inference && cpu::bf16_decode_unit();
    return bf16 && (device == Device::CUDA || cpu::bf16_kernel() != cpu::Bf16Kernel::F32Units || decode_unit);
  }
  if (storage != "f32" && storage != "bf16")
    throw Error(fmt::format("--storage must be f32 or bf16, got '{}'", storage));
  if (storage == "bf16" && !bf16)
    throw Error("--storage bf16 needs --dtype bf16 (bf16 activations feed bf16 products)");
  return storage == "bf16";
}

void check_numerics(const Numerics& numerics, Device device, const char* how) {
  if (device != Device::CUDA || cuda::compute_capability() >= 80) return;
  if (numerics.attention != AttentionMath::F32) {
    throw Error(fmt::format("{} flash attention needs tensor cores of compute capability 8.0 or newer; {} has none: {}",
                            attention_math_name(numerics.attention), cuda::device_description(), how));
  }
  if (numerics.bf16) {
    throw Error(
        fmt::format("bf16 matmuls need tensor cores of compute capability 8.0 or newer; {} has none: use "
                    "--dtype fp32",
                    cuda::device_description()));
  }
}

namespace {

void positive(const char* flag, double v) {
  if (!(v > 0)) throw Error(fmt::format("{} must be positive, got {}", flag, v));
}

void non_negative(const char* flag, double v) {
  if (!(v >= 0)) throw Error(fmt::format("{} must not be negative, got {}", flag, v));
}

/// The flags of what the run reads and starts from: data, tokenizer, checkpoints, LoRA.
void check_input_flags(const TrainConfig& c) {
  if (c.data.empty()) throw Error("--data is required: the text files, directories or globs to train on");
  if (c.sft && c.init_from.empty() && !c.resume) {
    throw Error(
        "sft fine-tunes a model on conversations: give --init-from RUN (a run or an imported model), or --resume");
  }
  if (!c.sft && !c.chat_template.empty()) throw Error("--chat-template is for sft (and chat)");
  if (c.tokenizer.empty()) throw Error("--tokenizer must be char, bpe or a tokenizer.json file");
  if (c.vocab_size != 0 && c.tokenizer != "bpe") {
    throw Error(fmt::format(
        "--vocab-size is the size of a BPE trained here: it needs --tokenizer bpe (got --tokenizer {})", c.tokenizer));
  }
  if (c.vocab_size != 0 && (c.vocab_size < data::kMinBpeVocab || c.vocab_size > data::kMaxTrainedBpeVocab)) {
    throw Error(fmt::format("--vocab-size must be in [{}, {}] (256 bytes, the merges and <|endoftext|>), got {}",
                            data::kMinBpeVocab, data::kMaxTrainedBpeVocab, c.vocab_size));
  }
  if (c.tokenizer != "char" && !c.model.doc_separator.empty() && c.model.doc_separator != data::kEndOfText) {
    throw Error(
        "--doc-sep is for character models: with a BPE each file is a document ended by <|endoftext|>; "
        "--doc-mask keeps attention within documents");
  }
  if (c.doc_mask && c.tokenizer == "char") {
    throw Error(
        "--doc-mask is for BPE models (documents end with <|endoftext|>); a character model keeps attention "
        "within documents with --doc-sep TEXT");
  }
  if (!c.init_from.empty() && c.resume)
    throw Error("--init-from starts a new run from a checkpoint; --resume continues one: give one");
  if (c.lora.enabled()) {
    if (c.init_from.empty() && !c.resume) {
      throw Error(
          "--lora-rank adapts a trained model, which stays frozen: give --init-from RUN (a run or an imported "
          "model)");
    }
    if (c.optimizer != "adamw") throw Error("--lora-rank trains its adapters with AdamW: drop --optimizer muon");
    if (!(c.lora.alpha > 0 && std::isfinite(c.lora.alpha))) {
      throw Error(fmt::format("--lora-alpha must be a finite number above 0, got {}", c.lora.alpha));
    }
    if (c.lora.targets == 0) throw Error("--lora-targets needs at least one of q, k, v, o, gate, up, down");
  } else if (c.lora.rank < 0) {
    throw Error(fmt::format("--lora-rank must be positive (0: no LoRA), got {}", c.lora.rank));
  }
  if (!c.init_from.empty() && c.tokenizer != "char") {
    throw Error("--init-from takes the checkpoint's tokenizer: drop --tokenizer");
  }
}

/// The flags of the schedule, the optimizer and the evaluations: ranges and contradictions.
void check_schedule_flags(const TrainConfig& c) {
  positive("--batch-size", double(c.batch_size));
  non_negative("--max-iters", double(c.max_iters));
  non_negative("--time-budget", c.time_budget);
  if (!std::isfinite(c.time_budget))
    throw Error(fmt::format("--time-budget must be a finite number of seconds, got {}", c.time_budget));
  positive("--lr", c.lr);
  non_negative("--min-lr", c.min_lr);
  if (c.min_lr > c.lr) throw Error(fmt::format("--min-lr ({}) must not exceed --lr ({})", c.min_lr, c.lr));
  non_negative("--warmup-iters", double(c.warmup_iters));
  if (!(c.cooldown >= 0 && c.cooldown <= 1)) {
    throw Error(fmt::format("--cooldown must be a fraction in [0, 1] (0: cosine decay), got {}", c.cooldown));
  }
  if (c.lr_decay_iters < c.warmup_iters) {
    throw Error(
        fmt::format("--lr-decay-iters ({}) must be at least --warmup-iters ({})", c.lr_decay_iters, c.warmup_iters));
  }
  non_negative("--weight-decay", c.weight_decay);
  if (!(c.beta1 >= 0 && c.beta1 < 1)) throw Error(fmt::format("--beta1 must be in [0, 1), got {}", c.beta1));
  if (!(c.beta2 >= 0 && c.beta2 < 1)) throw Error(fmt::format("--beta2 must be in [0, 1), got {}", c.beta2));
  non_negative("--grad-clip", c.grad_clip);
  if (c.optimizer != "adamw" && c.optimizer != "muon") {
    throw Error(fmt::format("--optimizer must be adamw or muon, got '{}'", c.optimizer));
  }
  positive("--muon-lr", c.muon_lr);
  if (!(c.muon_momentum >= 0 && c.muon_momentum < 1))
    throw Error(fmt::format("--muon-momentum must be in [0, 1), got {}", c.muon_momentum));
  non_negative("--muon-weight-decay", c.muon_weight_decay);
  if (c.muon_scale != "original" && c.muon_scale != "match-adamw") {
    throw Error(fmt::format("--muon-scale must be original or match-adamw, got '{}'", c.muon_scale));
  }
  positive("--grad-accum", double(c.grad_accum));
  non_negative("--bucket-mb", c.bucket_mb);
  positive("--eval-interval", double(c.eval_interval));
  positive("--eval-iters", double(c.eval_iters));
  positive("--log-interval", double(c.log_interval));
  if (!(c.train_fraction > 0 && c.train_fraction < 1)) {
    throw Error(fmt::format("--train-fraction must be in (0, 1), got {}", c.train_fraction));
  }
}

}  // namespace

void TrainConfig::validate() const {
  check_input_flags(*this);
  check_schedule_flags(*this);
  check_dtype_flag(dtype);
  check_attention_math_flag(attention_math, device);
  bf16_storage_of(storage, dtype == "bf16", device == "cuda" ? Device::CUDA : Device::CPU);
  nn::GPTConfig m = model;
  m.vocab_size = std::max<int64_t>(m.vocab_size, 1);
  m.validate();
}

double learning_rate(const TrainConfig& c, int64_t iter, double seconds) {
  if (iter < c.warmup_iters) return c.lr * double(iter + 1) / double(c.warmup_iters + 1);
  // How far the decay has gone, 0 to 1: by the budget's seconds, or by the iterations after the warmup.
  double ratio = 1.0;
  if (c.time_budget > 0) {
    ratio = std::clamp(seconds / c.time_budget, 0.0, 1.0);
  } else if (iter < c.lr_decay_iters) {
    ratio = double(iter - c.warmup_iters) / double(c.lr_decay_iters - c.warmup_iters);
  }
  if (c.cooldown > 0) {  // warmup-stable-decay: the peak rate, then linear to min_lr over the last `cooldown`
    const double left = 1.0 - ratio;
    return left >= c.cooldown ? c.lr : c.min_lr + (left / c.cooldown) * (c.lr - c.min_lr);
  }
  return c.min_lr + 0.5 * (1.0 + std::cos(M_PI * ratio)) * (c.lr - c.min_lr);
}

Numerics NumericsFlags::over(const Numerics& checkpoint, Device device) const {
  Numerics n = checkpoint;
  if (!dtype.empty()) n.bf16 = dtype == "bf16";
  if (tf32) n.tf32 = *tf32;
  // --dtype or --tf32 / --no-tf32 given: attention's default follows them, unless --attention-math says otherwise.
  if (!dtype.empty() || tf32) n.attention = default_attention_math(n.bf16, n.tf32, device == Device::CUDA);
  if (!attention_math.empty()) n.attention = parse_attention_math(attention_math);
  n.bf16_storage = bf16_storage_of(storage, n.bf16, device, Work::Inference);
  n.flash = env::flash_variants();
  n.lt_epilogues = env::lt_epilogues();
  return n;
}

nlohmann::json flags_json(const TrainConfig& c, int world_size) {
  nlohmann::json j = {{"data", c.data},
                      {"tokenizer", c.tokenizer},
                      {"batch_size", c.batch_size},
                      {"max_iters", c.max_iters},
                      {"time_budget", c.time_budget},
                      {"lr", c.lr},
                      {"min_lr", c.min_lr},
                      {"warmup_iters", c.warmup_iters},
                      {"lr_decay_iters", c.lr_decay_iters},
                      {"weight_decay", c.weight_decay},
                      {"beta1", c.beta1},
                      {"beta2", c.beta2},
                      {"grad_clip", c.grad_clip},
                      {"optimizer", c.optimizer},
                      {"dtype", c.dtype},
                      {"storage", c.storage},
                      {"grad_accum", c.grad_accum},
                      {"eval_interval", c.eval_interval},
                      {"eval_iters", c.eval_iters},
                      {"train_fraction", c.train_fraction},
                      {"seed", std::to_string(c.seed)},
                      {"world_size", world_size}};
  if (c.optimizer == "muon") {
    j.update({{"muon_lr", c.muon_lr},
              {"muon_momentum", c.muon_momentum},
              {"muon_weight_decay", c.muon_weight_decay},
              {"muon_scale", c.muon_scale}});
  }
  if (c.cooldown > 0) j["cooldown"] = c.cooldown;
  if (!c.init_from.empty() || !c.fine_tuned_from.empty())
    j["init_from"] = c.init_from.empty() ? c.fine_tuned_from : c.init_from;
  if (c.sft) j["sft"] = true;
  if (c.lora.enabled())
    j["lora"] = {{"rank", c.lora.rank}, {"alpha", c.lora.alpha}, {"targets", nn::lora_targets_name(c.lora.targets)}};
  if (!c.chat_template.empty()) j["chat_template"] = c.chat_template;
  return j;
}

}  // namespace tinygpt

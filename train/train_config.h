// A training run's configuration (TrainConfig, the `train` and `sft` flags) and the policy over it: the flags'
// checks, the learning-rate schedule, the device, and the numerics a run computes with (numerics_of, and
// NumericsFlags for the commands that run a checkpoint). train_config.cpp holds them.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "../data/tokenizer.h"
#include "../nn/gpt.h"

namespace tinygpt {

/// A flag's value that the run itself finds wrong (it contradicts the checkpoint): the command answers it as a usage
/// error (exit 2), as it does the values the parser refuses.
struct UsageError : Error {
  using Error::Error;
};

struct TrainConfig {
  std::vector<std::string> data;   // text files, directories and globs (data/documents.h); each file a document
  std::string tokenizer = "char";  // char, bpe (trained on the training documents), or a tokenizer.json file
  int64_t vocab_size = 0;          // with tokenizer "bpe": its vocabulary (0: 4096)
  bool doc_mask = false;           // with a BPE: attention stays within documents (ended by <|endoftext|>)
  std::string init_from;           // a checkpoint whose weights and tokenizer the run starts from (fine-tuning)
  std::string fine_tuned_from;     // --resume of a run started with --init-from: that checkpoint (the run's record)
  bool sft = false;                // `tinygpt sft`: --data holds conversations (JSON lines), the loss on the replies
  std::string chat_template;       // sft: chatml, llama3 or a Jinja file (empty: the model's own, else ChatML)
  // --lora-rank: low-rank adapters on the --init-from model, which stays frozen (its weights as a base); rank 0: none.
  // On --resume the checkpoint's.
  nn::LoraConfig lora{};
  std::string out = "out";    // run directory: checkpoints, metrics.jsonl, token cache
  nn::GPTConfig model = [] {  // vocab_size comes from the data
    nn::GPTConfig m;
    m.dropout = 0.2;  // nanoGPT's shakespeare_char setting
    return m;
  }();
  int64_t batch_size = 64;
  int64_t max_iters = 5000;
  // > 0: train until this many seconds of training steps are spent (evaluations and checkpoints not counted), the
  // cosine decay following the fraction of the budget used; max_iters then only caps the iterations.
  double time_budget = 0;
  double lr = 1e-3;
  double min_lr = 1e-4;
  int64_t warmup_iters = 100;
  int64_t lr_decay_iters = 5000;
  // 0: cosine decay from lr to min_lr (nanoGPT). In (0, 1]: warmup-stable-decay, lr held and then decayed linearly to
  // min_lr over this last fraction of the decay (of the iterations to lr_decay_iters, or of the time budget).
  double cooldown = 0;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double grad_clip = 1.0;           // 0: no clipping
  std::string optimizer = "adamw";  // or "muon": Muon for the blocks' matrices, AdamW (the flags above) for the rest
  double muon_lr = 0.02;            // the matrices' peak rate; the schedule scales it as it scales lr
  double muon_momentum = 0.95;
  double muon_weight_decay = 0.0;
  std::string muon_scale = "original";  // or "match-adamw" (MuonScale)
  int64_t grad_accum = 1;
  double bucket_mb = 1.0;  // several CPU ranks: gradients reduced in buckets of this size as backward finishes them
  int64_t eval_interval = 250;
  int64_t eval_iters = 200;
  int64_t log_interval = 1;
  double train_fraction = 0.9;
  uint64_t seed = 1337;
  std::string device = "cpu";
  // fp32, or bf16 (autocast): matmul operands rounded to bf16, f32 accumulation; weights, gradients, optimizer state,
  // LayerNorm, softmax and the loss stay f32. On the GPU it also makes flash attention's operands bf16.
  std::string dtype = "fp32";
  bool tf32 = true;  // on the GPU: TF32 tensor cores for f32 matmuls (as nanoGPT); --no-tf32 for full f32
  // On one GPU: the step captured once as a CUDA graph and replayed, dropout included (--no-cuda-graphs: queued op
  // by op, the same work and results).
  bool cuda_graphs = true;
  std::string attention_math;  // on the GPU: flash attention's operands, f32, tf32 or bf16; empty: as dtype
  std::string storage;  // activations' storage, f32 or bf16 (with --dtype bf16); empty: bf16_storage_of's default
  bool resume = false;
  bool optimizer_given = true;  // false: --resume takes the checkpoint's optimizer (the CLI, without --optimizer)
  // Numerics flags given ("dtype", "attention_math", "storage", "tf32"): on resume they must match the checkpoint;
  // the others are taken from it.
  std::vector<std::string> numerics_flags_given{"dtype", "attention_math", "storage", "tf32"};
  bool quiet = false;                          // only the final summary and errors on stderr
  std::vector<std::string> model_flags_given;  // config keys set by flags ("n_embd", ...): on resume they must match

  /// Throws naming the first flag that is out of range or contradicts another.
  void validate() const;
  bool operator==(const TrainConfig&) const = default;
};

/// Device::CPU for "cpu", Device::CUDA for "cuda" when this build and machine have a GPU; else throws saying why.
Device parse_device(const std::string& device);

/// Gives the model the ids of its config's document separator in `vocab` (nothing without one); throws naming a
/// character of the separator that the vocabulary lacks.
void use_document_separator(nn::GPT& model, const data::Tokenizer& tokenizer);

/// Whether --init-from trains on a shorter context than the checkpoint's: --block-size given, at most the saved one,
/// and a model without a position table (rotary or relative positions: no weight depends on the block size).
bool shorter_context(const TrainConfig& cfg, const nn::GPTConfig& saved_config);
/// --init-from: throws a UsageError naming each model flag given (TrainConfig::model_flags_given) that contradicts the
/// checkpoint's config `saved` (a fine-tuned model is the checkpoint's model), or LoRA adapters that do not fit it.
void check_init_flags(const TrainConfig& cfg, const nn::GPTConfig& saved);
/// --resume: throws a UsageError naming each model or numerics flag given that contradicts the checkpoint (both
/// values); the command line answers it with exit 2.
struct Checkpoint;
void check_resume_flags(const TrainConfig& cfg, const Checkpoint& ckpt);

/// Throws unless `dtype` is fp32 or bf16, naming the flag.
void check_dtype_flag(const std::string& dtype);
/// AttentionMath for "f32", "tf32" or "bf16"; else throws naming the flag.
AttentionMath parse_attention_math(const std::string& math);
/// Throws unless --attention-math `math` is empty or valid and, when it asks for tf32, --device is cuda.
void check_attention_math_flag(const std::string& math, const std::string& device);
/// Flash attention's operands when --attention-math is not given: the matmuls' format where a kernel computes it
/// on matrix units. On a GPU with tensor cores (compute capability 8.0+) bf16 with --dtype bf16, tf32 with TF32
/// matmuls (the default: a faster training step than the f32 kernel, docs/RESULTS.md, "One GPU"), else f32. On the
/// CPU bf16 with --dtype bf16 where a bf16 unit runs it (AMX-BF16 or AVX512-BF16: cpu::bf16_kernel()), else f32: on
/// the f32 units the CPU would only round the operands, which slows attention down and buys nothing (docs/RESULTS.md,
/// "bf16 on the CPU"); --attention-math bf16 asks for it anyway.
AttentionMath default_attention_math(bool bf16, bool tf32, bool cuda);
/// The numerics a run computes with and its checkpoints record: --dtype's on every device, the attention operands
/// (--attention-math, else default_attention_math), and on the GPU the TF32 flag (the CPU has no TF32).
Numerics numerics_of(const TrainConfig& c);
/// What a model is run for: training (train, sft), or inference (sample, chat, serve, eval), whose decoding reads the
/// weights on a bf16 unit even where training's blocked products do better on the f32 units.
enum class Work : uint8_t { Training, Inference };
/// Whether activations are stored in bf16 (Numerics::bf16_storage): as --storage says ("f32" or "bf16"; bf16 needs
/// --dtype bf16); when it is not given, bf16 with bf16 products on the GPU and on a CPU whose blocked products run on
/// a bf16 unit (AMX-BF16 or AVX512-BF16: cpu::bf16_kernel), for inference also on any CPU with AVX512-BF16
/// (cpu::bf16_decode_unit), else f32. Throws naming the flag.
bool bf16_storage_of(const std::string& storage, bool bf16, Device device, Work work = Work::Training);
/// Throws before any work when `device` cannot compute with `numerics` (tensor-core attention and bf16 matmuls need
/// compute capability 8.0); `how` says which flag to change.
void check_numerics(const Numerics& numerics, Device device, const char* how);

/// nanoGPT's schedule: linear warmup to lr over warmup_iters, cosine decay to min_lr at lr_decay_iters,
/// min_lr after that. With a time budget the decay after the warmup follows `seconds / time_budget` (the training
/// steps' seconds so far) instead of the iterations, reaching min_lr when the budget is spent. With c.cooldown > 0
/// the decay is warmup-stable-decay instead: lr until the last `cooldown` fraction of the decay's span, then linear
/// to min_lr.
double learning_rate(const TrainConfig& c, int64_t iter, double seconds = 0);

/// The run's flags as its checkpoints record them (TrainState::train_config), with the number of ranks.
nlohmann::json flags_json(const TrainConfig& c, int world_size);

/// eval's and sample's --dtype, --tf32/--no-tf32 and --attention-math: unset, the checkpoint's numerics (what
/// training used).
struct NumericsFlags {
  std::string dtype;  // empty: the checkpoint's
  std::optional<bool> tf32;
  std::string attention_math;  // empty: the checkpoint's, or with --dtype that dtype's (default_attention_math)
  std::string storage;         // empty: the default (bf16_storage_of)
  bool operator==(const NumericsFlags&) const = default;
  /// The numerics an inference command runs a checkpoint with: the flags' over the checkpoint's, the storage
  /// bf16_storage_of's for Work::Inference.
  Numerics over(const Numerics& checkpoint, Device device) const;
};

}  // namespace tinygpt

#include "train/cli_train.h"

#include <fmt/core.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "train/checkpoint.h"

namespace tinygpt {

namespace fs = std::filesystem;

namespace {

/// A model flag and the config keys it sets (--arch sets several): given with --init-from or --resume, they must agree
/// with the checkpoint.
struct ModelFlag {
  const CLI::Option* option;
  std::vector<std::string> keys;
};

/// The model options of its shape: depth, widths, heads, context, dropout, biases.
void add_shape_options(CLI::App* cmd, nn::GPTConfig& m, std::vector<ModelFlag>& flags) {
  const auto keyed = [&flags](CLI::Option* option, std::vector<std::string> keys) {
    flags.push_back({option, std::move(keys)});
  };
  keyed(cmd->add_option("--n-layer", m.n_layer, "Transformer blocks")->capture_default_str(), {"n_layer"});
  keyed(cmd->add_option("--n-head", m.n_head, "Attention heads")->capture_default_str(), {"n_head"});
  keyed(cmd->add_option("--n-kv-head", m.n_kv_head, "Key/value heads (0: same as --n-head; fewer: grouped-query)")
            ->capture_default_str(),
        {"n_kv_head"});
  keyed(cmd->add_option("--n-embd", m.n_embd, "Embedding width")->capture_default_str(), {"n_embd"});
  keyed(cmd->add_option("--head-dim", m.head_dim,
                        "Each attention head's width (0: --n-embd / --n-head; else q, k and "
                        "v are --n-head heads this wide, as Qwen3's and Gemma's)")
            ->capture_default_str(),
        {"head_dim"});
  keyed(cmd->add_option("--block-size", m.block_size, "Context length in tokens")->capture_default_str(),
        {"block_size"});
  cmd->add_option("--dropout", m.dropout, "Dropout probability")->capture_default_str();
  keyed(add_switch(cmd, "bias", m.bias, "Biases in Linear and LayerNorm layers"), {"bias"});
}

/// The model options of attention: positions, windows, soft-caps, documents.
void add_attention_model_options(CLI::App* cmd, nn::GPTConfig& m, std::vector<ModelFlag>& flags) {
  const auto keyed = [&flags](CLI::Option* option, std::vector<std::string> keys) {
    flags.push_back({option, std::move(keys)});
  };
  std::vector<std::string> positions;
  for (const nn::Positions p : {nn::Positions::Learned, nn::Positions::Rope, nn::Positions::Relative,
                                nn::Positions::Alibi, nn::Positions::T5, nn::Positions::None}) {
    positions.emplace_back(nn::positions_name(p));
  }
  keyed(cmd->add_option_function<std::string>(
               "--pos", [&m](const std::string& name) { nn::parse_positions(name, m.pos); },
               "Positions: learned (a table added to the embeddings, GPT-2), rope (rotary), relative "
               "(Shaw's relative position tables), alibi (fixed linear bias per head), t5 (T5's learned bias over "
               "distance buckets) or none; the last four depend on distances only, so sampling runs past the block")
            ->check(CLI::IsMember(positions))
            ->default_str(nn::positions_name(m.pos)),
        {"pos"});
  keyed(cmd->add_flag_callback(
            "--rope", [&m] { m.pos = nn::Positions::Rope; }, "Same as --pos rope"),
        {"pos"});
  keyed(cmd->add_option("--max-relative-position", m.max_relative_position,
                        "With --pos relative: distances are clipped to [-M, M], 2M + 1 learned rows per layer")
            ->capture_default_str(),
        {"max_relative_position"});
  for (const nn::ScoreModifier& row : nn::score_modifiers()) {  // --window, --softcap, --doc-sep
    std::visit(
        [&](auto field) {
          CLI::Option* o = cmd->add_option(row.flag, m.*field, row.help);
          if constexpr (!std::is_same_v<std::decay_t<decltype(m.*field)>, std::string>) o->capture_default_str();
          keyed(o, {row.key});
        },
        row.field);
  }
}

/// The model options of the blocks' layers and the head: MLP, normalization, biases, the family preset.
void add_block_options(CLI::App* cmd, nn::GPTConfig& m, std::vector<ModelFlag>& flags) {
  const auto keyed = [&flags](CLI::Option* option, std::vector<std::string> keys) {
    flags.push_back({option, std::move(keys)});
  };
  keyed(cmd->add_option_function<std::string>(
               "--mlp", [&m](const std::string& name) { nn::parse_mlp(name, m.mlp); },
               "The MLP: gelu (GPT-2), relu2 (relu(x)^2, modded-nanogpt) or swiglu (the Llama "
               "family: silu(gate) * up, then down)")
            ->check(CLI::IsMember({"gelu", "relu2", "swiglu"}))
            ->default_str("gelu"),
        {"mlp"});
  keyed(cmd->add_option("--ffn-hidden", m.ffn_hidden,
                        "The MLP's inner width (0: 4 x --n-embd; swiglu: 8/3 x --n-embd rounded "
                        "up to a multiple of 64)")
            ->capture_default_str(),
        {"ffn_hidden"});
  keyed(cmd->add_option_function<std::string>(
               "--norm", [&m](const std::string& name) { nn::parse_norm(name, m.norm); },
               "The blocks' and the final normalization: layernorm (GPT-2) or rmsnorm (the "
               "Llama family; no bias)")
            ->check(CLI::IsMember({"layernorm", "rmsnorm"}))
            ->default_str("layernorm"),
        {"norm"});
  keyed(cmd->add_option("--norm-eps", m.norm_eps, "The normalization's epsilon")->capture_default_str(), {"norm_eps"});
  keyed(cmd->add_option("--rope-theta", m.rope_theta,
                        "With --pos rope: the base of the rotation frequencies (Llama 2 "
                        "10000, SmolLM2 100000, Llama 3 500000)")
            ->capture_default_str(),
        {"rope_theta"});
  keyed(add_switch(cmd, "qkv-bias", m.qkv_bias, "Biases in the q, k and v projections even without --bias (Qwen2)"),
        {"qkv_bias"});
  keyed(
      cmd->add_option_function<std::string>(
             "--arch",
             [&m](const std::string& name) {
               // The family's choices in one flag, set as it is parsed: the other model flags are applied after
               // parsing, so any of them given beside it changes its value.
               if (name == "llama") {
                 m.norm = nn::NormKind::RMSNorm, m.norm_eps = 1e-5, m.mlp = nn::MlpKind::SwiGLU,
                 m.pos = nn::Positions::Rope;
                 m.bias = false, m.untied_head = false;
               }
             },
             "gpt2 (the defaults) or llama: RMSNorm, a SwiGLU MLP, rotary positions, no biases (other model flags "
             "beside "
             "it change any of these; add --n-kv-head for grouped-query heads, --rope-theta, --untied-head as wanted)")
          ->check(CLI::IsMember({"gpt2", "llama"}))
          ->trigger_on_parse(),
      {"norm", "norm_eps", "mlp", "pos", "bias", "untied_head"});
  keyed(cmd->add_option("--logit-softcap", m.logit_softcap,
                        "Soft-cap the head's logits: x -> CAP tanh(x / CAP) (0: off; "
                        "modded-nanogpt uses 15 to 30)")
            ->capture_default_str(),
        {"logit_softcap"});
  keyed(cmd->add_flag("--zero-init-proj", m.zero_init_proj,
                      "Start the residual output projections (attn.c_proj, mlp.c_proj) "
                      "at zero"),
        {"zero_init_proj"});
  keyed(cmd->add_flag("--untied-head", m.untied_head,
                      "Give the head its own weight (lm_head.weight) instead of the token "
                      "embedding's"),
        {"untied_head"});
  keyed(cmd->add_flag("--qk-norm", m.qk_norm,
                      "QK-norm: LayerNorm each head's queries and keys (learned gains) before the "
                      "scores"),
        {"qk_norm"});
}

/// train's model options: the GPT's shape, positions, attention and MLP variants; each flag that sets a config key is
/// listed in `flags`.
void add_model_options(CLI::App* cmd, nn::GPTConfig& m, std::vector<ModelFlag>& flags) {
  add_shape_options(cmd, m, flags);
  add_attention_model_options(cmd, m, flags);
  add_block_options(cmd, m, flags);
}

/// train's options of where and in what precision it computes.
void add_numerics_options(CLI::App* cmd, TrainConfig& c) {
  cmd->add_option("--device", c.device, "cpu or cuda")->capture_default_str();
  cmd->add_option("--dtype", c.dtype,
                  "fp32, or bf16 as autocast computes it: the matmuls' operands rounded to bf16 "
                  "and their products summed in f32 (on the GPU on tensor cores, with bf16 flash attention); weights, "
                  "gradients, optimizer state, LayerNorm, softmax and the loss stay f32. On the CPU: on the bf16 unit "
                  "that does the most FLOPs a cycle, measured at start-up (AMX-BF16 tiles, or AVX512-BF16 as on AMD "
                  "Zen 4; TINYGPT_CPU_BF16 picks one), for flash attention's products too, else rounded for the f32 "
                  "units at fp32 speed (attention then stays f32; see --attention-math)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  add_switch(cmd, "tf32", c.tf32, "On the GPU, TF32 tensor cores for f32 matmuls");
  add_switch(cmd, "cuda-graphs", c.cuda_graphs,
             "On one GPU, capture the training step as a CUDA graph once and replay it "
             "(the same work and results as queueing it op by op, without the launch overhead)");
  cmd->add_option(
      "--attention-math", c.attention_math,
      "The operands of flash attention's products: f32, bf16 (f32 accumulation and softmax; on the GPU on "
      "tensor cores, on the CPU on its bf16 unit where it has one, else rounded for the f32 units), or "
      "on the GPU tf32 (default: bf16 with --dtype bf16 on the GPU and on CPUs with a bf16 unit; on the GPU "
      "tf32 with TF32 matmuls; else f32)");
  cmd->add_option("--storage", c.storage,
                  "How activations and their gradients are stored between ops: f32, or bf16 (half the bytes; each op "
                  "computes in f32 inside and rounds what it stores; weights, their gradients and the optimizer stay "
                  "f32, the layers reading bf16 copies written after each update). bf16 needs --dtype bf16; "
                  "attention reads q, k and v as stored, except with rope, QK-norm, score modifiers or "
                  "documents, which run on f32 copies (default: bf16 with --dtype bf16 on the GPU and on CPUs with "
                  "a bf16 unit, else f32)")
      ->check(CLI::IsMember({"f32", "bf16"}));
}

/// --lora-rank, --lora-alpha, --lora-targets; the targets' list is kept until apply_lora_flags reads it.
std::shared_ptr<std::string> add_lora_options(CLI::App* cmd, TrainConfig& c) {
  auto lora_targets = std::make_shared<std::string>("q,v");
  cmd->add_option(
         "--lora-rank", c.lora.rank,
         "LoRA: train low-rank adapters of this rank on the --init-from model, which "
         "stays frozen (0: off; checkpoints then hold only the adapters and name the base; --lr then defaults to 2e-4, "
         "--min-lr to 2e-5)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--lora-alpha", c.lora.alpha,
                  "LoRA: the adapters' outputs are scaled by alpha / rank (default: 2 x "
                  "--lora-rank)");
  cmd->add_option("--lora-targets", *lora_targets,
                  "LoRA: the layers adapted, of q, k, v, o (attention), gate, up, "
                  "down (MLP)")
      ->check([](const std::string& v) {
        try {
          nn::parse_lora_targets(v);
          return std::string();
        } catch (const Error& e) {
          return std::string(e.what());
        }
      })
      ->capture_default_str();
  return lora_targets;
}

/// After parsing: LoRA's defaults (PEFT's targets q,v, alpha 2 r, and an adapter's rate, B starting at zero).
void apply_lora_flags(const CLI::App& cmd, TrainConfig& c, const std::string& targets) {
  if (c.lora.rank > 0) {
    c.lora.targets = nn::parse_lora_targets(targets);
    if (cmd.count("--lora-alpha") == 0) c.lora.alpha = 2.0 * double(c.lora.rank);
    if (cmd.count("--lr") == 0) c.lr = 2e-4;
    if (cmd.count("--min-lr") == 0) c.min_lr = std::min(c.lr, 2e-5);
  } else if (cmd.count("--lora-alpha") > 0 || targets != "q,v") {
    throw CLI::ValidationError("--lora-alpha and --lora-targets need --lora-rank R");
  }
}

/// train's options of the learning-rate schedule and the optimizer.
void add_optimizer_options(CLI::App* cmd, TrainConfig& c) {
  cmd->add_option("--lr", c.lr, "Peak learning rate")->capture_default_str();
  cmd->add_option("--min-lr", c.min_lr, "Learning rate at the end of the cosine decay")->capture_default_str();
  cmd->add_option("--warmup-iters", c.warmup_iters, "Linear warmup iterations")->capture_default_str();
  cmd->add_option("--lr-decay-iters", c.lr_decay_iters, "Iteration where the cosine decay reaches --min-lr")
      ->capture_default_str();
  cmd->add_option("--cooldown", c.cooldown,
                  "0: cosine decay to --min-lr (nanoGPT); a fraction in (0, 1]: "
                  "warmup-stable-decay, --lr held, then linear to --min-lr over this last fraction of the decay "
                  "(of the iterations to --lr-decay-iters, or of --time-budget)")
      ->capture_default_str();
  cmd->add_option("--weight-decay", c.weight_decay, "AdamW weight decay (matrices and embeddings only)")
      ->capture_default_str();
  cmd->add_option("--beta1", c.beta1, "AdamW beta1")->capture_default_str();
  cmd->add_option("--beta2", c.beta2, "AdamW beta2")->capture_default_str();
  cmd->add_option("--optimizer", c.optimizer,
                  "adamw, or muon: Muon (orthogonalized momentum) for the blocks' weight "
                  "matrices and AdamW for embeddings, head, gains and biases")
      ->check(CLI::IsMember({"adamw", "muon"}))
      ->capture_default_str();
  cmd->add_option("--muon-lr", c.muon_lr, "With --optimizer muon: the matrices' peak rate (scheduled as --lr is)")
      ->capture_default_str();
  cmd->add_option("--muon-momentum", c.muon_momentum, "With --optimizer muon: Nesterov momentum")
      ->capture_default_str();
  cmd->add_option("--muon-weight-decay", c.muon_weight_decay,
                  "With --optimizer muon: decoupled weight decay of the "
                  "matrices")
      ->capture_default_str();
  cmd->add_option("--muon-scale", c.muon_scale,
                  "With --optimizer muon: the rate per matrix shape (out A, in B): "
                  "original sqrt(max(1, A/B)) or match-adamw 0.2 sqrt(max(A, B)) (AdamW's update size)")
      ->check(CLI::IsMember({"original", "match-adamw"}))
      ->capture_default_str();
  cmd->add_option("--grad-clip", c.grad_clip, "Clip the global gradient norm to this (0: off)")->capture_default_str();
  cmd->add_option("--grad-accum", c.grad_accum, "Micro-batches per optimizer step")->capture_default_str();
}

/// After parsing: LoRA's defaults, and which model, optimizer and numerics flags were given (on --resume or
/// --init-from they must agree with the checkpoint).
void record_flags_given(const CLI::App& cmd, TrainConfig& c, const std::vector<ModelFlag>& model_flags,
                        const std::string& lora_targets) {
  apply_lora_flags(cmd, c, lora_targets);
  c.model_flags_given.clear();
  for (const ModelFlag& f : model_flags) {
    if (f.option->count() == 0) continue;
    for (const std::string& key : f.keys) {
      if (std::ranges::count(c.model_flags_given, key) == 0) c.model_flags_given.push_back(key);
    }
  }
  c.optimizer_given = cmd.count("--optimizer") > 0;
  c.numerics_flags_given.clear();
  for (const auto& [flag, key] : {std::pair{"--dtype", "dtype"},
                                  {"--attention-math", "attention_math"},
                                  {"--storage", "storage"},
                                  {"--no-tf32", "tf32"}}) {
    if (cmd.count(flag) > 0) c.numerics_flags_given.emplace_back(key);
  }
  // A time budget ends the run; --max-iters still caps it when given, and only then.
  if (c.time_budget > 0 && cmd.count("--max-iters") == 0) c.max_iters = std::numeric_limits<int64_t>::max();
}

}  // namespace

void add_train_options(CLI::App& app, TrainConfig& c) {
  CLI::App* cmd = &app;
  cmd->add_option("--data", c.data,
                  "Text to train on: files, directories (walked; text files only) and globs, repeatable; "
                  "each file is a document")
      ->required()
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--tokenizer", c.tokenizer,
                  "char (one token per character of the data), bpe (a byte-level BPE trained "
                  "on the training documents first, saved as OUT/tokenizer.json), or a tokenizer.json file")
      ->capture_default_str();
  cmd->add_option("--vocab-size", c.vocab_size, "With --tokenizer bpe: its vocabulary, 257 to 65536 (default: 4096)");
  cmd->add_flag("--doc-mask", c.doc_mask,
                "With a BPE: attention stays within documents (each file is one, ended by "
                "<|endoftext|>)");
  cmd->add_option("--init-from", c.init_from,
                  "Fine-tune: start from this checkpoint's (or run directory's) weights and "
                  "tokenizer with a fresh optimizer and schedule");
  cmd->add_option("--out", c.out, "Run directory: checkpoints, metrics.jsonl, token cache")->capture_default_str();
  auto model_flags = std::make_shared<std::vector<ModelFlag>>();
  add_model_options(cmd, c.model, *model_flags);
  cmd->add_option("--batch-size", c.batch_size, "Sequences per micro-batch")->capture_default_str();
  cmd->add_option("--max-iters", c.max_iters, "Training iterations (with --time-budget: at most this many, if given)")
      ->capture_default_str();
  cmd->add_option("--time-budget", c.time_budget,
                  "Train for this many seconds of training steps (evaluations and "
                  "checkpoints not counted), the cosine decay following the fraction of the budget used; 0: off, "
                  "--max-iters and --lr-decay-iters decide")
      ->capture_default_str();
  add_optimizer_options(cmd, c);
  cmd->add_option("--bucket-mb", c.bucket_mb,
                  "Several ranks on CPUs: sum the gradients over the ranks in buckets of this "
                  "many MB as backward finishes them (0: all at once after backward)")
      ->capture_default_str();
  cmd->add_option("--eval-interval", c.eval_interval, "Iterations between evaluations and checkpoints")
      ->capture_default_str();
  cmd->add_option("--eval-iters", c.eval_iters, "Batches per evaluation of each split")->capture_default_str();
  cmd->add_option("--log-interval", c.log_interval, "Iterations between log lines (metrics.jsonl gets every one)")
      ->capture_default_str();
  cmd->add_option("--train-fraction", c.train_fraction,
                  "Leading fraction of the text used for training; the rest validates")
      ->capture_default_str();
  cmd->add_option("--seed", c.seed, "Random seed (weights, batches, dropout)")->capture_default_str();
  add_numerics_options(cmd, c);
  const std::shared_ptr<std::string> lora_targets = add_lora_options(cmd, c);
  cmd->add_flag("--resume", c.resume, "Continue the run in --out from its latest checkpoint");
  cmd->add_flag("--quiet", c.quiet, "Print only the final summary and errors (metrics.jsonl still gets everything)");
  // After parsing: which flags were given (on --resume or --init-from they must agree with the checkpoint).
  cmd->final_callback(
      [cmd, &c, model_flags, lora_targets] { record_flags_given(*cmd, c, *model_flags, *lora_targets); });
}

}  // namespace tinygpt

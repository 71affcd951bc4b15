#include "train/cli_inspect.h"

#include <fmt/core.h>

#include <optional>

#include "data/text.h"
#include "train/memory.h"
#include "train/plots.h"
#include "train/run_dir.h"

namespace tinygpt {

namespace fs = std::filesystem;

/// The position scheme and attention options of a model, for `info`: "relative positions (m = 16), window 64".
std::string describe_attention(const nn::GPTConfig& c) {
  std::string s = c.pos == nn::Positions::Rope ? "RoPE"
                  : c.pos == nn::Positions::Relative
                      ? fmt::format("relative positions (clipped at {})", c.max_relative_position)
                  : c.pos == nn::Positions::Alibi ? "ALiBi"
                  : c.pos == nn::Positions::T5    ? "T5 relative bias"
                  : c.pos == nn::Positions::None  ? "no positions"
                                                  : "learned positions";
  for (const nn::ScoreModifier& m : nn::score_modifiers()) {
    if (nn::modifier_on(m, c)) s += ", " + nn::describe_modifier(m, c);
  }
  if (c.mlp == nn::MlpKind::Relu2) s += ", relu^2 MLP";
  if (c.mlp == nn::MlpKind::SwiGLU) s += fmt::format(", SwiGLU MLP ({} wide)", c.ffn_width());
  if (c.mlp != nn::MlpKind::SwiGLU && c.ffn_hidden > 0) s += fmt::format(", MLP {} wide", c.ffn_hidden);
  if (c.norm == nn::NormKind::RMSNorm) s += fmt::format(", RMSNorm (eps {:g})", c.norm_eps);
  if (c.pos == nn::Positions::Rope && c.rope_theta != 10000.0) s += fmt::format(", RoPE theta {:g}", c.rope_theta);
  if (c.pos == nn::Positions::Rope && c.rope_scaling.factor != 1.0) {
    s += fmt::format(" scaled as Llama 3's (factor {:g} from a context of {:g})", c.rope_scaling.factor,
                     c.rope_scaling.original_context);
  }
  if (c.qkv_bias && !c.bias) s += ", q/k/v biases";
  if (c.logit_softcap > 0) s += fmt::format(", logits soft-capped at {}", c.logit_softcap);
  if (c.zero_init_proj) s += ", output projections initialized to zero";
  if (c.untied_head) s += ", untied head";
  if (c.qk_norm) s += ", QK-norm";
  return s;
}

void add_info_options(CLI::App& cmd, std::string& ckpt) {
  cmd.add_option("--ckpt", ckpt, "Checkpoint file, or a run directory (its best checkpoint, else its latest)")
      ->required();
}

void run_info(const std::string& path) {
  const Checkpoint ckpt = load_checkpoint(path);
  int64_t params = 0, positions = 0;  // counted from the saved weights (the optimizer's moments left out)
  for (const auto& [name, t] : ckpt.contents.tensors) {
    if (name.rfind("optimizer.", 0) == 0) continue;
    params += t.numel();
    if (name == "transformer.wpe.weight") positions = t.numel();
  }
  const auto& c = ckpt.config;
  fmt::print("checkpoint     {}\n", ckpt.path.string());
  fmt::print(
      "model          {} layers, {} heads ({} key/value{}), {} wide, block {}, vocabulary {} ({}), bias {}, {}\n",
      c.n_layer, c.n_head, c.n_kv_head > 0 ? c.n_kv_head : c.n_head,
      c.head_dim > 0 ? fmt::format("; {} wide each", c.head_dim) : "", c.n_embd, c.block_size, c.vocab_size,
      ckpt.tokenizer.vocab_size() < c.vocab_size
          ? fmt::format("{}, {} tokens and {} rows of padding", ckpt.tokenizer.kind(), ckpt.tokenizer.vocab_size(),
                        c.vocab_size - ckpt.tokenizer.vocab_size())
          : ckpt.tokenizer.kind(),
      c.bias ? "on" : "off", describe_attention(c));
  if (positions > 0) {
    fmt::print("parameters     {} ({:.2f}M without the position table)\n", params, double(params - positions) / 1e6);
  } else {
    fmt::print("parameters     {} ({:.2f}M)\n", params, double(params) / 1e6);
  }
  if (ckpt.merged_lora.enabled()) {
    const nn::LoraConfig& l = ckpt.merged_lora;
    fmt::print("LoRA           rank {}, alpha {:g}, on {}: the file holds the adapters, merged here into the base {}\n",
               l.rank, l.alpha, nn::lora_targets_name(l.targets), ckpt.state.lora_base.path);
  }
  fmt::print("iteration      {}\n", ckpt.state.iter);
  fmt::print("best val loss  {:.4f}\n", ckpt.state.best_val_loss);
  fmt::print("numerics       {}, {} attention operands; on the GPU: {} matmuls\n",
             ckpt.numerics.bf16 ? "bf16 matmul operands (--dtype bf16)" : "fp32",
             attention_math_name(ckpt.numerics.attention), matmul_math_name(ckpt.numerics.matmul()));
  const nlohmann::json& flags = ckpt.state.train_config;
  const int64_t batch = flags.is_object() && flags.contains("batch_size") && flags["batch_size"].is_number_integer()
                            ? flags["batch_size"].get<int64_t>()
                            : 64;
  // As training on this machine's CPU would store activations: the run's --storage, else the CPU's default for its
  // --dtype (bf16 with --dtype bf16 on AMX; older checkpoints recorded no --storage; a GPU run that took the GPU's
  // default recorded none either, so its figure is the CPU's).
  const std::string storage = flags.is_object() ? flags.value("storage", std::string()) : std::string();
  bool storage_bf16 = false;
  try {
    storage_bf16 = bf16_storage_of(storage, ckpt.numerics.bf16, Device::CPU);
  } catch (const Error&) {  // a value this version does not know: count f32
  }
  fmt::print("memory         training at batch {}: about {}; sampling: about {}\n", batch,
             describe(training_memory(c, batch, ckpt.optimizer == "muon", storage_bf16)),
             describe(inference_memory(c, 1)));
  fmt::print(
      "optimizer      {}\n",
      ckpt.optimizer_step > 0
          ? fmt::format("{}, {} steps", ckpt.optimizer == "muon" ? "Muon and AdamW" : "AdamW", ckpt.optimizer_step)
          : "none saved");
  std::optional<MetricsRow> last_eval;  // the last line with an evaluation's numbers
  for (MetricsRow& r : read_metrics(ckpt.path.parent_path() / "metrics.jsonl")) {
    if (r.val_loss && r.train_loss) last_eval = std::move(r);
  }
  if (last_eval) {
    fmt::print("last eval      iteration {}: train loss {:.4f}, val loss {:.4f}{}\n", last_eval->iter,
               *last_eval->train_loss, *last_eval->val_loss,
               last_eval->val_bpb ? fmt::format(" ({:.4f} bits per byte)", *last_eval->val_bpb) : "");
  }
  fmt::print("training flags {}\n", ckpt.state.train_config.dump());
}

void run_attention(const AttentionArgs& a) {
  const Checkpoint ckpt = load_checkpoint(a.ckpt);
  const auto model = model_from(ckpt);
  if (a.text.empty()) throw Error("--text is empty: give the text to look at");
  const std::vector<int32_t> ids = encode_flag_text(ckpt.tokenizer, a.text, "--text");
  if (int64_t(ids.size()) > ckpt.config.block_size) {
    throw Error(
        fmt::format("--text is {} tokens, more than the model's block size {}", ids.size(), ckpt.config.block_size));
  }
  std::vector<std::string> tokens;
  for (const int32_t id : ids) tokens.push_back(ckpt.tokenizer.token_bytes(uint32_t(id)));
  const Tensor w = model->attention_weights(from_vector(ids, {1, int64_t(ids.size())}), a.layer);  // (1, NH, T, T)
  std::vector<int64_t> heads = a.heads;
  if (heads.empty()) {
    for (int64_t h = 0; h < ckpt.config.n_head; ++h) heads.push_back(h);
  }
  data::write_text_file(a.out, attention_svg(reshape(w, {w.size(1), w.size(2), w.size(3)}), tokens, a.layer, heads));
  fmt::print(stderr, "wrote {} (layer {}, {} head{})\n", a.out, a.layer, heads.size(), heads.size() == 1 ? "" : "s");
}

void validate_attention(const AttentionArgs& a) {
  if (a.layer < 0) throw Error(fmt::format("--layer must not be negative, got {}", a.layer));
  for (const int64_t h : a.heads) {
    if (h < 0) throw Error(fmt::format("--head must not be negative, got {}", h));
  }
}

void add_attention_options(CLI::App& cmd, AttentionArgs& a) {
  cmd.add_option("--ckpt", a.ckpt, "Checkpoint file, or a run directory")->required();
  cmd.add_option("--text", a.text, "Characters to run through the model (at most block_size)")->required();
  cmd.add_option("--layer", a.layer, "Block whose attention to draw (0 = first)")->capture_default_str();
  cmd.add_option("--head", a.heads, "Head(s) to draw, repeatable (default: all)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd.add_option("--out", a.out, "SVG file to write")->capture_default_str();
}

void add_plot_options(CLI::App& cmd, PlotArgs& a) {
  cmd.add_option("--run", a.run, "Run directory (its metrics.jsonl)")->required();
  cmd.add_option("--out", a.out, "SVG file to write")->capture_default_str();
}

void run_plot(const PlotArgs& a) {
  data::write_text_file(a.out, loss_curves_svg(fs::path(a.run) / "metrics.jsonl"));
  fmt::print(stderr, "wrote {}\n", a.out);
}

}  // namespace tinygpt

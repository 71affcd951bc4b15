// GPT as nanoGPT builds it: token (+ learned position) embeddings or another position scheme (Positions), N
// pre-LayerNorm transformer blocks of causal self-attention and a 4x GELU MLP, a final LayerNorm, and an LM head tied
// to the token embedding. The Llama family is the same model with other values of its config: RMSNorm, a SwiGLU MLP of
// its own width, rotary positions with their base, grouped-query heads, q/k/v biases (Qwen2), an untied head. Parameter
// names are nanoGPT's ("transformer.wte.weight", "transformer.h.0.attn.c_attn.weight", ...), so weights move between
// the two by name; train/import_hf.cpp and export.cpp map them to Hugging Face's.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "attention.h"
#include "layers.h"

namespace tinygpt::nn {

/// How the model knows where a token is: a learned table added to the token embeddings (GPT-2), rotary
/// embeddings of q and k, or a term of the attention scores inside the kernels (Shaw's relative positions, ALiBi,
/// T5's bucketed bias); or not at all (the causal mask alone). The last four depend on distances only, so such a
/// model runs on sequences longer than its block size.
enum class Positions : uint8_t { Learned, Rope, Relative, Alibi, T5, None };

/// "learned", "rope", "relative", "alibi", "t5", "none".
const char* positions_name(Positions p);
/// The Positions named `name`; false for any other name.
bool parse_positions(std::string_view name, Positions& p);

/// The MLP: GELU (GPT-2), relu(x)^2 (modded-nanogpt), or SwiGLU (the Llama family: down(silu(gate(x)) * up(x)),
/// gate and up one fused product, c_fc's rows [gate; up]).
enum class MlpKind : uint8_t { Gelu, Relu2, SwiGLU };

/// "gelu", "relu2", "swiglu"; parse_mlp: false for any other name.
const char* mlp_name(MlpKind m);
bool parse_mlp(std::string_view name, MlpKind& m);
/// "layernorm", "rmsnorm"; parse_norm: false for any other name.
const char* norm_name(NormKind n);
bool parse_norm(std::string_view name, NormKind& n);

/// LoRA's targets: the linear layers (or, in the fused ones, the rows) that get adapters: q, k and v (rows of
/// attn.c_attn), o (attn.c_proj), gate and up (rows of mlp.c_fc with SwiGLU; without, c_fc is "up"), down (mlp.c_proj).
enum LoraTarget : uint32_t {
  kLoraQ = 1,
  kLoraK = 2,
  kLoraV = 4,
  kLoraO = 8,
  kLoraGate = 16,
  kLoraUp = 32,
  kLoraDown = 64
};
/// The targets as "q,k,v,o,gate,up,down" lists them (in that order).
std::string lora_targets_name(uint32_t targets);
/// The bits of a comma-separated list of target names; throws naming an unknown one.
uint32_t parse_lora_targets(std::string_view list);

/// Low-rank adapters on chosen linear layers; the rest of the model is frozen (nothing trains it).
struct LoraConfig {
  int64_t rank = 0;      // 0: none
  double alpha = 0;      // the adapters' outputs scaled by alpha / rank
  uint32_t targets = 0;  // LoraTarget bits
  bool enabled() const { return rank > 0; }
  double scale() const { return alpha / double(rank); }
  bool operator==(const LoraConfig&) const = default;
};

/// Where one block's adapters go: the linear layer (its name within the block) and its rows.
struct LoraSite {
  const char* linear;  // "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"
  const char* target;  // "q", "k", ...: the parameters are "<linear>.lora_<target>_A" and "_B"
  int64_t first, rows, in;
};

/// Whether a parameter name is a LoRA adapter's ("...lora_q_A").
bool is_lora_parameter(std::string_view name);

struct GPTConfig {
  int64_t vocab_size = 0;
  int64_t block_size = 256;  // longest context
  int64_t n_layer = 6;
  int64_t n_head = 6;
  int64_t n_kv_head = 0;  // 0: n_head (plain multi-head); fewer: grouped-query attention
  int64_t n_embd = 384;
  int64_t head_dim = 0;   // each head's width; 0: n_embd / n_head (else q, k, v are n_head x it, as Qwen3's, Gemma's)
  double dropout = 0.0;   // embeddings, attention weights, residual branches (training mode only)
  bool bias = false;      // biases in Linear and LayerNorm layers
  bool qkv_bias = false;  // biases in the q, k and v projections even without `bias` (Qwen2)
  NormKind norm = NormKind::LayerNorm;
  double norm_eps = 1e-5;
  MlpKind mlp = MlpKind::Gelu;
  int64_t ffn_hidden = 0;       // the MLP's inner width; 0: ffn_width()'s default
  double rope_theta = 10000.0;  // pos rope: the base of the rotation frequencies
  RopeScaling rope_scaling{};   // pos rope: Llama 3's rescaling of them (factor 1: none; kernels/rope_freqs.h)
  Positions pos = Positions::Learned;
  int64_t max_relative_position = 16;  // pos relative: distances clipped to [-m, m]
  int64_t window = 0;                  // > 0: sliding-window attention over the last `window` positions
  double attn_softcap = 0;             // > 0: attention logits soft-capped to (-attn_softcap, attn_softcap)
  std::string doc_separator = {};      // packed documents: the text ending one; attention stays within (empty: none)
  // Modern small-GPT options (modded-nanogpt's speedrun), all off by default:
  double logit_softcap = 0;     // > 0: the head's logits soft-capped, cap * tanh(logits / cap)
  bool zero_init_proj = false;  // the residual output projections (attn.c_proj, mlp.c_proj) start at zero
  bool untied_head = false;     // the head has its own weight, lm_head.weight (vocab_size, n_embd), not wte's
  bool qk_norm = false;         // QK-norm: queries and keys LayerNorm'd per head (attn.q_norm, attn.k_norm)
  LoraConfig lora{};            // LoRA adapters (train/sft --lora-rank), in every block
  static constexpr int32_t kT5Buckets = 32, kT5MaxDistance = 128;  // pos t5: T5's defaults

  /// The MLP's inner width: ffn_hidden, else 4 n_embd (SwiGLU: 8/3 n_embd rounded up to a multiple of 64, about the
  /// parameters of a 4x GELU MLP).
  int64_t ffn_width() const;
  /// Each head's width: head_dim, else n_embd / n_head.
  int64_t head_size() const { return head_dim > 0 ? head_dim : n_embd / n_head; }
  /// Whether positions enter only through distances (relative, alibi, t5, none): no table bounds the length.
  bool relative_positions() const { return pos != Positions::Learned && pos != Positions::Rope; }

  /// The attention's score modifiers this config asks for (pos, window, attn_softcap): what every layer's
  /// MultiHeadAttentionConfig::mods holds.
  ScoreModSettings score_mods() const;
  /// Each block's LoRA adapters, in row order within each linear layer (none without LoRA).
  std::vector<LoraSite> lora_sites() const;
  /// Throws an Error naming the first field that is out of range or inconsistent.
  void validate() const;
  bool operator==(const GPTConfig&) const = default;
};

/// The attention's score modifiers as a model's config holds them (beside the position scheme, --pos), one row each:
/// the one list that the command line (train/cli_train.cpp), the checkpoint's metadata, `info` (describe_attention)
/// and every export's refusals read, and GPTConfig::score_mods() maps into the kernels' settings. A new modifier adds
/// a GPTConfig field and a row here, its settings field and math in kernels/score_mods.h (docs/DESIGN.md's recipe).
struct ScoreModifier {
  const char* key;   // the GPTConfig field's name: the checkpoint's key, and what --init-from's checks name
  const char* flag;  // the command line's option, "--window"
  const char* help;
  const char* what;    // what it is, for an export that cannot hold it: "sliding-window attention"
  const char* set_by;  // the flags that set it, for the same: "--window"
  const char* info;    // `info`'s words, {} standing for the value: "window {}"
  std::variant<int64_t GPTConfig::*, double GPTConfig::*, std::string GPTConfig::*> field;        // off: 0 or empty
  std::variant<std::monostate, int64_t ScoreModSettings::*, double ScoreModSettings::*> setting;  // the kernels'
};
inline std::span<const ScoreModifier> score_modifiers() {
  static const ScoreModifier rows[] = {
      {"window", "--window", "Sliding-window attention: each position sees the last W (0: the whole block)",
       "sliding-window attention", "--window", "window {}", &GPTConfig::window, &ScoreModSettings::window},
      {"attn_softcap", "--softcap", "Soft-cap attention logits: x -> CAP tanh(x / CAP) (0: off; Gemma 2 uses 50)",
       "soft-capped attention logits", "--softcap", "soft-cap {}", &GPTConfig::attn_softcap,
       &ScoreModSettings::softcap},
      {"doc_separator", "--doc-sep",
       "Packed documents: the text that ends one (e.g. $'\\n\\n'); attention stays within a document, and sampling "
       "starts a fresh context after it (default: none)",
       "attention kept within documents", "--doc-sep or --doc-mask", "documents", &GPTConfig::doc_separator,
       std::monostate{}},
  };
  return rows;
}

/// Whether the row's modifier is on in c (its field nonzero or not empty).
bool modifier_on(const ScoreModifier& m, const GPTConfig& c);
/// `info`'s words for the row's modifier in c: m.info with c's value.
std::string describe_modifier(const ScoreModifier& m, const GPTConfig& c);

/// relu(x)^2, the MLP activation of relu2 (composed of gradient-checked ops: relu, then the product with itself).
Tensor relu_squared(const Tensor& x);
/// cap * tanh(x / cap): x soft-capped to (-cap, cap), the head's logits with logit_softcap.
Tensor soft_cap(const Tensor& x, double cap);

/// Linear H -> GELU (or relu^2) -> Linear C; SwiGLU: Linear 2H (gate and up) -> silu(gate) * up -> Linear C.
class MLP : public Module {
 public:
  MLP(const GPTConfig& c, Generator& gen);
  Tensor forward(const Tensor& x) const;

  Linear c_fc, c_proj;

 private:
  MlpKind kind_;
};

/// The keys and values of every layer for the positions seen so far, for incremental decoding.
struct KVCache {
  std::vector<Tensor> k, v;  // per layer (B, capacity, NKV * E)
  int64_t len = 0;           // positions filled
  int64_t capacity() const { return k.empty() ? 0 : k[0].size(1); }
};

/// x + attn(ln_1(x)), then x + mlp(ln_2(x)) (GPT::forward runs the same math with the adds fused into the norms).
class Block : public Module {
 public:
  Block(const GPTConfig& c, Generator& gen);
  Tensor forward(const Tensor& x, Generator& gen, const Tensor& doc_ids = {}) const;
  /// Inference for new positions [cache.len, cache.len + T) given the cached earlier ones; writes this
  /// layer's keys and values into cache.k[layer], cache.v[layer].
  Tensor forward_cached(const Tensor& x, KVCache& cache, size_t layer) const;
  /// The linear layer called `name` within the block ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj").
  Linear& linear(std::string_view name);

  LayerNorm ln_1;
  MultiHeadAttention attn;
  LayerNorm ln_2;
  MLP mlp;

 private:
  double dropout_;
};

class GPT : public Module {
 public:
  explicit GPT(const GPTConfig& config, Generator& gen = default_generator());

  /// ids (B, T) i32 -> logits (B, T, vocab_size), or with Logits::Last those of the last position alone (B, 1,
  /// vocab_size). With targets (B, T), also the mean cross-entropy (targets of -1 are ignored). With a document
  /// separator, attention stays within each document.
  struct Output {
    Tensor logits;
    Tensor loss;
  };
  enum class Logits : uint8_t { All, Last };
  Output forward(const Tensor& ids, const Tensor& targets = {}, Logits logits = Logits::All) const;

  /// Inference: logits (B, vocab_size) of the last position, computing the whole context.
  Tensor last_logits(const Tensor& ids) const;

  /// Inference: the causal attention weights (B, n_head, T, T) of block `layer` for ids (B, T).
  Tensor attention_weights(const Tensor& ids, int64_t layer) const;

  /// An empty cache for `batch` sequences of up to `capacity` positions (0: block_size; at most block_size): a
  /// sample of a few hundred tokens from a model of a 131,072-token context holds what it uses, not gigabytes.
  KVCache make_cache(int64_t batch, int64_t capacity = 0) const;
  /// Inference: appends ids (B, T) at positions [cache.len, cache.len + T) and returns the logits
  /// (B, vocab_size) of the last one. Only the new positions are computed; earlier ones come from the cache.
  Tensor forward_cached(const Tensor& ids, KVCache& cache) const;
  /// Drops the oldest n positions of the cache, keeping the others' keys and values (a sliding cache, for models
  /// with relative positions only: their cached keys do not depend on where the cache starts).
  void slide_cache(KVCache& cache, int64_t n) const;

  const GPTConfig& config() const { return config_; }
  /// The ids of config().doc_separator in the data's vocabulary: from then on forward() keeps attention within
  /// the documents they delimit (a separator belongs to the document it ends).
  void set_document_separator(std::vector<int32_t> ids) { doc_separator_ = std::move(ids); }
  /// The document of each position of ids (B, T) under the separator (an undefined tensor without one).
  Tensor document_ids(const Tensor& ids) const;
  /// Whether `context` ends with the document separator (so the next token starts a new document).
  bool ends_document(const std::vector<int32_t>& context) const;
  /// Parameters without the position table, as nanoGPT counts them.
  int64_t num_parameters_non_embedding() const;

  Embedding wte;
  std::unique_ptr<Embedding> wpe;  // with learned positions only
  std::vector<std::unique_ptr<Block>> h;
  LayerNorm ln_f;
  std::unique_ptr<Linear> lm_head;  // weight (vocab_size, n_embd), no bias; with untied_head only (else wte.weight)

 private:
  /// The head: logits (..., vocab_size) of hidden states (..., n_embd), through the tied token embedding (or
  /// lm_head), soft-capped with logit_softcap.
  Tensor head(const Tensor& x) const;
  /// Token plus position embeddings of ids (B, T) at positions [pos0, pos0 + T), after checking both.
  Tensor embed(const Tensor& ids, int64_t pos0) const;
  /// Position ids [pos0, pos0 + T) on `device`; from position 0 on the GPU the last ones are kept (positions_), so a
  /// training step uploads nothing (and can be captured as a CUDA graph).
  Tensor position_ids(int64_t pos0, int64_t T, Device device) const;

  GPTConfig config_;
  mutable Tensor positions_;  // the GPU's position ids from 0 of the last length asked for
  Generator* gen_;            // dropout masks
  std::vector<int32_t> doc_separator_;
};

}  // namespace tinygpt::nn

#include "nn/gpt.h"

#include <algorithm>
#include <cmath>
#include <tuple>

namespace tinygpt::nn {

bool modifier_on(const ScoreModifier& m, const GPTConfig& c) {
  return std::visit(
      [&c](auto field) {
        const auto& v = c.*field;
        if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::string>) {
          return !v.empty();
        } else {
          return v != 0;
        }
      },
      m.field);
}

std::string describe_modifier(const ScoreModifier& m, const GPTConfig& c) {
  return std::visit([&](auto field) { return fmt::format(fmt::runtime(m.info), c.*field); }, m.field);
}

ScoreModSettings GPTConfig::score_mods() const {
  ScoreModSettings m;
  if (pos == Positions::Relative) m.max_rel = max_relative_position;
  m.alibi = pos == Positions::Alibi;
  if (pos == Positions::T5) m.t5_buckets = kT5Buckets, m.t5_max_distance = kT5MaxDistance;
  for (const ScoreModifier& row : score_modifiers()) {
    std::visit(
        [&](auto field, auto setting) {
          using Field = std::decay_t<decltype(this->*field)>;
          if constexpr (!std::is_same_v<decltype(setting), std::monostate>) {
            using Setting = std::decay_t<decltype(m.*setting)>;
            if constexpr (std::is_same_v<Field, Setting>) {
              m.*setting = this->*field;
            } else {
              throw Error(fmt::format("score_modifiers: the row of {} sets a setting of another type", row.key));
            }
          }
        },
        row.field, row.setting);
  }
  return m;
}

namespace {

MultiHeadAttentionConfig attention_config(const GPTConfig& c) {
  MultiHeadAttentionConfig a;
  a.embed_dim = c.n_embd;
  a.num_heads = c.n_head;
  a.num_kv_heads = c.n_kv_head;
  a.head_dim = c.head_size();
  a.bias = c.bias || c.qkv_bias;
  a.out_bias = c.bias;
  a.rope_freqs = RopeFreqs(c.rope_theta, c.rope_scaling);
  a.dropout = c.dropout;
  a.rope = c.pos == Positions::Rope;
  a.proj_init_std = c.zero_init_proj ? 0.0 : kInitStd / std::sqrt(2.0 * double(c.n_layer));
  a.mods = c.score_mods();
  a.qk_norm = c.qk_norm;
  return a;
}

constexpr std::pair<MlpKind, const char*> kMlpNames[] = {
    {MlpKind::Gelu, "gelu"}, {MlpKind::Relu2, "relu2"}, {MlpKind::SwiGLU, "swiglu"}};
constexpr std::pair<NormKind, const char*> kNormNames[] = {{NormKind::LayerNorm, "layernorm"},
                                                           {NormKind::RMSNorm, "rmsnorm"}};

template <class E, size_t N>
const char* name_of(const std::pair<E, const char*> (&names)[N], E value) {
  for (const auto& [v, name] : names) {
    if (v == value) return name;
  }
  return "?";
}

template <class E, size_t N>
bool parse_name(const std::pair<E, const char*> (&names)[N], std::string_view name, E& value) {
  for (const auto& [v, n] : names) {
    if (name == n) {
      value = v;
      return true;
    }
  }
  return false;
}

constexpr std::pair<Positions, const char*> kPositionNames[] = {
    {Positions::Learned, "learned"}, {Positions::Rope, "rope"}, {Positions::Relative, "relative"},
    {Positions::Alibi, "alibi"},     {Positions::T5, "t5"},     {Positions::None, "none"}};

/// Positions [pos0, pos0 + T) as i32 ids.
Tensor positions(int64_t pos0, int64_t T) {
  std::vector<int32_t> p(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) p[size_t(t)] = int32_t(pos0 + t);
  return from_vector(p, {T});
}

}  // namespace

const char* positions_name(Positions p) { return name_of(kPositionNames, p); }
bool parse_positions(std::string_view name, Positions& p) { return parse_name(kPositionNames, name, p); }
const char* mlp_name(MlpKind m) { return name_of(kMlpNames, m); }
bool parse_mlp(std::string_view name, MlpKind& m) { return parse_name(kMlpNames, name, m); }
const char* norm_name(NormKind n) { return name_of(kNormNames, n); }
bool parse_norm(std::string_view name, NormKind& n) { return parse_name(kNormNames, name, n); }

namespace {

constexpr std::pair<LoraTarget, const char*> kLoraTargetNames[] = {
    {kLoraQ, "q"},       {kLoraK, "k"},   {kLoraV, "v"},      {kLoraO, "o"},
    {kLoraGate, "gate"}, {kLoraUp, "up"}, {kLoraDown, "down"}};

}  // namespace

std::string lora_targets_name(uint32_t targets) {
  std::string out;
  for (const auto& [bit, name] : kLoraTargetNames) {
    if (!(targets & bit)) continue;
    if (!out.empty()) out += ',';
    out += name;
  }
  return out;
}

uint32_t parse_lora_targets(std::string_view list) {
  uint32_t targets = 0;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    const std::string_view name = list.substr(start, comma - start);
    LoraTarget bit{};
    if (!parse_name(kLoraTargetNames, name, bit)) {
      throw Error(fmt::format("LoRA target '{}' is not one of q, k, v, o, gate, up, down", name));
    }
    targets |= bit;
    start = comma + 1;
  }
  return targets;
}

bool is_lora_parameter(std::string_view name) {
  const size_t dot = name.rfind('.');
  const std::string_view last = dot == std::string_view::npos ? name : name.substr(dot + 1);
  return last.starts_with("lora_") && (last.ends_with("_A") || last.ends_with("_B"));
}

std::vector<LoraSite> GPTConfig::lora_sites() const {
  std::vector<LoraSite> sites;
  if (!lora.enabled()) return sites;
  const int64_t E = head_size(), NH = n_head, NKV = n_kv_head > 0 ? n_kv_head : n_head, H = ffn_width();
  auto add = [&](uint32_t bit, const char* linear, const char* target, int64_t first, int64_t rows, int64_t in) {
    if (lora.targets & bit) sites.push_back({linear, target, first, rows, in});
  };
  add(kLoraQ, "attn.c_attn", "q", 0, NH * E, n_embd);
  add(kLoraK, "attn.c_attn", "k", NH * E, NKV * E, n_embd);
  add(kLoraV, "attn.c_attn", "v", (NH + NKV) * E, NKV * E, n_embd);
  add(kLoraO, "attn.c_proj", "o", 0, n_embd, NH * E);
  if (mlp == MlpKind::SwiGLU) add(kLoraGate, "mlp.c_fc", "gate", 0, H, n_embd);
  add(kLoraUp, "mlp.c_fc", "up", mlp == MlpKind::SwiGLU ? H : 0, H, n_embd);
  add(kLoraDown, "mlp.c_proj", "down", 0, n_embd, H);
  return sites;
}

int64_t GPTConfig::ffn_width() const {
  if (ffn_hidden > 0) return ffn_hidden;
  return mlp == MlpKind::SwiGLU ? (8 * n_embd / 3 + 63) / 64 * 64 : 4 * n_embd;
}

void GPTConfig::validate() const {
  auto positive = [](const char* name, int64_t v) {
    if (v <= 0) throw Error(fmt::format("model config: {} must be positive, got {}", name, v));
  };
  positive("vocab_size", vocab_size);
  positive("block_size", block_size);
  positive("n_layer", n_layer);
  positive("n_head", n_head);
  positive("n_embd", n_embd);
  if (n_kv_head < 0)
    throw Error(fmt::format("model config: n_kv_head must be 0 (= n_head) or positive, got {}", n_kv_head));
  if (head_dim < 0 || head_dim > 1024) {
    throw Error(fmt::format("model config: head_dim must be 0 (n_embd / n_head) or in [1, 1024], got {}", head_dim));
  }
  if (head_dim == 0 && n_embd % n_head != 0) {
    throw Error(
        fmt::format("model config: n_embd ({}) must be divisible by n_head ({}), or give head_dim", n_embd, n_head));
  }
  if (n_kv_head > 0 && n_head % n_kv_head != 0) {
    throw Error(fmt::format("model config: n_head ({}) must be divisible by n_kv_head ({})", n_head, n_kv_head));
  }
  if (pos == Positions::Relative && max_relative_position <= 0) {
    throw Error(fmt::format("model config: max_relative_position must be positive, got {}", max_relative_position));
  }
  check_score_mods(score_mods(), "model config");
  if (!(logit_softcap >= 0.0) || !std::isfinite(logit_softcap)) {
    throw Error(
        fmt::format("model config: logit_softcap must be a finite number >= 0 (0: off), got {}", logit_softcap));
  }
  if (pos == Positions::Rope && head_size() % 2 != 0) {
    throw Error(fmt::format("model config: RoPE needs an even head size, got {}", head_size()));
  }
  if (!(dropout >= 0.0 && dropout < 1.0))
    throw Error(fmt::format("model config: dropout must be in [0, 1), got {}", dropout));
  if (!(norm_eps > 0.0 && norm_eps < 1.0))
    throw Error(fmt::format("model config: norm_eps must be in (0, 1), got {}", norm_eps));
  if (ffn_hidden < 0)
    throw Error(fmt::format("model config: ffn_hidden must be 0 (the default width) or positive, got {}", ffn_hidden));
  if (!(rope_theta > 1.0 && std::isfinite(rope_theta))) {
    throw Error(fmt::format("model config: rope_theta must be a finite number above 1, got {}", rope_theta));
  }
  const RopeScaling& s = rope_scaling;
  if (s != RopeScaling{} &&
      !(s.factor >= 1.0 && s.factor <= 1024.0 && s.low_freq_factor > 0.0 && s.high_freq_factor > s.low_freq_factor &&
        s.original_context >= 1.0 && s.original_context <= 1e9 && std::isfinite(s.high_freq_factor))) {
    throw Error(
        fmt::format("model config: RoPE scaling needs a factor in [1, 1024], 0 < low_freq_factor < "
                    "high_freq_factor and an original context of at least 1; got factor {}, low {}, high {}, "
                    "original context {}",
                    s.factor, s.low_freq_factor, s.high_freq_factor, s.original_context));
  }
  if (lora.enabled()) {
    if (lora.targets == 0 || lora.targets >= 2 * kLoraDown) throw Error("model config: LoRA needs at least one target");
    if ((lora.targets & kLoraGate) && mlp != MlpKind::SwiGLU) {
      throw Error("model config: the LoRA target gate needs the SwiGLU MLP (--mlp swiglu); a GELU MLP's c_fc is up");
    }
    int64_t narrowest = n_embd;
    for (const LoraSite& site : lora_sites()) narrowest = std::min({narrowest, site.rows, site.in});
    if (lora.rank > narrowest) {
      throw Error(fmt::format("model config: the LoRA rank {} is above the narrowest adapted layer's width {}",
                              lora.rank, narrowest));
    }
    if (!(lora.alpha > 0 && std::isfinite(lora.alpha))) {
      throw Error(fmt::format("model config: the LoRA alpha must be a finite number above 0, got {}", lora.alpha));
    }
  } else if (lora.rank < 0) {
    throw Error(fmt::format("model config: the LoRA rank must be 0 (none) or positive, got {}", lora.rank));
  }
}

MLP::MLP(const GPTConfig& c, Generator& gen)
    : c_fc(c.n_embd, (c.mlp == MlpKind::SwiGLU ? 2 : 1) * c.ffn_width(), c.bias, gen),
      c_proj(c.ffn_width(), c.n_embd, c.bias, gen,
             c.zero_init_proj ? 0.0 : kInitStd / std::sqrt(2.0 * double(c.n_layer))),
      kind_(c.mlp) {
  register_module("c_fc", c_fc);
  register_module("c_proj", c_proj);
}

Tensor relu_squared(const Tensor& x) {
  const Tensor r = relu(x);
  return r * r;
}

Tensor soft_cap(const Tensor& x, double cap) { return cap * tanh(x * (1.0 / cap)); }

Tensor MLP::forward(const Tensor& x) const {
  if (kind_ == MlpKind::SwiGLU) return c_proj.forward(swiglu(c_fc.forward(x)));
  if (c_fc.has_adapters() || c_proj.has_adapters()) {  // the layers' own forwards, which add the adapters
    const Tensor h = c_fc.forward(x);
    return c_proj.forward(kind_ == MlpKind::Relu2 ? relu_squared(h) : gelu(h));
  }
  // c_proj(act(c_fc(x))) as one op: the activation in the products' epilogues.
  return mlp(x, stored(c_fc.weight, x), stored(c_fc.bias, x), stored(c_proj.weight, x), stored(c_proj.bias, x),
             kind_ == MlpKind::Relu2 ? Activation::ReluSquared : Activation::Gelu, c_fc.numerics());
}

Block::Block(const GPTConfig& c, Generator& gen)
    : ln_1(c.n_embd, c.bias, c.norm_eps, c.norm),
      attn(attention_config(c), gen),
      ln_2(c.n_embd, c.bias, c.norm_eps, c.norm),
      mlp(c, gen),
      dropout_(c.dropout) {
  register_module("ln_1", ln_1);
  register_module("attn", attn);
  register_module("ln_2", ln_2);
  register_module("mlp", mlp);
}

Tensor Block::forward(const Tensor& x, Generator& gen, const Tensor& doc_ids) const {
  const Tensor a = ln_1.forward(x);
  const Tensor attended = attn.forward(a, a, a, {.is_causal = true, .doc_ids = doc_ids}).out;
  const Tensor x1 = x + dropout(attended, dropout_, gen, training());
  return x1 + dropout(mlp.forward(ln_2.forward(x1)), dropout_, gen, training());
}

Tensor Block::forward_cached(const Tensor& x, KVCache& cache, size_t layer) const {
  const Tensor x1 = x + attn.forward_cached(ln_1.forward(x), cache.k[layer], cache.v[layer], cache.len);
  return x1 + mlp.forward(ln_2.forward(x1));
}

Linear& Block::linear(std::string_view name) {
  if (name == "attn.c_attn" && attn.c_attn) return *attn.c_attn;
  if (name == "attn.c_proj") return attn.c_proj;
  if (name == "mlp.c_fc") return mlp.c_fc;
  if (name == "mlp.c_proj") return mlp.c_proj;
  throw Error(fmt::format("Block: no linear layer '{}'", name));
}

GPT::GPT(const GPTConfig& config, Generator& gen)
    : wte(config.vocab_size, config.n_embd, gen),
      ln_f(config.n_embd, config.bias, config.norm_eps, config.norm),
      config_(config),
      gen_(&gen) {
  config_.validate();
  register_module("transformer.wte", wte);
  if (config_.pos == Positions::Learned) {
    wpe = std::make_unique<Embedding>(config_.block_size, config_.n_embd, gen);
    register_module("transformer.wpe", *wpe);
  }
  for (int64_t i = 0; i < config_.n_layer; ++i) {
    h.push_back(std::make_unique<Block>(config_, gen));
    register_module(fmt::format("transformer.h.{}", i), *h.back());
  }
  register_module("transformer.ln_f", ln_f);
  if (config_.untied_head) {
    lm_head = std::make_unique<Linear>(config_.n_embd, config_.vocab_size, /*bias=*/false, gen);
    register_module("lm_head", *lm_head);
  }
  // LoRA's adapters last, so the base's weights draw the same numbers with or without them.
  for (const auto& block : h) {
    for (const LoraSite& site : config_.lora_sites()) {
      block->linear(site.linear)
          .add_adapter(site.target, site.first, site.rows, config_.lora.rank, config_.lora.scale(), gen);
    }
  }
}

int64_t GPT::num_parameters_non_embedding() const { return num_parameters() - (wpe ? wpe->weight.numel() : 0); }

Tensor GPT::embed(const Tensor& ids, int64_t pos0) const {
  if (ids.ndim() != 2 || ids.dtype() != DType::I32) {
    throw Error(
        fmt::format("GPT: ids must be an i32 (B, T) tensor, got {} {}", dtype_name(ids.dtype()), ids.shape().str()));
  }
  const int64_t T = ids.size(1);
  if (pos0 + T > config_.block_size && !config_.relative_positions()) {
    throw Error(
        fmt::format("GPT: a sequence of {} tokens is longer than the block size {}", pos0 + T, config_.block_size));
  }
  Tensor x = wte.forward(ids);  // (B, T, C)
  if (wpe) x = x + wpe->forward(position_ids(pos0, T, ids.device()));
  return x;
}

Tensor GPT::position_ids(int64_t pos0, int64_t T, Device device) const {
  if (pos0 != 0 || device == Device::CPU) return positions(pos0, T).to(device);
  if (!(positions_.defined() && positions_.device() == device && positions_.size(0) == T)) {
    positions_ = positions(0, T).to(device);
  }
  return positions_;
}

Tensor GPT::document_ids(const Tensor& ids) const {
  if (doc_separator_.empty()) return Tensor();
  const int64_t B = ids.size(0), T = ids.size(1), n = int64_t(doc_separator_.size());
  const std::vector<int32_t> x = ids.to(Device::CPU).to_vector<int32_t>();
  std::vector<int32_t> doc(x.size());
  for (int64_t b = 0; b < B; ++b) {
    int32_t id = 0;
    for (int64_t t = 0; t < T; ++t) {
      doc[size_t(b * T + t)] = id;
      const int32_t* end = x.data() + b * T + t + 1;  // a separator ending at t: the next position starts a document
      if (t + 1 >= n && std::equal(doc_separator_.begin(), doc_separator_.end(), end - n)) ++id;
    }
  }
  return from_vector(doc, {B, T}).to(ids.device());
}

bool GPT::ends_document(const std::vector<int32_t>& context) const {
  const size_t n = doc_separator_.size();
  return n > 0 && context.size() >= n &&
         std::equal(doc_separator_.begin(), doc_separator_.end(), context.end() - int64_t(n));
}

GPT::Output GPT::forward(const Tensor& ids, const Tensor& targets, Logits logits) const {
  const Tensor doc_ids = document_ids(ids);
  const double p = training() ? config_.dropout : 0.0;
  Tensor x = dropout(embed(ids, 0), config_.dropout, *gen_, training());
  // Each block's residual adds fused with the norms that read them: its ln_2, then the next block's ln_1 (ln_f last),
  // so a = ln_1(x) going into a block; the residual dropouts inside the adds (the same masks as Block::forward's
  // dropout(), seeds drawn at the same points).
  Tensor a = (h.empty() ? ln_f : h[0]->ln_1).forward(x);
  for (size_t i = 0; i < h.size(); ++i) {
    const Block& b = *h[i];
    const Tensor attended = b.attn.forward(a, a, a, {.is_causal = true, .doc_ids = doc_ids}).out;
    const auto [x1, normed] = b.ln_2.forward_add(x, attended, p, p > 0.0 ? gen_->dropout_seed() : DropoutSeed());
    const Tensor m = b.mlp.forward(normed);
    const LayerNorm& next = i + 1 < h.size() ? h[i + 1]->ln_1 : ln_f;
    std::tie(x, a) = next.forward_add(x1, m, p, p > 0.0 ? gen_->dropout_seed() : DropoutSeed());
  }
  if (logits == Logits::Last) a = narrow(a, 1, a.size(1) - 1, 1);
  Output out;
  out.logits = head(a);  // (B, T, V), or (B, 1, V)
  if (targets.defined()) out.loss = cross_entropy(out.logits, targets);
  return out;
}

Tensor GPT::last_logits(const Tensor& ids) const {
  const Tensor logits = forward(ids, {}, Logits::Last).logits;
  return reshape(logits, {logits.size(0), logits.size(2)});
}

Tensor GPT::head(const Tensor& x) const {
  const Tensor logits = linear(x, stored(lm_head ? lm_head->weight : wte.weight, x), Tensor(), numerics());
  return config_.logit_softcap > 0 ? soft_cap(logits, config_.logit_softcap) : logits;
}

Tensor GPT::attention_weights(const Tensor& ids, int64_t layer) const {
  if (layer < 0 || layer >= int64_t(h.size())) {
    throw Error(fmt::format("GPT: layer {} does not exist (the model has layers 0 to {})", layer, h.size() - 1));
  }
  NoGradGuard no_grad;
  Tensor x = embed(ids, 0);
  const Tensor doc_ids = document_ids(ids);
  for (int64_t i = 0; i < layer; ++i) x = h[size_t(i)]->forward(x, *gen_, doc_ids);
  const Tensor a = h[size_t(layer)]->ln_1.forward(x);
  return h[size_t(layer)]
      ->attn
      .forward(a, a, a, {.is_causal = true, .need_weights = true, .average_attn_weights = false, .doc_ids = doc_ids})
      .weights;
}

KVCache GPT::make_cache(int64_t batch, int64_t capacity) const {
  KVCache cache;
  capacity = capacity > 0 ? std::min(capacity, config_.block_size) : config_.block_size;
  const int64_t kv_heads = config_.n_kv_head > 0 ? config_.n_kv_head : config_.n_head;
  const int64_t width = kv_heads * config_.head_size();
  const Device device = this->device();
  for (int64_t i = 0; i < config_.n_layer; ++i) {
    cache.k.push_back(zeros({batch, capacity, width}, wte.weight.dtype(), device));
    cache.v.push_back(zeros({batch, capacity, width}, wte.weight.dtype(), device));
  }
  return cache;
}

Tensor GPT::forward_cached(const Tensor& ids, KVCache& cache) const {
  const int64_t T = ids.ndim() == 2 ? ids.size(1) : 0;
  if (cache.len + T > cache.capacity()) {
    throw Error(fmt::format("GPT: {} cached positions and {} new ones exceed the block size {}", cache.len, T,
                            cache.capacity()));
  }
  Tensor x = embed(ids, cache.len);
  for (size_t i = 0; i < h.size(); ++i) x = h[i]->forward_cached(x, cache, i);
  cache.len += T;
  x = ln_f.forward(narrow(x, 1, T - 1, 1));
  return head(reshape(x, {x.size(0), x.size(2)}));
}

void GPT::slide_cache(KVCache& cache, int64_t n) const {
  if (!config_.relative_positions()) {
    throw Error(
        fmt::format("GPT: a sliding cache needs relative positions; this model's are {}", positions_name(config_.pos)));
  }
  if (n < 0 || n > cache.len) throw Error(fmt::format("GPT: cannot drop {} of {} cached positions", n, cache.len));
  NoGradGuard no_grad;
  const int64_t kept = cache.len - n;
  for (auto* layers : {&cache.k, &cache.v}) {
    for (Tensor& t : *layers) {
      if (kept > 0) write_slice(t, 1, 0, narrow(t, 1, n, kept).clone());
    }
  }
  cache.len = kept;
}

}  // namespace tinygpt::nn

#include "train/gguf.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <numeric>
#include <vector>

#include "autograd/ops.h"
#include "kernels/bf16.h"
#include "kernels/rope_freqs.h"
#include "train/export.h"
#include "train/hf_llama.h"

namespace tinygpt {

namespace fs = std::filesystem;

bool parse_gguf_type(std::string_view name, GgufType& out) {
  for (const GgufType t : {GgufType::F32, GgufType::F16, GgufType::BF16, GgufType::Q8_0}) {
    if (name == gguf_type_name(t)) {
      out = t;
      return true;
    }
  }
  return false;
}

const char* gguf_type_name(GgufType type) {
  switch (type) {
    case GgufType::F32:
      return "f32";
    case GgufType::F16:
      return "f16";
    case GgufType::BF16:
      return "bf16";
    case GgufType::Q8_0:
      return "q8_0";
  }
  return "?";
}

namespace {

// ggml's tensor types and llama.cpp's file types (general.file_type), for the types written here.
enum GgmlType : uint32_t { kF32 = 0, kF16 = 1, kQ8_0 = 8, kBF16 = 30 };
uint32_t file_type(GgufType t) {
  return t == GgufType::F32 ? 0 : t == GgufType::F16 ? 1 : t == GgufType::Q8_0 ? 7 : 32;
}
// GGUF's metadata value types.
enum ValueType : uint32_t { kU32 = 4, kI32 = 5, kF32Value = 6, kBool = 7, kString = 8, kArray = 9 };
// llama.cpp's token types (llama_token_type).
constexpr int32_t kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5;
constexpr uint64_t kAlignment = 32;  // general.alignment's default
constexpr int64_t kQ8Block = 32;

/// An IEEE half, rounded to nearest even (as F16C's vcvtps2ph, which ggml uses on x86).
uint16_t half_bits(float f) {
  uint32_t x = 0;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u, exp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (exp == 0xff) return uint16_t(sign | 0x7c00u | (mant != 0 ? 0x200u : 0u));  // inf, NaN
  const int32_t e = int32_t(exp) - 127 + 15;
  if (e >= 0x1f) return uint16_t(sign | 0x7c00u);  // too large: inf
  if (e <= 0) {                                    // a subnormal half, or zero
    if (e < -10) return uint16_t(sign);
    mant |= 0x800000u;
    const uint32_t shift = uint32_t(14 - e), half = mant >> shift, rem = mant & ((1u << shift) - 1);
    const uint32_t mid = 1u << (shift - 1);
    return uint16_t(sign | (half + (rem > mid || (rem == mid && (half & 1u)) ? 1u : 0u)));
  }
  const uint32_t half = (uint32_t(e) << 10) | (mant >> 13), rem = mant & 0x1fffu;
  return uint16_t(sign | (half + (rem > 0x1000u || (rem == 0x1000u && (half & 1u)) ? 1u : 0u)));  // a carry: inf
}

template <class T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
void put_string(std::string& s, std::string_view v) {
  put<uint64_t>(s, v.size());
  s.append(v);
}

/// The metadata, key by key, in GGUF's encoding.
struct Metadata {
  std::string bytes;
  uint64_t count = 0;
  void key(std::string_view k, ValueType t) {
    put_string(bytes, k);
    put<uint32_t>(bytes, t);
    ++count;
  }
  void u32(std::string_view k, int64_t v) { key(k, kU32), put<uint32_t>(bytes, uint32_t(v)); }
  void f32(std::string_view k, double v) { key(k, kF32Value), put<float>(bytes, float(v)); }
  void boolean(std::string_view k, bool v) { key(k, kBool), put<uint8_t>(bytes, v ? 1 : 0); }
  void string(std::string_view k, std::string_view v) { key(k, kString), put_string(bytes, v); }
  void strings(std::string_view k, const std::vector<std::string>& v) {
    key(k, kArray), put<uint32_t>(bytes, kString), put<uint64_t>(bytes, v.size());
    for (const std::string& s : v) put_string(bytes, s);
  }
  void i32s(std::string_view k, const std::vector<int32_t>& v) {
    key(k, kArray), put<uint32_t>(bytes, kI32), put<uint64_t>(bytes, v.size());
    for (const int32_t x : v) put<int32_t>(bytes, x);
  }
};

/// A tensor of the file: its name, shape as we keep it (row-major), ggml type, and its values (made when written).
struct Out {
  std::string name;
  std::vector<int64_t> shape;
  uint32_t type;
  std::function<std::vector<float>()> values;
  int64_t numel() const {
    int64_t n = 1;
    for (const int64_t d : shape) n *= d;
    return n;
  }
  uint64_t bytes() const {
    const auto n = uint64_t(numel());
    return type == kF32 ? 4 * n : type == kQ8_0 ? n / kQ8Block * (2 + kQ8Block) : 2 * n;
  }
};

std::string encode(const Out& t) {
  const std::vector<float> v = t.values();
  if (int64_t(v.size()) != t.numel()) throw Error(fmt::format("export_gguf: {} has the wrong size", t.name));
  std::string s;
  s.reserve(t.bytes());
  if (t.type == kF32) {
    s.append(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  } else if (t.type == kF16) {
    for (const float x : v) put<uint16_t>(s, half_bits(x));
  } else if (t.type == kBF16) {
    for (const float x : v) put<uint16_t>(s, bf16_bits_of(x));
  } else {  // q8_0, as ggml's quantize_row_q8_0_ref: d = max |x| / 127, q = round(x / d)
    for (size_t b = 0; b < v.size(); b += kQ8Block) {
      float amax = 0;
      for (int64_t j = 0; j < kQ8Block; ++j) amax = std::max(amax, std::fabs(v[b + size_t(j)]));
      if (!std::isfinite(amax)) {
        throw Error(
            fmt::format("export_gguf: {} holds a weight that is not finite (near value {}); q8_0 cannot hold "
                        "it (the model diverged: export an earlier checkpoint)",
                        t.name, b));
      }
      const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
      put<uint16_t>(s, half_bits(d));
      for (int64_t j = 0; j < kQ8Block; ++j) put<int8_t>(s, int8_t(std::roundf(v[b + size_t(j)] * id)));
    }
  }
  return s;
}

/// llama.cpp's name for our pre-split (tokenizer.ggml.pre), or "" where it has none.
std::string pre_name(const data::BpeTokenizer& bpe) {
  if (bpe.individual_digits()) return bpe.pre_split() == data::PreSplit::Gpt2 ? "smollm" : "";
  switch (bpe.pre_split()) {
    case data::PreSplit::Gpt2:
      return "gpt-2";
    case data::PreSplit::Llama3:
      return "llama-bpe";
    case data::PreSplit::Qwen2:
      return "qwen2";
  }
  return "";
}

void tokenizer_metadata(Metadata& m, const data::Tokenizer& tok, int64_t model_vocab) {
  const data::BpeTokenizer& bpe = tok.bpe();
  const nlohmann::json j = nlohmann::json::parse(bpe.to_json());  // Hugging Face's spelling of tokens and merges
  std::vector<std::string> tokens(size_t(bpe.vocab_size()));
  std::vector<int32_t> types(tokens.size(), kNormal);
  for (const auto& [text, id] : j["model"]["vocab"].items()) tokens.at(id.get<size_t>()) = text;
  for (const data::BpeTokenizer::Added& a : bpe.added()) {
    tokens.at(a.id) = a.content;
    types.at(a.id) = a.special ? kControl : kUserDefined;
  }
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (tokens[id].empty()) throw Error(fmt::format("export_gguf: the tokenizer has no text for id {}", id));
  }
  // A model padded past its tokenizer: llama.cpp wants a token per row; its converter names them [PADn], unused.
  for (auto id = int64_t(tokens.size()); id < model_vocab; ++id) tokens.push_back(fmt::format("[PAD{}]", id));
  types.resize(tokens.size(), kUnused);
  std::vector<std::string> merges;
  for (const auto& merge : j["model"]["merges"]) {
    merges.push_back(merge.is_string() ? merge.get<std::string>()
                                       : merge.at(0).get<std::string>() + " " + merge.at(1).get<std::string>());
  }
  m.string("tokenizer.ggml.model", "gpt2");
  m.string("tokenizer.ggml.pre", pre_name(bpe));
  m.strings("tokenizer.ggml.tokens", tokens);
  m.i32s("tokenizer.ggml.token_type", types);
  m.strings("tokenizer.ggml.merges", merges);
  const int32_t eos = tok.end_of_text(), bos = bpe.begin_of_text();
  const std::string& bos_token = tok.config().bos_token;
  const int32_t named_bos = bos >= 0 ? bos : bos_token.empty() ? eos : bpe.added_id(bos_token);
  if (named_bos >= 0) m.u32("tokenizer.ggml.bos_token_id", named_bos);
  if (eos >= 0) m.u32("tokenizer.ggml.eos_token_id", eos);
  m.boolean("tokenizer.ggml.add_bos_token", bos >= 0);
  m.boolean("tokenizer.ggml.add_eos_token", false);
  if (!tok.config().chat_template.empty()) m.string("tokenizer.chat_template", tok.config().chat_template);
}

/// Rows r0 .. r0 + rows of a checkpoint tensor as f32 (all of it: rows < 0); zeros where the model has no such tensor
/// (GPT-2's biases: llama.cpp's gpt2 requires them).
std::vector<float> rows_of(const Checkpoint& ckpt, const GgufPiece& p) {
  const Tensor t = ckpt.contents.find(p.ours);
  if (!t.defined())
    return std::vector<float>(size_t(std::accumulate(p.shape.begin(), p.shape.end(), int64_t(1), std::multiplies<>())));
  return (p.rows < 0 ? t : narrow(t, 0, p.row0, p.rows)).to(DType::F32).to_vector<float>();
}

/// The tensors of the file, each made from its piece of a parameter.
std::vector<Out> tensors_of(const Checkpoint& ckpt, const std::string& arch, uint32_t matrix) {
  std::vector<Out> out;
  const nn::GPTConfig& c = ckpt.config;
  const int64_t E = c.head_size();
  for (GgufPiece& p : gguf_pieces(c, arch)) {
    // Matrices at the chosen type; norms, biases and GPT-2's position table f32, as llama.cpp's converter keeps them.
    const uint32_t type = p.shape.size() == 2 && p.gguf != "position_embd.weight" ? matrix : kF32;
    std::vector<int64_t> shape = p.shape;
    out.push_back({p.gguf, std::move(shape), type, [&ckpt, p = std::move(p)] {
                     const std::vector<float> w = rows_of(ckpt, p);
                     if (p.interleave == 0) return w;
                     return interleave_rotary_pairs(w, p.interleave, p.shape.size() == 2 ? p.shape[1] : 1, false);
                   }});
    if (out.size() == 1 &&
        c.rope_scaling != RopeScaling{}) {  // after token_embd: llama.cpp divides each pair's frequency
      out.push_back(
          {"rope_freqs.weight", {E / 2}, kF32, [&c, E] { return rope_freq_factors(c.rope_theta, c.rope_scaling, E); }});
    }
  }
  return out;
}

void hyperparameters(Metadata& m, const std::string& arch, const nn::GPTConfig& c) {
  const std::string a = arch + ".";
  m.u32(a + "context_length", c.block_size);
  m.u32(a + "embedding_length", c.n_embd);
  m.u32(a + "block_count", c.n_layer);
  m.u32(a + "feed_forward_length", c.ffn_width());
  m.u32(a + "attention.head_count", c.n_head);
  m.u32(a + "vocab_size", c.vocab_size);
  if (arch == "gpt2") {
    m.f32(a + "attention.layer_norm_epsilon", c.norm_eps);
    return;
  }
  m.u32(a + "attention.head_count_kv", c.n_kv_head > 0 ? c.n_kv_head : c.n_head);
  if (c.head_dim > 0) {  // heads not n_embd / n_head wide: llama.cpp reads their width here
    m.u32(a + "attention.key_length", c.head_dim);
    m.u32(a + "attention.value_length", c.head_dim);
  }
  m.u32(a + "rope.dimension_count", c.head_size());
  m.f32(a + "rope.freq_base", c.rope_theta);
  m.f32(a + "attention.layer_norm_rms_epsilon", c.norm_eps);
}

void write_file(const fs::path& file, const std::string& header, const std::vector<Out>& tensors) {
  const fs::path tmp = file.string() + ".tmp";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(fmt::format("cannot write '{}': {}", tmp.string(), std::strerror(errno)));
  const std::string pad(kAlignment, '\0');
  out.write(header.data(), std::streamsize(header.size()));
  for (const Out& t : tensors) {
    const std::string bytes = encode(t);
    out.write(bytes.data(), std::streamsize(bytes.size()));
    out.write(pad.data(), std::streamsize((kAlignment - bytes.size() % kAlignment) % kAlignment));
    if (!out) break;
  }
  out.close();
  std::error_code ec;
  if (!out) {
    fs::remove(tmp, ec);
    throw Error(fmt::format("writing '{}' failed (disk full?); '{}' is untouched", tmp.string(), file.string()));
  }
  if (const int fd = ::open(tmp.c_str(), O_RDONLY); fd >= 0) ::fsync(fd), ::close(fd);
  fs::rename(tmp, file, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove(tmp, ec);
    throw Error(fmt::format("cannot move '{}' into place at '{}': {}", tmp.string(), file.string(), why));
  }
}

}  // namespace

std::vector<float> interleave_rotary_pairs(const std::vector<float>& w, int64_t heads, int64_t cols, bool back) {
  const int64_t E = int64_t(w.size()) / cols / heads, half = E / 2;
  std::vector<float> out(w.size());
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 0; j < half; ++j) {
      for (int64_t s = 0; s < 2; ++s) {
        const int64_t ours = h * E + s * half + j, theirs = h * E + 2 * j + s;
        const float* src = w.data() + (back ? theirs : ours) * cols;
        std::copy(src, src + cols, out.data() + (back ? ours : theirs) * cols);
      }
    }
  }
  return out;
}

std::vector<float> rope_freq_factors(double theta, const RopeScaling& scaling, int64_t E) {
  std::vector<float> f(size_t(E / 2));
  for (int64_t i = 0; i < E / 2; ++i) {
    f[size_t(i)] = float(rope_inv_freq(RopeFreqs(theta), i, E) / rope_inv_freq(RopeFreqs(theta, scaling), i, E));
  }
  return f;
}

std::vector<GgufPiece> gguf_pieces(const nn::GPTConfig& c, const std::string& arch) {
  const int64_t C = c.n_embd, V = c.vocab_size;
  std::vector<GgufPiece> out;
  if (arch != "gpt2") {  // llama and qwen2: Hugging Face's table under llama.cpp's names
    const int64_t E = c.head_size(), Q = c.n_head * E, NKV = c.n_kv_head > 0 ? c.n_kv_head : c.n_head, KV = NKV * E;
    const int64_t H = c.ffn_width();
    struct Name {
      const char *hf, *gguf;
      int64_t rows, cols, interleave;  // cols 0: a vector
    };
    const bool permute = arch == "llama";  // llama.cpp's llama pairs rotary features i and i + 1: q and k permuted
    const Name layer_names[] = {
        {"input_layernorm.weight", "attn_norm.weight", C, 0, 0},
        {"self_attn.q_proj.weight", "attn_q.weight", Q, C, permute ? c.n_head : 0},
        {"self_attn.q_proj.bias", "attn_q.bias", Q, 0, permute ? c.n_head : 0},
        {"self_attn.k_proj.weight", "attn_k.weight", KV, C, permute ? NKV : 0},
        {"self_attn.k_proj.bias", "attn_k.bias", KV, 0, permute ? NKV : 0},
        {"self_attn.v_proj.weight", "attn_v.weight", KV, C, 0},
        {"self_attn.v_proj.bias", "attn_v.bias", KV, 0, 0},
        {"self_attn.o_proj.weight", "attn_output.weight", C, Q, 0},
        {"self_attn.o_proj.bias", "attn_output.bias", C, 0, 0},
        {"post_attention_layernorm.weight", "ffn_norm.weight", C, 0, 0},
        {"mlp.gate_proj.weight", "ffn_gate.weight", H, C, 0},
        {"mlp.gate_proj.bias", "ffn_gate.bias", H, 0, 0},
        {"mlp.up_proj.weight", "ffn_up.weight", H, C, 0},
        {"mlp.up_proj.bias", "ffn_up.bias", H, 0, 0},
        {"mlp.down_proj.weight", "ffn_down.weight", C, H, 0},
        {"mlp.down_proj.bias", "ffn_down.bias", C, 0, 0},
    };
    const Name model_names[] = {{"model.embed_tokens.weight", "token_embd.weight", V, C, 0},
                                {"model.norm.weight", "output_norm.weight", C, 0, 0},
                                {"lm_head.weight", "output.weight", V, C, 0}};
    for (const HfPiece& hf : llama_pieces(c)) {
      GgufPiece p{"", hf.ours, hf.row0, hf.rows, {}, 0};
      const auto take = [&](const Name& n, const std::string& prefix) {
        p.gguf = prefix + n.gguf;
        p.shape = n.cols > 0 ? std::vector<int64_t>{n.rows, n.cols} : std::vector<int64_t>{n.rows};
        p.interleave = n.interleave;
      };
      for (const Name& n : model_names) {
        if (hf.hf == n.hf) take(n, "");
      }
      if (hf.hf.rfind("model.layers.", 0) == 0) {
        const size_t dot = hf.hf.find('.', 13);
        for (const Name& n : layer_names) {
          if (hf.hf.compare(dot + 1, std::string::npos, n.hf) == 0) take(n, "blk." + hf.hf.substr(13, dot - 13) + ".");
        }
      }
      if (p.gguf.empty()) throw Error(fmt::format("gguf_pieces: no llama.cpp name for {}", hf.hf));
      out.push_back(std::move(p));
    }
    return out;
  }
  const int64_t H = c.ffn_width();
  auto add = [&](std::string gguf, std::string ours, std::vector<int64_t> shape) {
    out.push_back({std::move(gguf), std::move(ours), 0, -1, std::move(shape)});
  };
  add("token_embd.weight", "transformer.wte.weight", {V, C});
  add("position_embd.weight", "transformer.wpe.weight", {c.block_size, C});
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string g = fmt::format("blk.{}.", i), h = fmt::format("transformer.h.{}.", i);
    add(g + "attn_norm.weight", h + "ln_1.weight", {C});
    add(g + "attn_norm.bias", h + "ln_1.bias", {C});
    add(g + "attn_qkv.weight", h + "attn.c_attn.weight", {3 * C, C});  // q, k, v rows, as llama.cpp splits them
    add(g + "attn_qkv.bias", h + "attn.c_attn.bias", {3 * C});
    add(g + "attn_output.weight", h + "attn.c_proj.weight", {C, C});
    add(g + "attn_output.bias", h + "attn.c_proj.bias", {C});
    add(g + "ffn_norm.weight", h + "ln_2.weight", {C});
    add(g + "ffn_norm.bias", h + "ln_2.bias", {C});
    add(g + "ffn_up.weight", h + "mlp.c_fc.weight", {H, C});
    add(g + "ffn_up.bias", h + "mlp.c_fc.bias", {H});
    add(g + "ffn_down.weight", h + "mlp.c_proj.weight", {C, H});
    add(g + "ffn_down.bias", h + "mlp.c_proj.bias", {C});
  }
  add("output_norm.weight", "transformer.ln_f.weight", {C});
  add("output_norm.bias", "transformer.ln_f.bias", {C});
  if (c.untied_head) add("output.weight", "lm_head.weight", {V, C});
  return out;
}

std::string check_gguf_exportable(const Checkpoint& ckpt) {
  const nn::GPTConfig& c = ckpt.config;
  check_hf_exportable(c);
  if (!ckpt.tokenizer.is_bpe()) {
    throw Error(
        "this model's tokenizer is characters, which GGUF's tokenizers (byte-level BPE, SentencePiece) cannot "
        "hold one to one. Export a model trained with --tokenizer (a byte-level BPE: tinygpt tokenizer train)");
  }
  if (pre_name(ckpt.tokenizer.bpe()).empty()) {
    throw Error(
        "this model's tokenizer splits digits one by one before Llama 3's or Qwen2's pre-split, which "
        "llama.cpp names no pre-tokenizer for (it knows gpt-2, smollm, llama-bpe and qwen2)");
  }
  const std::string arch = !is_llama_shaped(c) ? "gpt2" : c.qkv_bias && !c.bias ? "qwen2" : "llama";
  if (arch == "qwen2" && c.rope_scaling != RopeScaling{}) {
    throw Error(
        "this model has q/k/v biases (llama.cpp's qwen2) and Llama 3's RoPE scaling, which llama.cpp's qwen2 "
        "does not read. Export a model without one of them");
  }
  return arch;
}

GgufWritten export_gguf(const Checkpoint& ckpt, const fs::path& file, GgufType type) {
  const std::string arch = check_gguf_exportable(ckpt);
  NoGradGuard no_grad;
  const uint32_t matrix = type == GgufType::F32    ? kF32
                          : type == GgufType::F16  ? kF16
                          : type == GgufType::BF16 ? kBF16
                                                   : kQ8_0;
  std::vector<Out> tensors = tensors_of(ckpt, arch, matrix);
  GgufWritten written{arch, int64_t(tensors.size())};
  for (Out& t : tensors) {
    if (t.type == kQ8_0 && t.shape.back() % kQ8Block != 0) t.type = kF16, ++written.as_f16;
  }
  Metadata m;
  m.string("general.architecture", arch);
  m.string("general.name", ckpt.path.parent_path().filename().string());
  m.u32("general.file_type", file_type(type));
  m.u32("general.quantization_version", 2);
  hyperparameters(m, arch, ckpt.config);
  tokenizer_metadata(m, ckpt.tokenizer, ckpt.config.vocab_size);

  std::string header = "GGUF";
  put<uint32_t>(header, 3);
  put<uint64_t>(header, tensors.size());
  put<uint64_t>(header, m.count);
  header += m.bytes;
  uint64_t offset = 0;
  for (const Out& t : tensors) {  // ggml's dims run from the fastest: ours reversed
    put_string(header, t.name);
    put<uint32_t>(header, uint32_t(t.shape.size()));
    for (auto d = t.shape.rbegin(); d != t.shape.rend(); ++d) put<uint64_t>(header, uint64_t(*d));
    put<uint32_t>(header, t.type);
    put<uint64_t>(header, offset);
    offset += (t.bytes() + kAlignment - 1) / kAlignment * kAlignment;
  }
  header.resize((header.size() + kAlignment - 1) / kAlignment * kAlignment, '\0');
  write_file(file, header, tensors);
  written.bytes = int64_t(header.size() + offset);
  return written;
}

}  // namespace tinygpt

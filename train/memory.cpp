#include "train/memory.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>

#include "kernels/device.h"

namespace tinygpt {

namespace {

constexpr double kFloat = 4.0;  // bytes per f32 element
constexpr double kBf16 = 2.0;   // bytes per bf16 element
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

/// The first number in a file, or NaN when it cannot be read (or says "max").
double read_number(const char* path) {
  std::ifstream in(path);
  double v = NAN;
  if (!(in >> v)) return NAN;
  return v;
}

/// MemAvailable from /proc/meminfo, in bytes; NaN when unreadable.
double mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  double kib = 0;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024.0;
  }
  return NAN;
}

/// "96 KiB", "512 MiB", "3.2 GiB", "1.4 PiB".
std::string gib(double bytes) {
  if (bytes < 1048576.0) return fmt::format("{:.0f} KiB", bytes / 1024.0);
  if (bytes < 0.1 * kGiB) return fmt::format("{:.0f} MiB", bytes / 1048576.0);
  const char* units[] = {"GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"};
  double v = bytes / kGiB;
  size_t u = 0;
  while (v >= 1024.0 && u + 1 < std::size(units)) v /= 1024.0, ++u;
  return fmt::format("{:.1f} {}", v, units[u]);
}

/// Whether attention on bf16 storage computes on f32 copies of q, k, v and its output: QK-norm runs in f32, and
/// score modifiers and documents go through f32 (nn/attention.cpp; autograd/attention.cpp, attention_bf16).
/// Otherwise the CPU's flash kernels read q, k and v as stored (RoPE rotates them as stored).
bool attention_on_f32_copies(const nn::GPTConfig& c) {
  const ScoreModSettings m = c.score_mods();
  return c.qk_norm || any_score_mod(m, !c.doc_separator.empty(), m.t5_buckets > 0, m.max_rel > 0);
}

}  // namespace

double gpt_parameter_count(const nn::GPTConfig& c) {
  const double C = double(c.n_embd), V = double(c.vocab_size), L = double(c.n_layer), b = c.bias ? 1.0 : 0.0;
  const double hd = double(c.head_size()), q = double(c.n_head) * hd;
  const double qkv = double(c.n_head + 2 * (c.n_kv_head > 0 ? c.n_kv_head : c.n_head)) * hd;
  const double nb = c.norm == nn::NormKind::RMSNorm ? 0.0 : b, qb = c.bias || c.qkv_bias ? 1.0 : 0.0;
  const double H = double(c.ffn_width()), fc = (c.mlp == nn::MlpKind::SwiGLU ? 2.0 : 1.0) * H;
  const double layer = 2 * C * (1 + nb)                   // ln_1, ln_2
                       + qkv * C + qkv * qb               // c_attn
                       + q * C + C * b                    // attn.c_proj
                       + fc * C + fc * b + H * C + C * b  // mlp.c_fc (SwiGLU: gate and up), mlp.c_proj
                       + (c.qk_norm ? 2 * hd : 0.0);      // attn.q_norm, attn.k_norm
  double positions = c.pos == nn::Positions::Learned ? double(c.block_size) * C : 0.0;                     // wpe
  if (c.pos == nn::Positions::Relative) positions = L * 2 * double(2 * c.max_relative_position + 1) * hd;  // A_K, A_V
  if (c.pos == nn::Positions::T5) positions = L * double(c.n_head) * nn::GPTConfig::kT5Buckets;
  const double head = c.untied_head ? V * C : 0.0;             // lm_head (else tied to wte)
  return V * C + positions + L * layer + C * (1 + nb) + head;  // wte, position tables, blocks, ln_f, lm_head
}

MemoryNeed training_memory(const nn::GPTConfig& c, int64_t batch_size, bool muon, bool bf16_storage) {
  const double P = gpt_parameter_count(c), BT = double(batch_size) * double(c.block_size), C = double(c.n_embd);
  const double L = double(c.n_layer), V = double(c.vocab_size);
  MemoryNeed need;
  need.weights = P * kFloat + (bf16_storage ? P * kBf16 : 0.0);  // f32 masters, and their bf16 working copies
  need.optimizer = (muon ? 4 : 3) * P * kFloat;
  if (c.lora.enabled()) {  // a frozen base (kept in bf16 with bf16 storage) and the adapters, which alone train
    double adapters = 0;
    for (const nn::LoraSite& s : c.lora_sites()) adapters += double(c.lora.rank) * double(s.in + s.rows) * L;
    need.weights = P * (bf16_storage ? kBf16 : kFloat) + adapters * (kFloat + (bf16_storage ? kBf16 : 0.0));
    need.optimizer = 3 * adapters * kFloat;
  }
  // Kept for backward, per block: the residual input, both LayerNorm outputs, q/k/v, the attention output, the two
  // residual sums, the attention and MLP projections (~10 C per token) and the MLP's hidden layer before and after
  // its activation (8 C for GELU's 4C; SwiGLU's 2H, then H); then the logits and their gradient, and backward's widest
  // transient (the MLP's hidden gradient).
  const double H = double(c.ffn_width()), fc = (c.mlp == nn::MlpKind::SwiGLU ? 2.0 : 1.0) * H;
  const double stored = (10 * C + fc + H) * L + 2 * V + fc;
  if (!bf16_storage) {
    need.activations = kFloat * BT * stored;
  } else {
    // The same in bf16, plus what attention keeps in f32 where it computes on copies: q, k, v and its output (4 C
    // per block).
    need.activations = BT * (kBf16 * stored + (attention_on_f32_copies(c) ? kFloat * 4 * C * L : 0.0));
  }
  return need;
}

MemoryNeed inference_memory(const nn::GPTConfig& c, int64_t batch_size, int64_t context) {
  const int64_t T = context > 0 ? std::min(context, c.block_size) : c.block_size;
  const double P = gpt_parameter_count(c), BT = double(batch_size) * double(T), C = double(c.n_embd);
  MemoryNeed need;
  need.weights = P * kFloat;
  // One block's transients (the 4C MLP hidden layer and its GELU, q/k/v), the logits, and a KV cache of every layer.
  need.activations = kFloat * BT * (12 * C + double(c.vocab_size) + 2 * C * double(c.n_layer));
  return need;
}

double available_memory(Device device) {
  if (device == Device::CUDA) return double(cuda::free_memory());
  double avail = mem_available();
  if (std::isnan(avail)) {
    avail = std::numeric_limits<double>::infinity();  // unknown: no limit claimed
#if defined(_SC_AVPHYS_PAGES)                         // glibc's; macOS has no such query
    const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) avail = double(pages) * double(page);
#endif
  }
  // A container's limit: cgroup v2, then v1 (whose "no limit" is a huge number, harmless here).
  for (const auto& [limit, usage] :
       {std::pair{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
        {"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"}}) {
    const double l = read_number(limit), u = read_number(usage);
    if (!std::isnan(l) && !std::isnan(u)) {
      avail = std::min(avail, std::max(0.0, l - u));
      break;
    }
  }
  return avail;
}

std::string describe(const MemoryNeed& need) {
  std::string parts = fmt::format("weights {}", gib(need.weights));
  if (need.optimizer > 0) parts += fmt::format(", gradients and optimizer state {}", gib(need.optimizer));
  parts += fmt::format(", activations {}", gib(need.activations));
  return fmt::format("{} ({})", gib(need.total()), parts);
}

void require_memory(const MemoryNeed& need, Device device, const std::string& what, const std::string& advice) {
  const double have = available_memory(device);
  if (!(need.total() > have)) return;
  throw Error(fmt::format("{} needs about {} of {} memory, but {} is available; {}", what, describe(need),
                          device == Device::CUDA ? "GPU" : "host", gib(have), advice));
}

void require_memory_to_read(const std::filesystem::path& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return;  // the reader names what is wrong with the file
  const double have = available_memory(Device::CPU);
  if (double(size) > have) {
    throw Error(fmt::format("reading '{}' needs {} of host memory, but {} is available", path.string(),
                            gib(double(size)), gib(have)));
  }
}

}  // namespace tinygpt

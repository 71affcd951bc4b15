#include "train/trainer.h"

#include <fmt/core.h>
#include <omp.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <unordered_map>

#include "kernels/device.h"
#include "kernels/profile.h"
#include "train/adamw.h"
#include "train/checkpoint.h"
#include "train/comm.h"
#include "train/memory.h"
#include "train/muon.h"

namespace tinygpt {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

/// Seeds derived from the run's seed, one per purpose, so each stream is independent of the others.
uint64_t derived_seed(uint64_t seed, uint64_t purpose) { return seed * 0x9E3779B97F4A7C15ULL + purpose; }
constexpr uint64_t kSamplerStream = 1, kModelStream = 2, kEvalTrainStream = 3, kEvalValStream = 4, kDropoutStream = 5;

/// The global L2 norm of the gradient.
double grad_norm(const FlatParameters& flat) {
  NoGradGuard no_grad;
  const Tensor g = flat.grads();
  return std::sqrt(sum(g * g).item());  // the gaps between parameters hold zeros
}

/// The factor that clips a gradient of this norm to max_norm (1 when it is below, or max_norm is 0: no clipping);
/// AdamW applies it as it reads the gradient.
double clip_factor(double norm, double max_norm) { return max_norm > 0 && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0; }

/// Parameters in the order the flat buffers keep them: the reverse of the model's, which is about the order in which
/// backward finishes their gradients (the last block's first, the token embedding, used by the LM head too, last),
/// so that gradient buckets fill front to back.
std::vector<std::pair<std::string, Tensor>> backward_order(std::vector<std::pair<std::string, Tensor>> params) {
  std::reverse(params.begin(), params.end());
  return params;
}

/// Several ranks on CPUs: the gradient buffer cut into buckets of about `mb` megabytes at parameter boundaries,
/// each summed over the ranks (Communicator::start_all_reduce_sum) as soon as backward has finished every gradient
/// in it, in bucket order, so the reduction runs while backward goes on. The sums are those of one reduction of
/// the whole buffer (each element is added in rank order either way).
class GradientBuckets {
 public:
  GradientBuckets(const FlatParameters& flat, double mb, Communicator& comm) : grads_(flat.grads()), comm_(comm) {
    const auto& slots = flat.slots();
    const int64_t limit = std::max<int64_t>(1, int64_t(mb * 1e6 / sizeof(float)));
    for (size_t i = 0; i < slots.size(); ++i) {
      if (buckets_.empty() || slots[i].offset - buckets_.back().begin >= limit) {
        buckets_.push_back({slots[i].offset, 0, 0, 0});
      }
      ++buckets_.back().params;
      bucket_of_[&slots[i].param.impl()] = buckets_.size() - 1;
    }
    for (size_t b = 0; b < buckets_.size(); ++b) {
      buckets_[b].end = b + 1 < buckets_.size() ? buckets_[b + 1].begin : flat.numel();
    }
  }

  /// Before the backward pass that completes the step's gradients.
  void arm() {
    for (Bucket& b : buckets_) b.remaining = b.params;
    next_ = 0;
  }
  /// Backward has finished this leaf's gradient: starts, in order, every bucket that is complete.
  void ready(const Tensor& leaf) {
    const auto found = bucket_of_.find(&leaf.impl());
    if (found == bucket_of_.end()) return;
    --buckets_[found->second].remaining;
    start_complete();
    comm_.progress();
  }
  /// After backward: starts what is left and waits for every sum.
  void finish() {
    while (next_ < buckets_.size()) start(buckets_[next_++]);
    comm_.wait_all();
  }
  size_t count() const { return buckets_.size(); }

 private:
  struct Bucket {
    int64_t begin, end;  // elements of the gradient buffer
    int params, remaining;
  };
  void start(const Bucket& b) { comm_.start_all_reduce_sum(grads_.data<float>() + b.begin, b.end - b.begin); }
  void start_complete() {
    while (next_ < buckets_.size() && buckets_[next_].remaining == 0) start(buckets_[next_++]);
  }

  Tensor grads_;
  Communicator& comm_;
  std::vector<Bucket> buckets_;
  std::unordered_map<const TensorImpl*, size_t> bucket_of_;
  size_t next_ = 0;  // the first bucket not started
};

}  // namespace

void use_document_separator(nn::GPT& model, const data::CharVocab& vocab) {
  const std::string& sep = model.config().doc_separator;
  if (sep.empty()) return;
  std::vector<int32_t> ids;
  for (const char32_t c : data::decode_utf8(sep)) {
    if (vocab.id(c) < 0) {
      throw Error(fmt::format("--doc-sep: character '{}' (U+{:04X}) is not in the data's vocabulary, so no document "
                              "ever ends; give a separator that occurs in the text",
                              data::encode_utf8(std::u32string(1, c)), uint32_t(c)));
    }
    ids.push_back(vocab.id(c));
  }
  model.set_document_separator(std::move(ids));
}

Device parse_device(const std::string& device) {
  if (device == "cpu") return Device::CPU;
  if (device != "cuda") throw Error(fmt::format("--device must be cpu or cuda, got '{}'", device));
  if (!cuda::built_with_cuda()) {
    throw Error("--device cuda: this build has no CUDA backend (nvcc was not found when it was configured); use --device cpu");
  }
  if (cuda::device_count() == 0) throw Error("--device cuda: no CUDA GPU is visible; use --device cpu");
  return Device::CUDA;
}

AttentionMath parse_attention_math(const std::string& math) {
  AttentionMath m{};
  if (!tinygpt::parse_attention_math(math, m)) {
    throw Error(fmt::format("--attention-math must be f32, tf32 or bf16, got '{}'", math));
  }
  return m;
}

void check_attention_math_flag(const std::string& math, const std::string& device) {
  if (parse_attention_math(math) != AttentionMath::F32 && device != "cuda") {
    throw Error(fmt::format("--attention-math {} runs attention on GPU tensor cores: it needs --device cuda", math));
  }
}

Numerics numerics_of(const TrainConfig& c) {
  if (c.device != "cuda") return {};
  return {c.tf32, parse_attention_math(c.attention_math)};
}

void check_numerics(const Numerics& numerics, Device device, const char* how) {
  if (device != Device::CUDA || numerics.attention == AttentionMath::F32 || cuda::compute_capability() >= 80) return;
  throw Error(fmt::format("{} flash attention needs tensor cores of compute capability 8.0 or newer; {} has none: {}",
                          attention_math_name(numerics.attention), cuda::device_description(), how));
}

namespace {

nlohmann::json flags_json(const TrainConfig& c) {
  nlohmann::json j = {{"data", c.data},
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
          {"grad_accum", c.grad_accum},
          {"eval_interval", c.eval_interval},
          {"eval_iters", c.eval_iters},
          {"train_fraction", c.train_fraction},
          {"seed", std::to_string(c.seed)},
          {"world_size", communicator().world_size()}};
  if (c.optimizer == "muon") {
    j.update({{"muon_lr", c.muon_lr}, {"muon_momentum", c.muon_momentum}, {"muon_weight_decay", c.muon_weight_decay},
              {"muon_scale", c.muon_scale}});
  }
  return j;
}

std::atomic<int> g_stop_signals{0};

extern "C" void on_stop_signal(int sig) {
  if (g_stop_signals.fetch_add(1) > 0) _exit(128 + sig);  // a second signal: leave at once
  constexpr char kMsg[] = "\nsignal received: finishing this iteration and saving a checkpoint (again to quit now)\n";
  [[maybe_unused]] const auto n = ::write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
}

/// While alive, SIGINT and SIGTERM ask the training loop to stop after the current iteration.
class StopSignals {
 public:
  StopSignals() {
    g_stop_signals = 0;
    struct sigaction sa{};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~StopSignals() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  bool requested() const { return g_stop_signals.load() > 0; }

 private:
  struct sigaction old_int_{}, old_term_{};
};

/// Progress on stderr: a live status line on a terminal (redrawn in place, at most 10 times a second) besides
/// the log lines, plain log lines when stderr is not a terminal, and only the final summary when quiet.
class Console {
 public:
  explicit Console(bool quiet) : quiet_(quiet), tty_(::isatty(STDERR_FILENO) == 1) {}
  ~Console() { clear(); }

  template <class... Args>
  void line(fmt::format_string<Args...> format, Args&&... args) {
    if (quiet_) return;
    clear();
    fmt::print(stderr, format, std::forward<Args>(args)...);
  }
  void status(int64_t iter, int64_t max_iters, double loss, double tok_per_s, double ms_per_iter) {
    if (quiet_ || !tty_) return;
    show(fmt::format("{}/{} ({:.0f}%)", iter + 1, max_iters, 100.0 * double(iter + 1) / double(std::max<int64_t>(max_iters, 1))),
         loss, tok_per_s, double(max_iters - iter - 1) * ms_per_iter / 1e3);
  }
  /// The status line of a run with a time budget: progress and ETA by the budget's seconds.
  void status_budget(int64_t iter, double spent, double budget, double loss, double tok_per_s) {
    if (quiet_ || !tty_) return;
    show(fmt::format("iter {} ({:.0f}% of {:g} s)", iter + 1, 100.0 * std::min(spent / budget, 1.0), budget), loss,
         tok_per_s, std::max(budget - spent, 0.0));
  }
  void clear() {
    if (live_) fmt::print(stderr, "\r\x1b[K");
    live_ = false;
  }

 private:
  /// Rewrites the status line (a terminal only, at most every 100 ms): progress, loss, speed and ETA.
  void show(const std::string& progress, double loss, double tok_per_s, double eta_s) {
    if (quiet_ || !tty_) return;
    const auto now = Clock::now();
    if (live_ && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    const auto eta = int64_t(eta_s);
    fmt::print(stderr, "\r{}  loss {:.4f}  {:.0f} tok/s  ETA {}:{:02d}:{:02d}\x1b[K", progress, loss, tok_per_s, eta / 3600,
               eta / 60 % 60, eta % 60);
    live_ = true;
  }

  bool quiet_, tty_;
  bool live_ = false;
  Clock::time_point last_{};
};

/// One writer per run directory: an exclusive flock on OUT/train.lock, held until the run ends. The kernel drops
/// the lock when the process dies however it dies, so a crashed run never leaves the directory locked. Readers
/// (sample, eval, info, plot) take no lock: checkpoints are replaced by rename and metrics lines are whole.
class RunLock {
 public:
  explicit RunLock(const fs::path& dir) : path_(dir / "train.lock") {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error(fmt::format("cannot create '{}': {}", path_.string(), std::strerror(errno)));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      char pid[32] = {};
      [[maybe_unused]] const auto n = ::pread(fd_, pid, sizeof(pid) - 1, 0);
      ::close(fd_);
      throw Error(fmt::format("'{}' is being trained into by another tinygpt train (pid {}): one run directory takes one "
                              "writer. Wait for it, stop it (Ctrl-C saves), or choose another --out; sample, eval and "
                              "info can read it meanwhile",
                              dir.string(), std::string(pid).empty() ? "unknown" : std::string(pid)));
    }
    const std::string pid = std::to_string(::getpid());
    if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != ssize_t(pid.size())) {
      ::close(fd_);
      throw Error(fmt::format("cannot write '{}': {}", path_.string(), std::strerror(errno)));
    }
  }
  ~RunLock() { ::close(fd_); }
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  fs::path path_;
  int fd_ = -1;
};

/// On resume: drops the lines a stopped run wrote after its checkpoint (iterations from `iter` on, evaluations
/// after it), so the resumed run's lines follow without repeats.
void truncate_metrics(const fs::path& path, int64_t iter) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("iter") || !j["iter"].is_number_integer()) continue;
    const int64_t it = j["iter"].get<int64_t>();
    if (j.contains("val_loss") ? it <= iter : it < iter) kept += line + '\n';
  }
  in.close();
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out || !(out << kept) || !out.flush()) throw Error(fmt::format("cannot rewrite '{}'", path.string()));
  }
  fs::rename(tmp, path);
}

/// Appends one JSON object per line, flushed, so a crash keeps every line written before it. Disabled (it
/// writes nothing) on every rank but the first.
class MetricsLog {
 public:
  MetricsLog(const fs::path& path, bool append, bool enabled) {
    if (!enabled) return;
    out_.open(path, append ? std::ios::app : std::ios::trunc);
    if (!out_) throw Error(fmt::format("cannot write '{}'", path.string()));
  }
  void write(const nlohmann::json& j) {
    if (out_.is_open()) out_ << j.dump() << '\n' << std::flush;
  }

 private:
  std::ofstream out_;
};

/// A checksum of every parameter's bytes (FNV-1a), to check that all ranks start from the same weights.
uint64_t weights_checksum(const std::vector<Tensor>& params) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const Tensor& p : params) {
    const auto v = p.to(Device::CPU).to_vector<float>();
    const auto* bytes = reinterpret_cast<const unsigned char*>(v.data());
    for (size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ bytes[i]) * 0x100000001b3ULL;
  }
  return h;
}


}  // namespace

void TrainConfig::validate() const {
  auto positive = [](const char* flag, double v) {
    if (!(v > 0)) throw Error(fmt::format("{} must be positive, got {}", flag, v));
  };
  auto non_negative = [](const char* flag, double v) {
    if (!(v >= 0)) throw Error(fmt::format("{} must not be negative, got {}", flag, v));
  };
  if (data.empty()) throw Error("--data is required: the UTF-8 text file to train on");
  positive("--batch-size", double(batch_size));
  non_negative("--max-iters", double(max_iters));
  non_negative("--time-budget", time_budget);
  if (!std::isfinite(time_budget)) throw Error(fmt::format("--time-budget must be a finite number of seconds, got {}", time_budget));
  positive("--lr", lr);
  non_negative("--min-lr", min_lr);
  if (min_lr > lr) throw Error(fmt::format("--min-lr ({}) must not exceed --lr ({})", min_lr, lr));
  non_negative("--warmup-iters", double(warmup_iters));
  if (lr_decay_iters < warmup_iters) {
    throw Error(fmt::format("--lr-decay-iters ({}) must be at least --warmup-iters ({})", lr_decay_iters, warmup_iters));
  }
  non_negative("--weight-decay", weight_decay);
  if (!(beta1 >= 0 && beta1 < 1)) throw Error(fmt::format("--beta1 must be in [0, 1), got {}", beta1));
  if (!(beta2 >= 0 && beta2 < 1)) throw Error(fmt::format("--beta2 must be in [0, 1), got {}", beta2));
  non_negative("--grad-clip", grad_clip);
  if (optimizer != "adamw" && optimizer != "muon") {
    throw Error(fmt::format("--optimizer must be adamw or muon, got '{}'", optimizer));
  }
  positive("--muon-lr", muon_lr);
  if (!(muon_momentum >= 0 && muon_momentum < 1)) throw Error(fmt::format("--muon-momentum must be in [0, 1), got {}", muon_momentum));
  non_negative("--muon-weight-decay", muon_weight_decay);
  if (muon_scale != "original" && muon_scale != "match-adamw") {
    throw Error(fmt::format("--muon-scale must be original or match-adamw, got '{}'", muon_scale));
  }
  positive("--grad-accum", double(grad_accum));
  non_negative("--bucket-mb", bucket_mb);
  positive("--eval-interval", double(eval_interval));
  positive("--eval-iters", double(eval_iters));
  positive("--log-interval", double(log_interval));
  if (!(train_fraction > 0 && train_fraction < 1)) {
    throw Error(fmt::format("--train-fraction must be in (0, 1), got {}", train_fraction));
  }
  check_attention_math_flag(attention_math, device);
  nn::GPTConfig m = model;
  m.vocab_size = std::max<int64_t>(m.vocab_size, 1);
  m.validate();
}

double learning_rate(const TrainConfig& c, int64_t iter, double seconds) {
  if (iter < c.warmup_iters) return c.lr * double(iter + 1) / double(c.warmup_iters + 1);
  if (c.time_budget > 0) {
    const double ratio = std::clamp(seconds / c.time_budget, 0.0, 1.0);
    return c.min_lr + 0.5 * (1.0 + std::cos(M_PI * ratio)) * (c.lr - c.min_lr);
  }
  if (iter > c.lr_decay_iters) return c.min_lr;
  if (c.lr_decay_iters == c.warmup_iters) return c.min_lr;
  const double ratio = double(iter - c.warmup_iters) / double(c.lr_decay_iters - c.warmup_iters);
  return c.min_lr + 0.5 * (1.0 + std::cos(M_PI * ratio)) * (c.lr - c.min_lr);
}

double estimate_loss(nn::GPT& model, std::span<const data::Token> ids, int64_t batch_size, int64_t iters,
                     uint64_t seed, const char* what, Communicator* comm) {
  NoGradGuard no_grad;
  const bool was_training = model.training();
  model.train(false);
  data::BatchSampler sampler(ids, batch_size, model.config().block_size, seed, what);
  const int rank = comm ? comm->rank() : 0, world = comm ? comm->world_size() : 1;
  double total = 0;
  const Device device = model.device();
  for (int64_t i = 0; i < iters; ++i) {
    if (i % world != rank) {  // another rank's batch: drawn (so every rank's draws stay in step), not evaluated
      sampler.skip();
      continue;
    }
    const auto b = sampler.next();
    total += model.forward(b.x.to(device), b.y.to(device)).loss.item();
  }
  if (comm) comm->all_reduce_sum(&total, 1);
  model.train(was_training);
  return total / double(iters);
}

namespace {

/// The run's output directory, created when missing.
fs::path make_output_dir(const std::string& dir) {
  const fs::path out = dir;
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec || !fs::is_directory(out, ec)) {
    throw Error(fmt::format("cannot create the output directory '{}': {}", out.string(), ec ? ec.message() : "not a directory"));
  }
  return out;
}

/// --resume: the run's latest checkpoint, whose model config the run takes (all but dropout, which may change);
/// throws when the data's vocabulary or a model flag given contradicts it.
Checkpoint resume_checkpoint(TrainConfig& cfg, const fs::path& out, const data::Corpus& corpus) {
  Checkpoint ckpt = load_checkpoint(out / kLatestCheckpoint);
  if (ckpt.vocab.chars() != corpus.vocab.chars()) {
    throw Error(fmt::format("--resume: the checkpoint's vocabulary ({} characters) differs from '{}' ({}); resume "
                            "with the data the run was started on",
                            ckpt.vocab.size(), cfg.data, corpus.vocab.size()));
  }
  std::string diffs;
  const auto flags = to_json(cfg.model), saved = to_json(ckpt.config);
  for (const std::string& key : cfg.model_flags_given) {
    if (saved.contains(key) && flags[key] != saved[key]) {
      diffs += fmt::format("{}{} {} (flags) vs {} (checkpoint)", diffs.empty() ? "" : ", ", key, flags[key].dump(),
                           saved[key].dump());
    }
  }
  if (!diffs.empty()) {
    throw Error(fmt::format("--resume: the model flags contradict the checkpoint: {}; drop them to resume as saved", diffs));
  }
  const double dropout = cfg.model.dropout;
  cfg.model = ckpt.config;
  cfg.model.dropout = dropout;
  return ckpt;
}

/// Several ranks: checks that every rank starts from rank 0's weights, and says how the ranks work together.
void check_ranks(const nn::GPT& model, Communicator& comm, Device device, const TrainConfig& cfg, Console& console) {
  uint64_t sum = weights_checksum(model.parameters()), first = sum;
  comm.broadcast(&first, sizeof(first), 0);
  if (sum != first) {
    throw Error(fmt::format("rank {}: its starting weights differ from rank 0's (checksum {:016x} vs {:016x}); every "
                            "rank must run the same binary with the same flags and checkpoint",
                            comm.rank(), sum, first));
  }
  const char* gradients = device == Device::CPU        ? ""
                          : cuda::built_with_nccl() ? ", gradients summed over NCCL, one GPU per rank"
                                                    : ", gradients summed through host memory (no NCCL in this build), "
                                                      "one GPU per rank";
  console.line("data parallel: {} ranks ({}{}), {} micro-batch{} each per step: the same steps as one process with "
               "--grad-accum {}\n",
               comm.world_size(), comm.backend(), gradients, cfg.grad_accum, cfg.grad_accum == 1 ? "" : "es",
               cfg.grad_accum * comm.world_size());
}

/// The run's optimizer over the packed parameters: AdamW, or Muon for the block matrices with AdamW for the rest.
std::unique_ptr<Optimizer> make_optimizer(const TrainConfig& cfg, FlatParameters& flat) {
  const AdamWConfig adamw{.lr = cfg.lr, .beta1 = cfg.beta1, .beta2 = cfg.beta2, .eps = 1e-8, .weight_decay = cfg.weight_decay};
  if (cfg.optimizer == "adamw") return std::make_unique<AdamW>(flat, adamw);
  const MuonConfig muon{.lr = cfg.muon_lr,
                        .momentum = cfg.muon_momentum,
                        .weight_decay = cfg.muon_weight_decay,
                        .scale = cfg.muon_scale == "match-adamw" ? MuonScale::MatchAdamW : MuonScale::Original};
  return std::make_unique<Muon>(flat, muon, adamw);
}

/// The log's model line: size, and where and how it computes.
std::string describe_model(const nn::GPT& model, Device device) {
  const nn::GPTConfig& m = model.config();
  const Numerics& n = model.numerics();
  const std::string where =
      device == Device::CUDA
          ? fmt::format("on {}{}{}", cuda::device_description(), n.tf32 ? ", TF32 matmuls" : "",
                        n.attention != AttentionMath::F32
                            ? fmt::format(", {} tensor-core attention", attention_math_name(n.attention))
                            : "")
          : fmt::format("{} threads", omp_get_max_threads());
  return fmt::format("model: {} layers, {} heads, {} wide, block {}, {:.2f}M parameters; {}\n", m.n_layer, m.n_head,
                     m.n_embd, m.block_size, double(model.num_parameters_non_embedding()) / 1e6, where);
}

/// FLOPs of one training step as nanoGPT's estimate_mfu counts them: per token, 6 per weight (the position table
/// left out; forward and backward) plus 12 L T C for attention's two products, forward and backward.
double step_flops(const nn::GPT& model, int64_t tokens_per_step) {
  const nn::GPTConfig& c = model.config();
  const double per_token = 6.0 * double(model.num_parameters_non_embedding()) +
                           12.0 * double(c.n_layer) * double(c.block_size) * double(c.n_embd);
  return per_token * double(tokens_per_step);
}

/// The machine's practical peak for this run: square f32 matmuls on the run's device and threads, with the run's TF32
/// setting, growing from 128 while one takes under 100 ms (up to 1536 on the CPU, 4096 on a GPU), then the best of
/// runs at the last size repeated for at least 0.3 s and 5 runs (one run when that took over 100 ms, as under a
/// sanitizer): cold caches, a core still ramping up its clock or a page-faulting first touch made three short runs
/// read low (112 GFLOP/s where training then reached 141 on a 2-core Zen 4). Model FLOPs utilization (MFU) is
/// measured against it, and the trainer raises it to any step that runs faster, so MFU never reads above 100%.
/// Returns GFLOP/s and the size used.
std::pair<double, int64_t> measure_peak_gflops(Device device, const Numerics& numerics) {
  NoGradGuard no_grad;
  const int64_t largest = device == Device::CPU ? 1536 : 4096;
  Generator gen(0);
  Tensor a, b;
  auto seconds = [&] {
    const auto t0 = Clock::now();
    const Tensor c = matmul(a, b, false, false, numerics);
    if (device == Device::CUDA) cuda::synchronize();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  int64_t n = 64;
  double best = 0;
  do {
    n = std::min(largest, n * 2);
    a = randn({n, n}, gen).to(device), b = randn({n, n}, gen).to(device);
    best = seconds();
  } while (n < largest && best < 0.1);
  if (best < 0.1) {
    double spent = 0;
    for (int i = 0; i < 5 || spent < 0.3; ++i) {
      const double t = seconds();
      spent += t;
      best = std::min(best, t);
    }
  }
  return {2.0 * double(n) * double(n) * double(n) / best / 1e9, n};
}

struct StepStats {
  double loss = 0, grad_norm = 0;
  double comm_ms = 0;  // waiting on and doing the reduction (the faster ranks wait here for the slowest)
  bool stop_from_any_rank = false;  // several ranks: a stop signal reached one of them during the step
};

/// What the training loop works on; the pieces are owned by train().
struct Run {
  const TrainConfig& cfg;
  Device device;
  const fs::path& out;
  Communicator& comm;
  const data::Corpus& corpus;
  const data::Split& split;
  nn::GPT& model;
  Generator& model_gen;
  Optimizer& opt;
  data::BatchSampler& sampler;
  TrainState& state;
  MetricsLog& metrics;
  Console& console;
  const StopSignals& stop;
  FlatParameters& flat;
  GradientBuckets* buckets;  // several CPU ranks with --bucket-mb > 0, else null

  bool lead() const { return comm.rank() == 0; }  // rank 0 speaks for the run: log lines, metrics, checkpoints

  void save_latest(int64_t iter) {
    state.iter = iter;
    state.sampler_rng = sampler.generator().state();
    state.model_rng = model_gen.state();
    if (lead()) save_checkpoint(out / kLatestCheckpoint, model, corpus.vocab, &opt, state);
  }

  /// Both splits' losses, logged; the latest checkpoint saved, and the best one when the validation loss is the
  /// lowest yet. Returns the validation loss.
  double evaluate(int64_t iter) {
    const auto t0 = Clock::now();
    const double train_loss = estimate_loss(model, split.train, cfg.batch_size, cfg.eval_iters,
                                            derived_seed(cfg.seed, kEvalTrainStream), "training split", &comm);
    const double val_loss = estimate_loss(model, split.val, cfg.batch_size, cfg.eval_iters,
                                          derived_seed(cfg.seed, kEvalValStream), "validation split", &comm);
    metrics.write({{"iter", iter}, {"train_loss", train_loss}, {"val_loss", val_loss}});
    const bool best = val_loss < state.best_val_loss;
    if (best) state.best_val_loss = val_loss;
    save_latest(iter);
    if (best && lead()) save_checkpoint(out / kBestCheckpoint, model, corpus.vocab, &opt, state);
    console.line("step {}: train loss {:.4f}, val loss {:.4f}{} ({:.1f}s)\n", iter, train_loss, val_loss,
                 best ? ", best so far: saved" : "", std::chrono::duration<double>(Clock::now() - t0).count());
    return val_loss;
  }

  /// One optimizer step over the step's world * grad_accum micro-batches, drawn in order by every rank; rank r
  /// computes the ones a single process with --grad-accum world * grad_accum computes at micro-steps
  /// r * grad_accum .. r * grad_accum + A - 1. Throws before the update when the loss or gradient is not finite.
  StepStats step(int64_t iter, double lr) {
    const int rank = comm.rank(), world = comm.world_size();
    const int64_t micro_steps = cfg.grad_accum * world;
    double reduced[2] = {0, 0};  // this rank's loss sum; whether a stop was asked of it (summed: of any rank)
    for (int64_t micro = 0; micro < micro_steps; ++micro) {
      if (micro / cfg.grad_accum != rank) {
        sampler.skip();
        continue;
      }
      const auto batch = sampler.next();
      // Dropout masks from the run's seed and the micro-batch's place in the run only: a rank draws the masks one
      // process would draw for this micro-batch, whatever the world size.
      model_gen.manual_seed(derived_seed(derived_seed(cfg.seed, kDropoutStream) + uint64_t(iter), uint64_t(micro)));
      Tensor loss;
      {
        profile::Phase phase("forward");
        loss = model.forward(batch.x.to(device), batch.y.to(device)).loss;
      }
      reduced[0] += loss.item();
      std::optional<GradReadyHook> hook;  // this rank's last backward of the step: reduce buckets as they complete
      if (buckets != nullptr && micro % cfg.grad_accum == cfg.grad_accum - 1) {
        buckets->arm();
        hook.emplace([this](const Tensor& leaf) { buckets->ready(leaf); });
      }
      profile::Phase phase("backward");
      (micro_steps == 1 ? loss : scale(loss, 1.0 / double(micro_steps))).backward();
    }
    StepStats s;
    if (world > 1) {
      profile::Phase phase("gradient reduction");
      reduced[1] = stop.requested() ? 1.0 : 0.0;  // all ranks stop after the same iteration
      const auto c0 = Clock::now();
      if (buckets != nullptr) {  // the buckets backward has not started yet, then every sum
        buckets->finish();
      } else {  // one buffer: one reduction
        Tensor g = flat.grads();
        float* grads = g.data<float>();
        device == Device::CPU ? comm.all_reduce_sum(grads, flat.numel()) : comm.all_reduce_sum_gpu(grads, flat.numel());
      }
      comm.all_reduce_sum(reduced, 2);
      s.comm_ms = std::chrono::duration<double, std::milli>(Clock::now() - c0).count();
    }
    profile::Phase phase("optimizer");
    s.grad_norm = grad_norm(flat);
    s.loss = reduced[0] / double(micro_steps);
    if (!std::isfinite(s.loss) || !std::isfinite(s.grad_norm)) {  // before the update: the weights stay finite
      throw Error(fmt::format("at iteration {} the {} is {}: training stopped before the update. Lower --lr (now {}), "
                              "raise --warmup-iters or --grad-clip, or check the data; {} holds the last good checkpoint",
                              iter, std::isfinite(s.loss) ? "gradient norm" : "loss",
                              std::isfinite(s.loss) ? s.grad_norm : s.loss, cfg.lr, (out / kLatestCheckpoint).string()));
    }
    opt.step(lr, clip_factor(s.grad_norm, cfg.grad_clip));
    opt.zero_grad();
    s.stop_from_any_rank = reduced[1] > 0;
    return s;
  }
};

}  // namespace

TrainResult train(const TrainConfig& cfg_in) {
  TrainConfig cfg = cfg_in;
  cfg.validate();
  const Device device = parse_device(cfg.device);
  Communicator& comm = communicator();
  const int world = comm.world_size();
  // One GPU per rank, by the rank's place on its machine, before anything else touches a GPU.
  if (device == Device::CUDA && world > 1) cuda::set_device(comm.local_rank() % cuda::device_count());
  check_numerics(numerics_of(cfg), device, "use --attention-math f32");
  const fs::path out = make_output_dir(cfg.out);
  const bool lead = comm.rank() == 0;
  std::optional<RunLock> lock;
  if (lead) lock.emplace(out);

  const auto t_load = Clock::now();
  if (!lead) comm.barrier();  // the others map the token cache rank 0 has written
  const data::Corpus corpus = data::load_corpus(cfg.data, out);
  if (lead) comm.barrier();
  const auto ids = corpus.tokens.ids();
  const data::Split split = data::split_tokens(ids, cfg.train_fraction);
  Console console(cfg.quiet || !lead);
  console.line("data: {} tokens, vocabulary {} ({} {}, {:.2f}s); train {} / val {} tokens\n", ids.size(),
               corpus.vocab.size(), corpus.from_cache ? "mapped from" : "encoded into", (out / "tokens.bin").string(),
               std::chrono::duration<double>(Clock::now() - t_load).count(), split.train.size(), split.val.size());

  // Model: the flags' config, or the checkpoint's when resuming.
  cfg.model.vocab_size = corpus.vocab.size();
  std::optional<Checkpoint> ckpt;
  if (cfg.resume) ckpt = resume_checkpoint(cfg, out, corpus);
  require_memory(training_memory(cfg.model, cfg.batch_size), device, "training this model",
                 "use a smaller --n-layer, --n-embd, --block-size or --batch-size (--grad-accum keeps the tokens per step)");
  Generator model_gen(derived_seed(cfg.seed, kModelStream));
  nn::GPT model(cfg.model, model_gen);
  use_document_separator(model, corpus.vocab);
  model.set_numerics(numerics_of(cfg));
  model.to(device);  // before packing the parameters, and before the optimizer, whose moments live beside them
  FlatParameters flat(backward_order(model.named_parameters()));
  const std::unique_ptr<Optimizer> opt_owner = make_optimizer(cfg, flat);
  Optimizer& opt = *opt_owner;
  data::BatchSampler sampler(split.train, cfg.batch_size, cfg.model.block_size, derived_seed(cfg.seed, kSamplerStream),
                             "training split");
  data::BatchSampler(split.val, 1, cfg.model.block_size, 0, "validation split");  // fails early when too short

  TrainState state;
  if (ckpt) {
    load_weights(model, *ckpt);
    load_optimizer(opt, *ckpt);
    state = ckpt->state;
    sampler.generator().set_state(state.sampler_rng);
    model_gen.set_state(state.model_rng);
    console.line("resuming from {} at iteration {} (best val loss {:.4f})\n", ckpt->path.string(), state.iter,
                 state.best_val_loss);
  }
  state.train_config = flags_json(cfg);
  if (cfg.resume && lead) truncate_metrics(out / "metrics.jsonl", state.iter);
  MetricsLog metrics(out / "metrics.jsonl", cfg.resume, lead);
  if (world > 1) check_ranks(model, comm, device, cfg, console);
  console.line("{}", describe_model(model, device));

  const StopSignals stop;
  std::optional<GradientBuckets> buckets;
  if (world > 1 && device == Device::CPU && cfg.bucket_mb > 0) {
    buckets.emplace(flat, cfg.bucket_mb, comm);
    console.line("gradients summed over the ranks in {} bucket{} of up to {} MB, each as soon as backward has "
                 "finished it\n", buckets->count(), buckets->count() == 1 ? "" : "s", cfg.bucket_mb);
  }
  Run run{cfg, device, out,     comm,    corpus,  split, model, model_gen,
          opt, sampler, state, metrics, console, stop,  flat,  buckets ? &*buckets : nullptr};
  const int64_t tokens_per_iter = cfg.batch_size * cfg.model.block_size * cfg.grad_accum * world;
  const double flops_per_iter = step_flops(model, tokens_per_iter);
  const auto peak = measure_peak_gflops(device, model.numerics());
  double peak_gflops = peak.first;
  const int64_t peak_n = peak.second;
  bool peak_raised = false;
  console.line("speed: a step is {:.2f} GFLOP (nanoGPT's count); MFU is against {:.0f} GFLOP/s per rank, a {}^3 "
               "matmul measured now on {}\n", flops_per_iter / 1e9, peak_gflops, peak_n,
               device == Device::CPU ? fmt::format("{} threads", omp_get_max_threads()) : std::string("the GPU"));
  TrainResult result{state.best_val_loss, NAN, state.iter};
  const int64_t first = state.iter;
  double ms_avg = 0;  // moving average of the iteration time, for the ETA
  const bool budget = cfg.time_budget > 0;
  if (budget) {
    console.line("time budget: {:g} s of training steps{}\n", cfg.time_budget,
                 state.train_seconds > 0 ? fmt::format(", {:.1f} s spent before this run", state.train_seconds) : "");
  }
  for (int64_t iter = state.iter;; ++iter) {
    const double lr = learning_rate(cfg, iter, state.train_seconds);
    const bool done = iter >= cfg.max_iters || (budget && state.train_seconds >= cfg.time_budget);
    if ((iter % cfg.eval_interval == 0 || done) && !(cfg.resume && iter == first)) {
      profile::Phase phase("evaluation");
      result.last_val_loss = run.evaluate(iter);
    }
    if (done) {
      result.iters = iter;
      break;
    }
    const auto t0 = Clock::now();
    const StepStats s = [&] {
      profile::Phase phase("step");
      return run.step(iter, lr);
    }();
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    state.train_seconds += ms / 1e3;
    // Every rank stops after the same iteration and schedules the same learning rate: rank 0's clock decides.
    if (budget && world > 1) comm.broadcast(&state.train_seconds, sizeof(double), 0);
    const double tok_per_s = double(tokens_per_iter) / (ms / 1e3);
    const double gflops = flops_per_iter / (ms / 1e3) / 1e9;
    if (gflops > peak_gflops * world) {  // the step outran the start-up matmul: that was not the peak
      peak_gflops = gflops / world;
      if (!peak_raised) {
        console.line("speed: iteration {} ran faster than the start-up matmul; MFU is against the fastest step from "
                     "here on\n", iter);
        peak_raised = true;
      }
    }
    const double mfu = gflops / (peak_gflops * world);
    nlohmann::json row = {{"iter", iter},           {"loss", s.loss},   {"lr", lr},   {"grad_norm", s.grad_norm},
                          {"ms", ms},               {"tok_per_s", tok_per_s}, {"gflops", gflops}, {"mfu", mfu},
                          {"train_s", state.train_seconds}};
    if (world > 1) row["comm_ms"] = s.comm_ms;
    metrics.write(row);
    if (iter % cfg.log_interval == 0) {
      console.line("iter {}: loss {:.4f}, lr {:.2e}, grad norm {:.3f}, {:.1f} ms, {:.0f} tok/s, {:.1f} GFLOP/s ({:.0f}% "
                   "of peak)\n", iter, s.loss, lr, s.grad_norm, ms, tok_per_s, gflops, 100 * mfu);
    }
    ms_avg = ms_avg == 0 ? ms : 0.9 * ms_avg + 0.1 * ms;
    if (budget) {
      console.status_budget(iter, state.train_seconds, cfg.time_budget, s.loss, tok_per_s);
    } else {
      console.status(iter, cfg.max_iters, s.loss, tok_per_s, ms_avg);
    }
    if (world > 1 ? s.stop_from_any_rank : stop.requested()) {  // one process: checked after the step's logging
      run.save_latest(iter + 1);
      console.clear();
      if (lead) fmt::print(stderr, "stopped by a signal after iteration {}: saved {}; continue with --resume\n", iter,
                           (out / kLatestCheckpoint).string());
      result.iters = iter + 1;
      result.interrupted = true;
      break;
    }
  }
  result.best_val_loss = state.best_val_loss;
  if (result.interrupted) return result;
  console.clear();
  if (lead) {
    fmt::print(stderr, "done: {} iterations in {:.1f} s of training steps{}, best val loss {:.4f}; checkpoints in {}\n",
               result.iters, state.train_seconds, budget ? fmt::format(" (time budget {:g} s)", cfg.time_budget) : "",
               result.best_val_loss, out.string());
  }
  return result;
}

}  // namespace tinygpt

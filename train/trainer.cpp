#include "train/trainer.h"

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>

#include "kernels/device.h"
#include "kernels/env.h"
#include "kernels/profile.h"
#include "kernels/scalar_math.h"
#include "train/adamw.h"
#include "train/checkpoint.h"
#include "train/comm.h"
#include "train/console.h"
#include "train/gradient_buckets.h"
#include "train/lora.h"
#include "train/memory.h"
#include "train/muon.h"
#include "train/run_dir.h"
#include "train/speed.h"
#include "train/training_data.h"

namespace tinygpt {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

/// Seeds derived from the run's seed, one per purpose, so each stream is independent of the others.
uint64_t derived_seed(uint64_t seed, uint64_t purpose) { return seed * 0x9E3779B97F4A7C15ULL + purpose; }
constexpr uint64_t kSamplerStream = 1, kModelStream = 2, kEvalTrainStream = 3, kEvalValStream = 4, kDropoutStream = 5;

/// Parameters in the order the flat buffers keep them: the reverse of the model's, which is about the order in which
/// backward finishes their gradients (the last block's first, the token embedding, used by the LM head too, last),
/// so that gradient buckets fill front to back.
std::vector<std::pair<std::string, Tensor>> backward_order(std::vector<std::pair<std::string, Tensor>> params) {
  std::reverse(params.begin(), params.end());
  return params;
}

}  // namespace

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

namespace {

/// --resume: the run's latest checkpoint, whose model config the run takes (all but dropout, which may change);
/// throws when the data's vocabulary or a model flag given contradicts it.
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

/// --init-from: the checkpoint whose config (all but dropout) and weights a new run starts from; its optimizer state
/// and iteration are left behind. Throws when a model flag given contradicts it (check_init_flags says so first).
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

/// Several ranks: checks that every rank starts from rank 0's weights, and says how the ranks work together.
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

/// The run's optimizer over the packed parameters: AdamW, or Muon for the block matrices with AdamW for the rest.
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

/// The log's model line: size, and where and how it computes.
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

/// The training step, one form on every device: every per-step value the work reads is in memory where the model is
/// (device memory on a GPU), refilled before the step (the rank's micro-batches, the optimizer's rates:
/// Optimizer::schedule, the dropout offset: Run::dropout_for_step), and what the host needs is read back after it
/// ({loss sum, gradient sum of squares}: the step's one host synchronisation); the optimizer clips and refuses a
/// non-finite step where the parameters are. So the step's work is the same every step, and on one GPU with CUDA
/// graphs on it is captured once, on the second step (the first warms the allocator and loads the kernels), and
/// replayed from then on, dropout included.
struct StepBuffers {
  std::vector<Tensor> x, y;  // the rank's micro-batches, refilled in place
  Tensor sched, stats;       // the optimizer's values in, {loss sum, sum of squares} out
  bool use_graph = false;
  int64_t queued = 0;   // steps queued op by op so far
  int64_t replays = 0;  // steps run as a replay of `graph`
  cuda::Graph graph;
};

struct StepStats {
  double loss = 0, grad_norm = 0;
  double comm_ms = 0;               // waiting on and doing the reduction (the faster ranks wait here for the slowest)
  bool stop_from_any_rank = false;  // several ranks: a stop signal reached one of them during the step
};

/// What the training loop works on; the pieces are owned by train().
struct Run {
  const TrainConfig& cfg;
  Device device;
  const fs::path& out;
  Communicator& comm;
  const TrainingData& data;
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
  StepBuffers step_buffers = {};
  // The step's dropout offset (DropoutSeed::offset), one 64-bit word in the model's device memory, which every
  // dropout seed the model draws from model_gen adds; see dropout_for_step.
  Tensor dropout_offset = {};

  ~Run() { model_gen.set_dropout_offset(nullptr); }  // the word lives here

  bool lead() const { return comm.rank() == 0; }  // rank 0 speaks for the run: log lines, metrics, checkpoints

  /// Dropout masks from the run's seed and the micro-batch's place in the run only, drawn so that a captured step
  /// replays with each step's own: the sites' seeds come from model_gen seeded by the micro-batch's index in the step
  /// (the same every step, as a graph captures them), and each adds the step's offset, a hash of the iteration
  /// written to device memory before the step (as the optimizer's rates are). A rank draws the masks one process would
  /// draw for its micro-batches, whatever the world size; the CPU draws the same masks as the GPU.
  void dropout_for_step(int64_t iter) {
    if (!dropout_offset.defined()) {
      dropout_offset = zeros({2}, DType::I32, device);
      model_gen.set_dropout_offset(reinterpret_cast<const uint64_t*>(dropout_offset.data<int32_t>()));
    }
    const uint64_t key = mix64(derived_seed(derived_seed(cfg.seed, kDropoutStream), uint64_t(iter)));
    dropout_offset.copy_(from_vector(std::vector<int32_t>{int32_t(uint32_t(key)), int32_t(uint32_t(key >> 32))}, {2}));
  }

  /// model_gen as the dropout sites of micro-batch `micro` of a step draw from it (see dropout_for_step).
  void dropout_for_micro_batch(int64_t micro) {
    model_gen.manual_seed(derived_seed(derived_seed(cfg.seed, kDropoutStream), uint64_t(micro)));
  }

  void save_latest(int64_t iter) {
    state.iter = iter;
    state.sampler_rng = sampler.generator().state();
    state.model_rng = model_gen.state();
    if (lead()) save_checkpoint(out / kLatestCheckpoint, model, data.tokenizer, &opt, state);
  }

  /// Both splits' losses, logged; the latest checkpoint saved, and the best one when the validation loss is the
  /// lowest yet. Returns the validation loss.
  double evaluate(int64_t iter) {
    if (data.chat) return evaluate_chat(iter);
    const auto t0 = Clock::now();
    const double train_loss = estimate_loss(model, split.train, cfg.batch_size, cfg.eval_iters,
                                            derived_seed(cfg.seed, kEvalTrainStream), "training split", &comm);
    const double val_loss = estimate_loss(model, split.val, cfg.batch_size, cfg.eval_iters,
                                          derived_seed(cfg.seed, kEvalValStream), "validation split", &comm);
    const double val_bpb = bits_per_byte(val_loss, split.val.size(), data.val_bytes);
    metrics.write({{"iter", iter}, {"train_loss", train_loss}, {"val_loss", val_loss}, {"val_bpb", val_bpb}});
    const bool best = val_loss < state.best_val_loss;
    if (best) state.best_val_loss = val_loss;
    save_latest(iter);
    if (best && lead()) save_checkpoint(out / kBestCheckpoint, model, data.tokenizer, &opt, state);
    console.line("step {}: train loss {:.4f}, val loss {:.4f} ({:.4f} bits per byte){} ({:.1f}s)\n", iter, train_loss,
                 val_loss, val_bpb, best ? ", best so far: saved" : "",
                 std::chrono::duration<double>(Clock::now() - t0).count());
    return val_loss;
  }

  /// sft's evaluation: the assistant-token loss of the held-out conversations (at most --eval-iters batches of them)
  /// and of as many training ones, then the checkpoints as evaluate() saves them.
  double evaluate_chat(int64_t iter) {
    const auto t0 = Clock::now();
    const size_t limit = size_t(cfg.eval_iters * cfg.batch_size);
    int64_t train_targets = 0, val_targets = 0;
    const double train_loss = rows_loss(model, data.chat->train.rows(), cfg.batch_size, limit, train_targets, &comm);
    const double val_loss = rows_loss(model, data.chat->val.rows(), cfg.batch_size, limit, val_targets, &comm);
    metrics.write({{"iter", iter}, {"train_loss", train_loss}, {"val_loss", val_loss}, {"val_tokens", val_targets}});
    const bool best = val_loss < state.best_val_loss;
    if (best) state.best_val_loss = val_loss;
    save_latest(iter);
    if (best && lead()) save_checkpoint(out / kBestCheckpoint, model, data.tokenizer, &opt, state);
    console.line("step {}: train loss {:.4f}, val loss {:.4f} (the assistants' {} held-out tokens){} ({:.1f}s)\n", iter,
                 train_loss, val_loss, val_targets, best ? ", best so far: saved" : "",
                 std::chrono::duration<double>(Clock::now() - t0).count());
    return val_loss;
  }

  /// The error that stops a run whose step's loss or gradient norm is not finite (the weights were not updated).
  [[noreturn]] void refuse_non_finite(int64_t iter, const StepStats& s) const {
    throw Error(
        fmt::format("at iteration {} the {} is {}: training stopped before the update. Lower --lr (now {}), "
                    "raise --warmup-iters or --grad-clip, or check the data; {} holds the last good checkpoint",
                    iter, std::isfinite(s.loss) ? "gradient norm" : "loss",
                    std::isfinite(s.loss) ? s.grad_norm : s.loss, cfg.lr, (out / kLatestCheckpoint).string()));
  }

  /// One optimizer step over the step's world * grad_accum micro-batches, drawn in order by every rank; rank r
  /// computes the ones a single process with --grad-accum world * grad_accum computes at micro-steps
  /// r * grad_accum .. r * grad_accum + A - 1. The buffers refilled (StepBuffers), then the step replayed as a graph,
  /// captured, or queued op by op. Throws when the loss or gradient is not finite (the weights were not updated).
  StepStats step(int64_t iter, double lr) {
    StepBuffers& d = step_buffers;
    const int rank = comm.rank(), world = comm.world_size();
    for (int64_t micro = 0, mine = 0; micro < cfg.grad_accum * world; ++micro) {
      if (micro / cfg.grad_accum != rank) {
        sampler.skip();
        continue;
      }
      const auto batch = sampler.next();
      d.x[size_t(mine)].copy_(batch.x);
      d.y[size_t(mine)].copy_(batch.y);
      ++mine;
    }
    const std::vector<float> sched = opt.schedule(lr);
    if (!d.sched.defined()) d.sched = empty({int64_t(sched.size())}, DType::F32, device);
    d.sched.copy_(from_vector(sched, {int64_t(sched.size())}));
    dropout_for_step(iter);
    StepStats s;
    if (!d.graph && d.use_graph && d.queued >= 1) {
      cuda::begin_capture();
      try {
        queue_step(s);
        d.graph = cuda::end_capture();
        console.line("CUDA graphs: iteration {} captured ({} kernels, copies and memsets); replayed from here on\n",
                     iter, d.graph.nodes());
      } catch (const Error& e) {  // nothing recorded ran: queue the step instead, and every later one
        cuda::abort_capture();
        d.use_graph = false;
        console.line("CUDA graphs off: the training step could not be captured ({}); queueing it op by op\n", e.what());
      }
    }
    if (d.graph) {
      d.graph.replay();
      ++d.replays;
    } else {
      queue_step(s);
      ++d.queued;
    }
    return finish_step(iter, s);
  }

  /// Queues (or, while capturing, records) the step's work: each of the rank's micro-batches' forward and backward,
  /// the gradients summed over the ranks, the loss sum and the gradient's sum of squares into stats, the optimizer's
  /// update reading them, the gradients zeroed. The reduction's time goes to s.comm_ms.
  void queue_step(StepStats& s) {
    StepBuffers& d = step_buffers;
    const int world = comm.world_size();
    const int64_t micro_steps = cfg.grad_accum * world;
    Tensor loss_sum;  // the micro-batch losses, summed where they are (on the GPU: no synchronisation)
    for (int64_t a = 0; a < cfg.grad_accum; ++a) {
      dropout_for_micro_batch(comm.rank() * cfg.grad_accum + a);
      Tensor loss;
      {
        profile::Phase phase("forward");
        loss = model.forward(d.x[size_t(a)], d.y[size_t(a)]).loss;
      }
      {
        NoGradGuard no_grad;
        loss_sum = loss_sum.defined() ? loss_sum + loss.detach() : loss.detach();
      }
      std::optional<GradReadyHook> hook;  // the rank's last backward of the step: reduce buckets as they complete
      if (buckets != nullptr && a == cfg.grad_accum - 1) {
        buckets->arm();
        hook.emplace([this](const Tensor& leaf) { buckets->ready(leaf); });
      }
      profile::Phase phase("backward");
      (micro_steps == 1 ? loss : scale(loss, 1.0 / double(micro_steps))).backward();
    }
    if (world > 1) {
      profile::Phase phase("gradient reduction");
      const auto c0 = Clock::now();
      if (buckets != nullptr) {  // the buckets backward has not started yet, then every sum
        buckets->finish();
      } else {  // one buffer: one reduction
        Tensor g = flat.grads();
        float* grads = g.data<float>();
        device == Device::CPU ? comm.all_reduce_sum(grads, flat.numel()) : comm.all_reduce_sum_gpu(grads, flat.numel());
      }
      s.comm_ms = std::chrono::duration<double, std::milli>(Clock::now() - c0).count();
    }
    profile::Phase phase("optimizer");
    NoGradGuard no_grad;
    // A rank's loss is its own, the gradient's sum of squares the ranks' (a non-finite loss makes every rank's summed
    // gradient non-finite too, so all refuse the update together).
    d.stats.copy_(concat({reshape(loss_sum, {1}), reshape(sum_squares(flat.grads()), {1})}, 0));
    opt.step(d.sched, d.stats, cfg.grad_clip);
    opt.zero_grad();
  }

  /// The step's stats read back (its one host synchronisation), the loss summed over the ranks with whether any was
  /// asked to stop (so all stop after the same iteration); throws when the loss or the gradient is not finite.
  StepStats finish_step(int64_t iter, StepStats s) {
    const int world = comm.world_size();
    const Tensor& st = step_buffers.stats;
    const std::vector<double> stats = st.dtype() == DType::F64 ? st.to_vector<double>() : [&] {
      const std::vector<float> f = st.to_vector<float>();
      return std::vector<double>{double(f[0]), double(f[1])};
    }();
    double reduced[2] = {stats[0], stop.requested() ? 1.0 : 0.0};
    if (world > 1) {
      const auto c0 = Clock::now();
      comm.all_reduce_sum(reduced, 2);
      s.comm_ms += std::chrono::duration<double, std::milli>(Clock::now() - c0).count();
    }
    s.loss = reduced[0] / double(cfg.grad_accum * world);
    s.grad_norm = std::sqrt(stats[1]);
    s.stop_from_any_rank = reduced[1] > 0;
    if (!std::isfinite(s.loss) || !std::isfinite(s.grad_norm)) refuse_non_finite(iter, s);  // nothing was updated
    return s;
  }
};

/// The step's buffers (StepBuffers), and whether it runs as a CUDA graph (one GPU, one rank; said in the log).
void set_up_step(Run& run) {
  const TrainConfig& cfg = run.cfg;
  const Device device = run.device;
  StepBuffers& d = run.step_buffers;
  for (int64_t micro = 0; micro < cfg.grad_accum; ++micro) {
    d.x.push_back(empty({cfg.batch_size, cfg.model.block_size}, DType::I32, device));
    d.y.push_back(empty({cfg.batch_size, cfg.model.block_size}, DType::I32, device));
  }
  d.stats = empty({2}, run.flat.values().dtype(), device);
  if (device != Device::CUDA) return;
  const bool one = run.comm.world_size() == 1;
  d.use_graph = one && cfg.cuda_graphs && !cuda::profiling();
  const char* graphs = d.use_graph ? "CUDA graphs: the training step is captured on its second iteration and replayed"
                       : !cfg.cuda_graphs ? "CUDA graphs off (--no-cuda-graphs): the step is queued op by op"
                       : !one
                           ? "CUDA graphs off: several ranks; the step is queued op by op"
                           : "CUDA graphs off: TINYGPT_CUDA_PROFILE=1 times each op alone; the step is queued op by op";
  run.console.line("{}\n", graphs);
}

/// The meter's peak for this run, stated on the console with the step's FLOPs (the CPU's measured rates cached for
/// the next run).
Peak announce_meter(Run& run, double flops_per_iter) {
  const Peak peak = stated_peak(run.device, run.model.numerics());
  if (run.device == Device::CPU && run.lead()) {
    if (const std::string why = save_cpu_rates_cache(); !why.empty()) {
      run.console.line("note: {}: the CPU is measured again next run\n", why);
    }
  }
  const std::string against = peak.gflops > 0
                                  ? fmt::format("MFU is against {:.0f} GFLOP/s per rank: {}", peak.gflops, peak.how)
                                  : fmt::format("no MFU: the peak is {}", peak.how);
  run.console.line("speed: a step is {:.2f} GFLOP (nanoGPT's count, causal attention's half{}); {}\n",
                   flops_per_iter / 1e9, run.opt.step_flops() > 0 ? ", Muon's Newton-Schulz" : "", against);
  return peak;
}

/// What the loop knows of the run's speed: the work per iteration and the peak MFU is measured against.
struct Meter {
  int64_t tokens_per_iter = 0;
  double flops_per_iter = 0;
  Peak peak;
  double ms_avg = 0;  // moving average of the iteration time, for the ETA
};

/// An iteration's row of metrics.jsonl, its log line and the status line; raises the meter's peak first when the
/// step passed it, so no logged MFU is above 1.
void log_step(Run& run, Meter& meter, int64_t iter, double lr, const StepStats& s, double ms, int64_t step_syncs) {
  const TrainConfig& cfg = run.cfg;
  const int world = run.comm.world_size();
  const double train_s = run.state.train_seconds;
  const double tok_per_s = double(meter.tokens_per_iter) / (ms / 1e3);
  const double gflops = meter.flops_per_iter / (ms / 1e3) / 1e9;
  if (meter.peak.gflops > 0 && gflops > meter.peak.gflops * world) {
    meter.peak = peak_passed(run.device, run.model.numerics(), meter.peak, gflops / world);
    run.console.line(
        "speed: iteration {} ran at {:.0f} GFLOP/s, above the peak: MFU is now against {:.0f} GFLOP/s per "
        "rank, {}\n",
        iter, gflops, meter.peak.gflops, meter.peak.how);
  }
  const double mfu = meter.peak.gflops > 0 ? gflops / (meter.peak.gflops * world) : 0;  // only against a stated peak
  nlohmann::json row = {{"iter", iter}, {"loss", s.loss},         {"lr", lr},         {"grad_norm", s.grad_norm},
                        {"ms", ms},     {"tok_per_s", tok_per_s}, {"gflops", gflops}, {"train_s", train_s}};
  if (meter.peak.gflops > 0) row["mfu"] = mfu;
  if (world > 1) row["comm_ms"] = s.comm_ms;
  if (run.device == Device::CUDA) {
    row["host_syncs"] = step_syncs;
    row["gpu_peak_mib"] = double(cuda::memory_stats().peak_allocated) / (1 << 20);  // the allocator's count: no sync
  }
  run.metrics.write(row);
  if (iter % cfg.log_interval == 0) {
    run.console.line("iter {}: loss {:.4f}, lr {:.2e}, grad norm {:.3f}, {:.1f} ms, {:.0f} tok/s, {:.1f} GFLOP/s{}\n",
                     iter, s.loss, lr, s.grad_norm, ms, tok_per_s, gflops,
                     meter.peak.gflops > 0 ? fmt::format(" ({:.0f}% of peak)", 100 * mfu) : "");
  }
  meter.ms_avg = meter.ms_avg == 0 ? ms : 0.9 * meter.ms_avg + 0.1 * ms;
  if (cfg.time_budget > 0) {
    run.console.status_budget(iter, train_s, cfg.time_budget, s.loss, tok_per_s);
  } else {
    run.console.status(iter, cfg.max_iters, s.loss, tok_per_s, meter.ms_avg);
  }
}

/// The closing line of a run that was not stopped.
void say_done(const Run& run, const TrainResult& result) {
  run.console.clear();
  if (!run.lead()) return;
  const TrainConfig& cfg = run.cfg;
  fmt::print(stderr, "done: {} iterations in {:.1f} s of training steps{}, best val loss {:.4f}; checkpoints in {}\n",
             result.iters, run.state.train_seconds,
             cfg.time_budget > 0 ? fmt::format(" (time budget {:g} s)", cfg.time_budget) : "", result.best_val_loss,
             run.out.string());
}

/// The training loop: steps, evaluations, logs and checkpoints, until the last iteration, the time budget or a stop
/// signal; then the closing line.
TrainResult run_steps(Run& run) {
  const TrainConfig& cfg = run.cfg;
  TrainState& state = run.state;
  const int world = run.comm.world_size();
  Meter meter;
  meter.tokens_per_iter = cfg.batch_size * cfg.model.block_size * cfg.grad_accum * world;
  // Muon's Newton-Schulz products run on every rank.
  meter.flops_per_iter = step_flops(run.model, meter.tokens_per_iter) + world * run.opt.step_flops();
  meter.peak = announce_meter(run, meter.flops_per_iter);
  TrainResult result{state.best_val_loss, NAN, state.iter};
  const int64_t first = state.iter;
  const bool budget = cfg.time_budget > 0;
  if (budget) {
    run.console.line(
        "time budget: {:g} s of training steps{}\n", cfg.time_budget,
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
    const int64_t syncs0 = cuda::host_syncs(), reads0 = Tensor::float_host_reads();
    const StepStats s = [&] {
      profile::Phase phase("step");
      return run.step(iter, lr);
    }();
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    const int64_t step_syncs = cuda::host_syncs() - syncs0;
    result.max_step_syncs = std::max(result.max_step_syncs, step_syncs);
    result.max_step_float_reads = std::max(result.max_step_float_reads, Tensor::float_host_reads() - reads0);
    state.train_seconds += ms / 1e3;
    // Every rank stops after the same iteration and schedules the same learning rate: rank 0's clock decides.
    if (budget && world > 1) run.comm.broadcast(&state.train_seconds, sizeof(double), 0);
    log_step(run, meter, iter, lr, s, ms, step_syncs);
    if (world > 1 ? s.stop_from_any_rank : run.stop.requested()) {  // one process: checked after the step's logging
      run.save_latest(iter + 1);
      run.console.clear();
      if (run.lead())
        fmt::print(stderr, "stopped by a signal after iteration {}: saved {}; continue with --resume\n", iter,
                   (run.out / kLatestCheckpoint).string());
      result.iters = iter + 1;
      result.interrupted = true;
      break;
    }
  }
  result.best_val_loss = state.best_val_loss;
  result.graph_replays = run.step_buffers.replays;
  if (!result.interrupted) say_done(run, result);
  return result;
}

/// sft from a BPE model without a chat template (one trained here): ChatML, its tokens added to init's tokenizer where
/// missing and cfg's vocabulary grown to hold them; returns the tokens added (none otherwise).
std::vector<std::string> add_chatml(TrainConfig& cfg, std::optional<Checkpoint>& init) {
  const bool chatml = cfg.chat_template.empty() || cfg.chat_template == "chatml";
  if (!init || !cfg.sft || !chatml || !init->tokenizer.is_bpe() || !init->tokenizer.config().chat_template.empty())
    return {};
  std::vector<std::string> added = data::add_chatml_tokens(init->tokenizer);
  cfg.model.vocab_size = std::max(cfg.model.vocab_size, init->tokenizer.vocab_size());
  if (!added.empty()) refuse_lora_new_tokens(cfg.model.lora);
  return added;
}

/// The sampler of the training rows (token ids or conversations); checks first that the held-out ids hold a batch.
data::BatchSampler training_sampler(const TrainConfig& cfg, const TrainingData& data) {
  const uint64_t seed = derived_seed(cfg.seed, kSamplerStream);
  if (data.chat) {
    return data::BatchSampler(data.chat->train.rows(), cfg.batch_size, cfg.model.block_size, seed,
                              "training conversations");
  }
  data::BatchSampler sampler(data.split.train, cfg.batch_size, cfg.model.block_size, seed, "training split");
  data::BatchSampler(data.split.val, 1, cfg.model.block_size, 0, "validation split");  // fails early when too short
  return sampler;
}

/// The memory training needs, checked against the device's before any work.
MemoryNeed require_training_memory(const TrainConfig& cfg, Device device) {
  const MemoryNeed need =
      training_memory(cfg.model, cfg.batch_size, cfg.optimizer == "muon", numerics_of(cfg).bf16_storage);
  require_memory(
      need, device, "training this model",
      "use a smaller --n-layer, --n-embd, --block-size or --batch-size (--grad-accum keeps the tokens per step)");
  return need;
}

/// --resume: the checkpoint's optimizer state, generators and training state, its contents freed after.
TrainState resume_state(Checkpoint& ckpt, Optimizer& opt, data::BatchSampler& sampler, Generator& model_gen,
                        Console& console) {
  load_optimizer(opt, ckpt);
  ckpt.contents = {};
  TrainState state = ckpt.state;
  sampler.generator().set_state(state.sampler_rng);
  model_gen.set_state(state.model_rng);
  console.line("resuming from {} at iteration {} (best val loss {:.4f}, --optimizer {})\n", ckpt.path.string(),
               state.iter, state.best_val_loss, opt.name());
  return state;
}

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
  // Model: the flags' config, or the checkpoint's when fine-tuning (--init-from: checked before --out is made) or
  // resuming.
  std::optional<Checkpoint> ckpt, init;
  if (!cfg.init_from.empty()) init = init_checkpoint(cfg);
  const fs::path out = make_output_dir(cfg.out);
  const bool lead = comm.rank() == 0;
  std::optional<RunLock> lock;
  if (lead) lock.emplace(out);
  if (cfg.resume) ckpt = resume_checkpoint(cfg, out);
  const std::vector<std::string> added_tokens = add_chatml(cfg, init);
  if (cfg.doc_mask) cfg.model.doc_separator = std::string(data::kEndOfText);

  if (!lead) comm.barrier();  // the others map the token cache rank 0 has written
  const data::Tokenizer* given = ckpt ? &ckpt->tokenizer : init ? &init->tokenizer : nullptr;
  const TrainingData data = load_training_data(cfg, out, given, cfg.quiet || !lead, lead);
  if (lead) comm.barrier();
  const data::Split& split = data.split;
  Console console(cfg.quiet || !lead);
  console.line("{}\n", data.summary);
  if (!ckpt && !init) cfg.model.vocab_size = data.tokenizer.vocab_size();
  const MemoryNeed memory_need = require_training_memory(cfg, device);
  Generator model_gen(derived_seed(cfg.seed, kModelStream));
  nn::GPT model(cfg.model, model_gen);
  use_document_separator(model, data.tokenizer);
  if (init) (added_tokens.empty() ? load_weights : load_weights_grown)(model, *init);
  const LoraBase lora_base = init && cfg.model.lora.enabled() ? lora_base_of(*init) : LoraBase{};
  if (init) init->contents = {};  // its weights are the model's now
  if (!added_tokens.empty())
    console.line("ChatML for this model: {} added to its tokenizer (ids from {}), its vocabulary {} rows\n",
                 fmt::format("{}", fmt::join(added_tokens, " and ")),
                 data.tokenizer.vocab_size() - int64_t(added_tokens.size()), cfg.model.vocab_size);
  if (cfg.model.lora.enabled()) freeze_base(model);  // no gradients, no optimizer state
  model.set_numerics(numerics_of(cfg));
  model.to(device);  // before packing the parameters, and before the optimizer, whose moments live beside them
  if (ckpt) load_weights(model, *ckpt);  // a resumed LoRA run's base included, before it is rounded below
  const std::vector<std::pair<std::string, Tensor>> trained =
      trainable_parameters(model, model.numerics().bf16_storage);
  FlatParameters flat(backward_order(trained));
  const std::unique_ptr<Optimizer> opt_owner = make_optimizer(cfg, flat);
  Optimizer& opt = *opt_owner;
  data::BatchSampler sampler = training_sampler(cfg, data);
  TrainState state;
  if (ckpt) {
    state = resume_state(*ckpt, opt, sampler, model_gen, console);
  } else {
    state.lora_base = lora_base;
  }
  if (cfg.model.lora.enabled()) console.line("{}", describe_lora(model, trained, state.lora_base));
  state.train_config = flags_json(cfg, world);
  if (cfg.resume && lead) truncate_metrics(out / "metrics.jsonl", state.iter);
  MetricsLog metrics(out / "metrics.jsonl", cfg.resume, lead);
  if (world > 1) check_ranks(model, comm, device, cfg, console);
  if (model.numerics().bf16_storage) flat.write_bf16_copies();  // of the weights as loaded or broadcast
  console.line("{}", describe_model(model, device));
  console.line("memory: about {} on the {}\n", describe(memory_need), device == Device::CUDA ? "GPU" : "host");

  const StopSignals stop;
  std::optional<GradientBuckets> buckets;
  if (world > 1 && device == Device::CPU && cfg.bucket_mb > 0) {
    buckets.emplace(flat, cfg.bucket_mb, comm);
    console.line(
        "gradients summed over the ranks in {} bucket{} of up to {} MB, each as soon as backward has finished "
        "it\n",
        buckets->count(), buckets->count() == 1 ? "" : "s", cfg.bucket_mb);
  }
  Run run{cfg, device,  out,   comm,    data,    split, model, model_gen,
          opt, sampler, state, metrics, console, stop,  flat,  buckets ? &*buckets : nullptr};
  set_up_step(run);
  return run_steps(run);
}

}  // namespace tinygpt

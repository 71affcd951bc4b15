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
#include "train/run_setup.h"
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

/// The flags' config, checked, with the rank's GPU chosen (several ranks: one each, by the rank's place on its machine,
/// before anything else touches a GPU).
TrainConfig checked(const TrainConfig& config) {
  TrainConfig cfg = config;
  cfg.validate();
  const Device device = parse_device(cfg.device);
  Communicator& comm = communicator();
  if (device == Device::CUDA && comm.world_size() > 1) cuda::set_device(comm.local_rank() % cuda::device_count());
  check_numerics(numerics_of(cfg), device, "use --attention-math f32");
  return cfg;
}

/// The run's data, read with the checkpoint's tokenizer when there is one (rank 0 writes the token cache, the others
/// map it after), said on the console; a new model takes the data's vocabulary.
TrainingData read_data(TrainConfig& cfg, const fs::path& out, const data::Tokenizer* given, Communicator& comm,
                       Console& console) {
  if (cfg.doc_mask) cfg.model.doc_separator = std::string(data::kEndOfText);
  const bool lead = comm.rank() == 0;
  if (!lead) comm.barrier();
  TrainingData data = load_training_data(cfg, out, given, cfg.quiet || !lead, lead);
  if (lead) comm.barrier();
  console.line("{}\n", data.summary);
  if (given == nullptr) cfg.model.vocab_size = data.tokenizer.vocab_size();
  return data;
}

/// The model made ready to train: the checkpoint's weights loaded (--init-from, its vocabulary grown by `added`
/// tokens; or --resume, after the move to the device), a LoRA base frozen, the run's numerics set; returns the
/// parameters that train, each checkpoint's contents freed once loaded.
std::vector<std::pair<std::string, Tensor>> ready_model(nn::GPT& model, const TrainConfig& cfg, Device device,
                                                        std::optional<Checkpoint>& init,
                                                        std::optional<Checkpoint>& ckpt,
                                                        const std::vector<std::string>& added,
                                                        const data::Tokenizer& tokenizer, Console& console) {
  use_document_separator(model, tokenizer);
  if (init) (added.empty() ? load_weights : load_weights_grown)(model, *init);
  if (init) init->contents = {};  // its weights are the model's now
  if (!added.empty())
    console.line("ChatML for this model: {} added to its tokenizer (ids from {}), its vocabulary {} rows\n",
                 fmt::format("{}", fmt::join(added, " and ")), tokenizer.vocab_size() - int64_t(added.size()),
                 cfg.model.vocab_size);
  if (cfg.model.lora.enabled()) freeze_base(model);  // no gradients, no optimizer state
  model.set_numerics(numerics_of(cfg));
  model.to(device);  // before packing the parameters, and before the optimizer, whose moments live beside them
  if (ckpt) load_weights(model, *ckpt);  // a resumed LoRA run's base included, before it is rounded below
  return trainable_parameters(model, model.numerics().bf16_storage);
}

/// metrics.jsonl in the run directory, cut (rank 0, resuming) to the rows before the run's iteration.
fs::path metrics_path(const fs::path& out, bool resume, bool lead, int64_t iter) {
  const fs::path path = out / "metrics.jsonl";
  if (resume && lead) truncate_metrics(path, iter);
  return path;
}

/// A training run: what the loop works on, owned, built by the constructor in the order of the members (the set-up:
/// the checkpoints read, the run directory made and locked, the data read, the model built and loaded, its
/// parameters packed, the optimizer, the sampler and the state made, the step's buffers); evaluation and the step.
struct Run {
  explicit Run(const TrainConfig& config);
  ~Run() { model_gen.set_dropout_offset(nullptr); }  // the word lives here
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  TrainConfig cfg;  // the flags', as the checkpoints and the data leave them
  Device device;
  Communicator& comm;
  std::optional<Checkpoint> init;         // --init-from: read before --out is made, freed once loaded
  fs::path out;                           // the run directory
  std::unique_ptr<RunLock> lock;          // rank 0's, for the whole run
  std::optional<Checkpoint> ckpt;         // --resume: the latest checkpoint, freed once loaded
  std::vector<std::string> added_tokens;  // sft from a BPE without a chat template: ChatML's
  Console console;
  TrainingData data;
  MemoryNeed memory_need;
  LoraBase lora_base;  // --init-from with LoRA: the checkpoint its adapters sit on
  Generator model_gen;
  nn::GPT model;
  std::vector<std::pair<std::string, Tensor>> trained;  // the parameters that train (LoRA: the adapters)
  FlatParameters flat;
  std::unique_ptr<Optimizer> opt;
  data::BatchSampler sampler;
  TrainState state;
  MetricsLog metrics;
  const StopSignals stop;
  std::optional<GradientBuckets> buckets;  // several CPU ranks with --bucket-mb > 0
  StepBuffers step_buffers;
  // The step's dropout offset (DropoutSeed::offset), one 64-bit word in the model's device memory, which every
  // dropout seed the model draws from model_gen adds; see dropout_for_step.
  Tensor dropout_offset;

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
    if (lead()) save_checkpoint(out / kLatestCheckpoint, model, data.tokenizer, opt.get(), state);
  }

  /// Both splits' losses, logged; the latest checkpoint saved, and the best one when the validation loss is the
  /// lowest yet. Returns the validation loss.
  double evaluate(int64_t iter) {
    if (data.chat) return evaluate_chat(iter);
    const auto t0 = Clock::now();
    const double train_loss = estimate_loss(model, data.split.train, cfg.batch_size, cfg.eval_iters,
                                            derived_seed(cfg.seed, kEvalTrainStream), "training split", &comm);
    const double val_loss = estimate_loss(model, data.split.val, cfg.batch_size, cfg.eval_iters,
                                          derived_seed(cfg.seed, kEvalValStream), "validation split", &comm);
    const double val_bpb = bits_per_byte(val_loss, data.split.val.size(), data.val_bytes);
    metrics.write({{"iter", iter}, {"train_loss", train_loss}, {"val_loss", val_loss}, {"val_bpb", val_bpb}});
    const bool best = val_loss < state.best_val_loss;
    if (best) state.best_val_loss = val_loss;
    save_latest(iter);
    if (best && lead()) save_checkpoint(out / kBestCheckpoint, model, data.tokenizer, opt.get(), state);
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
    if (best && lead()) save_checkpoint(out / kBestCheckpoint, model, data.tokenizer, opt.get(), state);
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

  /// One optimizer step over the step's world * grad_accum micro-batches (see fill_step), replayed as a graph, captured
  /// then replayed, or queued op by op: each of the rank's micro-batches' forward and backward, the gradients summed
  /// over the ranks, the loss sum and the gradient's sum of squares into stats, the optimizer's update reading them,
  /// the gradients zeroed. Throws when the loss or gradient is not finite (the weights were not updated).
  StepStats step(int64_t iter, double lr) {
    StepBuffers& d = step_buffers;
    fill_step(iter, lr);
    StepStats s;
    if (d.graph) {
      d.graph.replay();
      ++d.replays;
      return finish_step(iter, s);
    }
    const int world = comm.world_size();
    const int64_t micro_steps = cfg.grad_accum * world;
    for (bool capture = d.use_graph && d.queued >= 1;; capture = false) {  // a failed capture: queued after all
      if (capture) cuda::begin_capture();
      try {
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
          if (buckets && a == cfg.grad_accum - 1) {
            buckets->arm();
            hook.emplace([this](const Tensor& leaf) { buckets->ready(leaf); });
          }
          profile::Phase phase("backward");
          (micro_steps == 1 ? loss : scale(loss, 1.0 / double(micro_steps))).backward();
        }
        if (world > 1) {
          profile::Phase phase("gradient reduction");
          const auto c0 = Clock::now();
          if (buckets) {  // the buckets backward has not started yet, then every sum
            buckets->finish();
          } else {  // one buffer: one reduction
            Tensor g = flat.grads();
            float* grads = g.data<float>();
            device == Device::CPU ? comm.all_reduce_sum(grads, flat.numel())
                                  : comm.all_reduce_sum_gpu(grads, flat.numel());
          }
          s.comm_ms = std::chrono::duration<double, std::milli>(Clock::now() - c0).count();
        }
        {
          profile::Phase phase("optimizer");
          NoGradGuard no_grad;
          // A rank's loss is its own, the gradient's sum of squares the ranks' (a non-finite loss makes every rank's
          // summed gradient non-finite too, so all refuse the update together).
          d.stats.copy_(concat({reshape(loss_sum, {1}), reshape(sum_squares(flat.grads()), {1})}, 0));
          opt->step(d.sched, d.stats, cfg.grad_clip);
          opt->zero_grad();
        }
        if (!capture) {
          ++d.queued;
          break;
        }
        d.graph = cuda::end_capture();
        console.line("CUDA graphs: iteration {} captured ({} kernels, copies and memsets); replayed from here on\n",
                     iter, d.graph.nodes());
        d.graph.replay();
        ++d.replays;
        break;
      } catch (const Error& e) {  // nothing recorded ran: queue the step instead, and every later one
        if (!capture) throw;
        cuda::abort_capture();
        d.use_graph = false;
        console.line("CUDA graphs off: the training step could not be captured ({}); queueing it op by op\n", e.what());
      }
    }
    return finish_step(iter, s);
  }

  /// The step's inputs refilled in place (StepBuffers): the micro-batches, drawn in order by every rank (rank r takes
  /// the ones a single process with --grad-accum world * grad_accum computes at micro-steps r * grad_accum ..
  /// r * grad_accum + A - 1), the optimizer's rates, the dropout offset.
  void fill_step(int64_t iter, double lr) {
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
    const std::vector<float> sched = opt->schedule(lr);
    if (!d.sched.defined()) d.sched = empty({int64_t(sched.size())}, DType::F32, device);
    d.sched.copy_(from_vector(sched, {int64_t(sched.size())}));
    dropout_for_step(iter);
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

Run::Run(const TrainConfig& config)
    : cfg(checked(config)),
      device(parse_device(cfg.device)),
      comm(communicator()),
      init(cfg.init_from.empty() ? std::nullopt : std::optional(init_checkpoint(cfg))),
      out(make_output_dir(cfg.out)),
      lock(lead() ? std::make_unique<RunLock>(out) : nullptr),
      ckpt(cfg.resume ? std::optional(resume_checkpoint(cfg, out)) : std::nullopt),
      added_tokens(add_chatml(cfg, init)),
      console(cfg.quiet || !lead()),
      data(read_data(cfg, out,
                     ckpt   ? &ckpt->tokenizer
                     : init ? &init->tokenizer
                            : nullptr,
                     comm, console)),
      memory_need(require_training_memory(cfg, device)),
      lora_base(init && cfg.model.lora.enabled() ? lora_base_of(*init) : LoraBase{}),
      model_gen(derived_seed(cfg.seed, kModelStream)),
      model(cfg.model, model_gen),
      trained(ready_model(model, cfg, device, init, ckpt, added_tokens, data.tokenizer, console)),
      flat(backward_order(trained)),
      opt(make_optimizer(cfg, flat)),
      sampler(training_sampler(cfg, data)),
      state(ckpt ? resume_state(*ckpt, *opt, sampler, model_gen, console) : TrainState{.lora_base = lora_base}),
      metrics(metrics_path(out, cfg.resume, lead(), state.iter), cfg.resume, lead()) {
  const int world = comm.world_size();
  if (cfg.model.lora.enabled()) console.line("{}", describe_lora(model, trained, state.lora_base));
  state.train_config = flags_json(cfg, world);
  if (world > 1) check_ranks(model, comm, device, cfg, console);
  if (model.numerics().bf16_storage) flat.write_bf16_copies();  // of the weights as loaded or broadcast
  console.line("{}", describe_model(model, device));
  console.line("memory: about {} on the {}\n", describe(memory_need), device == Device::CUDA ? "GPU" : "host");
  if (world > 1 && device == Device::CPU && cfg.bucket_mb > 0) {
    buckets.emplace(flat, cfg.bucket_mb, comm);
    console.line(
        "gradients summed over the ranks in {} bucket{} of up to {} MB, each as soon as backward has finished "
        "it\n",
        buckets->count(), buckets->count() == 1 ? "" : "s", cfg.bucket_mb);
  }
  // The step's buffers, and whether it runs as a CUDA graph (one GPU, one rank; said in the log).
  StepBuffers& d = step_buffers;
  for (int64_t micro = 0; micro < cfg.grad_accum; ++micro) {
    d.x.push_back(empty({cfg.batch_size, cfg.model.block_size}, DType::I32, device));
    d.y.push_back(empty({cfg.batch_size, cfg.model.block_size}, DType::I32, device));
  }
  d.stats = empty({2}, flat.values().dtype(), device);
  if (device != Device::CUDA) return;
  d.use_graph = world == 1 && cfg.cuda_graphs && !cuda::profiling();
  const char* graphs = d.use_graph ? "CUDA graphs: the training step is captured on its second iteration and replayed"
                       : !cfg.cuda_graphs ? "CUDA graphs off (--no-cuda-graphs): the step is queued op by op"
                       : world > 1
                           ? "CUDA graphs off: several ranks; the step is queued op by op"
                           : "CUDA graphs off: TINYGPT_CUDA_PROFILE=1 times each op alone; the step is queued op by op";
  console.line("{}\n", graphs);
}

/// What the loop knows of the run's speed: the work per iteration and the peak MFU is measured against.
struct Meter {
  int64_t tokens_per_iter = 0;
  double flops_per_iter = 0;
  Peak peak;
  double ms_avg = 0;  // moving average of the iteration time, for the ETA
};

/// The run's meter, stated on the console: the step's FLOPs and the peak (the CPU's measured rates cached for the next
/// run), and the time budget.
Meter start_meter(Run& run) {
  const TrainConfig& cfg = run.cfg;
  const int world = run.comm.world_size();
  Meter meter;
  meter.tokens_per_iter = cfg.batch_size * cfg.model.block_size * cfg.grad_accum * world;
  // Muon's Newton-Schulz products run on every rank.
  meter.flops_per_iter = step_flops(run.model, meter.tokens_per_iter) + world * run.opt->step_flops();
  meter.peak = stated_peak(run.device, run.model.numerics());
  if (run.device == Device::CPU && run.lead()) {
    if (const std::string why = save_cpu_rates_cache(); !why.empty()) {
      run.console.line("note: {}: the CPU is measured again next run\n", why);
    }
  }
  const Peak& peak = meter.peak;
  const std::string against = peak.gflops > 0
                                  ? fmt::format("MFU is against {:.0f} GFLOP/s per rank: {}", peak.gflops, peak.how)
                                  : fmt::format("no MFU: the peak is {}", peak.how);
  run.console.line("speed: a step is {:.2f} GFLOP (nanoGPT's count, causal attention's half{}); {}\n",
                   meter.flops_per_iter / 1e9, run.opt->step_flops() > 0 ? ", Muon's Newton-Schulz" : "", against);
  if (cfg.time_budget > 0) {
    const double spent = run.state.train_seconds;
    run.console.line("time budget: {:g} s of training steps{}\n", cfg.time_budget,
                     spent > 0 ? fmt::format(", {:.1f} s spent before this run", spent) : "");
  }
  return meter;
}

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
void say_done(Run& run, const TrainResult& result) {
  run.console.clear();
  if (!run.lead()) return;
  const TrainConfig& cfg = run.cfg;
  fmt::print(stderr, "done: {} iterations in {:.1f} s of training steps{}, best val loss {:.4f}; checkpoints in {}\n",
             result.iters, run.state.train_seconds,
             cfg.time_budget > 0 ? fmt::format(" (time budget {:g} s)", cfg.time_budget) : "", result.best_val_loss,
             run.out.string());
}

}  // namespace

/// The training loop: steps, evaluations, logs and checkpoints, until the last iteration, the time budget or a stop
/// signal; then the closing line.
TrainResult train(const TrainConfig& config) {
  Run run(config);
  const TrainConfig& cfg = run.cfg;
  TrainState& state = run.state;
  const int world = run.comm.world_size();
  Meter meter = start_meter(run);
  TrainResult result{state.best_val_loss, NAN, state.iter};
  const int64_t first = state.iter;
  const bool budget = cfg.time_budget > 0;
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
    StepStats s;
    {
      profile::Phase phase("step");
      s = run.step(iter, lr);
    }
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

}  // namespace tinygpt

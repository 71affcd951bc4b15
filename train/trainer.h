// The training loop, as nanoGPT's train.py: AdamW (or Muon), linear warmup then cosine decay of the learning rate,
// global-norm gradient clipping, gradient accumulation, periodic evaluation, best and latest checkpoints,
// a log line per iteration on stderr and metrics.jsonl in the run directory.
//
// The pieces, one concern each: train_config.h (the configuration, its checks, the schedule, device and numerics),
// optimizer.h (AdamW in adamw.h, Muon in muon.h), gradient_buckets.h (several CPU ranks), speed.h (FLOPs and the
// matmul peak behind MFU), console.h (stderr and stop signals), run_dir.h (the run lock, metrics.jsonl),
// checkpoint.h, run_setup.h (the checkpoints a run starts from, its optimizer, the model line); trainer.cpp joins them:
// the Run (built by its constructor, the set-up), its step, evaluation, the log, and train(), the loop.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "../data/corpus.h"
#include "../data/tokenizer.h"
#include "../nn/gpt.h"
#include "train_config.h"

namespace tinygpt {

class Communicator;

/// Mean loss over `iters` batches drawn with a generator seeded by `seed` (the same batches every call),
/// in eval mode and without a graph. With a communicator, rank r evaluates batches r, r + N, ... and the sum
/// is reduced over the ranks (the same mean as one process).
double estimate_loss(nn::GPT& model, data::TokenSpan ids, int64_t batch_size, int64_t iters, uint64_t seed,
                     const char* what, Communicator* comm = nullptr);

/// The loss over the targets of the first `limit` rows (conversations: their assistants' tokens), each target weighted
/// alike, in eval mode and without a graph; `targets` gets their count. With a communicator, rank r evaluates batches
/// r, r + N, ... and the sums are reduced over the ranks.
double rows_loss(nn::GPT& model, const data::Rows& rows, int64_t batch_size, size_t limit, int64_t& targets,
                 Communicator* comm = nullptr);

struct TrainResult {
  double best_val_loss;
  double last_val_loss;
  int64_t iters;
  bool interrupted = false;          // SIGINT/SIGTERM: stopped after an iteration and saved the latest checkpoint
  int64_t max_step_syncs = 0;        // on the GPU: the most times one step waited for it (the aim is 1); 0 on the CPU
  int64_t max_step_float_reads = 0;  // the most floating-point reads to the host in one step (Tensor::float_host_reads)
  int64_t graph_replays = 0;         // on the GPU: steps run as a replay of the captured CUDA graph
};

/// Trains (or resumes) per the config; progress on stderr. Returns the final evaluation. SIGINT or SIGTERM
/// finishes the current iteration, saves the latest checkpoint and returns (interrupted); a second signal
/// exits at once. A non-finite loss or gradient norm stops with an Error before the weights are touched.
TrainResult train(const TrainConfig& config);

}  // namespace tinygpt

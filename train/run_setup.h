// A training run's set-up pieces that read or say something (train/trainer.cpp builds the run from them): the
// checkpoints it starts from and how they change its config, its optimizer, the ranks' agreement, the log's model line.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "../nn/gpt.h"
#include "checkpoint.h"
#include "console.h"
#include "flat_parameters.h"
#include "optimizer.h"
#include "train_config.h"

namespace tinygpt {

class Communicator;

/// --resume: the run's latest checkpoint, whose model config the run takes (all but dropout, which may change);
/// throws when the data's vocabulary or a model flag given contradicts it.
Checkpoint resume_checkpoint(TrainConfig& cfg, const std::filesystem::path& out);

/// --init-from: the checkpoint whose config (all but dropout) and weights a new run starts from; its optimizer state
/// and iteration are left behind. Throws when a model flag given contradicts it (check_init_flags says so first).
Checkpoint init_checkpoint(TrainConfig& cfg);

/// Several ranks: checks that every rank starts from rank 0's weights, and says how the ranks work together.
void check_ranks(const nn::GPT& model, Communicator& comm, Device device, const TrainConfig& cfg, Console& console);

/// The run's optimizer over the packed parameters: AdamW, or Muon for the block matrices with AdamW for the rest.
std::unique_ptr<Optimizer> make_optimizer(const TrainConfig& cfg, FlatParameters& flat);

/// The log's model line: size, and where and how it computes.
std::string describe_model(const nn::GPT& model, Device device);

}  // namespace tinygpt

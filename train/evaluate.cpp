// Evaluation: the mean loss over batches of token ids or over rows of conversations, in eval mode without a graph,
// split over the ranks when a communicator is given. `train` and `eval` both call it.
#include <algorithm>
#include <cmath>

#include "train/comm.h"
#include "train/trainer.h"

namespace tinygpt {

double estimate_loss(nn::GPT& model, data::TokenSpan ids, int64_t batch_size, int64_t iters, uint64_t seed,
                     const char* what, Communicator* comm) {
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

double rows_loss(nn::GPT& model, const data::Rows& rows, int64_t batch_size, size_t limit, int64_t& targets,
                 Communicator* comm) {
  NoGradGuard no_grad;
  const bool was_training = model.training();
  model.train(false);
  const int rank = comm ? comm->rank() : 0, world = comm ? comm->world_size() : 1;
  const size_t n = std::min(limit, rows.size());
  double sums[2] = {0, 0};  // loss x targets, targets
  const Device device = model.device();
  for (size_t first = 0, k = 0; first < n; first += size_t(batch_size), ++k) {
    if (int64_t(k % size_t(world)) != rank) continue;
    const data::RowBatch b =
        data::row_batch(rows, first, std::min<int64_t>(batch_size, int64_t(n - first)), model.config().block_size);
    if (b.targets == 0) continue;
    sums[0] += model.forward(b.x.to(device), b.y.to(device)).loss.item() * double(b.targets);
    sums[1] += double(b.targets);
  }
  if (comm) comm->all_reduce_sum(sums, 2);
  model.train(was_training);
  targets = int64_t(sums[1]);
  return sums[1] > 0 ? sums[0] / sums[1] : NAN;
}

}  // namespace tinygpt

// Several CPU ranks: the gradient buffer summed over the ranks in buckets while backward is still running.
#pragma once

#include <unordered_map>
#include <vector>

#include "comm.h"
#include "flat_parameters.h"

namespace tinygpt {

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

}  // namespace tinygpt

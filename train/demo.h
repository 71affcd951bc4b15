// A first end-to-end run through the autograd API: a character-level MLP language model (a context
// window of characters -> embeddings -> hidden GELU layer -> next-character logits), trained with AdamW
// on a text file and then sampled. It exercises embedding, reshape, linear, gelu, cross-entropy and the
// optimizer on real data.
#pragma once

#include <cstdint>
#include <string>

namespace tinygpt {

struct DemoConfig {
  std::string data_path;
  int64_t context = 8;
  int64_t n_embd = 24;
  int64_t hidden = 512;
  int64_t batch_size = 128;
  int64_t steps = 5000;
  double lr = 3e-3;
  int64_t eval_interval = 500;
  int64_t sample_chars = 300;
  uint64_t seed = 1337;
};

/// Trains and samples; progress goes to stderr, the sample to stdout. Returns the final validation loss.
double run_demo(const DemoConfig& config);

}  // namespace tinygpt

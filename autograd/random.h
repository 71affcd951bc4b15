// Seeded, platform-independent random numbers (xoshiro256**), so runs reproduce across machines.
#pragma once

#include <array>
#include <cstdint>

#include "../kernels/dropout_hash.h"  // DropoutSeed

namespace tinygpt {

class Generator {
 public:
  explicit Generator(uint64_t seed = 1337) { manual_seed(seed); }
  /// A generator for a model whose weights are loaded right after it is built (a checkpoint, an import): randn and
  /// rand draw nothing from it and give zeros, so building a 135M-parameter model costs its allocation, not seconds
  /// of Box-Muller.
  static Generator for_loading() {
    Generator g(0);
    g.draws_nothing_ = true;
    return g;
  }
  bool draws_nothing() const { return draws_nothing_; }
  void manual_seed(uint64_t seed);
  uint64_t next_u64();
  /// Uniform in [0, 1) with 53 random bits.
  double uniform();
  /// Standard normal (Box-Muller; the second value of each pair is kept for the next call).
  double normal();
  /// A dropout site's seed: the next value, plus the word at the generator's dropout offset when one is set.
  DropoutSeed dropout_seed() { return {next_u64(), dropout_offset_}; }
  /// Where the dropout seeds drawn from here read a per-step offset (DropoutSeed::offset: a word in the memory of
  /// the device the model runs on), or nullptr for none. Not part of the state.
  void set_dropout_offset(const uint64_t* offset) { dropout_offset_ = offset; }

  /// The whole state, for checkpoints.
  struct State {
    std::array<uint64_t, 4> s;
    bool has_spare;
    double spare;
  };
  State state() const { return {s_, has_spare_, spare_}; }
  void set_state(const State& st);

 private:
  std::array<uint64_t, 4> s_{};
  bool has_spare_ = false;
  double spare_ = 0;
  const uint64_t* dropout_offset_ = nullptr;
  bool draws_nothing_ = false;
};

/// The generator used when none is passed (randn, rand, dropout, weight init).
Generator& default_generator();
/// Seeds the default generator.
void manual_seed(uint64_t seed);

}  // namespace tinygpt

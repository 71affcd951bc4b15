// Muon (Keller Jordan, 2024) for the weight matrices of the transformer blocks, AdamW for every other parameter
// (embeddings, the head, LayerNorm gains and biases, position tables), as torch.optim.Muon's documentation pairs them.
// A Muon step per matrix W with gradient G:
//   B <- mu B + (1 - mu) G                          momentum (a lerp, as PyTorch's)
//   U <- (1 - mu) G + mu B  (Nesterov)  or  B
//   O <- NewtonSchulz5(U)                          about U's polar factor: the same directions, every singular value ~1
//   W <- (1 - lr wd) W - lr s O                    s from W's shape (MuonScale)
// The matrices' rate follows the schedule in proportion to AdamW's: lr = muon.lr * (AdamW's rate now / adamw.lr).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "adamw.h"
#include "flat_parameters.h"
#include "optimizer.h"

namespace tinygpt {

/// How a matrix's shape (out A, in B) scales its rate: the update O has unit singular values, so its size per element
/// depends on the shape. Original (Keller Jordan's): sqrt(max(1, A / B)). MatchAdamW (Moonshot's "match_rms_adamw"):
/// 0.2 sqrt(max(A, B)), which gives the update AdamW's typical RMS, so AdamW's rate and weight decay carry over.
enum class MuonScale { Original, MatchAdamW };

struct MuonConfig {
  double lr = 0.02;
  double momentum = 0.95;
  bool nesterov = true;
  int ns_steps = 5;
  double weight_decay = 0.0;  // decoupled, on the matrices: W <- (1 - lr wd) W
  MuonScale scale = MuonScale::Original;
  // Newton-Schulz products with bf16 operands and f32 sums (--dtype bf16): Keller Jordan's Muon iterates in bf16.
  bool bf16 = false;
};

/// The quintic Newton-Schulz iteration's coefficients (a, b, c), chosen by Keller Jordan to make the slope at zero
/// as steep as possible while converging; X <- a X + (b A + c A^2) X with A = X X^T.
inline constexpr double kNewtonSchulzA = 3.4445, kNewtonSchulzB = -4.7750, kNewtonSchulzC = 2.0315;

/// `steps` Newton-Schulz iterations on G (M, N) / max(||G||_F, eps), f32 or f64, on G's device: about U V^T for
/// G = U S V^T (singular values land roughly in [0.7, 1.2], not exactly 1; Muon needs no more). A tall G is
/// iterated as G^T, so the Gram matrix is the smaller one. `bf16`: the products' operands rounded to bf16, their sums
/// and X in f32 (as --dtype bf16 computes a matmul).
Tensor newton_schulz(const Tensor& g, int steps = 5, double eps = 1e-7, bool bf16 = false);

/// The rate factor of a (out A, in B) matrix under `scale`.
double muon_scale(MuonScale scale, int64_t rows, int64_t cols);

/// Whether Muon updates this parameter: a 2-D weight of a transformer block ("transformer.h.<i>.<...>.weight").
/// Embeddings, the head and the position tables (relative_key, t5_bias: not "weight") go to AdamW.
bool muon_updates(const std::string& name, const Tensor& param);

class Muon : public Optimizer {
 public:
  /// Muon over the block matrices of `flat` (muon_updates), AdamW with `adamw` over the rest.
  Muon(FlatParameters& flat, MuonConfig muon, AdamWConfig adamw);
  /// `lr`: AdamW's rate this step; the matrices get muon.lr * lr / adamw.lr. sched = AdamW's {lr, c1, c2}, then
  /// each matrix's update factors {-rate * scale, 1 - rate * weight decay}.
  std::vector<float> schedule(double lr) override;
  /// AdamW's update, then each matrix's: the momentum takes clipping's factor from stats, the update the rate's
  /// factors from sched. bf16 copies: AdamW's share in its update's pass; each matrix's right after its update
  /// (write_bf16_copy), while in cache.
  void step(const Tensor& sched, const Tensor& stats, double max_norm) override;
  using Optimizer::step;
  void zero_grad() override { adamw_.zero_grad(); }
  int64_t steps() const override { return adamw_.steps(); }
  void set_steps(int64_t steps) override { adamw_.set_steps(steps); }
  /// AdamW's moments, then "<matrix>.momentum_buffer" (torch.optim.Muon's name) for each matrix.
  std::vector<std::pair<std::string, Tensor>> state() const override;
  const char* name() const override { return "muon"; }
  /// Per matrix (m x n, m <= n) and iteration: X X^T, A A and B X, 4 m^2 n + 2 m^3.
  double step_flops() const override;

 protected:
  const Tensor& any_parameter() const override;

 private:
  struct Slot {
    std::string name;
    Tensor param, grad, momentum;
    double scale;  // muon_scale of its shape
  };
  std::vector<Slot> slots_;
  AdamW adamw_;
  MuonConfig config_;
  double adamw_lr_;

  /// Runs update(slot, index) for every matrix: side by side on the CPU (see step), in order on the GPU.
  template <class F>
  void for_each_slot(F update_matrix);
};

}  // namespace tinygpt

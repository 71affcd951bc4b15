// The basic layers of a GPT. Initialization follows GPT-2: normal(0, 0.02) weights, zero biases.
#pragma once

#include "../autograd/ops.h"
#include "module.h"

namespace tinygpt::nn {

inline constexpr double kInitStd = 0.02;

/// A LoRA adapter of a Linear (Hu et al., 2021): rows [first, first + rows) of the output get scale * B A x.
struct LoraAdapter {
  int64_t first = 0, rows = 0;
  Tensor A;  // (rank, in): uniform in +-1/sqrt(in), as PEFT's kaiming_uniform(a=sqrt(5))
  Tensor B;  // (rows, rank): zeros, so an adapted model starts as its base
};

/// y = x W^T + b, W (out, in); with LoRA adapters, plus each adapter's scale * (x A^T) B^T in its rows.
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias, Generator& gen, double init_std = kInitStd);
  Tensor forward(const Tensor& x) const {
    Tensor y = linear(x, stored(weight, x), stored(bias, x), numerics());
    return lora_.empty() ? y : add_lora(x, y);
  }
  /// Adds an adapter of rank `rank` on output rows [first, first + rows), its parameters "lora_<target>_A" and
  /// "lora_<target>_B", its output scaled by `scale` (alpha / rank). Adapters are added in row order.
  void add_adapter(const char* target, int64_t first, int64_t rows, int64_t rank, double scale, Generator& gen);
  bool has_adapters() const { return !lora_.empty(); }

  Tensor weight;  // (OC, C)
  Tensor bias;    // (OC), undefined without bias

 private:
  /// y + the adapters' outputs (zeros in the rows none covers).
  Tensor add_lora(const Tensor& x, const Tensor& y) const;

  std::vector<LoraAdapter> lora_;
  double lora_scale_ = 0;
};

/// Rows of a (V, C) table looked up by i32 ids.
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim, Generator& gen, double init_std = kInitStd);
  /// With bf16 storage the rows come from the weight's bf16 working copy: the activations start bf16.
  Tensor forward(const Tensor& ids) const {
    return embedding(ids, numerics().bf16_storage ? working_copy(weight) : weight);
  }

  Tensor weight;  // (V, C)
};

/// The normalization of a layer: LayerNorm (GPT-2) or RMSNorm (the Llama family: no mean, no bias).
enum class NormKind : uint8_t { LayerNorm, RMSNorm };

/// Normalization over the last dim with a learned gain and (optionally, LayerNorm only) bias.
class LayerNorm : public Module {
 public:
  LayerNorm(int64_t dim, bool bias, double eps = 1e-5, NormKind kind = NormKind::LayerNorm);
  Tensor forward(const Tensor& x) const {
    return kind_ == NormKind::RMSNorm ? rms_norm(x, stored(weight, x), eps_)
                                      : layer_norm(x, stored(weight, x), stored(bias, x), eps_);
  }
  /// {x + r, forward(x + r)} in one pass: a residual add and this norm fused (add_layer_norm, add_rms_norm); with
  /// p > 0, r is added as dropout(r, p, seed) would make it.
  std::pair<Tensor, Tensor> forward_add(const Tensor& x, const Tensor& r, double p = 0.0, DropoutSeed seed = {}) const {
    return kind_ == NormKind::RMSNorm ? add_rms_norm(x, r, stored(weight, x), eps_, p, seed)
                                      : add_layer_norm(x, r, stored(weight, x), stored(bias, x), eps_, p, seed);
  }

  Tensor weight;  // (C)
  Tensor bias;    // (C), undefined without bias

 private:
  double eps_;
  NormKind kind_;
};

}  // namespace tinygpt::nn

#include "nn/layers.h"

#include <cmath>

namespace tinygpt::nn {

Linear::Linear(int64_t in_features, int64_t out_features, bool with_bias, Generator& gen, double init_std) {
  weight = register_parameter("weight", randn({out_features, in_features}, gen, DType::F32, Device::CPU, init_std));
  if (with_bias) bias = register_parameter("bias", zeros({out_features}));
}

void Linear::add_adapter(const char* target, int64_t first, int64_t rows, int64_t rank, double scale, Generator& gen) {
  const int64_t in = weight.size(1), out = weight.size(0);
  if (rank <= 0 || first < 0 || rows <= 0 || first + rows > out ||
      (!lora_.empty() && first < lora_.back().first + lora_.back().rows)) {
    throw Error(fmt::format("Linear: a LoRA adapter of rank {} on rows [{}, {}) of {} does not fit", rank, first,
                            first + rows, out));
  }
  const double bound = 1.0 / std::sqrt(double(in));
  LoraAdapter a{.first = first, .rows = rows, .A = {}, .B = {}};
  a.A = register_parameter(fmt::format("lora_{}_A", target),
                           rand({rank, in}, gen, DType::F32, Device::CPU, -bound, bound));
  a.B = register_parameter(fmt::format("lora_{}_B", target), zeros({rows, rank}));
  lora_.push_back(std::move(a));
  lora_scale_ = scale;
}

Tensor Linear::add_lora(const Tensor& x, const Tensor& y) const {
  const int64_t out = weight.size(0);
  std::vector<int64_t> gap_shape = x.shape().vec();
  auto gap = [&](int64_t rows) {
    gap_shape.back() = rows;
    return zeros(Shape(gap_shape), y.dtype(), y.device());
  };
  std::vector<Tensor> pieces;
  int64_t at = 0;
  for (const LoraAdapter& a : lora_) {
    if (a.first > at) pieces.push_back(gap(a.first - at));
    // The scale applied to the rank-wide x A^T, the narrowest tensor of the three.
    const Tensor u = scale(linear(x, stored(a.A, x), Tensor(), numerics()), lora_scale_);
    pieces.push_back(linear(u, stored(a.B, u), Tensor(), numerics()));
    at = a.first + a.rows;
  }
  if (at < out) pieces.push_back(gap(out - at));
  return y + (pieces.size() == 1 ? pieces[0] : concat(pieces, -1));
}

Embedding::Embedding(int64_t num_embeddings, int64_t dim, Generator& gen, double init_std) {
  weight = register_parameter("weight", randn({num_embeddings, dim}, gen, DType::F32, Device::CPU, init_std));
}

LayerNorm::LayerNorm(int64_t dim, bool with_bias, double eps, NormKind kind) : eps_(eps), kind_(kind) {
  weight = register_parameter("weight", ones({dim}));
  if (with_bias && kind == NormKind::LayerNorm) bias = register_parameter("bias", zeros({dim}));
}

}  // namespace tinygpt::nn

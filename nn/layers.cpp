#include "nn/layers.h"

namespace tinygpt::nn {

Linear::Linear(int64_t in_features, int64_t out_features, bool with_bias, Generator& gen, double init_std) {
  weight = register_parameter("weight", randn({out_features, in_features}, gen, DType::F32, Device::CPU, init_std));
  if (with_bias) bias = register_parameter("bias", zeros({out_features}));
}

Embedding::Embedding(int64_t num_embeddings, int64_t dim, Generator& gen, double init_std) {
  weight = register_parameter("weight", randn({num_embeddings, dim}, gen, DType::F32, Device::CPU, init_std));
}

LayerNorm::LayerNorm(int64_t dim, bool with_bias, double eps, NormKind kind) : eps_(eps), kind_(kind) {
  weight = register_parameter("weight", ones({dim}));
  if (with_bias && kind == NormKind::LayerNorm) bias = register_parameter("bias", zeros({dim}));
}

}  // namespace tinygpt::nn

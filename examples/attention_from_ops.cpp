// Causal multi-head self-attention written out from tinygpt's ops, the way the tutorials build it, then checked
// against the library's nn::MultiHeadAttention holding the same weights: the outputs and the gradients of the
// input and of every weight must agree. Each stage prints its shape, and TINYGPT_TRACE_SHAPES=1 makes the
// library's layer print its own stages too.
#include <tinygpt/autograd/ops.h>
#include <tinygpt/nn/attention.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <vector>

using namespace tinygpt;

namespace {

Tensor traced(const char* stage, Tensor t) {
  std::fprintf(stderr, "[from ops]  %-28s %s\n", stage, t.shape().str().c_str());
  return t;
}

// x (B, T, C); w_qkv (3C, C), b_qkv (3C); w_proj (C, C), b_proj (C); NH heads of size E = C / NH.
Tensor attention_from_ops(const Tensor& x, const Tensor& w_qkv, const Tensor& b_qkv, const Tensor& w_proj,
                          const Tensor& b_proj, int64_t NH) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), E = C / NH;
  const Tensor qkv = traced("qkv = x W^T + b", linear(x, w_qkv, b_qkv));  // (B, T, 3C)
  auto heads = [&](int64_t which) {                                       // -> (B, NH, T, E)
    return transpose(reshape(narrow(qkv, 2, which * C, C), {B, T, NH, E}), 1, 2);
  };
  const Tensor q = traced("q", heads(0)), k = traced("k", heads(1)), v = traced("v", heads(2));
  Tensor scores = traced("scores = q k^T / sqrt(E)", scale(matmul(q, k, false, true), 1.0 / std::sqrt(double(E))));
  std::vector<float> causal(size_t(T * T), 0.0f);  // -inf above the diagonal: a query never sees the future
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = i + 1; j < T; ++j) causal[size_t(i * T + j)] = -std::numeric_limits<float>::infinity();
  scores = scores + from_vector(causal, {T, T});                                         // broadcast
  const Tensor weights = traced("softmax over keys", softmax(scores));                   // (B, NH, T, T)
  const Tensor y = traced("weights @ v", matmul(weights, v));                            // (B, NH, T, E)
  const Tensor merged = traced("heads merged", reshape(transpose(y, 1, 2), {B, T, C}));  // (B, T, C)
  return traced("output projection", linear(merged, w_proj, b_proj));
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const auto va = a.to_vector<float>(), vb = b.to_vector<float>();
  double worst = 0;
  for (size_t i = 0; i < va.size(); ++i) worst = std::fmax(worst, std::fabs(double(va[i]) - double(vb[i])));
  return worst;
}

}  // namespace

int main() {
  setenv("TINYGPT_TRACE_SHAPES", "1", 0);
  const int64_t B = 2, T = 5, C = 16, NH = 4;
  Generator gen(7);
  nn::MultiHeadAttention layer({.embed_dim = C, .num_heads = NH}, gen);

  // The same weights as separate leaves of our own graph.
  auto leaf = [](const Tensor& t) {
    Tensor c = t.clone();
    c.requires_grad_();
    return c;
  };
  Tensor w_qkv = leaf(layer.c_attn->weight), b_qkv = leaf(layer.c_attn->bias);
  Tensor w_proj = leaf(layer.c_proj.weight), b_proj = leaf(layer.c_proj.bias);
  Tensor x1 = randn({B, T, C}, gen);
  Tensor x2 = x1.clone();
  x1.requires_grad_();
  x2.requires_grad_();

  const Tensor ours = attention_from_ops(x1, w_qkv, b_qkv, w_proj, b_proj, NH);
  const Tensor theirs = layer.forward(x2, x2, x2, {.is_causal = true}).out;
  // The same scalar loss through both graphs: sum(out * r) for a fixed random r.
  const Tensor r = randn({B, T, C}, gen);
  sum(ours * r).backward();
  sum(theirs * r).backward();

  struct Check {
    const char* what;
    double diff;
  };
  const Check checks[] = {
      {"output", max_abs_diff(ours, theirs)},
      {"d input", max_abs_diff(x1.grad(), x2.grad())},
      {"d qkv weight", max_abs_diff(w_qkv.grad(), layer.c_attn->weight.grad())},
      {"d qkv bias", max_abs_diff(b_qkv.grad(), layer.c_attn->bias.grad())},
      {"d proj weight", max_abs_diff(w_proj.grad(), layer.c_proj.weight.grad())},
      {"d proj bias", max_abs_diff(b_proj.grad(), layer.c_proj.bias.grad())},
  };
  bool ok = true;
  for (const auto& c : checks) {
    const bool close = c.diff <= 1e-5;
    ok = ok && close;
    std::printf("%-14s max |ops - nn::MultiHeadAttention| = %.2e %s\n", c.what, c.diff, close ? "ok" : "MISMATCH");
  }
  std::printf(ok ? "attention from ops matches nn::MultiHeadAttention\n" : "error: attention from ops differs\n");
  return ok ? 0 : 1;
}

// Agreement with PyTorch on a committed fixture (tests/reference/make_score_mods_fixture.py): the attention score
// modifiers (AttentionOptions::mods: Shaw's relative key and value tables, ALiBi, T5's bucketed bias, sliding window,
// documents, soft-capping) against a torch reference written from the papers, alone and all at once, with causal
// masking, key padding, an additive mask, grouped-query heads and T != S. Checked, for the flash and the naive kernel:
// the output and the gradient of q, k, v and of every learned table for loss = sum(out * dout). tinygpt computes in
// float32 from the fixture's float32 values; torch's reference was computed in float64.
#include <doctest/doctest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "autograd/attention.h"
#include "autograd/ops.h"
#include "test_util.h"
#include "train/safetensors.h"

using namespace tinygpt;

namespace {

struct Fixture {
  safetensors::Contents contents;
  std::string prefix;

  /// The case's tensor `name`; fails the test when it is missing.
  Tensor at(const std::string& name) const {
    const Tensor t = contents.find(prefix + name);
    INFO("fixture tensor " << prefix + name);
    REQUIRE(t.defined());
    return t;
  }
  Tensor maybe(const std::string& name) const { return contents.find(prefix + name); }
};

/// A fresh float32 leaf requiring grad with the fixture's values (a copy: each kernel's run has its own gradients).
Tensor input_leaf(const Fixture& f, const std::string& name) {
  Tensor t = f.at(name).to(DType::F32).clone();
  t.requires_grad_();
  return t;
}

/// Every element within atol + rtol * |ref|, where atol is `floor` times the largest |ref| of the tensor, or times 1
/// when that is smaller (elements near zero carry the float32 rounding of the larger terms that cancelled there), as
/// in test_attention_reference.cpp.
void check_against(const Tensor& got, const Tensor& ref, double rtol, double floor, const std::string& what) {
  INFO(what);
  REQUIRE(got.defined());
  REQUIRE(got.shape() == ref.shape());
  const auto g = got.to(DType::F64).to_vector<double>(), r = ref.to(DType::F64).to_vector<double>();
  double largest = 1;
  for (double x : r) largest = std::max(largest, std::abs(x));
  const double atol = floor * largest;
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    const double ratio = std::abs(g[i] - r[i]) / (atol + rtol * std::abs(r[i]) + 1e-300);
    if (std::isnan(ratio)) {  // a NaN fails the check, wherever it is
      worst = ratio, worst_i = i;
      break;
    }
    if (ratio > worst) worst = ratio, worst_i = i;
  }
  INFO("worst element " << worst_i << ": got " << g[worst_i] << ", torch " << r[worst_i] << " (" << worst
                        << " x the tolerance)");
  CHECK(worst <= 1.0);
}

constexpr double kOutRtol = 1e-5, kOutFloor = 1e-5;    // outputs: 1e-5 relative
constexpr double kGradRtol = 1e-4, kGradFloor = 1e-5;  // gradients: atol + rtol * |ref|

void run_case(const Fixture& f, const nlohmann::json& c, AttentionImpl impl) {
  const Tensor q = input_leaf(f, "q"), k = input_leaf(f, "k"), v = input_leaf(f, "v");
  std::vector<std::pair<std::string, Tensor>> tables;  // the learned tables of the case, as leaves
  AttentionOptions o;
  o.impl = impl;
  o.is_causal = c.at("causal");
  o.key_padding_mask = f.maybe("key_padding_mask");
  o.attn_mask = f.maybe("attn_mask");
  ScoreModOptions& m = o.mods;
  m.window = c.at("window");
  m.softcap = c.at("softcap");
  m.alibi = c.at("alibi");
  if (c.at("rel_key").get<bool>()) {
    m.relative_key = input_leaf(f, "relative_key");
    tables.emplace_back("relative_key", m.relative_key);
  }
  if (c.at("rel_value").get<bool>()) {
    m.relative_value = input_leaf(f, "relative_value");
    tables.emplace_back("relative_value", m.relative_value);
  }
  if (c.at("t5").get<int64_t>() > 0) {
    m.t5_bias = input_leaf(f, "t5_bias");
    m.t5_max_distance = c.at("t5_max_distance");
    m.t5_bidirectional = c.at("t5_bidirectional");
    tables.emplace_back("t5_bias", m.t5_bias);
  }
  if (!c.at("docs").get<std::string>().empty()) {
    m.doc_ids = f.at("doc_ids");
    m.key_doc_ids = f.maybe("key_doc_ids");  // undefined: the keys share the queries' ids (T == S)
  }
  REQUIRE(m.any());

  const AttentionResult r = scaled_dot_product_attention(q, k, v, o);
  check_against(r.out, f.at("expected.out"), kOutRtol, kOutFloor, "output");
  sum(r.out * f.at("dout")).backward();
  auto check_grad = [&](const std::string& name, const Tensor& t) {
    check_against(t.grad(), f.at("expected.grad." + name), kGradRtol, kGradFloor, "gradient of " + name);
  };
  check_grad("q", q);
  check_grad("k", k);
  check_grad("v", v);
  for (const auto& [name, t] : tables) check_grad(name, t);
}

}  // namespace

TEST_CASE("score modifiers agree with PyTorch: outputs and every gradient (tests/reference/score_mods_fixture.safetensors)") {
  Fixture f{safetensors::load(test::reference_fixture("TINYGPT_SCORE_MODS_FIXTURE", "score_mods_fixture.safetensors")), ""};
  const auto cases = nlohmann::json::parse(f.contents.metadata.at("cases"));
  REQUIRE(cases.size() >= 15);
  for (const auto& c : cases) {
    const std::string name = c.at("name");
    CAPTURE(name);
    f.prefix = name + ".";
    for (AttentionImpl impl : {AttentionImpl::Flash, AttentionImpl::Naive}) {
      INFO((impl == AttentionImpl::Flash ? "flash" : "naive") << " kernel");
      run_case(f, c, impl);
    }
  }
}

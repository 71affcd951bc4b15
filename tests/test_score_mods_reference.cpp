// Agreement with PyTorch on a committed fixture (tests/reference/make_score_mods_fixture.py): the attention score
// modifiers (AttentionOptions::mods: Shaw's relative key and value tables, ALiBi, T5's bucketed bias, sliding window,
// documents, soft-capping) against a torch reference written from the papers, alone and all at once, with causal
// masking, key padding, an additive mask, grouped-query heads and T != S. Checked, for the flash and the naive kernel:
// the output and the gradient of q, k, v and of every learned table for loss = sum(out * dout). tinygpt computes in
// float32 from the fixture's float32 values; torch's reference was computed in float64.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "autograd/attention.h"
#include "autograd/ops.h"
#include "reference_fixture.h"
#include "train/safetensors.h"

using namespace tinygpt;
using test::check_against;
using test::Fixture;
using test::input_leaf;

namespace {

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

TEST_CASE(
    "score modifiers agree with PyTorch: outputs and every gradient (tests/reference/score_mods_fixture.safetensors)") {
  Fixture f{safetensors::load(test::reference_fixture("TINYGPT_SCORE_MODS_FIXTURE", "score_mods_fixture.safetensors")),
            ""};
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

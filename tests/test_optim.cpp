// Muon: the Newton-Schulz iteration against a plain f64 loop written from the formula, which parameters it takes,
// and 20 steps of Muon beside AdamW (and of AdamW alone) against torch.optim.Muon and torch.optim.AdamW
// (tests/reference/make_muon_fixture.py).
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "autograd/autograd.h"
#include "autograd/ops.h"
#include "reference_fixture.h"
#include "train/adamw.h"
#include "train/muon.h"

using namespace tinygpt;

namespace {

using Matrix = std::vector<std::vector<double>>;

Matrix product(const Matrix& a, const Matrix& b) {
  Matrix c(a.size(), std::vector<double>(b[0].size(), 0.0));
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t k = 0; k < b.size(); ++k)
      for (size_t j = 0; j < b[0].size(); ++j) c[i][j] += a[i][k] * b[k][j];
  return c;
}

Matrix transposed(const Matrix& a) {
  Matrix t(a[0].size(), std::vector<double>(a.size()));
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < a[0].size(); ++j) t[j][i] = a[i][j];
  return t;
}

/// Keller Jordan's quintic iteration as his muon.py writes it, in doubles: X = G / ||G||_F (transposed when tall),
/// then X <- 3.4445 X + (-4.7750 A + 2.0315 A A) X with A = X X^T, five times.
Matrix newton_schulz_reference(Matrix x) {
  const bool tall = x.size() > x[0].size();
  if (tall) x = transposed(x);
  double norm = 0;
  for (const auto& row : x)
    for (double v : row) norm += v * v;
  norm = std::sqrt(norm);
  for (auto& row : x)
    for (double& v : row) v /= norm;
  for (int step = 0; step < 5; ++step) {
    const Matrix a = product(x, transposed(x)), aa = product(a, a);
    Matrix b = a;
    for (size_t i = 0; i < a.size(); ++i)
      for (size_t j = 0; j < a.size(); ++j) b[i][j] = -4.7750 * a[i][j] + 2.0315 * aa[i][j];
    const Matrix bx = product(b, x);
    for (size_t i = 0; i < x.size(); ++i)
      for (size_t j = 0; j < x[0].size(); ++j) x[i][j] = 3.4445 * x[i][j] + bx[i][j];
  }
  return tall ? transposed(x) : x;
}

}  // namespace

TEST_CASE("muon: the Newton-Schulz iteration is Keller Jordan's quintic, for wide, tall and square matrices") {
  Generator gen(7);
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{6, 20}, {20, 6}, {9, 9}}) {
    for (const DType dtype : {DType::F64, DType::F32}) {
      INFO(rows << " x " << cols << " " << dtype_name(dtype));
      const Tensor g = randn({rows, cols}, gen, DType::F64);
      const auto v = g.to_vector<double>();
      Matrix m(size_t(rows), std::vector<double>(size_t(cols), 0.0));
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) m[size_t(i)][size_t(j)] = v[size_t(i * cols + j)];
      const Matrix want = newton_schulz_reference(m);
      const auto got = newton_schulz(g.to(dtype)).to(DType::F64).to_vector<double>();
      REQUIRE(got.size() == v.size());
      double worst = 0;
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j)
          worst = std::max(worst, std::abs(got[size_t(i * cols + j)] - want[size_t(i)][size_t(j)]));
      CHECK(worst < (dtype == DType::F64 ? 1e-12 : 2e-5));
      // What it is for: every singular value near 1 (the iteration leaves them in about [0.7, 1.2]), so each row of
      // the wide orientation has a squared norm, an average of squared singular values, within that band squared.
      const Matrix x = rows > cols ? transposed(want) : want;
      for (const auto& row : x) {
        double s = 0;
        for (double e : row) s += e * e;
        CHECK(s > 0.5 * 0.5);
        CHECK(s < 1.5 * 1.5);
      }
    }
  }
  CHECK_THROWS_WITH_AS(newton_schulz(zeros({2, 3, 4})), doctest::Contains("needs a matrix"), Error);
}

TEST_CASE("muon: Newton-Schulz with bf16 operands stays near the f32 iteration, and is not the f32 iteration") {
  // bf16 operands carry 8 significant bits: each product is off by about 2^-8 relative, and five iterations of a
  // contraction keep the result within a few percent of the f32 one; an iteration that ignored the flag would match
  // f32 to 1e-6.
  Generator gen(11);
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{48, 128}, {128, 48}}) {
    INFO(rows << " x " << cols);
    const Tensor g = randn({rows, cols}, gen, DType::F32);
    const auto f32 = newton_schulz(g).to_vector<float>();
    const auto b16 = newton_schulz(g, 5, 1e-7, true).to_vector<float>();
    double worst = 0, norm = 0;
    for (size_t i = 0; i < f32.size(); ++i) {
      worst = std::max(worst, double(std::abs(f32[i] - b16[i])));
      norm = std::max(norm, double(std::abs(f32[i])));
    }
    CHECK(worst < 0.05 * norm);
    CHECK(worst > 1e-5 * norm);
  }
}

TEST_CASE("muon: the blocks' weight matrices go to Muon; embeddings, head, gains, biases and tables to AdamW") {
  const Tensor matrix = zeros({4, 3}), vector = zeros({4});
  CHECK(muon_updates("transformer.h.0.attn.c_attn.weight", matrix));
  CHECK(muon_updates("transformer.h.11.mlp.c_proj.weight", matrix));
  CHECK_FALSE(muon_updates("transformer.h.0.ln_1.weight", vector));
  CHECK_FALSE(muon_updates("transformer.h.0.attn.c_attn.bias", vector));
  CHECK_FALSE(muon_updates("transformer.wte.weight", matrix));
  CHECK_FALSE(muon_updates("transformer.wpe.weight", matrix));
  CHECK_FALSE(muon_updates("lm_head.weight", matrix));
  CHECK_FALSE(muon_updates("transformer.h.0.attn.relative_key", matrix));
  CHECK_FALSE(muon_updates("transformer.h.0.attn.t5_bias", matrix));
  CHECK(muon_scale(MuonScale::Original, 32, 8) == doctest::Approx(2.0));
  CHECK(muon_scale(MuonScale::Original, 8, 32) == 1.0);
  CHECK(muon_scale(MuonScale::MatchAdamW, 8, 32) == doctest::Approx(0.2 * std::sqrt(32.0)));
}

TEST_CASE("muon and AdamW agree with PyTorch (torch.optim.Muon, torch.optim.AdamW) over 20 clipped, scheduled steps") {
  test::Fixture f{safetensors::load(test::reference_fixture("TINYGPT_MUON_FIXTURE", "muon_fixture.safetensors")), ""};
  const auto meta = nlohmann::json::parse(f.contents.metadata.at("config"));
  MESSAGE("fixture from torch " << f.contents.metadata.at("torch"));
  const int steps = meta["steps"].get<int>();
  const double max_norm = meta["max_norm"].get<double>();
  const AdamWConfig adamw{.lr = meta["adamw_lr"].get<double>(),
                          .beta1 = meta["beta1"].get<double>(),
                          .beta2 = meta["beta2"].get<double>(),
                          .eps = meta["eps"].get<double>(),
                          .weight_decay = meta["weight_decay"].get<double>()};
  for (const auto& c : meta["cases"]) {
    const std::string name = c["name"].get<std::string>();
    INFO("case " << name);
    f.prefix = name + ".";
    std::vector<std::pair<std::string, Tensor>> params;
    for (const auto& p : meta["params"]) {
      const std::string n = p[0].get<std::string>();
      params.emplace_back(n, test::input_leaf(f, "init." + n));
    }
    FlatParameters flat(params);
    std::unique_ptr<Optimizer> opt;
    if (c["optimizer"] == "muon") {
      const MuonConfig muon{.lr = meta["muon_lr"].get<double>(),
                            .momentum = meta["momentum"].get<double>(),
                            .nesterov = c["nesterov"].get<bool>(),
                            .weight_decay = c["muon_wd"].get<double>(),
                            .scale = c["adjust_lr_fn"] == "original" ? MuonScale::Original : MuonScale::MatchAdamW};
      opt = std::make_unique<Muon>(flat, muon, adamw);
    } else {
      opt = std::make_unique<AdamW>(flat, adamw);
    }
    for (int step = 0; step < steps; ++step) {
      INFO("step " << step);
      opt->zero_grad();
      Tensor loss;
      for (const auto& [n, p] : params) {
        const Tensor d = f.at("D." + n), t = f.at("T." + n), s = f.at("S." + n);
        const Tensor term = sum(d * (p - t) * (p - t) + s * p * p * p * (1.0 / 3.0));
        loss = loss.defined() ? loss + term : term;
      }
      loss.backward();
      NoGradGuard no_grad;
      const double norm = std::sqrt(sum(flat.grads() * flat.grads()).item());
      test::check_against(full({1}, norm), f.at("grad_norm." + std::to_string(step)), 1e-5, 0, "gradient norm");
      opt->step(adamw.lr * meta["schedule"][size_t(step)].get<double>(), norm * norm, max_norm);
      for (const auto& [n, p] : params) {
        test::check_against(p, f.at("step" + std::to_string(step) + "." + n), 1e-5, 1e-6, n);
      }
    }
    size_t states = 0;
    for (const auto& [n, t] : opt->state()) {
      test::check_against(t, f.at("state." + n), 1e-4, 1e-5, n);
      ++states;
    }
    CHECK(states == (c["optimizer"] == "muon" ? 3 * 2 + 3 : 6 * 2));  // AdamW: two moments each; Muon: one buffer
  }
}

TEST_CASE(
    "AdamW and Muon write the bf16 working copies as they update: each copy is its new master rounded, and the "
    "masters move exactly as without copies") {
  // The f32 masters are the optimizer's: an update of the copies alone, a copy left stale or one rounded another way
  // than to nearest even shows here.
  const std::vector<std::pair<std::string, Shape>> shapes = {{"transformer.wte.weight", {11, 8}},
                                                             {"transformer.h.0.ln_1.weight", {8}},
                                                             {"transformer.h.0.attn.c_attn.weight", {24, 8}},
                                                             {"transformer.h.0.mlp.c_fc.weight", {32, 8}}};
  for (const bool muon : {false, true}) {
    CAPTURE(muon);
    auto make = [&](uint64_t seed) {
      Generator gen(seed);
      std::vector<std::pair<std::string, Tensor>> params;
      for (const auto& [name, shape] : shapes) params.emplace_back(name, randn(shape, gen, DType::F32) * 0.5);
      for (auto& [name, p] : params) p.requires_grad_();
      return params;
    };
    auto with = make(3), without = make(3);
    FlatParameters flat_with(with), flat_without(without);
    flat_with.write_bf16_copies();
    const AdamWConfig adamw{.lr = 1e-2, .weight_decay = 0.1};
    auto optimizer = [&](FlatParameters& flat) -> std::unique_ptr<Optimizer> {
      if (muon) return std::make_unique<Muon>(flat, MuonConfig{.lr = 0.02}, adamw);
      return std::make_unique<AdamW>(flat, adamw);
    };
    const auto opt_with = optimizer(flat_with), opt_without = optimizer(flat_without);
    for (int step = 0; step < 3; ++step) {
      for (auto* params : {&with, &without}) {
        Tensor loss;
        for (const auto& [name, p] : *params) {
          const Tensor term = sum(p * p * p + p * double(step + 1));
          loss = loss.defined() ? loss + term : term;
        }
        loss.backward();
      }
      opt_with->step(1e-2);
      opt_without->step(1e-2);
      NoGradGuard no_grad;
      for (size_t i = 0; i < with.size(); ++i) {
        INFO(with[i].first << " after step " << step);
        const std::vector<float> master = with[i].second.to_vector<float>();
        CHECK(master == without[i].second.to_vector<float>());
        CHECK(master != make(3)[i].second.to_vector<float>());  // it moved
        REQUIRE(with[i].second.impl().bf16_copy);
        CHECK(working_copy(with[i].second).to(DType::F32).to_vector<float>() ==
              with[i].second.to(DType::BF16).to(DType::F32).to_vector<float>());
      }
      opt_with->zero_grad();
      opt_without->zero_grad();
    }
  }
}

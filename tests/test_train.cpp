// .safetensors files, checkpoints, the token cache and batch sampler, the LR schedule, host reads per step, and a
// short training run that checkpoints, resumes and samples.
#include <doctest/doctest.h>
#include <fmt/core.h>
#include <nlohmann/json.hpp>
#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>

#include "autograd/ops.h"
#include "data/corpus.h"
#include "data/documents.h"
#include "kernels/cpu/cpu_probe.h"
#include "kernels/cpu/gemm.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/cli.h"
#include "train/export.h"
#include "train/memory.h"
#include "train/safetensors.h"
#include "train/speed.h"
#include "train/trainer.h"

using namespace tinygpt;
using tinygpt::test::TempDir;
namespace fs = std::filesystem;

namespace {

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// A small text with structure a model can learn quickly.
std::string toy_text() {
  std::string s;
  for (int i = 0; i < 400; ++i)
    s += i % 3 == 0 ? "the cat sat on the mat. " : i % 3 == 1 ? "a dog ran. " : "hello world! ";
  return s;
}

/// A training config on toy_text() written into `dir`, with a small 2-layer model.
TrainConfig toy_run(const TempDir& dir, int64_t n_embd) {
  const fs::path text = dir.path / "toy.txt";
  write_file(text, toy_text());
  TrainConfig c;
  c.data = {text.string()};
  c.model.n_layer = 2, c.model.n_head = 2, c.model.n_embd = n_embd, c.model.block_size = 16;
  return c;
}

/// The "loss" of each step row of a run's metrics.jsonl, in order.
std::vector<double> step_losses(const fs::path& run) {
  std::vector<double> out;
  std::ifstream in(run / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out.push_back(j["loss"].get<double>());
  }
  return out;
}

}  // namespace

TEST_CASE("train: a step reads its loss and gradient norm to the host once (on the GPU: one synchronisation)") {
  for (const char* optimizer : {"adamw", "muon"}) {
    for (const int64_t accum : {1, 3}) {
      INFO(optimizer << ", --grad-accum " << accum);
      TempDir dir(fmt::format("step_reads_{}_{}", optimizer, accum));
      TrainConfig c = toy_run(dir, 32);
      c.out = (dir.path / "run").string();
      c.batch_size = 4, c.max_iters = 5, c.eval_interval = 100, c.eval_iters = 2, c.warmup_iters = 2;
      c.lr_decay_iters = 5, c.grad_accum = accum, c.optimizer = optimizer, c.quiet = true;
      const TrainResult r = train(c);
      CHECK(r.iters == 5);
      CHECK(r.max_step_float_reads == 1);
      CHECK(r.max_step_syncs == 0);  // the CPU never waits for a GPU
    }
  }
}

TEST_CASE(
    "train: the step (rates and clipping read from memory) learns with either optimizer, accumulating or not, "
    "clipped or not, on f32 and bf16 storage") {
  // Bf16 storage's working copies are written by the update: a step that left them alone would train nothing, the
  // loss flat at its start. Clipping at 0.05 (below every gradient norm here) changes every step after the first.

  for (const char* optimizer : {"adamw", "muon"}) {
    for (const bool bf16_storage : {false, true}) {
      std::map<std::pair<int64_t, double>, std::vector<double>> losses;  // by (--grad-accum, --grad-clip)
      for (const int64_t accum : {1, 2}) {
        for (const double clip : {1.0, 0.05}) {
          INFO(optimizer << ", --grad-accum " << accum << ", --grad-clip " << clip << ", bf16 storage "
                         << bf16_storage);
          TempDir dir(fmt::format("step_{}_{}_{}_{}", optimizer, accum, clip, bf16_storage));
          TrainConfig c = toy_run(dir, 32);
          c.out = (dir.path / "run").string();
          c.batch_size = 4 / accum, c.max_iters = 10, c.eval_interval = 5, c.eval_iters = 2, c.warmup_iters = 2;
          c.lr_decay_iters = 10, c.grad_accum = accum, c.grad_clip = clip, c.optimizer = optimizer, c.quiet = true;
          if (bf16_storage) c.dtype = "bf16", c.storage = "bf16";
          const TrainResult r = train(c);
          CHECK(r.max_step_float_reads == 1);
          const std::vector<double>& l = losses[{accum, clip}] = step_losses(c.out);
          REQUIRE(l.size() == 10);
          CHECK(r.last_val_loss < l.front() - 0.1);  // it learns
        }
      }
      CHECK(losses[{1, 1.0}][0] == losses[{1, 0.05}][0]);
      CHECK(losses[{1, 1.0}][9] != losses[{1, 0.05}][9]);
    }
  }
}

TEST_CASE("train --dtype bf16: rounded operands change the losses a little, and the checkpoint records it") {
  auto run = [](const std::string& dtype) {
    TempDir dir("dtype_" + dtype);
    TrainConfig c = toy_run(dir, 32);
    c.out = (dir.path / "run").string();
    c.batch_size = 4, c.max_iters = 30, c.eval_interval = 30, c.eval_iters = 4, c.warmup_iters = 5;
    c.lr_decay_iters = 30, c.lr = 3e-3, c.dtype = dtype, c.quiet = true;
    const TrainResult r = train(c);
    CHECK(load_checkpoint(dir.path / "run").numerics.bf16 == (dtype == "bf16"));
    return r.last_val_loss;
  };
  const double fp32 = run("fp32"), bf16 = run("bf16");
  CHECK(fp32 != bf16);                       // the rounding is applied in training
  CHECK(std::abs(fp32 - bf16) < 0.05);       // and it trains the same
  CHECK(bf16 < std::log(double(17)) - 0.5);  // well below a uniform guess over the toy's characters
  TrainConfig bad;
  bad.data = {"x.txt"}, bad.dtype = "fp16";
  CHECK_THROWS_WITH_AS(bad.validate(), "--dtype must be fp32 or bf16, got 'fp16'", Error);
}

TEST_CASE("safetensors: round trip of every dtype with metadata, and the layout other readers expect") {
  TempDir dir("st_roundtrip");
  const fs::path p = dir.path / "t.safetensors";
  const Tensor a = from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor b = from_vector(std::vector<double>{-1.5}, {1});
  const Tensor c = from_vector(std::vector<int32_t>{7, 8, 9}, {3});
  safetensors::save(p, {{"a", a}, {"b", b}, {"c", c}}, {{"note", "hello"}});
  const auto loaded = safetensors::load(p);
  CHECK(loaded.metadata.at("note") == "hello");
  CHECK(loaded.find("a").shape() == Shape{2, 3});
  CHECK(loaded.find("a").to_vector<float>() == a.to_vector<float>());
  CHECK(loaded.find("b").to_vector<double>() == b.to_vector<double>());
  CHECK(loaded.find("c").to_vector<int32_t>() == c.to_vector<int32_t>());
  CHECK_FALSE(loaded.find("missing").defined());
  // The format by hand: u64 header length, JSON header, data right after it.
  const std::string bytes = read_file(p);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  CHECK(header["a"]["dtype"] == "F32");
  CHECK(header["a"]["shape"] == nlohmann::json::array({2, 3}));
  const auto off = header["c"]["data_offsets"][0].get<uint64_t>();
  int32_t first = 0;
  std::memcpy(&first, bytes.data() + 8 + n + off, 4);
  CHECK(first == 7);
  CHECK_FALSE(fs::exists(dir.path / "t.safetensors.tmp"));
}

TEST_CASE("safetensors: damaged files are refused with the problem named") {
  TempDir dir("st_bad");
  const fs::path p = dir.path / "t.safetensors";
  safetensors::save(p, {{"w", from_vector(std::vector<float>(100, 1.0f), {10, 10})}}, {});
  const std::string good = read_file(p);
  CHECK_THROWS_WITH_AS(safetensors::load(dir.path / "nope.safetensors"), doctest::Contains("does not exist"), Error);
  CHECK_THROWS_WITH_AS(safetensors::load(dir.path), doctest::Contains("is a directory"), Error);
  write_file(p, good.substr(0, good.size() - 4));
  CHECK_THROWS_WITH_AS(safetensors::load(p), doctest::Contains("truncated"), Error);
  write_file(p, good.substr(0, 5));
  CHECK_THROWS_WITH_AS(safetensors::load(p), doctest::Contains("shorter than its 8-byte header"), Error);
  std::string bad_json = good;
  bad_json[9] = '#';
  write_file(p, bad_json);
  CHECK_THROWS_WITH_AS(safetensors::load(p), doctest::Contains("not a JSON object"), Error);
  std::string bad_shape = good;
  const size_t at = bad_shape.find("[10,10]");
  REQUIRE(at != std::string::npos);
  bad_shape.replace(at, 7, "[10,11]");
  write_file(p, bad_shape);
  CHECK_THROWS_WITH_AS(safetensors::load(p), doctest::Contains("needs 440 bytes"), Error);
  std::string huge = good;
  const uint64_t n = uint64_t(1) << 40;
  std::memcpy(huge.data(), &n, 8);
  write_file(p, huge);
  CHECK_THROWS_WITH_AS(safetensors::load(p), doctest::Contains("implausible"), Error);
}

TEST_CASE("one file of characters: a vocabulary of its characters, encoded once into the cache, mapped after") {
  TempDir dir("corpus");
  const fs::path text = dir.path / "t.txt", cache = dir.path / "tokens.bin";
  const auto note = [](const std::string&) {};
  write_file(text, "hello, w\xc3\xb6rld");  // ö is two bytes, one token
  const data::FileList files = data::list_text_files({text.string()}, note);
  const data::Tokenizer chars(data::vocab_of_files(files, ""));
  CHECK(chars.chars().chars() == U" ,dehlorw\u00f6");
  const data::DocumentCorpus first = data::load_documents(files, chars, {}, 0.9, cache, true);
  CHECK(first.encoded == 1);
  CHECK(first.tokens.ids().size() == 12);
  CHECK(first.train_count == 10);  // the last fraction validates, as nanoGPT splits one text
  const data::DocumentCorpus second = data::load_documents(files, chars, {}, 0.9, cache, true);
  CHECK(second.reused == 1);
  CHECK(second.encoded == 0);
  CHECK(std::equal(first.tokens.ids().begin(), first.tokens.ids().end(), second.tokens.ids().begin(),
                   second.tokens.ids().end()));
  CHECK(second.tokens.ids()[0] == uint32_t(chars.chars().id(U'h')));
  write_file(text, "something else entirely");
  const data::Tokenizer other(data::vocab_of_files(files, ""));
  const data::DocumentCorpus third = data::load_documents(files, other, {}, 0.9, cache, true);
  CHECK(third.encoded == 1);
  CHECK(third.tokens.ids().size() == 23);

  write_file(text, "ok\xff");
  CHECK_THROWS_WITH_AS(data::vocab_of_files(files, ""), doctest::Contains("invalid UTF-8 at byte offset 2"), Error);
  write_file(text, std::string("ok\0no", 5));
  CHECK_THROWS_WITH_AS(data::vocab_of_files(files, ""), doctest::Contains("a NUL byte at offset 2"), Error);
  write_file(text, "");
  CHECK_THROWS_WITH_AS(data::list_text_files({text.string()}, note), doctest::Contains("is empty"), Error);
  CHECK_THROWS_WITH_AS(data::list_text_files({(dir.path / "missing.txt").string()}, note),
                       doctest::Contains("does not exist"), Error);
  // A character outside a checkpoint's vocabulary is named with its byte offset in the file, also past the first
  // part a thread encodes (4 MiB).
  write_file(text, std::string(size_t(5) << 20, 'a') + "abc\xc3\xa9");
  const std::string where = fmt::format("at byte offset {} is not in the model's vocabulary", (size_t(5) << 20) + 3);
  CHECK_THROWS_WITH_AS(data::load_documents(files, data::Tokenizer(data::CharVocab(U"abc")), {}, 0.9, cache, true),
                       doctest::Contains(where.c_str()), Error);
}

TEST_CASE("batch sampler: y is x shifted by one, windows stay inside, the seed fixes the draw") {
  std::vector<data::Token> ids(50);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = data::Token(i);
  data::BatchSampler s1(ids, 4, 8, 7, "test"), s2(ids, 4, 8, 7, "test");
  for (int k = 0; k < 20; ++k) {
    const auto a = s1.next(), b = s2.next();
    const auto x = a.x.to_vector<int32_t>(), y = a.y.to_vector<int32_t>();
    CHECK(x == b.x.to_vector<int32_t>());
    for (size_t i = 0; i < x.size(); ++i) {
      CHECK(y[i] == x[i] + 1);
      CHECK(y[i] < 50);
      if (i % 8 != 0) CHECK(x[i] == x[i - 1] + 1);
    }
  }
  CHECK_THROWS_WITH_AS(data::BatchSampler(std::span(ids).first(8), 1, 8, 0, "validation split"),
                       doctest::Contains("validation split has 8 tokens, fewer than block_size + 1 = 9"), Error);
}

TEST_CASE("learning rate: linear warmup, cosine decay to min_lr, then min_lr (nanoGPT's get_lr)") {
  TrainConfig c;
  c.lr = 1e-3, c.min_lr = 1e-4, c.warmup_iters = 100, c.lr_decay_iters = 2000;
  CHECK(learning_rate(c, 0) == doctest::Approx(1e-3 * 1 / 101));
  CHECK(learning_rate(c, 99) == doctest::Approx(1e-3 * 100 / 101));
  CHECK(learning_rate(c, 100) == doctest::Approx(1e-3));
  CHECK(learning_rate(c, 1050) == doctest::Approx(1e-4 + 0.5 * 9e-4));
  CHECK(learning_rate(c, 2000) == doctest::Approx(1e-4));
  CHECK(learning_rate(c, 5000) == doctest::Approx(1e-4));
}

TEST_CASE("learning rate with a time budget: warmup by iterations, then the cosine follows the seconds spent") {
  TrainConfig c;
  c.lr = 1e-3, c.min_lr = 1e-4, c.warmup_iters = 100, c.lr_decay_iters = 2000, c.time_budget = 60;
  CHECK(learning_rate(c, 0, 5.0) == doctest::Approx(1e-3 * 1 / 101));
  CHECK(learning_rate(c, 100, 0.0) == doctest::Approx(1e-3));
  CHECK(learning_rate(c, 100, 30.0) == doctest::Approx(1e-4 + 0.5 * 9e-4));
  CHECK(learning_rate(c, 3, 45.0) == doctest::Approx(1e-3 * 4 / 101));  // still warming up
  CHECK(learning_rate(c, 1000, 45.0) == doctest::Approx(1e-4 + 0.5 * (1 + std::cos(M_PI * 0.75)) * 9e-4));
  CHECK(learning_rate(c, 5000, 60.0) == doctest::Approx(1e-4));
  CHECK(learning_rate(c, 5000, 90.0) == doctest::Approx(1e-4));  // past the budget (the last step's overrun)
}

TEST_CASE("learning rate with a cooldown: warmup, the peak held, then linear to min_lr over the last fraction") {
  TrainConfig c;
  c.lr = 1e-3, c.min_lr = 1e-4, c.warmup_iters = 100, c.lr_decay_iters = 2100, c.cooldown = 0.25;
  CHECK(learning_rate(c, 99) == doctest::Approx(1e-3 * 100 / 101));
  CHECK(learning_rate(c, 100) == doctest::Approx(1e-3));
  CHECK(learning_rate(c, 1600) == doctest::Approx(1e-3));  // 75% of the decay's 2000 iterations: still the peak
  CHECK(learning_rate(c, 1850) == doctest::Approx(1e-4 + 0.5 * 9e-4));
  CHECK(learning_rate(c, 2100) == doctest::Approx(1e-4));
  CHECK(learning_rate(c, 3000) == doctest::Approx(1e-4));
  c.time_budget = 60;  // with a budget the seconds decide, as for the cosine
  CHECK(learning_rate(c, 5000, 30.0) == doctest::Approx(1e-3));
  CHECK(learning_rate(c, 5000, 52.5) == doctest::Approx(1e-4 + 0.5 * 9e-4));
  CHECK(learning_rate(c, 5000, 90.0) == doctest::Approx(1e-4));
  c.cooldown = 1.0;  // linear over the whole decay
  CHECK(learning_rate(c, 200, 15.0) == doctest::Approx(1e-4 + 0.75 * 9e-4));
}

TEST_CASE("train: a time budget ends the run at the first step past it, schedules the decay on it, and resumes it") {
  TempDir dir("budget");
  TrainConfig c = toy_run(dir, 32);
  c.out = (dir.path / "run").string();
  c.batch_size = 4, c.warmup_iters = 5, c.eval_interval = 1000000, c.eval_iters = 2, c.log_interval = 1000000;
  c.time_budget = 0.3;
  c.max_iters = std::numeric_limits<int64_t>::max();  // as the command line leaves it when --max-iters is not given
  const TrainResult r = train(c);
  CHECK(r.iters > 0);
  auto rows = [&] {
    std::vector<nlohmann::json> out;
    std::ifstream metrics(fs::path(c.out) / "metrics.jsonl");
    for (std::string line; std::getline(metrics, line);) {
      const auto j = nlohmann::json::parse(line);
      if (!j.contains("val_loss")) out.push_back(j);
    }
    return out;
  };
  std::vector<nlohmann::json> iters = rows();
  REQUIRE(int64_t(iters.size()) == r.iters);
  double before = 0;  // the seconds spent before each step, which its learning rate follows
  for (size_t i = 0; i < iters.size(); ++i) {
    CAPTURE(i);
    CHECK(iters[i]["lr"].get<double>() == doctest::Approx(learning_rate(c, int64_t(i), before)).epsilon(1e-12));
    CHECK(before < c.time_budget);  // no step starts once the budget is spent
    const double after = iters[i]["train_s"].get<double>();
    CHECK(after == doctest::Approx(before + iters[i]["ms"].get<double>() / 1e3).epsilon(1e-9));
    before = after;
  }
  CHECK(before >= c.time_budget);  // and the run ends when it is
  CHECK(load_checkpoint(fs::path(c.out) / kLatestCheckpoint).state.train_seconds == doctest::Approx(before));

  // A larger budget on resume continues from the seconds already spent.
  c.time_budget = before + 0.2;
  c.resume = true;
  const TrainResult more = train(c);
  CHECK(more.iters > r.iters);
  iters = rows();
  REQUIRE(int64_t(iters.size()) == more.iters);
  CHECK(iters[size_t(r.iters) - 1]["train_s"].get<double>() == doctest::Approx(before));
  CHECK(iters.back()["train_s"].get<double>() >= c.time_budget);
  CHECK(iters[iters.size() - 2]["train_s"].get<double>() < c.time_budget);
}

TEST_CASE("train: a short run learns, keeps best and latest checkpoints and metrics, and resumes exactly") {
  TempDir dir("train");
  const fs::path text = dir.path / "toy.txt";
  TrainConfig c = toy_run(dir, 32);
  c.out = (dir.path / "run").string();
  c.batch_size = 8, c.max_iters = 60, c.warmup_iters = 5, c.lr_decay_iters = 60, c.lr = 3e-3;
  c.eval_interval = 30, c.eval_iters = 4, c.log_interval = 1000;
  const TrainResult r = train(c);
  CHECK(r.iters == 60);
  CHECK(r.last_val_loss < 2.0);  // ln(vocab) ~ 2.9 at the start
  CHECK(fs::exists(fs::path(c.out) / kLatestCheckpoint));
  CHECK(fs::exists(fs::path(c.out) / kBestCheckpoint));

  // metrics.jsonl: an object per iteration and per evaluation.
  std::ifstream metrics(fs::path(c.out) / "metrics.jsonl");
  int iter_lines = 0, eval_lines = 0;
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("val_loss")) {
      ++eval_lines;
      CHECK(j.contains("train_loss"));
    } else {
      ++iter_lines;
      for (const char* key : {"iter", "loss", "lr", "ms", "tok_per_s", "gflops"}) CHECK(j.contains(key));
      // GFLOP/s of a step, written out here: per token 6 FLOPs per weight (the position table left out, as nanoGPT)
      // plus 6 L T C, causal attention's half of nanoGPT's 12 L T C, for the step's batch_size x block_size tokens.
      const int64_t V = 17, L = 2, T = 16, C = 32, weights = V * C + L * (12 * C * C + 2 * C) + C;  // no biases
      const double flops = (6.0 * double(weights) + 6.0 * L * T * C) * 8 * T;
      CHECK(j["gflops"].get<double>() * j["ms"].get<double>() * 1e6 == doctest::Approx(flops).epsilon(1e-9));
      // MFU only against a stated peak, a ceiling no step passes (train/speed.h); none where no figure is known (a
      // CPU without the probe: under qemu a product timed at start-up read 3-11% below the steps' rate).
      const double peak = stated_peak(Device::CPU, Numerics{}).gflops;
      CHECK(j.contains("mfu") == (peak > 0));
      if (peak > 0) {
        CHECK(j["mfu"].get<double>() > 0);
        CHECK(j["mfu"].get<double>() <= 1.0);
      }
      CHECK(j["train_s"].get<double>() > 0);
    }
  }
  CHECK(iter_lines == 60);
  CHECK(eval_lines == 3);  // iterations 0, 30, 60

  // The checkpoint restores the model: the same evaluation, in a new model.
  const Checkpoint ckpt = load_checkpoint(fs::path(c.out) / kLatestCheckpoint);
  CHECK(ckpt.state.iter == 60);
  CHECK(ckpt.tokenizer.vocab_size() == ckpt.config.vocab_size);
  Generator gen(0);
  nn::GPT model(ckpt.config, gen);
  load_weights(model, ckpt);
  const data::DocumentCorpus corpus =
      data::load_documents({text}, ckpt.tokenizer, {}, 0.9, dir.path / "eval_tokens.bin", /*quiet=*/true);
  CHECK(estimate_loss(model, corpus.split().val, 8, 4, 12345, "val") < 2.0);

  // Resuming to 90 iterations continues from 60 (and appends to metrics.jsonl).
  c.max_iters = 90;
  c.lr_decay_iters = 90;
  c.resume = true;
  CHECK(train(c).iters == 90);
  CHECK(load_checkpoint(c.out).state.iter == 90);
}

TEST_CASE("checkpoints: a directory means best, else latest; foreign or mismatched files are refused") {
  TempDir dir("ckpt");
  CHECK_THROWS_WITH_AS(load_checkpoint(dir.path), doctest::Contains("holds no checkpoint"), Error);
  const fs::path p = dir.path / "other.safetensors";
  safetensors::save(p, {{"w", zeros({2})}}, {{"format", "something-else"}});
  CHECK_THROWS_WITH_AS(load_checkpoint(p), doctest::Contains("format 'something-else'"), Error);

  nn::GPTConfig cfg;
  cfg.vocab_size = 3, cfg.block_size = 4, cfg.n_layer = 1, cfg.n_head = 1, cfg.n_embd = 8;
  Generator gen(1);
  const nn::GPT model(cfg, gen);
  save_checkpoint(dir.path / kLatestCheckpoint, model, data::Tokenizer(data::CharVocab(U"abc")), nullptr, {});
  CHECK(resolve_checkpoint(dir.path) == dir.path / kLatestCheckpoint);
  CHECK(load_checkpoint(dir.path).config.n_embd == 8);
  save_checkpoint(dir.path / kBestCheckpoint, model, data::Tokenizer(data::CharVocab(U"abc")), nullptr, {});
  CHECK(resolve_checkpoint(dir.path) == dir.path / kBestCheckpoint);

  // Weights that do not match the config, and a vocabulary that does not match vocab_size.
  auto contents = safetensors::load(dir.path / kBestCheckpoint);
  contents.metadata["config"] = to_json([&] {
                                  nn::GPTConfig wider = cfg;
                                  wider.n_embd = 16;
                                  return wider;
                                }())
                                    .dump();
  safetensors::save(p, contents.tensors, contents.metadata);
  CHECK_THROWS_WITH_AS(load_checkpoint(p), doctest::Contains("but the config needs"), Error);
  contents = safetensors::load(dir.path / kBestCheckpoint);
  contents.metadata["vocab"] = "abcd";
  safetensors::save(p, contents.tensors, contents.metadata);
  CHECK_THROWS_WITH_AS(load_checkpoint(p), doctest::Contains("vocabulary has 4 tokens"), Error);
}

TEST_CASE("checkpoints record the model's numerics; eval's and sample's flags override them") {
  TempDir dir("numerics");
  nn::GPTConfig cfg;
  cfg.vocab_size = 3, cfg.block_size = 4, cfg.n_layer = 1, cfg.n_head = 1, cfg.n_embd = 8;
  Generator gen(1);
  nn::GPT model(cfg, gen);
  const Numerics trained{.tf32 = false, .bf16 = true, .attention = AttentionMath::BF16};
  model.set_numerics(trained);
  CHECK(model.h[0]->attn.numerics().attention == AttentionMath::BF16);  // the children follow
  CHECK(model.h[0]->mlp.c_fc.numerics().bf16);
  const fs::path p = dir.path / kLatestCheckpoint;
  save_checkpoint(p, model, data::Tokenizer(data::CharVocab(U"abc")), nullptr, {});
  const Checkpoint ckpt = load_checkpoint(p);
  CHECK(ckpt.numerics.tf32 == false);
  CHECK(ckpt.numerics.bf16);
  CHECK(ckpt.numerics.attention == AttentionMath::BF16);

  for (const Device d : {Device::CPU, Device::CUDA}) {  // no flags: what training used
    CHECK(NumericsFlags{}.over(ckpt.numerics, d).attention == AttentionMath::BF16);
    CHECK(NumericsFlags{}.over(ckpt.numerics, d).matmul() == MatmulMath::BF16);
  }
  auto flags = [](std::string dtype, std::optional<bool> tf32, std::string attention_math) {
    return NumericsFlags{std::move(dtype), tf32, std::move(attention_math), ""};
  };
  const Numerics over = flags("", true, "tf32").over(ckpt.numerics, Device::CUDA);
  CHECK(over.tf32);
  CHECK(over.bf16);  // --dtype not given: still the checkpoint's
  CHECK(over.attention == AttentionMath::TF32);
  // --dtype fp32: f32 operands, and on the GPU f32 attention unless --attention-math says otherwise.
  const Numerics fp32 = flags("fp32", {}, "").over(ckpt.numerics, Device::CUDA);
  CHECK(fp32.matmul() == MatmulMath::F32);
  CHECK(fp32.attention == AttentionMath::F32);
  CHECK(flags("fp32", {}, "bf16").over(ckpt.numerics, Device::CUDA).attention == AttentionMath::BF16);
  CHECK(flags("fp32", {}, "").over(ckpt.numerics, Device::CPU).matmul() == MatmulMath::F32);
  CHECK(flags("bf16", {}, "").over(Numerics{}, Device::CUDA).attention == AttentionMath::BF16);
  // TF32 matmuls on the GPU bring tf32 attention by default; --no-tf32 takes both back to f32; the CPU has no tf32.
  CHECK(flags("fp32", true, "").over(ckpt.numerics, Device::CUDA).attention == AttentionMath::TF32);
  CHECK(flags("fp32", true, "").over(ckpt.numerics, Device::CPU).attention == AttentionMath::F32);
  const Numerics tf32_run{.tf32 = true, .bf16 = false, .attention = AttentionMath::TF32};
  CHECK(flags("", false, "").over(tf32_run, Device::CUDA).attention == AttentionMath::F32);
  CHECK(flags("", false, "").over(tf32_run, Device::CUDA).matmul() == MatmulMath::F32);
  CHECK(flags("", {}, "").over(tf32_run, Device::CUDA).attention == AttentionMath::TF32);  // no flags: the checkpoint's
  TrainConfig gpu_run;
  gpu_run.device = "cuda";
  CHECK(numerics_of(gpu_run).attention == AttentionMath::TF32);
  gpu_run.tf32 = false;
  CHECK(numerics_of(gpu_run).attention == AttentionMath::F32);
  gpu_run.dtype = "bf16";
  CHECK(numerics_of(gpu_run).attention == AttentionMath::BF16);
  gpu_run.device = "cpu";
  CHECK(numerics_of(gpu_run).attention ==
        (cpu::bf16_kernel() != cpu::Bf16Kernel::F32Units ? AttentionMath::BF16 : AttentionMath::F32));

  // A checkpoint from before numerics were recorded loads as full f32; an unknown format is refused.
  auto contents = safetensors::load(p);
  contents.metadata.erase("numerics");
  safetensors::save(p, contents.tensors, contents.metadata);
  CHECK(load_checkpoint(p).numerics.attention == AttentionMath::F32);
  CHECK(load_checkpoint(p).numerics.matmul() == MatmulMath::F32);
  contents.metadata["numerics"] = R"({"tf32": true, "attention_math": "f32"})";  // from before --dtype: no bf16
  safetensors::save(p, contents.tensors, contents.metadata);
  CHECK(load_checkpoint(p).numerics.matmul() == MatmulMath::TF32);
  contents.metadata["numerics"] = R"({"tf32": true, "attention_math": "fp8"})";
  safetensors::save(p, contents.tensors, contents.metadata);
  CHECK_THROWS_WITH_AS(load_checkpoint(p), doctest::Contains("unknown attention_math 'fp8'"), Error);
}

TEST_CASE("train --storage bf16: learns as f32 storage does, the masters updated, resumes bit for bit") {
  for (const std::string optimizer : {"adamw", "muon"}) {
    INFO("--optimizer " << optimizer);
    TempDir dir("storage_" + optimizer);
    TrainConfig c = toy_run(dir, 32);
    c.optimizer = optimizer;
    c.model.dropout = 0.1;
    c.batch_size = 4, c.warmup_iters = 5, c.lr_decay_iters = 40, c.lr = 3e-3, c.dtype = "bf16";
    c.eval_interval = 20, c.eval_iters = 4, c.log_interval = 1000, c.quiet = true;
    auto run = [&](const std::string& name, const std::string& storage, int64_t iters, bool resume) {
      c.out = (dir.path / name).string(), c.storage = storage, c.max_iters = iters, c.resume = resume;
      return train(c);
    };
    const double f32 = run("f32", "f32", 40, false).last_val_loss;
    const double b16 = run("bf16", "bf16", 40, false).last_val_loss;
    // The masters are what the optimizer updates (a step that updated only the bf16 copies would leave them at
    // their initial values and the loss near ln(17)), and the copies follow them.
    CHECK(std::abs(f32 - b16) < 0.1);
    CHECK(b16 < std::log(double(17)) - 0.5);
    // Stopped at 20 and resumed: the same weights and state as the straight run, bit for bit.
    run("stopped", "bf16", 20, false);
    run("stopped", "bf16", 40, true);
    const Checkpoint a = load_checkpoint(dir.path / "bf16" / kLatestCheckpoint);
    const Checkpoint b = load_checkpoint(dir.path / "stopped" / kLatestCheckpoint);
    for (const auto& [name, t] : a.contents.tensors) {
      INFO(name);
      CHECK(t.dtype() == DType::F32);  // f32 masters and state in the checkpoint
      CHECK(t.to_vector<float>() == b.contents.find(name).to_vector<float>());
    }
  }
  TrainConfig bad = TrainConfig{};
  bad.data = {"x.txt"}, bad.storage = "bf16";
  CHECK_THROWS_WITH_AS(bad.validate(), doctest::Contains("--storage bf16 needs --dtype bf16"), Error);
  // On the GPU bf16 storage is the default with bf16 products (measured faster there), and f32 storage asked for.
  TrainConfig gpu = bad;
  gpu.dtype = "bf16", gpu.device = "cuda", gpu.attention_math = "f32";
  CHECK_NOTHROW(gpu.validate());
  CHECK(numerics_of(gpu).bf16_storage);
  gpu.storage.clear();
  CHECK(numerics_of(gpu).bf16_storage);
  gpu.storage = "f32";
  CHECK_FALSE(numerics_of(gpu).bf16_storage);
  gpu.storage.clear(), gpu.dtype = "fp32";
  CHECK_FALSE(numerics_of(gpu).bf16_storage);
}

TEST_CASE("train: stopping and resuming gives the same losses and weights, bit for bit, as one run (AdamW, Muon)") {
  for (const std::string optimizer : {"adamw", "muon"}) {
    INFO("--optimizer " << optimizer);
    TempDir dir("resume_exact_" + optimizer);
    TrainConfig c = toy_run(dir, 16);
    c.optimizer = optimizer;
    c.model.dropout = 0.1;
    c.batch_size = 4, c.warmup_iters = 10, c.lr_decay_iters = 120, c.lr = 3e-3;
    c.eval_interval = 30, c.eval_iters = 2, c.log_interval = 1000, c.quiet = true;
    const auto losses = step_losses;
    c.out = (dir.path / "straight").string();
    c.max_iters = 120;
    train(c);
    c.out = (dir.path / "stopped").string();
    c.max_iters = 60;
    train(c);
    c.max_iters = 120;
    c.resume = true;
    train(c);
    const auto a = losses(dir.path / "straight"), b = losses(dir.path / "stopped");
    REQUIRE(a.size() == 120);
    CHECK(a == b);
    const Checkpoint ca = load_checkpoint(dir.path / "straight" / kLatestCheckpoint);
    const Checkpoint cb = load_checkpoint(dir.path / "stopped" / kLatestCheckpoint);
    CHECK(ca.optimizer == optimizer);
    size_t momenta = 0;
    for (const auto& [name, t] : ca.contents.tensors) {
      INFO(name);
      const Tensor u = cb.contents.find(name);
      REQUIRE(u.defined());
      CHECK(t.to_vector<float>() == u.to_vector<float>());  // weights and the optimizer's state
      momenta += name.ends_with(".momentum_buffer");
    }
    CHECK(momenta == (optimizer == "muon" ? size_t(4 * c.model.n_layer) : 0));  // c_attn, c_proj, c_fc, mlp c_proj

    // Resuming with the other optimizer is refused, naming the one to give.
    c.optimizer = optimizer == "muon" ? "adamw" : "muon";
    c.max_iters = 130;
    CHECK_THROWS_WITH_AS(train(c), doctest::Contains(("was trained with --optimizer " + optimizer).c_str()), Error);
    // Not naming one (the CLI without --optimizer), the run takes the checkpoint's.
    c.optimizer_given = false;
    CHECK(train(c).iters == 130);
    CHECK(load_checkpoint(dir.path / "stopped" / kLatestCheckpoint).optimizer == optimizer);
  }
}

TEST_CASE("memory: the parameter count from a config is the built model's, and absurd sizes are refused") {
  for (const bool bias : {false, true})
    for (const nn::Positions pos : {nn::Positions::Learned, nn::Positions::Rope, nn::Positions::Relative,
                                    nn::Positions::Alibi, nn::Positions::T5, nn::Positions::None})
      for (const int64_t kv : {0, 1, 2}) {
        nn::GPTConfig c;
        c.vocab_size = 13, c.block_size = 16, c.n_layer = 2, c.n_head = 4, c.n_kv_head = kv, c.n_embd = 32;
        c.head_dim = kv == 2 ? 6 : 0;  // heads of their own width
        c.bias = bias, c.pos = pos, c.max_relative_position = 5;
        c.untied_head = kv == 1;
        c.qk_norm = kv == 2 || bias;
        Generator gen(1);
        const nn::GPT model(c, gen);
        CAPTURE(bias);
        CAPTURE(nn::positions_name(pos));
        CAPTURE(kv);
        CHECK(gpt_parameter_count(c) == double(model.num_parameters()));
      }
  nn::GPTConfig huge;
  huge.vocab_size = 65, huge.n_layer = 1000000, huge.n_embd = 65536, huge.n_head = 1;
  const MemoryNeed need = training_memory(huge, 64);
  CHECK(need.weights > 1e17);
  CHECK_THROWS_WITH_AS(require_memory(need, Device::CPU, "training this model", "use less"),
                       doctest::Contains("training this model needs about"), Error);
  nn::GPTConfig small;
  small.vocab_size = 65, small.n_layer = 4, small.n_head = 4, small.n_embd = 128, small.block_size = 64;
  CHECK_NOTHROW(require_memory(training_memory(small, 12), Device::CPU, "training this model", "use less"));
  // Muon's momentum: one more copy of the parameters in the optimizer's share.
  CHECK(training_memory(small, 12, true).optimizer ==
        doctest::Approx(training_memory(small, 12).optimizer * 4.0 / 3.0));
  // bf16 storage: a 2-byte working copy beside each 4-byte master, the same optimizer state, and activations of 2
  // bytes; with QK-norm (an f32 op) attention also keeps f32 copies of q, k, v and its output; RoPE rotates them as
  // stored.
  const MemoryNeed f32 = training_memory(small, 12), bf16 = training_memory(small, 12, false, true);
  CHECK(bf16.weights == doctest::Approx(f32.weights * 1.5));
  CHECK(bf16.optimizer == f32.optimizer);
  CHECK(bf16.activations == doctest::Approx(0.5 * f32.activations));
  nn::GPTConfig rope = small, qk = small;
  rope.pos = nn::Positions::Rope;
  qk.qk_norm = true;
  const MemoryNeed rope_f32 = training_memory(rope, 12), rope_bf16 = training_memory(rope, 12, false, true);
  CHECK(rope_bf16.activations == doctest::Approx(0.5 * rope_f32.activations));
  const MemoryNeed qk_f32 = training_memory(qk, 12), qk_bf16 = training_memory(qk, 12, false, true);
  CHECK(qk_bf16.activations > 0.5 * qk_f32.activations);
  CHECK(qk_bf16.activations < 0.75 * qk_f32.activations);
  CHECK(describe(bf16).find("activations") != std::string::npos);
  CHECK(available_memory(Device::CPU) > 0);
}

TEST_CASE("export to Hugging Face: GPT-2's names, layouts and config, a character tokenizer; RoPE and GQA refused") {
  TempDir dir("export_hf");
  for (const bool bias : {false, true}) {
    CAPTURE(bias);
    const int64_t V = 5, T = 8, L = 2, NH = 2, C = 8;
    const nn::GPTConfig config{.vocab_size = V, .block_size = T, .n_layer = L, .n_head = NH, .n_embd = C, .bias = bias};
    Generator gen(5);
    nn::GPT model(config, gen);
    if (bias) {  // GPT-2's initialization zeroes biases: give them values, so a zero written in their place shows
      for (auto& [name, p] : model.named_parameters()) {
        if (name.ends_with(".bias")) p.copy_(randn(p.shape(), gen));
      }
    }
    const data::CharVocab vocab(U"\n ab\u00e9");
    save_checkpoint(dir.path / "ckpt.safetensors", model, data::Tokenizer(vocab), nullptr, {});
    export_hf(load_checkpoint(dir.path / "ckpt.safetensors"), dir.path / "hf");

    const auto st = safetensors::load(dir.path / "hf" / "model.safetensors");
    CHECK(st.metadata.at("format") == "pt");  // transformers refuses a file without it
    // GPT2LMHeadModel's state dict (lm_head.weight tied to wte and not saved), written out from transformers' names.
    std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {{"transformer.wte.weight", {V, C}},
                                                                          {"transformer.wpe.weight", {T, C}}};
    for (int i = 0; i < L; ++i) {
      const std::string h = "transformer.h." + std::to_string(i) + ".";
      for (const auto& [name, shape] :
           std::vector<std::pair<std::string, std::vector<int64_t>>>{{"ln_1.weight", {C}},
                                                                     {"ln_1.bias", {C}},
                                                                     {"attn.c_attn.weight", {C, 3 * C}},
                                                                     {"attn.c_attn.bias", {3 * C}},
                                                                     {"attn.c_proj.weight", {C, C}},
                                                                     {"attn.c_proj.bias", {C}},
                                                                     {"ln_2.weight", {C}},
                                                                     {"ln_2.bias", {C}},
                                                                     {"mlp.c_fc.weight", {C, 4 * C}},
                                                                     {"mlp.c_fc.bias", {4 * C}},
                                                                     {"mlp.c_proj.weight", {4 * C, C}},
                                                                     {"mlp.c_proj.bias", {C}}}) {
        expected.emplace_back(h + name, shape);
      }
    }
    expected.push_back({"transformer.ln_f.weight", {C}});
    expected.push_back({"transformer.ln_f.bias", {C}});
    REQUIRE(st.tensors.size() == expected.size());
    std::map<std::string, Tensor> ours;
    for (const auto& [name, p] : model.named_parameters()) ours[name] = p;
    for (size_t i = 0; i < expected.size(); ++i) {
      const auto& [name, t] = st.tensors[i];
      CAPTURE(name);
      CHECK(name == expected[i].first);
      CHECK(t.dtype() == DType::F32);
      CHECK(t.shape() == Shape(expected[i].second));
      const auto values = t.to_vector<float>();
      if (!ours.contains(name)) {  // a bias the model does not have
        CHECK_FALSE(bias);
        CHECK(values == std::vector<float>(values.size(), 0.0f));
      } else if (name.ends_with("c_attn.weight") || name.ends_with("c_proj.weight") || name.ends_with("c_fc.weight")) {
        const auto w = ours[name].to_vector<float>();  // (out, in); GPT-2 keeps (in, out)
        const int64_t in = t.size(0), out = t.size(1);
        for (int64_t r = 0; r < in; ++r)
          for (int64_t c = 0; c < out; ++c) REQUIRE(values[size_t(r * out + c)] == w[size_t(c * in + r)]);
      } else {
        CHECK(values == ours[name].to_vector<float>());
      }
    }

    const auto cfg = nlohmann::json::parse(read_file(dir.path / "hf" / "config.json"));
    CHECK(cfg["model_type"] == "gpt2");
    CHECK(cfg["architectures"] == nlohmann::json::array({"GPT2LMHeadModel"}));
    CHECK(cfg["vocab_size"] == V);
    CHECK(cfg["n_positions"] == T);
    CHECK(cfg["n_layer"] == L);
    CHECK(cfg["n_head"] == NH);
    CHECK(cfg["n_embd"] == C);
    CHECK(cfg["activation_function"] == "gelu_new");  // transformers' name for GELU's tanh approximation
    CHECK(cfg["layer_norm_epsilon"] == 1e-5);
    CHECK(cfg["tie_word_embeddings"] == true);

    const auto tok = nlohmann::json::parse(read_file(dir.path / "hf" / "tokenizer.json"));
    CHECK(tok["model"]["vocab"] == nlohmann::json({{"\n", 0}, {" ", 1}, {"a", 2}, {"b", 3}, {"\xc3\xa9", 4}}));
    CHECK(tok["model"]["merges"].empty());
    CHECK(tok["decoder"]["type"] == "Fuse");  // decoding joins the characters without spaces
    const auto tok_cfg = nlohmann::json::parse(read_file(dir.path / "hf" / "tokenizer_config.json"));
    CHECK(tok_cfg["tokenizer_class"] == "PreTrainedTokenizerFast");
    CHECK(tok_cfg["clean_up_tokenization_spaces"] == false);
  }

  nn::GPTConfig rope{
      .vocab_size = 5, .block_size = 8, .n_layer = 1, .n_head = 2, .n_embd = 8, .pos = nn::Positions::Rope};
  // Rotary positions make a model of the Llama family: exported as LlamaForCausalLM with its other parts, refused by
  // name beside GPT-2's.
  CHECK_THROWS_WITH(check_hf_exportable(rope), doctest::Contains("LayerNorm beside Llama's other parts"));
  rope.norm = nn::NormKind::RMSNorm;
  CHECK_THROWS_WITH(check_hf_exportable(rope), doctest::Contains("a gelu MLP (Llama's is SwiGLU)"));
  rope.mlp = nn::MlpKind::SwiGLU;
  CHECK_NOTHROW(check_hf_exportable(rope));
  CHECK(hf_architecture(rope) == "LlamaForCausalLM");
  rope.qkv_bias = true;
  CHECK(hf_architecture(rope) == "Qwen2ForCausalLM");
  rope.window = 4;
  CHECK_THROWS_WITH(check_hf_exportable(rope), doctest::Contains("sliding-window attention (--window)"));
  rope = {.vocab_size = 5, .block_size = 8, .n_layer = 1, .n_head = 2, .n_embd = 8, .qkv_bias = true};
  CHECK_THROWS_WITH(check_hf_exportable(rope), doctest::Contains("--qkv-bias"));
  rope.pos = nn::Positions::Rope;
  for (const nn::Positions p :
       {nn::Positions::Relative, nn::Positions::Alibi, nn::Positions::T5, nn::Positions::None}) {
    nn::GPTConfig relative = rope;
    relative.pos = p;
    CHECK_THROWS_WITH(check_hf_exportable(relative),
                      doctest::Contains(doctest::String((std::string("--pos ") + nn::positions_name(p)).c_str())));
    relative.qkv_bias = false;
    CHECK_THROWS_WITH(check_hf_exportable(relative),
                      doctest::Contains(doctest::String((std::string("--pos ") + nn::positions_name(p)).c_str())));
  }
  nn::GPTConfig windowed{.vocab_size = 5, .block_size = 8, .n_layer = 1, .n_head = 2, .n_embd = 8, .window = 4};
  CHECK_THROWS_WITH(check_hf_exportable(windowed), doctest::Contains("sliding-window"));
  nn::GPTConfig gqa{.vocab_size = 5, .block_size = 8, .n_layer = 1, .n_head = 4, .n_kv_head = 2, .n_embd = 8};
  CHECK_THROWS_WITH(check_hf_exportable(gqa), doctest::Contains("grouped-query attention (2 key/value heads for 4"));
  gqa.n_kv_head = 4;
  CHECK_NOTHROW(check_hf_exportable(gqa));
  nn::GPTConfig modern = gqa;
  modern.mlp = nn::MlpKind::Relu2;
  CHECK_THROWS_WITH(check_hf_exportable(modern), doctest::Contains("relu^2 MLP (--mlp relu2)"));
  modern.mlp = nn::MlpKind::Gelu, modern.logit_softcap = 15;
  CHECK_THROWS_WITH(check_hf_exportable(modern), doctest::Contains("soft-capped logits (--logit-softcap)"));
  modern.logit_softcap = 0, modern.qk_norm = true;
  CHECK_THROWS_WITH(check_hf_exportable(modern), doctest::Contains("normalized queries and keys (--qk-norm)"));
  modern.qk_norm = false, modern.zero_init_proj = true;  // only how training starts: GPT-2 holds the result
  CHECK_NOTHROW(check_hf_exportable(modern));

  // An untied head: GPT-2 keeps it as lm_head.weight with tie_word_embeddings false.
  const nn::GPTConfig untied{
      .vocab_size = 5, .block_size = 8, .n_layer = 1, .n_head = 2, .n_embd = 8, .untied_head = true};
  Generator gen(6);
  nn::GPT model(untied, gen);
  save_checkpoint(dir.path / "untied.safetensors", model, data::Tokenizer(data::CharVocab(U"\n ab\u00e9")), nullptr,
                  {});
  export_hf(load_checkpoint(dir.path / "untied.safetensors"), dir.path / "hf_untied");
  const auto st = safetensors::load(dir.path / "hf_untied" / "model.safetensors");
  const Tensor head = st.find("lm_head.weight");
  REQUIRE(head.defined());
  CHECK(head.shape() == Shape{5, 8});
  CHECK(head.to_vector<float>() == model.lm_head->weight.to_vector<float>());
  CHECK(nlohmann::json::parse(read_file(dir.path / "hf_untied" / "config.json"))["tie_word_embeddings"] == false);
}

TEST_CASE("checkpoint config: the position scheme and attention options round-trip; old checkpoints read as saved") {
  nn::GPTConfig c;
  c.vocab_size = 7, c.block_size = 8, c.n_layer = 1, c.n_head = 2, c.n_embd = 8;
  c.pos = nn::Positions::Relative, c.max_relative_position = 3, c.window = 5, c.attn_softcap = 30,
  c.doc_separator = "\n\n";
  c.mlp = nn::MlpKind::Relu2, c.logit_softcap = 15, c.zero_init_proj = true, c.untied_head = true, c.qk_norm = true;
  CHECK(gpt_config_from_json(to_json(c)) == c);
  nn::GPTConfig llama = c;  // the Llama family's options
  llama.pos = nn::Positions::Rope, llama.norm = nn::NormKind::RMSNorm, llama.norm_eps = 1e-6;
  llama.mlp = nn::MlpKind::SwiGLU, llama.ffn_hidden = 24, llama.rope_theta = 1e5, llama.qkv_bias = true;
  CHECK(gpt_config_from_json(to_json(llama)) == llama);
  nlohmann::json old = to_json(c);
  for (const char* key :
       {"pos", "max_relative_position", "window", "attn_softcap", "doc_separator", "mlp", "logit_softcap",
        "zero_init_proj", "untied_head", "qk_norm", "norm", "norm_eps", "ffn_hidden", "rope_theta", "qkv_bias"}) {
    old.erase(key);
  }
  old["relu2"] = true;  // before "mlp"
  CHECK(gpt_config_from_json(old).mlp == nn::MlpKind::Relu2);
  old.erase("relu2");
  old["rope"] = true;
  const nn::GPTConfig read = gpt_config_from_json(old);
  CHECK(read.pos == nn::Positions::Rope);
  CHECK(read.window == 0);
  CHECK(read.doc_separator.empty());
  CHECK(read.mlp == nn::MlpKind::Gelu);
  CHECK(read.norm == nn::NormKind::LayerNorm);
  CHECK(read.norm_eps == 1e-5);
  CHECK(read.rope_theta == 10000.0);
  CHECK(read.ffn_hidden == 0);
  CHECK(!read.qkv_bias);
  CHECK(read.logit_softcap == 0);
  CHECK(!read.zero_init_proj);
  CHECK(!read.untied_head);
  CHECK(!read.qk_norm);
  old.erase("rope");
  CHECK(gpt_config_from_json(old).pos == nn::Positions::Learned);
  old["pos"] = "sinusoidal";
  CHECK_THROWS_WITH_AS(gpt_config_from_json(old), doctest::Contains("unknown position scheme"), Error);
}

TEST_CASE("MFU's peak is stated and fixed: the same figure at every call, for the unit the products run on") {
  for (const bool bf16 : {false, true}) {
    Numerics n;
    n.bf16 = bf16;
    const Peak a = stated_peak(Device::CPU, n), b = stated_peak(Device::CPU, n);
    INFO(a.how);
    CHECK_FALSE(a.how.empty());
    CHECK(a.gflops == b.gflops);
    // The clock and rates are measured once a process (and cached across runs by train); a CPU without the probe
    // (not x86-64) has no stated peak, and says why.
#if defined(__x86_64__)
    CHECK(a.gflops > 0);
#endif
    if (a.gflops == 0) CHECK(a.how.find("x86-64 only") != std::string::npos);
    if (cpu::unit_rates().ghz > 0) {
      CHECK(a.gflops == b.gflops);
      const cpu::Bf16Kernel k = bf16 ? cpu::bf16_kernel() : cpu::Bf16Kernel::F32Units;
      CHECK(a.gflops == doctest::Approx(omp_get_max_threads() * cpu::unit_rates().ghz * cpu::flops_per_cycle(k)));
      if (k != cpu::Bf16Kernel::F32Units) CHECK(a.how.find(cpu::bf16_kernel_name(k)) != std::string::npos);
    }
  }
}

TEST_CASE("the CPU probe: a plausible clock, FLOPs a cycle a power of two, and the bf16 unit with the most of them") {
  const cpu::UnitRates& r = cpu::unit_rates();
#if defined(__x86_64__)
  INFO(cpu::cpu_model_name());
  CHECK(r.ghz > 0.5);
  CHECK(r.ghz < 8.0);
  // At least half a vector FMA a cycle (2 FLOPs a lane), at most four.
  CHECK(r.f32 >= cpu::f32_lanes());
  CHECK(r.f32 <= 8 * cpu::f32_lanes());
  for (const double rate : {r.f32, r.avx512_bf16, r.amx}) {
    if (rate > 0) CHECK(std::exp2(std::round(std::log2(rate))) == rate);
  }
#endif
  if (std::getenv("TINYGPT_CPU_BF16") == nullptr) {
    for (const cpu::Bf16Kernel k : cpu::bf16_kernels_available()) {
      CHECK(cpu::flops_per_cycle(k) <= cpu::flops_per_cycle(cpu::bf16_kernel()));
    }
  }
  // Rates given after the first use are refused: the kernel choice could otherwise change under a run.
  CHECK_THROWS_AS(cpu::set_unit_rates(r), Error);
}

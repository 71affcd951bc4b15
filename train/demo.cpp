#include "train/demo.h"

#include <fmt/core.h>

#include <chrono>
#include <cmath>

#include "autograd/ops.h"
#include "data/text.h"
#include "nn/layers.h"
#include "train/adamw.h"

namespace tinygpt {
namespace {

class CharMLP : public nn::Module {
 public:
  CharMLP(int64_t vocab, int64_t context, int64_t n_embd, int64_t hidden, Generator& gen)
      : wte(vocab, n_embd, gen), fc(context * n_embd, hidden, true, gen), head(hidden, vocab, true, gen) {
    register_module("wte", wte);
    register_module("fc", fc);
    register_module("head", head);
  }

  /// ids (B, context) -> logits (B, V)
  Tensor forward(const Tensor& ids) const {
    const Tensor x = reshape(wte.forward(ids), {ids.size(0), -1});  // (B, context * n_embd)
    return head.forward(gelu(fc.forward(x)));
  }

  nn::Embedding wte;
  nn::Linear fc, head;
};

struct Batch {
  Tensor x, y;
};

/// Random windows of `context` tokens and the token after each.
Batch sample_batch(const std::vector<int32_t>& tokens, int64_t batch, int64_t context, Generator& gen) {
  std::vector<int32_t> x, y;
  for (int64_t b = 0; b < batch; ++b) {
    const auto i = int64_t(gen.next_u64() % uint64_t(tokens.size() - size_t(context)));
    x.insert(x.end(), tokens.begin() + i, tokens.begin() + i + context);
    y.push_back(tokens[size_t(i + context)]);
  }
  return {from_vector(x, {batch, context}), from_vector(y, {batch})};
}

double evaluate(const CharMLP& model, const std::vector<int32_t>& tokens, const DemoConfig& c, Generator& gen) {
  NoGradGuard no_grad;
  double total = 0;
  constexpr int kBatches = 20;
  for (int i = 0; i < kBatches; ++i) {
    const Batch b = sample_batch(tokens, c.batch_size, c.context, gen);
    total += cross_entropy(model.forward(b.x), b.y).item();
  }
  return total / kBatches;
}

}  // namespace

double run_demo(const DemoConfig& c) {
  const std::u32string text = data::decode_utf8(data::read_text_file(c.data_path));
  const data::CharVocab vocab(text);
  const std::vector<int32_t> tokens = vocab.encode(text);
  const size_t n_train = tokens.size() * 9 / 10;
  const std::vector<int32_t> train(tokens.begin(), tokens.begin() + long(n_train));
  const std::vector<int32_t> val(tokens.begin() + long(n_train), tokens.end());
  if (int64_t(val.size()) <= c.context + 1) {
    throw Error(fmt::format("data file '{}' is too short: need more than {} characters", c.data_path, 10 * (c.context + 1)));
  }

  Generator gen(c.seed);
  CharMLP model(vocab.size(), c.context, c.n_embd, c.hidden, gen);
  AdamW opt(model.named_parameters(), {.lr = c.lr, .weight_decay = 0.01});
  fmt::print(stderr, "demo: {} characters, vocabulary {}, model {} parameters\n", text.size(), vocab.size(),
             model.num_parameters());

  double val_loss = NAN;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t step = 1; step <= c.steps; ++step) {
    const double lr = c.lr * 0.5 * (1 + std::cos(M_PI * double(step - 1) / double(c.steps)));  // cosine decay
    const Batch b = sample_batch(train, c.batch_size, c.context, gen);
    const Tensor loss = cross_entropy(model.forward(b.x), b.y);
    opt.zero_grad();
    loss.backward();
    opt.step(lr);
    if (step % c.eval_interval == 0 || step == c.steps) {
      model.train(false);
      val_loss = evaluate(model, val, c, gen);
      model.train(true);
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      fmt::print(stderr, "step {:5d}/{}  train loss {:.4f}  val loss {:.4f}  lr {:.2e}  {:.1f}s\n", step, c.steps,
                 loss.item(), val_loss, lr, secs);
    }
  }

  NoGradGuard no_grad;
  std::vector<int32_t> context(train.begin(), train.begin() + c.context);
  std::vector<int32_t> generated;
  for (int64_t i = 0; i < c.sample_chars; ++i) {
    const Tensor probs = softmax(model.forward(from_vector(context, {1, c.context})));
    const std::vector<float> p = probs.to_vector<float>();
    double u = gen.uniform(), acc = 0;
    int32_t next = int32_t(p.size()) - 1;
    for (size_t v = 0; v < p.size(); ++v) {
      acc += p[v];
      if (u < acc) {
        next = int32_t(v);
        break;
      }
    }
    generated.push_back(next);
    context.erase(context.begin());
    context.push_back(next);
  }
  fmt::print("{}\n", data::encode_utf8(vocab.decode(generated)));
  return val_loss;
}

}  // namespace tinygpt

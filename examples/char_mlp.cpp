// A model that is not a GPT, trained on tinygpt's autograd, AdamW and data loader: Bengio et al.'s (2003)
// character-level MLP. The previous K characters are embedded, concatenated, passed through one tanh layer,
// and the next character is predicted. Usage: char_mlp TEXT_FILE [STEPS]
#include <tinygpt/data/documents.h>
#include <tinygpt/nn/layers.h>
#include <tinygpt/train/adamw.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

using namespace tinygpt;

constexpr int64_t K = 3, B = 64;  // characters of context, examples per step

struct CharMLP : nn::Module {
  nn::Embedding emb;
  nn::Linear hidden, out;
  CharMLP(int64_t V, Generator& gen) : emb(V, 24, gen), hidden(K * 24, 128, true, gen), out(128, V, true, gen, 0.01) {
    register_module("emb", emb);
    register_module("hidden", hidden);
    register_module("out", out);
  }
  Tensor forward(const Tensor& context) const {                             // (B, K) i32 -> (B, V) logits
    const Tensor e = reshape(emb.forward(context), {context.size(0), -1});  // (B, K * 24)
    return out.forward(tanh(hidden.forward(e)));
  }
};

// A batch of windows x[i, i + K), y[i + 1, i + K + 1): the context is x, the target y's last column.
std::pair<Tensor, Tensor> examples(data::BatchSampler& sampler) {
  const auto batch = sampler.next();
  const auto y = batch.y.to_vector<int32_t>();
  std::vector<int32_t> next(B);
  for (int64_t b = 0; b < B; ++b) next[size_t(b)] = y[size_t(b * K + K - 1)];
  return {batch.x, from_vector(next, {B})};
}

int main(int argc, char** argv) try {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s TEXT_FILE [STEPS]\n", argv[0]);
    return 2;
  }
  const int steps = argc > 2 ? std::atoi(argv[2]) : 2000;
  // As `tinygpt train --data TEXT_FILE` reads it: the file's characters are the vocabulary, their ids go to a token
  // cache (here in a temporary directory) and the last tenth of them validates.
  const auto cache = std::filesystem::temp_directory_path() / ("char_mlp_cache_" + std::to_string(getpid()));
  std::filesystem::create_directories(cache);
  const data::FileList files = data::list_text_files({argv[1]}, [](const std::string&) {});
  const data::Tokenizer chars(data::vocab_of_files(files, ""));
  const data::DocumentCorpus corpus = data::load_documents(files, chars, {}, 0.9, cache / "tokens.bin", true);
  const data::Split split = corpus.split();
  data::BatchSampler train(split.train, B, K, 1, "training text"), val(split.val, B, K, 2, "validation text");

  Generator gen(1337);
  CharMLP model(chars.vocab_size(), gen);
  AdamW opt(model.named_parameters(), {.lr = 3e-3, .weight_decay = 0.01});
  auto val_loss = [&] {
    NoGradGuard no_grad;
    double total = 0;
    for (int i = 0; i < 50; ++i) {
      auto [x, y] = examples(val);
      total += cross_entropy(model.forward(x), y).item();
    }
    return total / 50;
  };
  std::printf("vocabulary %lld characters, %lld parameters, val loss %.4f before training\n",
              (long long)chars.vocab_size(), (long long)model.num_parameters(), val_loss());
  for (int step = 1; step <= steps; ++step) {
    auto [x, y] = examples(train);
    const Tensor loss = cross_entropy(model.forward(x), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
    if (step % 200 == 0 || step == steps) std::printf("step %4d  train loss %.4f\n", step, loss.item());
  }
  std::printf("val loss %.4f after %d steps\n", val_loss(), steps);
  std::filesystem::remove_all(cache);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}

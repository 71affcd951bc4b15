// tinygpt_logits CKPT TEXT OUT.safetensors: the checkpoint's logits (1, T, V) for the characters of TEXT, with
// their token ids (1, T), for check_hf_export.py to compare with what transformers computes from the export.
#include <tinygpt/train/checkpoint.h>

#include <cstdio>

using namespace tinygpt;

int main(int argc, char** argv) try {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s CKPT TEXT OUT.safetensors\n", argv[0]);
    return 2;
  }
  const Checkpoint ckpt = load_checkpoint(argv[1]);
  nn::GPT model(ckpt.config);
  load_weights(model, ckpt);
  model.train(false);
  const std::vector<uint32_t> encoded = ckpt.tokenizer.encode(argv[2], "TEXT");
  const std::vector<int32_t> ids(encoded.begin(), encoded.end());
  const Tensor x = from_vector(ids, {1, int64_t(ids.size())});
  NoGradGuard no_grad;
  safetensors::save(argv[3], {{"ids", x}, {"logits", model.forward(x).logits}}, {});
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}

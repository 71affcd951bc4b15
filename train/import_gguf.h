// Import from GGUF: a llama.cpp, ollama or LM Studio model file (the llama, qwen2 or gpt2 architecture with a
// byte-level BPE tokenizer) as a tinygpt checkpoint, the reverse of export_gguf: its tensors dequantized as ggml does,
// q and k brought back from llama.cpp's pairing of rotary features, the tokenizer rebuilt from tokenizer.ggml.* and
// the chat template kept.
#pragma once

#include <filesystem>
#include <string>

#include "../data/tokenizer.h"
#include "../nn/gpt.h"

namespace tinygpt {

namespace gguf {
class File;
}

/// The model a GGUF file describes and its llama.cpp architecture; throws Error naming what tinygpt cannot compute
/// the same way (another architecture, mixture of experts, keys and values of two head widths, partial rotary
/// dimensions, a RoPE scaling other than Llama 3's, a tensor missing, of the wrong shape or unknown).
nn::GPTConfig gguf_config(const gguf::File& file, std::string& arch);

/// The tokenizer of tokenizer.ggml.* (model gpt2: a byte-level BPE with the pre-split tokenizer.ggml.pre names),
/// rebuilt as the tokenizer.json it came from and read as every other one; trailing unused tokens ([PADn]) are the
/// model's padding, not tokens. Throws Error naming a SentencePiece or other tokenizer, an unknown pre-tokenizer,
/// mismatched counts, duplicate tokens, a bos or eos outside the vocabulary.
data::Tokenizer gguf_tokenizer(const gguf::File& file);

/// Reads `file` and writes `out`/ckpt_latest.safetensors (weights, config, tokenizer and chat template; no optimizer
/// state, iteration 0). Nothing is written to `out` unless the whole file reads.
std::filesystem::path import_gguf(const std::filesystem::path& file, const std::filesystem::path& out);

}  // namespace tinygpt

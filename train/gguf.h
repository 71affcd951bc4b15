// GGUF out: a checkpoint as a GGUF v3 file, the format llama.cpp, ollama and LM Studio run: the llama, qwen2 or gpt2
// architecture with its byte-level BPE tokenizer (tokenizer.ggml.*) and chat template.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint.h"

namespace tinygpt {

/// The type of the weight matrices in the file (norms, biases, vectors and GPT-2's position table stay f32, as
/// llama.cpp's converter and quantizer keep them). q8_0: blocks of 32 weights as an f16 scale and 32 int8s (ggml's
/// quantize_row_q8_0); a matrix whose rows are not a multiple of 32 is written f16.
enum class GgufType : uint8_t { F32, F16, BF16, Q8_0 };
bool parse_gguf_type(std::string_view name, GgufType& out);
const char* gguf_type_name(GgufType type);

/// The llama.cpp architecture the model is: "qwen2" (q/k/v biases only), "llama" (the rest of the Llama family) or
/// "gpt2"; throws Error naming what neither holds (the Hugging Face export's limits, check_hf_exportable, plus a
/// character-level tokenizer, a pre-split llama.cpp does not name, Llama 3's RoPE scaling on qwen2).
std::string check_gguf_exportable(const Checkpoint& ckpt);

/// One tensor of a GGUF file: rows [row0, row0 + rows) of tinygpt's parameter `ours` (rows -1: all of it), of
/// `shape` (row-major); `interleave` > 0: q or k of that many heads, whose rotary pairs llama.cpp's llama architecture
/// interleaves (row 2j + s of a head is ours s E/2 + j).
struct GgufPiece {
  std::string gguf, ours;
  int64_t row0 = 0, rows = -1;
  std::vector<int64_t> shape;
  int64_t interleave = 0;
};
/// Every tensor of the model under llama.cpp's names for `arch` (llama, qwen2: Hugging Face's table, llama_pieces,
/// renamed; gpt2), in the order its converter writes them; rope_freqs.weight apart.
std::vector<GgufPiece> gguf_pieces(const nn::GPTConfig& c, const std::string& arch);
/// q or k rows of `heads` heads (`cols` columns; 1 for a bias) in llama.cpp's llama pairing of rotary features (i with
/// i + 1, GPT-J's), from ours and Hugging Face's (i with i + E/2): row 2j + s of a head is our row s E/2 + j, as its
/// converter's permute does; `back`: the reverse, for an import.
std::vector<float> interleave_rotary_pairs(const std::vector<float>& w, int64_t heads, int64_t cols, bool back);
/// The rope_freqs.weight tensor of Llama 3's scaling: per rotary pair, the factor its frequency is divided by.
std::vector<float> rope_freq_factors(double theta, const RopeScaling& scaling, int64_t E);

struct GgufWritten {
  std::string architecture;
  int64_t tensors = 0;
  int64_t bytes = 0;   // the file's size
  int64_t as_f16 = 0;  // q8_0 only: matrices written f16, their rows not a multiple of 32
};

/// Writes the checkpoint's model as GGUF v3 to `file` (by a temporary file and a rename: never half a file):
/// general.*, the architecture's hyperparameters, the tokenizer (model "gpt2": its tokens, token types, merges,
/// pre-split, bos/eos, add_bos), the chat template where the checkpoint has one, and the tensors under llama.cpp's
/// names (q and k permuted into llama.cpp's pairing of rotary features for the llama architecture, as its converter
/// does; Llama 3's scaling as the rope_freqs.weight tensor).
GgufWritten export_gguf(const Checkpoint& ckpt, const std::filesystem::path& file, GgufType type);

}  // namespace tinygpt

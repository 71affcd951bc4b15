// GGUF in: the reader of the files llama.cpp, ollama and LM Studio run (GGUF v2 and v3, little-endian). The file is
// mapped, not read: its header (metadata and tensor descriptions) is parsed with every count, length, type, shape and
// offset checked against the file's size before anything is allocated, and a tensor's bytes are dequantized to f32
// only when asked for, exactly as ggml's reference dequantizers compute them (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
// Q5_1, Q4_K, Q5_K, Q6_K: what llama.cpp's Q8_0 and Q4_K_M files hold).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace tinygpt::gguf {

/// ggml's tensor types (ggml_type), those read here and the rest by name for refusals.
enum Type : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kBF16 = 30,
};
/// ggml's name of a tensor type ("q4_K"), or "type N" for a number ggml does not name.
std::string type_name(uint32_t type);
/// A block of the type: how many values it holds and how many bytes it takes (0, 0: a type not read here).
struct Block {
  int64_t values = 0, bytes = 0;
};
Block block_of(uint32_t type);
/// Dequantizes `n` values (a multiple of the type's block) from `src` to `dst`, as ggml's dequantize_row_* do.
void dequantize(uint32_t type, const uint8_t* src, int64_t n, float* dst);

/// One metadata value: a number (integers kept exactly in `i`, the unsigned ones' bits as they are, and every number
/// as `f`), a bool (`i` 0 or 1), a string, or an array: of numbers or bools (`ints` and `reals`), of strings
/// (`strings`) or of arrays (`arrays`). Kept compactly: no value takes more than a few times its bytes in the file.
struct Value {
  enum Kind : uint32_t { U8, I8, U16, I16, U32, I32, F32, Bool, String, Array, U64, I64, F64 };
  Kind kind = U8;
  int64_t i = 0;
  double f = 0;
  std::string s;
  Kind element = U8;                 // Array: the kind of its values
  std::vector<int64_t> ints;         // an array of integers or bools
  std::vector<double> reals;         // an array of numbers (the integers too)
  std::vector<std::string> strings;  // an array of strings
  std::vector<Value> arrays;         // an array of arrays
  static bool integer_kind(Kind k) { return k <= I32 || k == U64 || k == I64 || k == Bool; }
  static bool signed_kind(Kind k) { return k == I8 || k == I16 || k == I32 || k == I64; }
};
const char* kind_name(Value::Kind kind);

/// A tensor's description: its shape as tinygpt keeps it (row-major, the slowest dimension first: ggml's ne
/// reversed), its type, and where its bytes are in the file.
struct TensorInfo {
  std::string name;
  std::vector<int64_t> shape;
  uint32_t type = 0;
  uint64_t offset = 0;  // from the start of the file
  uint64_t bytes = 0;
  int64_t numel() const;
};

class File {
 public:
  /// Maps and parses `path`; throws Error naming the file and what is wrong (not GGUF, an unsupported version or
  /// byte order, a count or length past the end, a value kind or tensor type it does not know, a duplicate key or
  /// tensor, a shape whose rows are not whole blocks, data outside the file).
  explicit File(const std::filesystem::path& path);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  const std::map<std::string, Value, std::less<>>& metadata() const { return metadata_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }

  /// The value of a key, or nullptr.
  const Value* find(std::string_view key) const;
  /// Typed reads of a key, throwing Error naming the key and what it holds where it is not of that kind; the
  /// `fallback` overloads return it for a missing key.
  std::string string(std::string_view key) const;
  std::string string(std::string_view key, const std::string& fallback) const;
  uint64_t integer(std::string_view key) const;
  uint64_t integer(std::string_view key, uint64_t fallback) const;
  double number(std::string_view key, double fallback) const;
  bool boolean(std::string_view key, bool fallback) const;
  std::vector<std::string> strings(std::string_view key) const;  // an array of strings
  std::vector<int64_t> integers(std::string_view key) const;     // an array of integers

  /// The tensor called `name`, or nullptr.
  const TensorInfo* tensor(std::string_view name) const;
  /// The tensor's values as f32, in tinygpt's row-major order (ggml's order: the same bytes).
  std::vector<float> values(const TensorInfo& t) const;

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  std::map<std::string, Value, std::less<>> metadata_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
};

}  // namespace tinygpt::gguf

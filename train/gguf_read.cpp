#include "train/gguf_read.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <tuple>
#include <utility>

#include "kernels/base.h"
#include "kernels/bf16.h"

// This file is compiled with -ffp-contract=off (CMakeLists.txt): ggml's reference dequantizers compute d * q - m as a
// product and a difference, and so does the gguf package; a fused multiply-add would round once and differ.

namespace tinygpt::gguf {

namespace {

struct TypeEntry {
  uint32_t type;
  const char* name;
  Block block;  // {0, 0}: named for refusals, not read
};
constexpr TypeEntry kTypes[] = {
    {0, "f32", {1, 4}},       {1, "f16", {1, 2}},    {2, "q4_0", {32, 18}},    {3, "q4_1", {32, 20}},
    {6, "q5_0", {32, 22}},    {7, "q5_1", {32, 24}}, {8, "q8_0", {32, 34}},    {9, "q8_1", {}},
    {10, "q2_K", {}},         {11, "q3_K", {}},      {12, "q4_K", {256, 144}}, {13, "q5_K", {256, 176}},
    {14, "q6_K", {256, 210}}, {15, "q8_K", {}},      {16, "iq2_xxs", {}},      {17, "iq2_xs", {}},
    {18, "iq3_xxs", {}},      {19, "iq1_s", {}},     {20, "iq4_nl", {}},       {21, "iq3_s", {}},
    {22, "iq2_s", {}},        {23, "iq4_xs", {}},    {24, "i8", {}},           {25, "i16", {}},
    {26, "i32", {}},          {27, "i64", {}},       {28, "f64", {}},          {29, "iq1_m", {}},
    {30, "bf16", {1, 2}},     {34, "tq1_0", {}},     {35, "tq2_0", {}},        {39, "mxfp4", {}},
};

const TypeEntry* entry_of(uint32_t type) {
  for (const TypeEntry& e : kTypes) {
    if (e.type == type) return &e;
  }
  return nullptr;
}

/// An IEEE half as a float (exact), as ggml's GGML_FP16_TO_FP32.
float half(const uint8_t* p) {
  const uint32_t h = uint32_t(p[0]) | uint32_t(p[1]) << 8;
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t bits = 0;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | mant << 13;  // inf, NaN
  } else if (exp != 0) {
    bits = sign | (exp + 112) << 23 | mant << 13;
  } else if (mant != 0) {  // a subnormal half: a normal float
    int e = -1;
    uint32_t m = mant;
    do {
      ++e;
      m <<= 1;
    } while ((m & 0x400u) == 0);
    bits = sign | uint32_t(112 - e) << 23 | (m & 0x3ffu) << 13;
  } else {
    bits = sign;
  }
  float f = 0;
  std::memcpy(&f, &bits, 4);
  return f;
}

/// Q4_K's and Q5_K's 6-bit scale and min of sub-block j, as ggml's get_scale_min_k4.
void scale_min_k4(int j, const uint8_t* q, uint8_t& d, uint8_t& m) {
  if (j < 4) {
    d = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    d = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

void q4_0(const uint8_t* b, float* y) {  // d, 16 bytes of nibbles: low ones the first 16 values, high the rest
  const float d = half(b);
  for (int j = 0; j < 16; ++j) {
    y[j] = float((b[2 + j] & 0x0F) - 8) * d;
    y[j + 16] = float((b[2 + j] >> 4) - 8) * d;
  }
}

void q4_1(const uint8_t* b, float* y) {  // d, m, nibbles
  const float d = half(b), m = half(b + 2);
  for (int j = 0; j < 16; ++j) {
    y[j] = float(b[4 + j] & 0x0F) * d + m;
    y[j + 16] = float(b[4 + j] >> 4) * d + m;
  }
}

void q5(const uint8_t* b, float* y, bool with_min) {  // Q5_0 (d, qh, qs; q - 16) and Q5_1 (d, m, qh, qs)
  const float d = half(b), m = with_min ? half(b + 2) : 0.0f;
  const uint8_t* p = b + (with_min ? 4 : 2);
  const uint32_t qh = uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
  const uint8_t* qs = p + 4;
  for (int j = 0; j < 16; ++j) {
    const int x0 = int((qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10));
    const int x1 = int((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10));
    if (with_min) {
      y[j] = float(x0) * d + m;
      y[j + 16] = float(x1) * d + m;
    } else {
      y[j] = float(x0 - 16) * d;
      y[j + 16] = float(x1 - 16) * d;
    }
  }
}

void q8_0(const uint8_t* b, float* y) {
  const float d = half(b);
  for (int j = 0; j < 32; ++j) y[j] = float(int8_t(b[2 + j])) * d;
}

void q45_k(const uint8_t* b, float* y, bool five) {  // Q4_K: d, dmin, scales[12], qs[128]; Q5_K: qh[32] before qs
  const float d = half(b), min = half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* q = b + (five ? 48 : 16);
  uint8_t u1 = 1, u2 = 2;
  for (int j = 0, is = 0; j < 256; j += 64, is += 2) {
    uint8_t sc = 0, m = 0;
    scale_min_k4(is, scales, sc, m);
    const float d1 = d * float(sc), m1 = min * float(m);
    scale_min_k4(is + 1, scales, sc, m);
    const float d2 = d * float(sc), m2 = min * float(m);
    for (int l = 0; l < 32; ++l) {
      const int hi = five && (qh[l] & u1) ? 16 : 0;
      *y++ = d1 * float((q[l] & 0xF) + hi) - m1;
    }
    for (int l = 0; l < 32; ++l) {
      const int hi = five && (qh[l] & u2) ? 16 : 0;
      *y++ = d2 * float((q[l] >> 4) + hi) - m2;
    }
    q += 32;
    u1 = uint8_t(u1 << 2), u2 = uint8_t(u2 << 2);
  }
}

void q6_k(const uint8_t* b, float* y) {  // ql[128], qh[64], int8 scales[16], d
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half(b + 208);
  for (int n = 0; n < 256; n += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = int((ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4) - 32;
      const int q2 = int((ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4) - 32;
      const int q3 = int((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
      const int q4 = int((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
      y[l] = d * float(sc[is]) * float(q1);
      y[l + 32] = d * float(sc[is + 2]) * float(q2);
      y[l + 64] = d * float(sc[is + 4]) * float(q3);
      y[l + 96] = d * float(sc[is + 6]) * float(q4);
    }
    y += 128, ql += 64, qh += 32, sc += 8;
  }
}

}  // namespace

std::string type_name(uint32_t type) {
  const TypeEntry* e = entry_of(type);
  return e ? e->name : fmt::format("type {}", type);
}

Block block_of(uint32_t type) {
  const TypeEntry* e = entry_of(type);
  return e ? e->block : Block{};
}

void dequantize(uint32_t type, const uint8_t* src, int64_t n, float* dst) {
  const Block b = block_of(type);
  if (b.values == 0) throw Error(fmt::format("GGUF tensor type {} is not one tinygpt reads", type_name(type)));
  for (int64_t i = 0; i < n / b.values; ++i) {
    const uint8_t* s = src + i * b.bytes;
    float* y = dst + i * b.values;
    switch (type) {
      case kF32:
        std::memcpy(y, s, 4);
        break;
      case kF16:
        *y = half(s);
        break;
      case kBF16:
        *y = float_of_bf16_bits(uint16_t(s[0] | s[1] << 8));
        break;
      case kQ4_0:
        q4_0(s, y);
        break;
      case kQ4_1:
        q4_1(s, y);
        break;
      case kQ5_0:
        q5(s, y, false);
        break;
      case kQ5_1:
        q5(s, y, true);
        break;
      case kQ8_0:
        q8_0(s, y);
        break;
      case kQ4_K:
        q45_k(s, y, false);
        break;
      case kQ5_K:
        q45_k(s, y, true);
        break;
      case kQ6_K:
        q6_k(s, y);
        break;
      default:
        break;
    }
  }
}

const char* kind_name(Value::Kind kind) {
  static constexpr const char* kNames[] = {"uint8", "int8",   "uint16", "int16",  "uint32", "int32",  "float32",
                                           "bool",  "string", "array",  "uint64", "int64",  "float64"};
  return uint32_t(kind) < std::size(kNames) ? kNames[kind] : "?";
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return n;
}

namespace {

/// A cursor over the mapped header: every read checked against the end of the file.
struct Reader {
  const uint8_t* data;
  uint64_t size, pos = 0;
  const std::string& path;

  [[noreturn]] void corrupt(const std::string& what) const {
    throw Error(fmt::format("'{}' is not a GGUF file tinygpt can read: {} (at byte {} of {})", path, what, pos, size));
  }
  void need(uint64_t n, const char* what) const {
    if (n > size - pos) corrupt(fmt::format("it ends inside {} (truncated?)", what));
  }
  template <class T>
  T get(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  std::string string(const char* what) {
    const auto n = get<uint64_t>(what);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(data + pos), size_t(n));
    pos += n;
    return s;
  }
  std::pair<int64_t, double> scalar(Value::Kind kind);
  Value value(Value::Kind kind, int depth);
};

/// A number or bool of `kind` as (integer bits, double).
std::pair<int64_t, double> Reader::scalar(Value::Kind kind) {
  switch (kind) {
    case Value::U8: {
      const auto x = get<uint8_t>("a value");
      return {x, double(x)};
    }
    case Value::I8: {
      const auto x = get<int8_t>("a value");
      return {x, double(x)};
    }
    case Value::U16: {
      const auto x = get<uint16_t>("a value");
      return {x, double(x)};
    }
    case Value::I16: {
      const auto x = get<int16_t>("a value");
      return {x, double(x)};
    }
    case Value::U32: {
      const auto x = get<uint32_t>("a value");
      return {x, double(x)};
    }
    case Value::I32: {
      const auto x = get<int32_t>("a value");
      return {x, double(x)};
    }
    case Value::U64: {
      const auto x = get<uint64_t>("a value");
      return {int64_t(x), double(x)};
    }
    case Value::I64: {
      const auto x = get<int64_t>("a value");
      return {x, double(x)};
    }
    case Value::F32:
      return {0, double(get<float>("a value"))};
    case Value::F64:
      return {0, get<double>("a value")};
    case Value::Bool: {
      const auto b = get<uint8_t>("a value");
      if (b > 1) corrupt(fmt::format("a bool holds {}", b));
      return {b, double(b)};
    }
    default:
      corrupt(fmt::format("a value of unknown kind {}", uint32_t(kind)));
  }
}

Value Reader::value(Value::Kind kind, int depth) {
  Value v;
  v.kind = kind;
  if (kind == Value::String) {
    v.s = string("a string");
    return v;
  }
  if (kind != Value::Array) {
    std::tie(v.i, v.f) = scalar(kind);
    return v;
  }
  if (depth >= 2) corrupt("arrays nest deeper than two");
  const auto element = get<uint32_t>("an array's kind");
  if (element > Value::F64) corrupt(fmt::format("an array of unknown kind {}", element));
  v.element = Value::Kind(element);
  const auto n = get<uint64_t>("an array's length");
  // A length the rest of the file cannot hold is refused before anything is allocated: each value takes at least its
  // size (a string or an array: its 8-byte length), and is kept in at most a few times that.
  static constexpr uint64_t kLeast[] = {1, 1, 2, 2, 4, 4, 4, 1, 8, 12, 8, 8, 8};
  if (n > (size - pos) / kLeast[element]) corrupt(fmt::format("an array of {} values runs past the end", n));
  if (v.element == Value::String) {
    v.strings.reserve(size_t(n));
    for (uint64_t k = 0; k < n; ++k) v.strings.push_back(string("a string"));
  } else if (v.element == Value::Array) {
    for (uint64_t k = 0; k < n; ++k) v.arrays.push_back(value(Value::Array, depth + 1));
  } else {
    v.reals.reserve(size_t(n));
    if (Value::integer_kind(v.element)) v.ints.reserve(size_t(n));
    for (uint64_t k = 0; k < n; ++k) {
      const auto [i, f] = scalar(v.element);
      if (Value::integer_kind(v.element)) v.ints.push_back(i);
      v.reals.push_back(f);
    }
  }
  return v;
}

[[noreturn]] void wrong_kind(const std::string& path, std::string_view key, const Value& v, const char* wanted) {
  throw Error(fmt::format("'{}': its {} is a {}, not {}", path, key, kind_name(v.kind), wanted));
}

/// A tensor's entry of the header: name, shape, type (one tinygpt reads) and aligned offset, checked as read.
TensorInfo read_tensor_info(Reader& r, uint64_t alignment, const std::string& path_) {
  TensorInfo t;
  t.name = r.string("a tensor's name");
  const auto dims = r.get<uint32_t>("a tensor's rank");
  if (dims == 0 || dims > 4) r.corrupt(fmt::format("tensor {} has {} dimensions (ggml's are 1 to 4)", t.name, dims));
  uint64_t n = 1;
  for (uint32_t d = 0; d < dims; ++d) {
    const auto ne = r.get<uint64_t>("a tensor's shape");
    if (ne == 0 || ne > (uint64_t(1) << 40) || n > (uint64_t(1) << 40) / ne) {
      r.corrupt(fmt::format("tensor {} has a dimension of {}", t.name, ne));
    }
    n *= ne;
    t.shape.insert(t.shape.begin(), int64_t(ne));
  }
  t.type = r.get<uint32_t>("a tensor's type");
  const Block b = block_of(t.type);
  if (b.values == 0) {
    throw Error(
        fmt::format("'{}': tensor {} is of type {}, which tinygpt does not read (it reads f32, f16, bf16, "
                    "q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K and q6_K: llama.cpp's Q8_0, Q4_0 and Q4_K_M "
                    "files; requantize with llama-quantize)",
                    path_, t.name, type_name(t.type)));
  }
  if (t.shape.back() % b.values != 0) {
    r.corrupt(fmt::format("tensor {} has rows of {} values, not whole {} blocks of {}", t.name, t.shape.back(),
                          type_name(t.type), b.values));
  }
  t.bytes = n / uint64_t(b.values) * uint64_t(b.bytes);
  t.offset = r.get<uint64_t>("a tensor's offset");
  if (t.offset % alignment != 0) r.corrupt(fmt::format("tensor {}'s offset is not aligned", t.name));
  return t;
}

}  // namespace

File::File(const std::filesystem::path& path) : path_(path.string()) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(fmt::format("cannot open '{}': {}", path_, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(fmt::format("'{}' is not a regular file", path_));
  }
  size_ = uint64_t(st.st_size);
  if (size_ < 24) {
    ::close(fd);
    throw Error(fmt::format("'{}' is not a GGUF file: it is {} bytes, shorter than a GGUF header", path_, size_));
  }
  void* map = ::mmap(nullptr, size_t(size_), PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) throw Error(fmt::format("cannot map '{}': {}", path_, std::strerror(errno)));
  data_ = static_cast<const uint8_t*>(map);
  try {
    Reader r{data_, size_, 0, path_};
    if (std::memcmp(data_, "GGUF", 4) != 0) {
      throw Error(fmt::format("'{}' is not a GGUF file (it does not start with \"GGUF\")", path_));
    }
    r.pos = 4;
    version_ = r.get<uint32_t>("the version");
    if (version_ == 0x02000000u || version_ == 0x03000000u) {
      throw Error(
          fmt::format("'{}' is a big-endian GGUF file; tinygpt reads little-endian ones (as llama.cpp's "
                      "converter writes by default)",
                      path_));
    }
    if (version_ != 2 && version_ != 3) {
      throw Error(fmt::format("'{}' is GGUF version {}; tinygpt reads versions 2 and 3", path_, version_));
    }
    const auto n_tensors = r.get<uint64_t>("the tensor count");
    const auto n_kv = r.get<uint64_t>("the metadata count");
    if (n_kv > (size_ - r.pos) / 12) r.corrupt(fmt::format("{} metadata keys cannot fit in it", n_kv));
    for (uint64_t k = 0; k < n_kv; ++k) {
      std::string key = r.string("a metadata key");
      const auto kind = r.get<uint32_t>("a metadata value's kind");
      if (kind > Value::F64) r.corrupt(fmt::format("metadata key {} has unknown kind {}", key, kind));
      Value v = r.value(Value::Kind(kind), 0);
      if (!metadata_.emplace(key, std::move(v)).second) r.corrupt(fmt::format("metadata key {} appears twice", key));
    }
    uint64_t alignment = 32;
    if (const Value* a = find("general.alignment")) {
      if (a->kind != Value::U32 || a->i == 0 || (a->i & (a->i - 1)) != 0) {
        r.corrupt("general.alignment is not a power of two (uint32)");
      }
      alignment = uint64_t(a->i);
    }
    if (n_tensors > (size_ - r.pos) / 24) r.corrupt(fmt::format("{} tensors cannot fit in it", n_tensors));
    for (uint64_t k = 0; k < n_tensors; ++k) {
      TensorInfo t = read_tensor_info(r, alignment, path_);
      if (!index_.emplace(t.name, tensors_.size()).second) r.corrupt(fmt::format("tensor {} appears twice", t.name));
      tensors_.push_back(std::move(t));
    }
    const uint64_t start = (r.pos + alignment - 1) / alignment * alignment;
    for (TensorInfo& t : tensors_) {
      if (start > size_ || t.offset > size_ - start || t.bytes > size_ - start - t.offset) {
        throw Error(
            fmt::format("'{}' is truncated or corrupt: tensor {} ({} bytes at offset {}) lies past its end "
                        "({} bytes)",
                        path_, t.name, t.bytes, t.offset, size_));
      }
      t.offset += start;
    }
  } catch (...) {
    ::munmap(const_cast<uint8_t*>(data_), size_t(size_));
    throw;
  }
}

File::~File() { ::munmap(const_cast<uint8_t*>(data_), size_t(size_)); }

const Value* File::find(std::string_view key) const {
  const auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

std::string File::string(std::string_view key) const {
  const Value* v = find(key);
  if (!v) throw Error(fmt::format("'{}' has no {}", path_, key));
  if (v->kind != Value::String) wrong_kind(path_, key, *v, "a string");
  return v->s;
}

std::string File::string(std::string_view key, const std::string& fallback) const {
  return find(key) ? string(key) : fallback;
}

uint64_t File::integer(std::string_view key) const {
  const Value* v = find(key);
  if (!v) throw Error(fmt::format("'{}' has no {}", path_, key));
  if (!Value::integer_kind(v->kind) || v->kind == Value::Bool || (Value::signed_kind(v->kind) && v->i < 0)) {
    wrong_kind(path_, key, *v, "a non-negative integer");
  }
  return uint64_t(v->i);
}

uint64_t File::integer(std::string_view key, uint64_t fallback) const { return find(key) ? integer(key) : fallback; }

double File::number(std::string_view key, double fallback) const {
  const Value* v = find(key);
  if (!v) return fallback;
  if (v->kind == Value::String || v->kind == Value::Array || v->kind == Value::Bool)
    wrong_kind(path_, key, *v, "a number");
  return v->f;
}

bool File::boolean(std::string_view key, bool fallback) const {
  const Value* v = find(key);
  if (!v) return fallback;
  if (v->kind != Value::Bool) wrong_kind(path_, key, *v, "a bool");
  return v->i != 0;
}

std::vector<std::string> File::strings(std::string_view key) const {
  const Value* v = find(key);
  if (!v) throw Error(fmt::format("'{}' has no {}", path_, key));
  if (v->kind != Value::Array || v->element != Value::String) wrong_kind(path_, key, *v, "an array of strings");
  return v->strings;
}

std::vector<int64_t> File::integers(std::string_view key) const {
  const Value* v = find(key);
  if (!v) throw Error(fmt::format("'{}' has no {}", path_, key));
  if (v->kind != Value::Array || !Value::integer_kind(v->element)) wrong_kind(path_, key, *v, "an array of integers");
  return v->ints;
}

const TensorInfo* File::tensor(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::vector<float> File::values(const TensorInfo& t) const {
  std::vector<float> out(size_t(t.numel()));
  dequantize(t.type, data_ + t.offset, t.numel(), out.data());
  return out;
}

}  // namespace tinygpt::gguf

#include "train/safetensors.h"

#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <optional>

namespace tinygpt::safetensors {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kMaxHeader = uint64_t(100) << 20;  // the reference implementation's limit

const char* st_dtype(DType d) {
  switch (d) {
    case DType::F32:
      return "F32";
    case DType::F64:
      return "F64";
    case DType::I32:
      return "I32";
    case DType::Bool:
      return "BOOL";
    case DType::BF16:
      return "BF16";
  }
  return "?";
}

std::optional<DType> parse_dtype(const std::string& s) {
  for (DType d : {DType::F32, DType::F64, DType::I32, DType::Bool, DType::BF16}) {
    if (s == st_dtype(d)) return d;
  }
  return std::nullopt;
}

/// An IEEE half's value (F16 tensors are read as f32: tinygpt computes in f32 and bf16, not in f16).
float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h >> 15) << 31, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  if (exp == 0) return (sign ? -1.0f : 1.0f) * std::ldexp(float(mant), -24);  // zero and subnormals
  const uint32_t bits = exp == 0x1f ? sign | 0x7f800000u | (mant << 13)       // inf and NaN
                                    : sign | ((exp + 112) << 23) | (mant << 13);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

void fsync_path(const fs::path& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

Tensor Contents::find(const std::string& name) const {
  for (const auto& [n, t] : tensors) {
    if (n == name) return t;
  }
  return {};
}

void save(const fs::path& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
          const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<Tensor> host;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__" || header.contains(name))
      throw Error(fmt::format("safetensors: duplicate or reserved name '{}'", name));
    host.push_back(t.device() == Device::CPU ? t : t.to(Device::CPU));
    const uint64_t bytes = uint64_t(t.numel()) * dtype_size(t.dtype());
    header[name] = {
        {"dtype", st_dtype(t.dtype())}, {"shape", t.shape().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');  // keeps the tensor data 8-byte aligned
  const uint64_t header_len = text.size();

  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error(fmt::format("cannot write '{}': {}", tmp.string(), std::strerror(errno)));
    out.write(reinterpret_cast<const char*>(&header_len), 8);
    out.write(text.data(), std::streamsize(text.size()));
    for (const Tensor& t : host) {
      out.write(static_cast<const char*>(t.raw_data()), std::streamsize(uint64_t(t.numel()) * dtype_size(t.dtype())));
    }
    out.close();
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw Error(fmt::format("writing '{}' failed (disk full?); the previous '{}' is untouched", tmp.string(),
                              path.filename().string()));
    }
  }
  fsync_path(tmp, O_RDONLY);
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove(tmp, ec);
    throw Error(fmt::format("cannot move '{}' into place at '{}': {}; the previous one is untouched", tmp.string(),
                            path.string(), why));
  }
  fsync_path(path.parent_path().empty() ? fs::path(".") : path.parent_path(), O_RDONLY | O_DIRECTORY);
}

namespace {

/// A tensor's entry of the header.
struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
  bool f16;  // stored as IEEE halves, read into an f32 tensor
};

/// The header's entry `name`: its dtype, shape and data offsets checked against the file and data sizes; else throws
/// bad(what).
template <class Bad>
Entry header_entry(const std::string& name, const nlohmann::json& info, uint64_t file_size, uint64_t data_size,
                   const Bad& bad) {
  if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") || !info.contains("data_offsets") ||
      !info["dtype"].is_string() || !info["shape"].is_array() || !info["data_offsets"].is_array() ||
      info["data_offsets"].size() != 2) {
    throw bad(fmt::format("tensor '{}' lacks a dtype, shape or data_offsets", name));
  }
  const bool f16 = info["dtype"] == "F16";
  const auto dtype = f16 ? std::optional(DType::F32) : parse_dtype(info["dtype"].get<std::string>());
  if (!dtype) throw bad(fmt::format("tensor '{}' has unsupported dtype {}", name, info["dtype"].get<std::string>()));
  std::vector<int64_t> dims;
  uint64_t numel = 1;
  for (const auto& d : info["shape"]) {
    // Sizes beyond the file cannot be right, and keeping them small keeps their product from overflowing.
    if (!d.is_number_unsigned() || d.get<uint64_t>() > file_size)
      throw bad(fmt::format("tensor '{}' has a bad shape", name));
    if (__builtin_mul_overflow(numel, d.get<uint64_t>(), &numel) || numel > file_size) {
      throw bad(fmt::format("tensor '{}' has more elements than the file has bytes", name));
    }
    dims.push_back(d.get<int64_t>());
  }
  if (dims.size() > size_t(kMaxDims))
    throw bad(fmt::format("tensor '{}' has {} dims (at most {})", name, dims.size(), kMaxDims));
  const auto& off = info["data_offsets"];
  if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned())
    throw bad(fmt::format("tensor '{}' has bad data_offsets", name));
  Entry e{name, *dtype, Shape(std::span<const int64_t>(dims)), off[0].get<uint64_t>(), off[1].get<uint64_t>(), f16};
  const uint64_t expected = uint64_t(e.shape.numel()) * (f16 ? 2 : dtype_size(e.dtype));
  if (e.end < e.begin || e.end - e.begin != expected) {
    throw bad(fmt::format("tensor '{}' of shape {} needs {} bytes but its data_offsets span {}", name, e.shape.str(),
                          expected, int64_t(e.end) - int64_t(e.begin)));
  }
  if (e.end > data_size) {
    throw bad(fmt::format("truncated: tensor '{}' ends at byte {} of the data, which has {}", name, e.end, data_size));
  }
  return e;
}

}  // namespace

Contents load(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw Error(fmt::format("checkpoint '{}' does not exist", path.string()));
  if (fs::is_directory(path, ec))
    throw Error(fmt::format("'{}' is a directory, not a .safetensors file", path.string()));
  if (!fs::is_regular_file(path, ec)) {
    throw Error(fmt::format("'{}' is not a regular file (a pipe or device?), not a .safetensors file", path.string()));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("cannot open '{}': {}", path.string(), std::strerror(errno)));
  const uint64_t file_size = fs::file_size(path, ec);
  auto bad = [&](const std::string& what) {
    return Error(fmt::format("'{}' is not a valid .safetensors file: {}", path.string(), what));
  };
  uint64_t header_len = 0;
  if (file_size < 8 || !in.read(reinterpret_cast<char*>(&header_len), 8))
    throw bad("shorter than its 8-byte header length");
  if (header_len > kMaxHeader) throw bad(fmt::format("header length {} is implausible", header_len));
  if (8 + header_len > file_size) {
    throw bad(fmt::format("truncated: the header needs {} bytes, the file has {}", 8 + header_len, file_size));
  }
  std::string text(header_len, '\0');
  in.read(text.data(), std::streamsize(header_len));
  const auto header = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!header.is_object()) throw bad("the header is not a JSON object");
  const uint64_t data_size = file_size - 8 - header_len;

  Contents c;
  std::vector<Entry> entries;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      if (!info.is_object()) throw bad("__metadata__ is not an object");
      for (const auto& [k, v] : info.items()) {
        if (!v.is_string()) throw bad(fmt::format("metadata '{}' is not a string", k));
        c.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    entries.push_back(header_entry(name, info, file_size, data_size, bad));
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < entries.size(); ++i) {
    if (entries[i].begin < entries[i - 1].end) {
      throw bad(fmt::format("tensors '{}' and '{}' overlap", entries[i - 1].name, entries[i].name));
    }
  }
  for (const Entry& e : entries) {
    Tensor t = empty(e.shape, e.dtype);
    in.seekg(std::streamoff(8 + header_len + e.begin));
    std::vector<uint16_t> halves(e.f16 ? size_t(e.shape.numel()) : 0);
    if (!in.read(e.f16 ? reinterpret_cast<char*>(halves.data()) : static_cast<char*>(t.raw_data()),
                 std::streamsize(e.end - e.begin))) {
      throw bad(fmt::format("cannot read the data of tensor '{}'", e.name));
    }
    if (e.f16) std::transform(halves.begin(), halves.end(), t.data<float>(), half_to_float);
    c.tensors.emplace_back(e.name, t);
  }
  return c;
}

}  // namespace tinygpt::safetensors

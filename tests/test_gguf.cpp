// The GGUF reader: small files made here, one tensor of each type with values worked out by hand from ggml's block
// layouts, and damaged files refused with one Error each.
#include <doctest/doctest.h>
#include <fmt/core.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/base.h"
#include "train/gguf_read.h"

namespace {

namespace fs = std::filesystem;
using tinygpt::gguf::File;

template <class T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
void put_string(std::string& s, const std::string& v) {
  put<uint64_t>(s, v.size());
  s += v;
}

struct Made {
  std::string name;
  std::vector<uint64_t> ne;  // ggml's order: the fastest first
  uint32_t type;
  std::string bytes;
};

/// A GGUF v3 file of the tensors, with general.architecture and `extra_kv` (already encoded: key, kind, value).
std::string gguf_bytes(const std::vector<Made>& tensors, const std::string& extra_kv = "", uint64_t extra_count = 0) {
  std::string s = "GGUF";
  put<uint32_t>(s, 3);
  put<uint64_t>(s, tensors.size());
  put<uint64_t>(s, 1 + extra_count);
  put_string(s, "general.architecture");
  put<uint32_t>(s, 8);
  put_string(s, "test");
  s += extra_kv;
  uint64_t offset = 0;
  for (const Made& t : tensors) {
    put_string(s, t.name);
    put<uint32_t>(s, uint32_t(t.ne.size()));
    for (const uint64_t d : t.ne) put<uint64_t>(s, d);
    put<uint32_t>(s, t.type);
    put<uint64_t>(s, offset);
    offset += (t.bytes.size() + 31) / 32 * 32;
  }
  s.resize((s.size() + 31) / 32 * 32, '\0');
  for (const Made& t : tensors) {
    s += t.bytes;
    s.resize((s.size() + 31) / 32 * 32, '\0');
  }
  return s;
}

struct TempFile {
  fs::path path = fs::temp_directory_path() / fmt::format("tinygpt_test_gguf_{}.gguf", ::getpid());
  explicit TempFile(const std::string& bytes) {
    std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
  }
  ~TempFile() { fs::remove(path); }
};

std::string half(uint16_t h) { return std::string{char(h & 0xff), char(h >> 8)}; }
std::string bytes_of(std::initializer_list<int> v) {
  std::string s;
  for (const int b : v) s += char(uint8_t(b));
  return s;
}
std::string repeat(int byte, size_t n) { return std::string(n, char(uint8_t(byte))); }

std::vector<Made> one_of_each_type() {
  using namespace tinygpt::gguf;
  std::vector<Made> t;
  std::string f32;
  put<float>(f32, 1.5f), put<float>(f32, -2.25f);
  t.push_back({"f32", {2}, kF32, f32});
  t.push_back({"f16", {4}, kF16, half(0x3c00) + half(0xc000) + half(0x0001) + half(0x7bff)});
  t.push_back({"bf16", {2}, kBF16, half(0x3f80) + half(0xc040)});
  std::string q8 = half(0x3800);  // d = 0.5, q_j = j - 16
  for (int j = 0; j < 32; ++j) q8 += char(int8_t(j - 16));
  t.push_back({"q8_0", {32}, kQ8_0, q8});
  std::string nibbles;  // byte j: low nibble j, high 15 - j
  for (int j = 0; j < 16; ++j) nibbles += char(uint8_t(j | (15 - j) << 4));
  t.push_back({"q4_0", {32}, kQ4_0, half(0x3400) + nibbles});                 // d = 0.25
  t.push_back({"q4_1", {32}, kQ4_1, half(0x3800) + half(0xbc00) + nibbles});  // d = 0.5, m = -1
  // q5_0: d = 1, qh bits 0 and 31 (the fifth bit of values 0 and 31), all nibbles 0
  t.push_back({"q5_0", {32}, kQ5_0, half(0x3c00) + bytes_of({0x01, 0, 0, 0x80}) + repeat(0, 16)});
  // q5_1: d = 0.5, m = 2, qh bit 16 (value 16), nibbles low 1, high 2
  t.push_back({"q5_1", {32}, kQ5_1, half(0x3800) + half(0x4000) + bytes_of({0, 0, 0x01, 0}) + repeat(0x21, 16)});
  // q4_K: d = 1, dmin = 0.5; sub-block scales 1, 2, 3, 4, 17, 6, 7, 8 and mins 0 .. 7 packed in 6 bits (17's top two
  // bits in byte 0's top two), nibbles low 1, high 3.
  const std::string k_scales = bytes_of({0x41, 2, 3, 4, 0, 1, 2, 3, 0x41, 0x56, 0x67, 0x78});
  t.push_back({"q4_K", {256}, kQ4_K, half(0x3c00) + half(0x3800) + k_scales + repeat(0x31, 128)});
  // q5_K: as q4_K (scale 5 for sub-block 4: byte 0 plain 1) with qh[0] bit 0 (value 0) and qh[1] bit 7 (value 225)
  const std::string k5_scales = bytes_of({1, 2, 3, 4, 0, 1, 2, 3, 0x45, 0x56, 0x67, 0x78});
  std::string qh(32, '\0');
  qh[0] = char(0x01), qh[1] = char(0x80);
  t.push_back({"q5_K", {256}, kQ5_K, half(0x3c00) + half(0x3800) + k5_scales + qh + repeat(0x31, 128)});
  // q6_K: ql all 0x21 (low 1, high 2), qh[0] = 3 (value 0's top two bits), scales k + 1 but scale 2 = -3, d = 0.5
  std::string q6 = repeat(0x21, 128) + bytes_of({3}) + repeat(0, 63);
  for (int k = 0; k < 16; ++k) q6 += char(int8_t(k == 2 ? -3 : k + 1));
  t.push_back({"q6_K", {256}, kQ6_K, q6 + half(0x3800)});
  return t;
}

}  // namespace

TEST_CASE("gguf: one tensor of each type dequantizes to the values ggml's block layouts give by hand") {
  const TempFile file(gguf_bytes(one_of_each_type()));
  const File f(file.path);
  CHECK(f.version() == 3);
  CHECK(f.string("general.architecture") == "test");
  REQUIRE(f.tensors().size() == 11);
  const auto v = [&](const char* name) { return f.values(*f.tensor(name)); };
  CHECK(v("f32") == std::vector<float>{1.5f, -2.25f});
  CHECK(v("f16") == std::vector<float>{1.0f, -2.0f, 5.9604645e-08f, 65504.0f});
  CHECK(v("bf16") == std::vector<float>{1.0f, -3.0f});
  const std::vector<float> q8 = v("q8_0");
  CHECK(q8[0] == -8.0f);
  CHECK(q8[16] == 0.0f);
  CHECK(q8[31] == 7.5f);
  const std::vector<float> q40 = v("q4_0");  // (nibble - 8) d
  CHECK(q40[0] == -2.0f);
  CHECK(q40[15] == 1.75f);
  CHECK(q40[16] == 1.75f);
  CHECK(q40[31] == -2.0f);
  const std::vector<float> q41 = v("q4_1");  // nibble d + m
  CHECK(q41[0] == -1.0f);
  CHECK(q41[15] == 6.5f);
  CHECK(q41[16] == 6.5f);
  CHECK(q41[31] == -1.0f);
  const std::vector<float> q50 = v("q5_0");  // (nibble | fifth bit) - 16, times d
  CHECK(q50[0] == 0.0f);
  CHECK(q50[1] == -16.0f);
  CHECK(q50[16] == -16.0f);
  CHECK(q50[31] == 0.0f);
  const std::vector<float> q51 = v("q5_1");
  CHECK(q51[0] == 2.5f);
  CHECK(q51[16] == 11.0f);
  CHECK(q51[17] == 3.0f);
  // q4_K: 64 values a chunk, the low nibbles with sub-block 2c's scale and min, the high ones with 2c + 1's
  const std::vector<float> q4k = v("q4_K");
  const std::vector<float> q4k_want = {1, 5.5, 2, 10.5, 15, 15.5, 4, 20.5};  // sc q - dmin m: 1-0, 6-0.5, 3-1, ...
  for (size_t s = 0; s < 8; ++s) CHECK(q4k[32 * s] == q4k_want[s]);
  const std::vector<float> q5k = v("q5_K");
  CHECK(q5k[0] == 17.0f);
  CHECK(q5k[1] == 1.0f);
  CHECK(q5k[128] == 3.0f);
  CHECK(q5k[224] == 20.5f);
  CHECK(q5k[225] == 148.5f);                 // 8 (3 + 16) - 0.5 7
  const std::vector<float> q6k = v("q6_K");  // d scale (q - 32)
  CHECK(q6k[0] == 8.5f);
  CHECK(q6k[1] == -15.5f);
  CHECK(q6k[16] == -31.0f);
  CHECK(q6k[32] == 46.5f);
  CHECK(q6k[64] == -75.0f);
  CHECK(q6k[96] == -105.0f);
  CHECK(q6k[129] == -139.5f);
}

TEST_CASE("gguf: a damaged or unsupported file is refused with one Error naming what is wrong") {
  const std::string good = gguf_bytes(one_of_each_type());
  // Every truncation: no prefix of the file reads, none crashes (up to the last tensor's last byte; 14 bytes of
  // padding follow its 210).
  for (size_t n = 0; n < good.size() - 14; n += (n < 700 ? 1 : 13)) {
    const TempFile file(good.substr(0, n));
    CHECK_THROWS_AS(File{file.path}, tinygpt::Error);
  }
  const auto refused = [](std::string bytes, const std::string& why) {
    const TempFile file(bytes);
    try {
      File f(file.path);
      FAIL("read: " << why);
    } catch (const tinygpt::Error& e) {
      CHECK_MESSAGE(std::string(e.what()).find(why) != std::string::npos, e.what());
    }
  };
  std::string b = good;
  b[0] = 'X';
  refused(b, "does not start with \"GGUF\"");
  b = good, b[4] = 1;
  refused(b, "GGUF version 1");
  b = good, std::memcpy(b.data() + 4, "\0\0\0\3", 4);
  refused(b, "big-endian");
  refused(gguf_bytes({{"w", {256}, 10, std::string(84, '\0')}}),
          "tensor w is of type q2_K, which tinygpt does not read");
  refused(gguf_bytes({{"w", {33}, tinygpt::gguf::kQ8_0, std::string(68, '\0')}}),
          "rows of 33 values, not whole q8_0 blocks");
  refused(gguf_bytes({{"w", {2}, 0, "12345678"}, {"w", {2}, 0, "12345678"}}), "tensor w appears twice");
  refused(gguf_bytes({{"w", {0}, 0, ""}}), "has a dimension of 0");
  refused(gguf_bytes({{"w", {1, 1, 1, 1, 1}, 0, "1234"}}), "5 dimensions");
  std::string kv;  // an array claiming 2^40 strings
  put_string(kv, "tokens"), put<uint32_t>(kv, 9), put<uint32_t>(kv, 8), put<uint64_t>(kv, uint64_t(1) << 40);
  refused(gguf_bytes({}, kv, 1), "an array of 1099511627776 values runs past the end");
  kv.clear();
  put_string(kv, "general.architecture"), put<uint32_t>(kv, 8), put_string(kv, "again");
  refused(gguf_bytes({}, kv, 1), "metadata key general.architecture appears twice");
  kv.clear();
  put_string(kv, "k"), put<uint32_t>(kv, 13), put<uint8_t>(kv, 0);
  refused(gguf_bytes({}, kv, 1), "metadata key k has unknown kind 13");
  b = gguf_bytes({{"w", {2}, 0, "12345678"}});
  b.resize(b.size() - 32);  // the tensor's bytes gone
  refused(b, "tensor w (8 bytes at offset 0) lies past its end");
  // A reader's typed access names the key and what it holds.
  const TempFile file(good);
  const File f(file.path);
  CHECK_THROWS_WITH_AS(f.integer("general.architecture"),
                       doctest::Contains("its general.architecture is a string, not a non-negative integer"),
                       tinygpt::Error);
  CHECK_THROWS_WITH_AS(f.string("general.name"), doctest::Contains("has no general.name"), tinygpt::Error);
}

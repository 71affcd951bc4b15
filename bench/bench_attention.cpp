// Attention benchmark: flash against naive scaled dot-product attention, forward and forward+backward,
// with the peak extra memory each allocates.
//
// --device cuda times the GPU kernels instead: flash with f32 operands on CUDA cores ("flash"), with tf32 and
// bf16 operands on tensor cores ("flash_tf32", "flash_bf16": f32 tensors in memory, f32 accumulation;
// AttentionOptions::numerics), flash on bf16 tensors ("flash_bf16_storage") and naive where its T x T scores fit
// comfortably: first nanoGPT's training shape (bf16 only), then B*T = 16384 tokens, T in {512, 1024, 2048, 4096,
// 8192}, E = 64 with 16 heads and E = 128 with 8, causal and not. extra_mib is then the peak of the caching
// allocator above what was in use before. bench/compare_attention_cuda.py runs this and
// PyTorch's scaled_dot_product_attention side by side.
//
// The GPU kernels (f32 on CUDA cores and tf32/bf16 tensor cores on f32 tensors: attention.cuh, flash_mma.cuh; bf16
// tensors: flash_bf16.cuh), what each version measured against PyTorch and what it taught: docs/RESULTS.md, "One GPU".
//
// Rows: B=4, NH=6, E=64, causal and not, T in {256, 1024, 4096}, flash and naive; then B=1, NH=1, E=64,
// T=16384, flash only (naive would need 1 GiB for one score matrix). FLOPs are counted as FlashAttention's
// benchmark counts them: forward 4*B*NH*T*S*E, halved when causal; backward 2.5x the forward.
// extra_mib is the peak of all live C++ heap allocations (tensors and kernel scratch: operator new is
// replaced below to count them) during one forward+backward, above what was live before it. The process's
// peak resident set is printed at the end.
#include <fmt/core.h>
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <new>
#include <string>
#include <vector>

#include "autograd/attention.h"
#include "autograd/ops.h"
#include "kernels/cpu/gemm.h"
#include "kernels/device.h"
#include "kernels/env.h"

namespace {

std::atomic<int64_t> g_live{0}, g_peak{0};

void note_alloc(size_t n) {
  const int64_t now = g_live += int64_t(n);
  int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {}
}

// Every allocation carries its size in a 64-byte header, so delete knows what to subtract.
constexpr size_t kHeader = 64;

void* counted_alloc(size_t n, size_t align) {
  align = std::max(align, kHeader);
  void* base = std::aligned_alloc(align, (n + kHeader + align - 1) / align * align);
  if (base == nullptr) throw std::bad_alloc();
  *static_cast<size_t*>(base) = n;
  note_alloc(n);
  return static_cast<char*>(base) + kHeader;
}

void counted_free(void* p) {
  if (p == nullptr) return;
  void* base = static_cast<char*>(p) - kHeader;
  g_live -= int64_t(*static_cast<size_t*>(base));
  std::free(base);
}

}  // namespace

void* operator new(size_t n) { return counted_alloc(n, alignof(std::max_align_t)); }
void* operator new[](size_t n) { return counted_alloc(n, alignof(std::max_align_t)); }
void* operator new(size_t n, std::align_val_t a) { return counted_alloc(n, size_t(a)); }
void* operator new[](size_t n, std::align_val_t a) { return counted_alloc(n, size_t(a)); }
void operator delete(void* p) noexcept { counted_free(p); }
void operator delete[](void* p) noexcept { counted_free(p); }
void operator delete(void* p, size_t) noexcept { counted_free(p); }
void operator delete[](void* p, size_t) noexcept { counted_free(p); }
void operator delete(void* p, std::align_val_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { counted_free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { counted_free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { counted_free(p); }

using namespace tinygpt;

namespace {

struct Row {
  std::string impl;
  int64_t B, NH, T, E;
  bool causal;
  double fwd_ms, fwd_bwd_ms, fwd_gflops, fwd_bwd_gflops, extra_mib;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Best time of `reps` runs of f (after one warm-up run), in milliseconds.
template <class F>
double best_ms(int reps, F f) {
  f();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, seconds_since(t0) * 1e3);
  }
  return best;
}

Row run(AttentionImpl impl, int64_t B, int64_t NH, int64_t T, int64_t E, bool causal, int reps,
        Device device = Device::CPU, AttentionMath math = AttentionMath::F32, bool bf16_storage = false) {
  Generator gen(1);
  auto input = [&] {
    const Tensor x = randn({B, NH, T, E}, gen).to(device);
    return bf16_storage ? x.to(DType::BF16) : x;
  };
  Tensor q = input(), k = input(), v = input();
  for (Tensor* t : {&q, &k, &v}) t->requires_grad_();
  const Tensor dout = input();
  AttentionOptions o;
  o.is_causal = causal;
  o.numerics.attention = math;
  o.numerics.flash = env::flash_variants();  // the GPU's variants waiting for a measurement (scripts/gpu_check.sh)
  o.impl = impl;
  const bool gpu = device == Device::CUDA;
  auto fwd_bwd = [&] {
    const Tensor out = scaled_dot_product_attention(q, k, v, o).out;
    out.backward(dout);
    if (gpu) cuda::synchronize();
  };
  fwd_bwd();  // gradients exist from here on, so the measurement below counts only transient memory
  const int64_t before = gpu ? int64_t(cuda::memory_stats().allocated) : g_live.load();
  g_peak = before;
  if (gpu) cuda::reset_peak_memory();
  fwd_bwd();
  const int64_t peak = gpu ? int64_t(cuda::memory_stats().peak_allocated) : g_peak.load();
  const double extra = double(peak - before) / (1 << 20);
  const double fwd = best_ms(reps, [&] {
    NoGradGuard no_grad;
    scaled_dot_product_attention(q, k, v, o);
    if (gpu) cuda::synchronize();
  });
  const double both = best_ms(reps, fwd_bwd);
  const double flops = 4.0 * double(B * NH) * double(T) * double(T) * double(E) * (causal ? 0.5 : 1.0);
  const std::string name = impl == AttentionImpl::Naive ? "naive"
                           : bf16_storage               ? "flash_bf16_storage"
                           : math == AttentionMath::F32 ? "flash"
                                                        : std::string("flash_") + attention_math_name(math);
  return {name, B, NH, T, E, causal, fwd, both, flops / (fwd * 1e-3) / 1e9, 3.5 * flops / (both * 1e-3) / 1e9, extra};
}

/// The GPU table: the training shape, then B*T = 16384 tokens per shape (FlashAttention's benchmark shapes), TFLOP/s.
int run_cuda_table(bool json, bool quick, bool bf16_only) {
  if (!json) {
    fmt::print("device: {}\n{:<10} {:>3} {:>3} {:>6} {:>4} {:>6} {:>9} {:>11} {:>10} {:>14} {:>10}\n",
               cuda::device_description(), "impl", "B", "NH", "T", "E", "causal", "fwd ms", "fwd+bwd ms", "fwd TF/s",
               "fwd+bwd TF/s", "extra MiB");
  }
  const std::vector<int64_t> lengths =
      quick ? std::vector<int64_t>{512, 1024} : std::vector<int64_t>{512, 1024, 2048, 4096, 8192};
  const auto print = [&](const Row& r) {
    if (json) {
      fmt::print(
          "{{\"impl\": \"{}\", \"B\": {}, \"NH\": {}, \"T\": {}, \"E\": {}, \"causal\": {}, "
          "\"fwd_ms\": {:.4f}, \"fwd_bwd_ms\": {:.4f}, \"extra_mib\": {:.2f}}}\n",
          r.impl, r.B, r.NH, r.T, r.E, r.causal, r.fwd_ms, r.fwd_bwd_ms, r.extra_mib);
    } else {
      fmt::print("{:<10} {:>3} {:>3} {:>6} {:>4} {:>6} {:>9.3f} {:>11.3f} {:>10.2f} {:>14.2f} {:>10.1f}\n", r.impl, r.B,
                 r.NH, r.T, r.E, r.causal ? "yes" : "no", r.fwd_ms, r.fwd_bwd_ms, r.fwd_gflops / 1e3,
                 r.fwd_bwd_gflops / 1e3, r.extra_mib);
    }
    std::fflush(stdout);
  };
  // First nanoGPT's Shakespeare training shape (batch 64, 6 heads, T 256, head dim 64, causal), in bf16.
  print(run(AttentionImpl::Flash, 64, 6, 256, 64, true, 5, Device::CUDA, AttentionMath::BF16));
  print(run(AttentionImpl::Flash, 64, 6, 256, 64, true, 5, Device::CUDA, AttentionMath::BF16, true));
  for (int64_t E : {64, 128}) {
    for (bool causal : {true, false}) {
      for (int64_t T : lengths) {
        const int64_t B = 16384 / T, NH = 1024 / E;
        std::vector<Row> rows;
        for (auto math : {AttentionMath::F32, AttentionMath::TF32, AttentionMath::BF16}) {
          if (bf16_only && math != AttentionMath::BF16) continue;
          rows.push_back(run(AttentionImpl::Flash, B, NH, T, E, causal, 5, Device::CUDA, math));
        }
        rows.push_back(run(AttentionImpl::Flash, B, NH, T, E, causal, 5, Device::CUDA, AttentionMath::BF16, true));
        if (T <= 1024 && !bf16_only) rows.push_back(run(AttentionImpl::Naive, B, NH, T, E, causal, 5, Device::CUDA));
        for (const Row& r : rows) print(r);
      }
    }
  }
  return 0;
}

/// min, median and max of xs.
struct Spread {
  double min, median, max;
};
Spread spread(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return {xs.front(), xs[xs.size() / 2], xs.back()};
}

/// The score modifiers' table: forward+backward of each modifier over plain causal flash attention on the same q, k, v
/// (B=4, NH=6, E=64), the two timed alternately `rounds` times; then a window of 256 against full causal attention at
/// T=16384 (B=1, NH=1). The learned tables (Shaw's, T5's) require gradients, so their backward is in the time.
int run_mods_table(bool quick, int rounds) {
  fmt::print("threads: {}\n{:<22} {:>6} {:>26} {:>26} {:>8} {:>10}\n", omp_get_max_threads(), "modifier", "T",
             "plain fwd+bwd ms (min/med/max)", "modified (min/med/max)", "ratio", "extra MiB");
  auto timed = [](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, const AttentionOptions& o) {
    const auto t0 = std::chrono::steady_clock::now();
    scaled_dot_product_attention(q, k, v, o).out.backward(dout);
    return seconds_since(t0) * 1e3;
  };
  auto extra_mib = [](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                      const AttentionOptions& o) {
    scaled_dot_product_attention(q, k, v, o).out.backward(dout);  // gradients exist from here on
    const int64_t before = g_live.load();
    g_peak = before;
    scaled_dot_product_attention(q, k, v, o).out.backward(dout);
    return double(g_peak.load() - before) / (1 << 20);
  };
  auto row = [&](const std::string& name, int64_t B, int64_t NH, int64_t T,
                 const std::function<void(AttentionOptions&)>& set, bool plain_causal) {
    Generator gen(1);
    auto input = [&] { return randn({B, NH, T, 64}, gen); };
    Tensor q = input(), k = input(), v = input();
    for (Tensor* t : {&q, &k, &v}) t->requires_grad_();
    const Tensor dout = input();
    AttentionOptions plain, mod;
    plain.is_causal = plain_causal;
    mod.is_causal = true;
    set(mod);
    std::vector<double> a, b;
    for (int r = 0; r < rounds + 1; ++r) {
      const double ta = timed(q, k, v, dout, plain), tb = timed(q, k, v, dout, mod);
      if (r > 0) a.push_back(ta), b.push_back(tb);  // the first round warms up
    }
    const Spread sa = spread(a), sb = spread(b);
    fmt::print("{:<22} {:>6} {:>8.1f} {:>8.1f} {:>8.1f} {:>8.1f} {:>8.1f} {:>8.1f} {:>7.2f}x {:>10.2f}\n", name, T,
               sa.min, sa.median, sa.max, sb.min, sb.median, sb.max, sb.median / sa.median,
               extra_mib(q, k, v, dout, mod));
    std::fflush(stdout);
  };
  Generator tables(2);
  auto table = [&](const Shape& shape) { return randn(shape, tables, DType::F32, Device::CPU, 0.1).requires_grad_(); };
  const Tensor rel_k = table({33, 64}), rel_v = table({33, 64}), t5 = table({6, 32});
  for (int64_t T : quick ? std::vector<int64_t>{256, 1024} : std::vector<int64_t>{256, 1024, 4096}) {
    std::vector<int32_t> docs(size_t(4 * T));
    for (size_t i = 0; i < docs.size(); ++i) docs[i] = int32_t(i % size_t(T) / 200);  // documents of 200 tokens
    const Tensor doc_ids = from_vector(docs, {4, T});
    row(
        "causal (itself)", 4, 6, T, [](AttentionOptions&) {}, true);
    row(
        "relative m=16 (k)", 4, 6, T, [&](AttentionOptions& o) { o.mods.relative_key = rel_k; }, true);
    row(
        "relative m=16 (k, v)", 4, 6, T,
        [&](AttentionOptions& o) {
          o.mods.relative_key = rel_k;
          o.mods.relative_value = rel_v;
        },
        true);
    row(
        "alibi", 4, 6, T, [](AttentionOptions& o) { o.mods.alibi = true; }, true);
    row(
        "t5 (32 buckets)", 4, 6, T, [&](AttentionOptions& o) { o.mods.t5_bias = t5; }, true);
    row(
        "softcap 50", 4, 6, T, [](AttentionOptions& o) { o.mods.softcap = 50; }, true);
    row(
        "documents of 200", 4, 6, T, [&](AttentionOptions& o) { o.mods.doc_ids = doc_ids; }, true);
    row(
        "window 256", 4, 6, T, [](AttentionOptions& o) { o.mods.window = 256; }, true);
  }
  if (!quick)
    row(
        "window 256 (1 head)", 1, 1, 16384, [](AttentionOptions& o) { o.mods.window = 256; }, true);
  return 0;
}

/// The CPU's bf16 table: flash attention forward+backward with f32 operands, bf16 operands on f32 tensors
/// (AttentionMath::BF16: tile products on AMX-BF16 where the CPU has it, else rounded for the f32 units), bf16 tensors
/// (bf16 storage), and bf16 tensors with dropout 0.2 (the training runs' setting), timed in turn `rounds` times on the
/// training shapes of the three-minute job (B=12, NH=4, T=128, E=32) and of nanoGPT's 6-layer config (B=64, NH=6,
/// T=256, E=64), and at T=1024. GF/s counts 3.5 x the causal forward's 2 T^2 E / 2 per head (nanoGPT's count).
int run_bf16_table(int rounds) {
  fmt::print("threads: {}, bf16 products on {}\n{:<26} {:<24} {:>8} {:>8} {:>8} {:>9} {:>9}\n", omp_get_max_threads(),
             cpu::bf16_kernel_name(cpu::bf16_kernel()), "shape (causal)", "operands", "min ms", "median", "max",
             "vs f32", "GF/s");
  struct Shape4 {
    int64_t B, NH, T, E;
  };
  struct Variant {
    const char* name;
    AttentionMath math;
    bool storage;
    double dropout;
  };
  const Variant variants[] = {{"f32", AttentionMath::F32, false, 0.0},
                              {"bf16 on f32 tensors", AttentionMath::BF16, false, 0.0},
                              {"bf16 tensors", AttentionMath::BF16, true, 0.0},
                              {"bf16 tensors, dropout 0.2", AttentionMath::BF16, true, 0.2}};
  for (const Shape4 sh : {Shape4{12, 4, 128, 32}, Shape4{64, 6, 256, 64}, Shape4{4, 6, 1024, 64}}) {
    Generator gen(1);
    auto input = [&] { return randn({sh.B, sh.NH, sh.T, sh.E}, gen); };
    const Tensor q = input(), k = input(), v = input(), dout = input();
    const size_t nv = std::size(variants);
    std::vector<std::array<Tensor, 4>> in(nv);  // q, k, v, dout per variant
    std::vector<AttentionOptions> opts(nv);
    for (size_t i = 0; i < nv; ++i) {
      const DType dt = variants[i].storage ? DType::BF16 : DType::F32;
      in[i] = {q.to(dt), k.to(dt), v.to(dt), dout.to(dt)};
      for (int j = 0; j < 3; ++j) in[i][size_t(j)].requires_grad_();
      opts[i].is_causal = true;
      opts[i].impl = AttentionImpl::Flash;
      opts[i].numerics.attention = variants[i].math;
      opts[i].dropout_p = variants[i].dropout;
      opts[i].dropout_seed = 7;
    }
    std::vector<std::vector<double>> ms(nv);
    for (int r = 0; r < rounds + 1; ++r) {
      for (size_t i = 0; i < nv; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        scaled_dot_product_attention(in[i][0], in[i][1], in[i][2], opts[i]).out.backward(in[i][3]);
        if (r > 0) ms[i].push_back(seconds_since(t0) * 1e3);  // the first round warms up
      }
    }
    const double flops = 3.5 * 4.0 * double(sh.B * sh.NH) * double(sh.T * sh.T) * double(sh.E) * 0.5;
    const double f32_median = spread(ms[0]).median;
    for (size_t i = 0; i < nv; ++i) {
      const Spread s = spread(ms[i]);
      fmt::print("{:<26} {:<24} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f}x {:>9.1f}\n",
                 fmt::format("B={} NH={} T={} E={}", sh.B, sh.NH, sh.T, sh.E), variants[i].name, s.min, s.median, s.max,
                 f32_median / s.median, flops / (s.median * 1e-3) / 1e9);
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

/// A row of the table, or of JSON lines with --json.
void print_row(const Row& r, bool json) {
  if (json) {
    fmt::print(
        "{{\"impl\": \"{}\", \"B\": {}, \"NH\": {}, \"T\": {}, \"E\": {}, \"causal\": {}, \"fwd_ms\": {:.3f}, "
        "\"fwd_bwd_ms\": {:.3f}, \"fwd_gflops\": {:.2f}, \"fwd_bwd_gflops\": {:.2f}, \"extra_mib\": {:.2f}, "
        "\"threads\": {}}}\n",
        r.impl, r.B, r.NH, r.T, r.E, r.causal, r.fwd_ms, r.fwd_bwd_ms, r.fwd_gflops, r.fwd_bwd_gflops, r.extra_mib,
        omp_get_max_threads());
  } else {
    fmt::print("{:<6} {:>2} {:>3} {:>6} {:>4} {:>6} {:>11.2f} {:>14.2f} {:>9.2f} {:>12.2f} {:>11.2f}\n", r.impl, r.B,
               r.NH, r.T, r.E, r.causal ? "yes" : "no", r.fwd_ms, r.fwd_bwd_ms, r.fwd_gflops, r.fwd_bwd_gflops,
               r.extra_mib);
  }
}

int main(int argc, char** argv) {
  // Tensors straight from operator new (no host cache keeping freed blocks), so the count above sees what each
  // algorithm allocates and frees.
  setenv("TINYGPT_HOST_CACHE", "0", 1);
  bool json = false, quick = false, long_only = false, mods = false, bf16 = false;
  Device device = Device::CPU;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      json = true;
    } else if (a == "--quick") {
      quick = true;
    } else if (a == "--long") {
      long_only = true;
    } else if (a == "--mods") {
      mods = true;
    } else if (a == "--bf16") {
      bf16 = true;
    } else if (a == "--threads" && i + 1 < argc) {
      omp_set_num_threads(std::atoi(argv[++i]));
    } else if (a == "--device" && i + 1 < argc) {
      const std::string d = argv[++i];
      if (d == "cuda" && cuda::device_count() > 0) {
        device = Device::CUDA;
      } else if (d != "cpu") {
        fmt::print(stderr, "bench_attention: --device {}: {}\n", d,
                   d == "cuda" ? (cuda::built_with_cuda() ? "no GPU is present" : "this build has no CUDA backend")
                               : "must be cpu or cuda");
        return 2;
      }
    } else {
      fmt::print(
          stderr,
          "usage: bench_attention [--json] [--quick | --long] [--mods] [--bf16] [--threads N] [--device cpu|cuda]\n"
          "  Times flash and naive attention (forward, forward+backward) and their peak extra memory.\n"
          "  --quick: T up to 1024 and no long case.\n"
          "  --long: only the T=16384 flash case, so the peak resident set printed is its own.\n"
          "  --mods: the score modifiers' table (each over plain causal flash attention; a window at T=16384).\n"
          "  --bf16: on the CPU, flash with f32 operands, bf16 operands, bf16 tensors (and with dropout 0.2) on\n"
          "          the training shapes (5 rounds); on\n"
          "          CUDA, only the bf16 rows (bf16 operands on f32 tensors, and bf16 tensors).\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  if (mods) return run_mods_table(quick, quick ? 3 : 5);
  if (bf16 && device == Device::CPU) return run_bf16_table(5);
  std::vector<Row> rows;
  auto emit = [&](const Row& r) {
    print_row(r, json);
    std::fflush(stdout);
    rows.push_back(r);
  };
  if (!json) {
    fmt::print("threads: {}\n{:<6} {:>2} {:>3} {:>6} {:>4} {:>6} {:>11} {:>14} {:>9} {:>12} {:>11}\n",
               omp_get_max_threads(), "impl", "B", "NH", "T", "E", "causal", "fwd ms", "fwd+bwd ms", "fwd GF/s",
               "fwd+bwd GF/s", "extra MiB");
  }
  if (device == Device::CUDA) return run_cuda_table(json, quick, bf16);
  const std::vector<int64_t> lengths = quick ? std::vector<int64_t>{256, 1024} : std::vector<int64_t>{256, 1024, 4096};
  for (bool causal : {true, false}) {
    for (int64_t T : long_only ? std::vector<int64_t>{} : lengths) {
      const int reps = T >= 4096 ? 1 : 3;
      const Row flash = run(AttentionImpl::Flash, 4, 6, T, 64, causal, reps);
      const Row naive = run(AttentionImpl::Naive, 4, 6, T, 64, causal, reps);
      emit(flash);
      emit(naive);
      if (!json) {
        fmt::print("       flash/naive speed-up: fwd {:.2f}x, fwd+bwd {:.2f}x\n", naive.fwd_ms / flash.fwd_ms,
                   naive.fwd_bwd_ms / flash.fwd_bwd_ms);
      }
    }
  }
  if (!quick) emit(run(AttentionImpl::Flash, 1, 1, 16384, 64, true, 1));
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  if (!json) fmt::print("peak resident set of this process: {:.1f} MiB\n", double(usage.ru_maxrss) / 1024.0);
  return 0;
}

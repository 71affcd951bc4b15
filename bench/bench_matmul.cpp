// bench_matmul: tinygpt::cpu::gemm<float> against OpenBLAS sgemm on the three products of a linear layer
// y = x W^T, x (M,K), W (N,K):
//   fwd   y(M,N)   = x @ W^T         gemm(false, true,  M, N, K)
//   dinp  dx(M,K)  = dy @ W          gemm(false, false, M, K, N)
//   dw    dW(N,K) += dy^T @ x        gemm(true,  false, N, K, M, beta = 1)
// Each row is validated against OpenBLAS first, then both are timed with the same thread count in alternating
// batches (3 rounds of ours then OpenBLAS) so background noise hits both; GFLOP/s = 2*M*N*K / median call time.
//
// Rows timed while other processes were busy are flagged with '*' (from /proc/stat): rerun those.
// --bf16 times our products with bf16 operands (--dtype bf16) on the CPU's default bf16 kernel (AMX-BF16 where
// present, else rounded for the f32 micro-kernel), from f32 operands rounded as they are packed and, in a column of
// its own, from operands stored in bf16 (packed as they lie: the same result bit for bit, checked), and in a third the
// same with the result stored in bf16 (Bf16Out, as the linear layers on bf16 storage run: checked to be the f32
// result rounded once); --bf16-kernel
// f32|avx512|amx on a chosen one. The peer is OpenBLAS's cblas_sbgemm on the bf16 operands where the loaded OpenBLAS
// has it (looked up at run time: built with BUILD_BFLOAT16); Debian's 0.3.21 declares it but does not contain it, and
// then the peer is its f32 sgemm and the table says the ratios are bf16 against f32. PyTorch's bf16 matmuls (oneDNN)
// are compared in bench/compare_torch.sh.
//
// What tuning the GEMM with this benchmark found (the machines, the figures, what was tried without gain):
// docs/RESULTS.md, "Measurements behind design decisions"; the latest full runs: "CPU matmul kernels".
#include <cblas.h>
#include <dlfcn.h>
#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/cpu_probe.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/vec_math.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Row {
  int64_t M, K, N;
  const char* kind;
  double ours, blas;  // GFLOP/s
  double err;         // max |ours - blas| / max |blas|
  double other_load;  // cores used by other processes while timing (NaN when unknown)
  double storage;     // --bf16: GFLOP/s of ours over bf16 storage (NaN when not run)
  double out16;       // --bf16: the same, the result stored in bf16 as the linear layers store it (NaN when not run)
  double gelu;        // --bf16, fwd and dinp: out16 with the MLP's GELU epilogue (bias and GELU; GELU's derivative)
};

// CPU seconds used machine-wide (everything but idle and iowait, steal included) and by this process. Over a row,
// their difference is the load from other processes; rows timed under such load are flagged so they can be rerun.
struct CpuSample {
  double machine, self;
};

CpuSample cpu_sample() {
  double machine = NAN;
  if (std::FILE* f = std::fopen("/proc/stat", "r")) {
    unsigned long long v[8];
    if (std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
                    &v[7]) == 8)
      machine = double(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / double(sysconf(_SC_CLK_TCK));
    std::fclose(f);
  }
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  const double self =
      double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
  return {machine, self};
}

// Rows timed while other processes used more than this many cores are flagged.
constexpr double kBusyCores = 0.15;

// One product in gemm terms: C(m,n) = alpha op(A) op(B) + beta C.
struct Product {
  bool ta, tb;
  int64_t m, n, k;
  const float *a, *b;
  int64_t lda, ldb, ldc;
  float beta;
  const tinygpt::bf16 *a16 = nullptr, *b16 = nullptr;  // --bf16: the operands stored in bf16
  tinygpt::bf16* c16 = nullptr;                        // --bf16: the result stored in bf16
  // --bf16, the GELU column: the bias (n floats) and GELU's output (fwd) or input (dinp), m x n in bf16
  const float* bias = nullptr;
  tinygpt::bf16* act16 = nullptr;
  bool forward = false;
};

bool g_bf16 = false;  // --bf16: our products with bf16 operands, on g_kernel
// OpenBLAS's bf16 GEMM (its bfloat16 is uint16_t), when the library has one and --bf16 asks for it.
using SbgemmFn = void (*)(CBLAS_ORDER, CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, blasint, blasint, blasint, float,
                          const uint16_t*, blasint, const uint16_t*, blasint, float, float*, blasint);
SbgemmFn g_sbgemm = nullptr;
tinygpt::cpu::Bf16Kernel g_kernel = tinygpt::cpu::Bf16Kernel::F32Units;

void run_ours(const Product& p, float* c) {
  if (g_bf16) {
    tinygpt::cpu::gemm_bf16(g_kernel, p.ta, p.tb, p.m, p.n, p.k, 1.0f, p.a, p.lda, p.b, p.ldb, p.beta, c, p.ldc);
  } else {
    tinygpt::cpu::gemm<float>(p.ta, p.tb, p.m, p.n, p.k, 1.0f, p.a, p.lda, p.b, p.ldb, p.beta, c, p.ldc);
  }
}

/// Ours over operands stored in bf16 (--dtype bf16's tensors): packed as they lie, nothing rounded.
void run_ours_bf16_storage(const Product& p, float* c) {
  tinygpt::cpu::gemm(p.ta, p.tb, p.m, p.n, p.k, 1.0f, p.a16, p.lda, p.b16, p.ldb, p.beta, c, p.ldc);
}

/// Ours over bf16 storage with the result stored in bf16 (Bf16Out), as the linear layers on bf16 storage call it:
/// each output rounded once, a dW accumulator (beta 1) added to in f32 and rounded. C is not used.
void run_ours_bf16_out(const Product& p, float*) {
  tinygpt::cpu::Bf16Out o{p.c16, p.ldc, p.beta != 0.0f};
  tinygpt::cpu::Epilogue<float> ep;
  ep.out16 = &o;
  tinygpt::cpu::gemm(p.ta, p.tb, p.m, p.n, p.k, 1.0f, p.a16, p.lda, p.b16, p.ldb, 0.0f, nullptr, p.ldc, ep);
}

/// run_ours_bf16_out as the MLP calls it: forward, the bias added and GELU's output written beside the product (the
/// fc layer); dinp, the product scaled by GELU's derivative at its input (the gradient into the fc layer's output).
void run_ours_bf16_gelu(const Product& p, float*) {
  tinygpt::cpu::Bf16Out o{p.c16, p.ldc, false};
  tinygpt::cpu::Epilogue<float> ep;
  ep.act = tinygpt::Activation::Gelu;
  if (p.forward) {
    ep.bias = p.bias;
    o.act_out = p.act16;
  } else {
    o.act_of = p.act16;
  }
  ep.out16 = &o;
  tinygpt::cpu::gemm(p.ta, p.tb, p.m, p.n, p.k, 1.0f, p.a16, p.lda, p.b16, p.ldb, 0.0f, nullptr, p.ldc, ep);
}

void run_blas(const Product& p, float* c) {
  if (g_sbgemm) {
    static_assert(sizeof(tinygpt::bf16) == sizeof(uint16_t));
    g_sbgemm(CblasRowMajor, p.ta ? CblasTrans : CblasNoTrans, p.tb ? CblasTrans : CblasNoTrans, blasint(p.m),
             blasint(p.n), blasint(p.k), 1.0f, reinterpret_cast<const uint16_t*>(p.a16), blasint(p.lda),
             reinterpret_cast<const uint16_t*>(p.b16), blasint(p.ldb), p.beta, c, blasint(p.ldc));
    return;
  }
  cblas_sgemm(CblasRowMajor, p.ta ? CblasTrans : CblasNoTrans, p.tb ? CblasTrans : CblasNoTrans, int(p.m), int(p.n),
              int(p.k), 1.0f, p.a, int(p.lda), p.b, int(p.ldb), p.beta, c, int(p.ldc));
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Ours over bf16 storage: bit for bit the f32 operands' product (rounded as packed), and stored in bf16 the f32
/// product rounded once; exits naming the product otherwise.
void check_storage(Product& p, const std::vector<float>& c0, std::vector<float>& c_storage,
                   const std::vector<tinygpt::bf16>& c16, int64_t M, int64_t K, int64_t N, const char* kind) {
  run_ours_bf16_storage(p, c_storage.data());
  std::vector<float> c_check = c0;
  run_ours(p, c_check.data());
  if (c_check != c_storage && p.beta == 0.0f) {
    std::fprintf(stderr, "bench_matmul: WRONG RESULT M=%lld K=%lld N=%lld %s: bf16 storage differs from rounded f32\n",
                 (long long)M, (long long)K, (long long)N, kind);
    std::exit(1);
  }
  if (p.beta == 0.0f) {  // stored in bf16: the f32 product rounded once, bit for bit
    run_ours_bf16_out(p, nullptr);
    for (size_t i = 0; i < c16.size(); ++i) {
      if (c16[i].bits != tinygpt::bf16(c_storage[i]).bits) {
        std::fprintf(stderr,
                     "bench_matmul: WRONG RESULT M=%lld K=%lld N=%lld %s: the bf16 output is not the f32 one rounded\n",
                     (long long)M, (long long)K, (long long)N, kind);
        std::exit(1);
      }
    }
  }
}

/// The GELU epilogue's outputs (fwd: bias, then GELU; dinp: GELU's derivative) against the f32 product with the
/// epilogue's arithmetic after it, bit for bit; exits naming the product otherwise.
void check_gelu(Product& p, const std::vector<float>& c_storage, const std::vector<tinygpt::bf16>& c16,
                std::vector<tinygpt::bf16>& act16, const std::vector<float>& bias, int64_t M, int64_t K, int64_t N,
                const char* kind) {
  if (!p.forward) {
    for (size_t i = 0; i < act16.size(); ++i) act16[i] = tinygpt::bf16(float(int64_t(i % 97) - 48) / 16.0f);
  }
  run_ours_bf16_gelu(p, nullptr);
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      const size_t e = size_t(i * p.ldc + j);
      const float x = p.forward
                          ? c_storage[e] + bias[size_t(j)]
                          : c_storage[e] * tinygpt::cpu::activation_grad_of(tinygpt::Activation::Gelu, float(act16[e]));
      const bool ok = c16[e].bits == tinygpt::bf16(x).bits &&
                      (!p.forward ||
                       act16[e].bits == tinygpt::bf16(tinygpt::cpu::activation_of(tinygpt::Activation::Gelu, x)).bits);
      if (!ok) {
        std::fprintf(stderr, "bench_matmul: WRONG RESULT M=%lld K=%lld N=%lld %s: the GELU epilogue's output\n",
                     (long long)M, (long long)K, (long long)N, kind);
        std::exit(1);
      }
    }
  }
}

/// max |ours - OpenBLAS| / max |OpenBLAS|; exits with a line naming the row when it is past the tolerance.
double error_against_blas(const std::vector<float>& c_ours, const std::vector<float>& c_blas, int64_t M, int64_t K,
                          int64_t N, const char* kind) {
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < c_ours.size(); ++i) {
    const double d = std::fabs(double(c_ours[i]) - double(c_blas[i]));
    max_diff = std::isnan(d) ? INFINITY : std::max(max_diff, d);
    max_ref = std::max(max_ref, std::fabs(double(c_blas[i])));
  }
  const double err = max_diff / std::max(max_ref, 1e-30);
  if (!(err < (g_bf16 ? 3e-2 : 1e-4))) {  // bf16: 8-bit operands against f32 ones
    std::fprintf(stderr, "bench_matmul: WRONG RESULT M=%lld K=%lld N=%lld %s: max|ours-openblas|/max|openblas| = %g\n",
                 (long long)M, (long long)K, (long long)N, kind, err);
    std::exit(1);
  }
  return err;
}

/// One batch of calls of fn after sleeping `settle` seconds: the first call and the first 30 ms not recorded, then at
/// least 2 calls and 80 ms recorded in `times`.
template <class F>
void timed_batch(F&& fn, const Product& p, float* c, double settle, std::vector<double>& times) {
  std::this_thread::sleep_for(std::chrono::duration<double>(settle));
  const Clock::time_point start = Clock::now();
  double kept = 0;
  for (int calls = 0, recorded = 0;; ++calls) {
    const Clock::time_point t0 = Clock::now();
    fn(p, c);
    const double t = seconds_since(t0);
    if (calls > 0 && std::chrono::duration<double>(t0 - start).count() >= 0.03) {
      times.push_back(t);
      kept += t;
      if (++recorded >= 2 && kept >= 0.08) break;
    }
  }
}

Row bench_one(int64_t M, int64_t K, int64_t N, const char* kind, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  auto filled = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = dist(rng);
    return v;
  };
  Product p{};
  std::vector<float> in0, in1, c0;
  const std::string k(kind);
  if (k == "fwd") {
    in0 = filled(M * K), in1 = filled(N * K);  // x, W
    p = {false, true, M, N, K, in0.data(), in1.data(), K, K, N, 0.0f};
  } else if (k == "dinp") {
    in0 = filled(M * N), in1 = filled(N * K);  // dy, W
    p = {false, false, M, K, N, in0.data(), in1.data(), N, K, K, 0.0f};
  } else {
    in0 = filled(M * N), in1 = filled(M * K);  // dy, x
    p = {true, false, N, K, M, in0.data(), in1.data(), N, K, K, 1.0f};
  }
  // beta = 0 outputs start as NaN (must not be read); the dW accumulator starts equal for both.
  c0 = p.beta == 0.0f ? std::vector<float>(size_t(p.m * p.n), NAN) : filled(p.m * p.n);
  std::vector<float> c_ours = c0, c_blas = c0, c_storage = c0;
  // With --bf16 on the default kernel, the same product over bf16 copies of the operands too (bit for bit ours).
  const bool storage = g_bf16 && g_kernel == tinygpt::cpu::bf16_kernel();
  const bool copies = storage || g_sbgemm;  // OpenBLAS's sbgemm reads the bf16 copies too
  const std::vector<tinygpt::bf16> a16 =
      copies ? std::vector<tinygpt::bf16>(in0.begin(), in0.end()) : std::vector<tinygpt::bf16>{};
  const std::vector<tinygpt::bf16> b16 =
      copies ? std::vector<tinygpt::bf16>(in1.begin(), in1.end()) : std::vector<tinygpt::bf16>{};
  p.a16 = a16.data(), p.b16 = b16.data();
  std::vector<tinygpt::bf16> c16(storage ? c0.size() : 0);
  p.c16 = c16.data();
  if (storage) check_storage(p, c0, c_storage, c16, M, K, N, kind);
  // The GELU column (fwd and dinp): checked against the f32 product with the epilogue's arithmetic after it.
  const bool gelu = storage && p.beta == 0.0f;
  std::vector<float> bias = gelu ? filled(p.n) : std::vector<float>{};
  std::vector<tinygpt::bf16> act16(gelu ? c0.size() : 0);
  p.forward = std::strcmp(kind, "fwd") == 0, p.bias = bias.data(), p.act16 = act16.data();
  if (gelu) check_gelu(p, c_storage, c16, act16, bias, M, K, N, kind);

  run_ours(p, c_ours.data());
  run_blas(p, c_blas.data());
  const double err = error_against_blas(c_ours, c_blas, M, K, N, kind);

  // Interleaved in rounds: a batch of ours, then a batch of OpenBLAS, 3 times. Alternating call by call was tried
  // and measured thread-pool contention instead of GEMM: after a call each library's idle workers keep spinning
  // (OpenBLAS's for ~110 ms with sched_yield, libgomp's for ~8 ms) and take a core from the other, which slows the
  // small shapes most (and trips gemm's oversubscription guard). So before our batch the process sleeps until
  // OpenBLAS's workers are asleep, and each batch starts with at least one call and 30 ms of calls that are not
  // recorded, then records at least 2 calls and 80 ms (so >= 6 calls and >= 0.24 s per implementation and row).
  std::vector<double> t_ours, t_blas, t_storage, t_out16, t_gelu;
  auto batch = [&](auto&& fn, float* c, double settle, std::vector<double>& times) {
    timed_batch(fn, p, c, settle, times);
  };
  const Clock::time_point start = Clock::now();
  const CpuSample cpu0 = cpu_sample();
  for (int round = 0; round < 3; ++round) {
    batch(run_ours, c_ours.data(), 0.15, t_ours);
    if (storage) batch(run_ours_bf16_storage, c_storage.data(), 0.0, t_storage);
    if (storage) batch(run_ours_bf16_out, nullptr, 0.0, t_out16);
    if (gelu) batch(run_ours_bf16_gelu, nullptr, 0.0, t_gelu);
    batch(run_blas, c_blas.data(), 0.0, t_blas);
  }
  const CpuSample cpu1 = cpu_sample();
  double other_load = (cpu1.machine - cpu0.machine - (cpu1.self - cpu0.self)) / seconds_since(start);
  if (other_load < 0) other_load = 0;  // tick rounding; NaN (no /proc/stat) stays NaN
  const double flops = 2.0 * double(M) * double(N) * double(K);
  return {M,
          K,
          N,
          kind,
          flops / median(t_ours) / 1e9,
          flops / median(t_blas) / 1e9,
          err,
          other_load,
          storage ? flops / median(t_storage) / 1e9 : NAN,
          storage ? flops / median(t_out16) / 1e9 : NAN,
          gelu ? flops / median(t_gelu) / 1e9 : NAN};
}

void usage() {
  std::printf(
      "usage: bench_matmul [--threads N] [--quick] [--bf16] [--bf16-kernel NAME] [--json] [--help]\n"
      "  Compares tinygpt::cpu::gemm<float> with OpenBLAS sgemm on the linear-layer products fwd/dinp/dw.\n"
      "  --threads N  threads for both (default: omp_get_max_threads())\n"
      "  --quick      only M = 768 (default: M in {768, 16384})\n"
      "  --bf16       ours with bf16 operands on this CPU's fastest bf16 kernel; OpenBLAS's sbgemm where it has one,\n"
      "               else its f32 sgemm (the table says which); also ours over bf16 storage, C in f32\n"
      "               (bf16_storage) and C stored in bf16 as the linear layers store it (bf16_out), and that with\n"
      "               the MLP's GELU epilogue (gelu: fwd adds a bias and writes GELU's output too, dinp scales by\n"
      "               GELU's derivative; the product's FLOPs only)\n"
      "  --bf16-kernel f32|avx512|amx  ours with bf16 operands on this kernel (f32: rounded as packed, f32 units)\n"
      "  --json       one JSON object per row instead of the table\n");
}

/// The options into threads, quick, json and the globals; an exit status (0 for --help, 2 for a bad argument), or -1
/// to go on.
int parse_args(int argc, char** argv, int& threads, bool& quick, bool& json) {
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--bf16")) {
      g_bf16 = true;
      g_kernel = tinygpt::cpu::bf16_kernel();
    } else if (!std::strcmp(argv[i], "--bf16-kernel") && i + 1 < argc) {
      const std::string name = argv[++i];
      using tinygpt::cpu::Bf16Kernel;
      g_bf16 = true;
      g_kernel = name == "amx" ? Bf16Kernel::Amx : name == "avx512" ? Bf16Kernel::Avx512Bf16 : Bf16Kernel::F32Units;
      const auto& have = tinygpt::cpu::bf16_kernels_available();
      if ((name != "amx" && name != "avx512" && name != "f32") ||
          std::find(have.begin(), have.end(), g_kernel) == have.end()) {
        std::fprintf(stderr, "bench_matmul: --bf16-kernel %s: not a kernel this CPU can run (it has:", name.c_str());
        for (const Bf16Kernel k : have) std::fprintf(stderr, " %s", tinygpt::cpu::bf16_kernel_name(k));
        std::fprintf(stderr, ")\n");
        return 2;
      }
    } else if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--json")) {
      json = true;
    } else if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      usage();
      return 0;
    } else {
      std::fprintf(stderr, "bench_matmul: unknown argument '%s'\n", argv[i]);
      usage();
      return 2;
    }
  }
  if (threads < 1) {
    std::fprintf(stderr, "bench_matmul: --threads must be >= 1\n");
    return 2;
  }
  return -1;
}

// The peer at its best: OpenBLAS 0.3.21 (Debian 12) does not recognize recent Xeons and falls back to its SSE
// "Prescott" kernels, 4x slower than its AVX-512 ones there. Rerun with OPENBLAS_CORETYPE naming the kernels this
// CPU can run (read when the library loads, so it takes a new process).
void use_best_openblas_kernels(char** argv) {
#if defined(__linux__) && defined(__x86_64__)  // x86 kernel names; /proc/self/exe is Linux's
  const std::string core = openblas_get_corename();
  const char* want = __builtin_cpu_supports("avx512f") ? "SkylakeX"
                     : __builtin_cpu_supports("avx2")  ? "Haswell"
                                                       : nullptr;
  if (want && !std::getenv("OPENBLAS_CORETYPE") && (core == "Prescott" || core == "Core2" || core == "Katmai")) {
    std::fprintf(stderr,
                 "bench_matmul: OpenBLAS chose its %s kernels on a CPU with %s; running again with "
                 "OPENBLAS_CORETYPE=%s\n",
                 core.c_str(), std::strcmp(want, "SkylakeX") ? "AVX2" : "AVX-512", want);
    setenv("OPENBLAS_CORETYPE", want, 1);
    execv("/proc/self/exe", argv);
    std::fprintf(stderr, "bench_matmul: could not run again (%s); OpenBLAS keeps its %s kernels\n",
                 std::strerror(errno), core.c_str());
  }
#endif
  (void)argv;
}

/// One row as a JSON object.
void print_json_row(const Row& r, double ratio, int threads) {
  char load[32] = "null";  // unknown without /proc/stat
  if (!std::isnan(r.other_load)) std::snprintf(load, sizeof load, "%.2f", r.other_load);
  std::printf(
      "{\"M\": %lld, \"K\": %lld, \"N\": %lld, \"kind\": \"%s\", \"gflops\": %.2f, \"openblas_gflops\": %.2f, "
      "\"ratio\": %.4f, \"threads\": %d, \"max_rel_err\": %.3g, \"other_load\": %s, \"bf16\": %s, \"bf16_kernel\": "
      "\"%s\", "
      "\"bf16_storage_gflops\": %.2f, \"bf16_out_gflops\": %.2f, \"gelu_gflops\": %.2f, \"openblas_precision\": "
      "\"%s\"}\n",
      (long long)r.M, (long long)r.K, (long long)r.N, r.kind, r.ours, r.blas, ratio, threads, r.err, load,
      g_bf16 ? "true" : "false", g_bf16 ? tinygpt::cpu::bf16_kernel_name(g_kernel) : "",
      std::isnan(r.storage) ? 0.0 : r.storage, std::isnan(r.out16) ? 0.0 : r.out16, std::isnan(r.gelu) ? 0.0 : r.gelu,
      g_sbgemm ? "bf16" : "f32");
}

}  // namespace

/// The table's heading: the stated peak, the threads and kernels, the peer, the columns.
void print_header(int threads, double peak, tinygpt::cpu::Bf16Kernel unit, const char* peer, const char* ratio_name) {
  const tinygpt::cpu::UnitRates& rates = tinygpt::cpu::unit_rates();
  if (peak > 0)
    std::printf("stated peak: %d threads x %.2f GHz x %.0f FLOP a cycle of %s = %.0f GFLOP/s (measured; %s)\n", threads,
                rates.ghz, tinygpt::cpu::flops_per_cycle(unit), tinygpt::cpu::bf16_kernel_name(unit), peak,
                tinygpt::cpu::cpu_model_name().c_str());
  std::printf(
      "threads=%d, GFLOP/s from the median call time of batches interleaved with OpenBLAS (%s kernels)%s\n", threads,
      openblas_get_corename(),
      g_bf16 ? (std::string("; ours with bf16 operands on ") + tinygpt::cpu::bf16_kernel_name(g_kernel) + " kernels")
                   .c_str()
             : "");
  std::printf("peer: %s\n", peer);
  std::printf("%6s %5s %5s %-5s %12s %16s %8s%s\n", "M", "K", "N", "kind", "ours_gflops", "openblas_gflops", ratio_name,
              g_bf16 ? "  bf16_storage_gflops  storage/ours  bf16_out_gflops  gelu_gflops" : "");
}

int main(int argc, char** argv) {
  int threads = omp_get_max_threads();
  bool quick = false, json = false;
  if (const int code = parse_args(argc, argv, threads, quick, json); code >= 0) return code;
  use_best_openblas_kernels(argv);
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  if (g_bf16) g_sbgemm = reinterpret_cast<SbgemmFn>(dlsym(RTLD_DEFAULT, "cblas_sbgemm"));
  // Whose precision each side computes in: a ratio across precisions says so in its column's name.
  const char* peer = !g_bf16 ? "OpenBLAS sgemm (f32)"
                     : g_sbgemm
                         ? "OpenBLAS sbgemm (bf16 operands)"
                         : "OpenBLAS sgemm (f32: this OpenBLAS has no cblas_sbgemm, built without BUILD_BFLOAT16)";
  const char* ratio_name = g_bf16 && !g_sbgemm ? "bf16/f32" : "ratio";

  const int64_t Ms[] = {768, 16384};
  const int64_t KNs[][2] = {{128, 384}, {128, 512}, {512, 128}, {384, 1152}, {384, 1536}, {1536, 384}};
  const char* kinds[] = {"fwd", "dinp", "dw"};

  // The unit's stated peak, as the training log states it (kernels/cpu/cpu_probe.h): threads x the measured clock x
  // the measured FLOPs a cycle of the unit the products run on; 0 where the probe does not run.
  const tinygpt::cpu::UnitRates& rates = tinygpt::cpu::unit_rates();
  const tinygpt::cpu::Bf16Kernel unit = g_bf16 ? g_kernel : tinygpt::cpu::Bf16Kernel::F32Units;
  const double peak = threads * rates.ghz * tinygpt::cpu::flops_per_cycle(unit);
  double ours_lo = INFINITY, ours_hi = 0, out16_lo = INFINITY, out16_hi = 0;

  std::mt19937 rng(42);
  if (!json) print_header(threads, peak, unit, peer, ratio_name);
  double min_ratio = INFINITY, log_sum = 0, storage_log_sum = 0;
  int storage_rows = 0;
  int rows = 0, busy_rows = 0;
  for (int64_t M : Ms) {
    if (quick && M != 768) continue;
    for (const auto& kn : KNs) {
      for (const char* kind : kinds) {
        const Row r = bench_one(M, kn[0], kn[1], kind, rng);
        const double ratio = r.ours / r.blas;
        ours_lo = std::min(ours_lo, r.ours), ours_hi = std::max(ours_hi, r.ours);
        if (!std::isnan(r.out16)) out16_lo = std::min(out16_lo, r.out16), out16_hi = std::max(out16_hi, r.out16);
        min_ratio = std::min(min_ratio, ratio);
        log_sum += std::log(ratio);
        ++rows;
        if (json) {
          print_json_row(r, ratio, threads);
        } else {
          const bool busy = r.other_load > kBusyCores;
          busy_rows += busy;
          std::printf("%6lld %5lld %5lld %-5s %12.1f %16.1f %8.3f", (long long)r.M, (long long)r.K, (long long)r.N,
                      r.kind, r.ours, r.blas, ratio);
          if (!std::isnan(r.storage)) {
            std::printf("  %19.1f  %12.3f  %15.1f  %11.1f", r.storage, r.storage / r.ours, r.out16, r.gelu);
            storage_log_sum += std::log(r.storage / r.ours);
            ++storage_rows;
          }
          std::printf("%s\n", busy ? "  *" : "");
        }
        std::fflush(stdout);
      }
    }
  }
  if (!json) {
    std::printf("%s over %d rows: min %.3f, geomean %.3f\n", ratio_name, rows, min_ratio, std::exp(log_sum / rows));
    if (storage_rows)
      std::printf("bf16 storage against f32 operands rounded as packed, geomean over %d rows: %.3f\n", storage_rows,
                  std::exp(storage_log_sum / storage_rows));
    if (peak > 0) {
      std::printf("of the stated peak: ours %.0f-%.0f%%", 100 * ours_lo / peak, 100 * ours_hi / peak);
      if (out16_hi > 0) std::printf(", bf16_out %.0f-%.0f%%", 100 * out16_lo / peak, 100 * out16_hi / peak);
      std::printf("\n");
    }
    if (busy_rows)
      std::printf("* %d rows ran while other processes used more than %.2f cores; rerun for clean numbers\n", busy_rows,
                  kBusyCores);
  }
  return 0;
}

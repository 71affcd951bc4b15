// bench_matmul: tinygpt::cpu::gemm<float> against OpenBLAS sgemm on the three products of a linear layer
// y = x W^T, x (M,K), W (N,K):
//   fwd   y(M,N)   = x @ W^T         gemm(false, true,  M, N, K)
//   dinp  dx(M,K)  = dy @ W          gemm(false, false, M, K, N)
//   dw    dW(N,K) += dy^T @ x        gemm(true,  false, N, K, M, beta = 1)
// Each row is validated against OpenBLAS first, then both are timed with the same thread count in alternating
// batches (3 rounds of ours then OpenBLAS) so background noise hits both; GFLOP/s = 2*M*N*K / median call time.
//
// Notes from tuning (2-core AMD EPYC Zen 3 VM, AVX2+FMA, 32 KB L1d / 512 KB L2 per core, g++ 12, 2 threads):
//   TODO
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/gemm.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Row {
  int64_t M, K, N;
  const char* kind;
  double ours, blas;  // GFLOP/s
  double err;         // max |ours - blas| / max |blas|
};

// One product in gemm terms: C(m,n) = alpha op(A) op(B) + beta C.
struct Product {
  bool ta, tb;
  int64_t m, n, k;
  const float *a, *b;
  int64_t lda, ldb, ldc;
  float beta;
};

void run_ours(const Product& p, float* c) {
  tinygpt::cpu::gemm<float>(p.ta, p.tb, p.m, p.n, p.k, 1.0f, p.a, p.lda, p.b, p.ldb, p.beta, c, p.ldc);
}

void run_blas(const Product& p, float* c) {
  cblas_sgemm(CblasRowMajor, p.ta ? CblasTrans : CblasNoTrans, p.tb ? CblasTrans : CblasNoTrans, int(p.m), int(p.n),
              int(p.k), 1.0f, p.a, int(p.lda), p.b, int(p.ldb), p.beta, c, int(p.ldc));
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
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
  std::vector<float> c_ours = c0, c_blas = c0;

  run_ours(p, c_ours.data());
  run_blas(p, c_blas.data());
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < c_ours.size(); ++i) {
    const double d = std::fabs(double(c_ours[i]) - double(c_blas[i]));
    max_diff = std::isnan(d) ? INFINITY : std::max(max_diff, d);
    max_ref = std::max(max_ref, std::fabs(double(c_blas[i])));
  }
  const double err = max_diff / std::max(max_ref, 1e-30);
  if (!(err < 1e-4)) {
    std::fprintf(stderr, "bench_matmul: WRONG RESULT M=%lld K=%lld N=%lld %s: max|ours-openblas|/max|openblas| = %g\n",
                 (long long)M, (long long)K, (long long)N, kind, err);
    std::exit(1);
  }

  // Interleaved in rounds: a batch of ours, then a batch of OpenBLAS, 3 times. Alternating call by call was tried
  // and measures thread-pool contention instead of GEMM: each library's idle workers spin for a while after a call
  // (OpenBLAS's with sched_yield, libgomp's busy) and steal a core from the other, costing up to 2x on small shapes.
  // So the first ~30 ms of each batch (at least one call) is warm-up and not recorded.
  std::vector<double> t_ours, t_blas;
  auto batch = [&](auto&& fn, float* c, std::vector<double>& times) {
    const Clock::time_point start = Clock::now();
    double kept = 0;
    for (int calls = 0;; ++calls) {
      const Clock::time_point t0 = Clock::now();
      fn(p, c);
      const double t = seconds_since(t0);
      if (calls > 0 && std::chrono::duration<double>(t0 - start).count() >= 0.03) {
        times.push_back(t);
        kept += t;
        if (kept >= 0.08) break;
      }
    }
  };
  for (int round = 0; round < 3; ++round) {
    batch(run_ours, c_ours.data(), t_ours);
    batch(run_blas, c_blas.data(), t_blas);
  }
  const double flops = 2.0 * double(M) * double(N) * double(K);
  return {M, K, N, kind, flops / median(t_ours) / 1e9, flops / median(t_blas) / 1e9, err};
}

void usage() {
  std::printf(
      "usage: bench_matmul [--threads N] [--quick] [--json] [--help]\n"
      "  Compares tinygpt::cpu::gemm<float> with OpenBLAS sgemm on the linear-layer products fwd/dinp/dw.\n"
      "  --threads N  threads for both (default: omp_get_max_threads())\n"
      "  --quick      only M = 768 (default: M in {768, 16384})\n"
      "  --json       one JSON object per row instead of the table\n");
}

}  // namespace

int main(int argc, char** argv) {
  int threads = omp_get_max_threads();
  bool quick = false, json = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
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
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);

  const int64_t Ms[] = {768, 16384};
  const int64_t KNs[][2] = {{128, 384}, {128, 512}, {512, 128}, {384, 1152}, {384, 1536}, {1536, 384}};
  const char* kinds[] = {"fwd", "dinp", "dw"};

  std::mt19937 rng(42);
  if (!json) {
    std::printf("threads=%d, GFLOP/s from the median of interleaved calls\n", threads);
    std::printf("%6s %5s %5s %-5s %12s %16s %7s\n", "M", "K", "N", "kind", "ours_gflops", "openblas_gflops", "ratio");
  }
  double min_ratio = INFINITY, log_sum = 0;
  int rows = 0;
  for (int64_t M : Ms) {
    if (quick && M != 768) continue;
    for (const auto& kn : KNs) {
      for (const char* kind : kinds) {
        const Row r = bench_one(M, kn[0], kn[1], kind, rng);
        const double ratio = r.ours / r.blas;
        min_ratio = std::min(min_ratio, ratio);
        log_sum += std::log(ratio);
        ++rows;
        if (json) {
          std::printf(
              "{\"M\": %lld, \"K\": %lld, \"N\": %lld, \"kind\": \"%s\", \"gflops\": %.2f, \"openblas_gflops\": %.2f, "
              "\"ratio\": %.4f, \"threads\": %d, \"max_rel_err\": %.3g}\n",
              (long long)r.M, (long long)r.K, (long long)r.N, r.kind, r.ours, r.blas, ratio, threads, r.err);
        } else {
          std::printf("%6lld %5lld %5lld %-5s %12.1f %16.1f %7.3f\n", (long long)r.M, (long long)r.K, (long long)r.N,
                      r.kind, r.ours, r.blas, ratio);
        }
        std::fflush(stdout);
      }
    }
  }
  if (!json) std::printf("ratio over %d rows: min %.3f, geomean %.3f\n", rows, min_ratio, std::exp(log_sum / rows));
  return 0;
}

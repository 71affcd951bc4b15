// bench_classifier: the classifier's loss and gradient during training, fused against the separate kernels.
//   separate: crossentropy_forward (loss, lse), the gradient slot zeroed, crossentropy_backward adding into it
//             (reads the logits twice, the slot once, writes the slot twice: what cross_entropy ran before the fusion)
//   fused:    crossentropy_fused (loss, lse and the gradient for a loss gradient of 1 from one read of the logits),
//             then crossentropy_backward(fused), which leaves it as it is for a loss gradient of 1 (read on the device)
//   copy:     a plain copy of the logits (one read, one write of the same bytes): the floor a fused pass can reach
// Each row times the three in turn, rounds alternating, and prints min / median / max ms; GB/s counts the bytes the
// fused pass must move (the logits read once, the gradient written once). The fused gradient is checked against the
// separate one (the same bits) before timing.
//
//   bench_classifier [--device cpu|cuda] [--bf16] [--rows N] [--vocab V[,V...]] [--rounds R]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "kernels/device.h"
#include "kernels/kernels.h"

using namespace tinygpt;

namespace {

struct Stats {
  double min, median, max;
};

Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v.front(), v[v.size() / 2], v.back()};
}

template <class T>
void run_row(Device device, int64_t N, int64_t V, int rounds) {
  using F = compute_t<T>;
  const DType dt = std::is_same_v<T, bf16> ? DType::BF16 : DType::F32;
  Generator gen(1);
  const Tensor logits = randn({N, V}, gen, DType::F32, device, 2.0).to(dt);
  std::vector<int32_t> ids(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) ids[size_t(n)] = int32_t((n * 7919) % V);
  const Tensor targets = from_vector(ids, {N}, device);
  const Tensor one = full({1}, 1.0, DType::F32, device);
  Tensor losses = empty({N}, DType::F32, device), lse = empty({N}, DType::F32, device);
  Tensor separate = empty({N, V}, dt, device), fused = empty({N, V}, dt, device), copy = empty({N, V}, dt, device);
  const F scale = F(1.0 / double(N));
  auto run_separate = [&] {
    launch(kernels::crossentropy_forward<T>, device, losses.data<F>(), lse.data<F>(), logits.data<T>(),
           targets.data<int32_t>(), N, V, -1);
    separate.zero_();
    launch(kernels::crossentropy_backward<T>, device, separate.data<T>(), one.data<F>(), scale, logits.data<T>(),
           lse.data<F>(), targets.data<int32_t>(), N, V, -1, false);
  };
  auto run_fused = [&] {
    launch(kernels::crossentropy_fused<T>, device, losses.data<F>(), lse.data<F>(), fused.data<T>(), logits.data<T>(),
           targets.data<int32_t>(), scale, N, V, -1);
    launch(kernels::crossentropy_backward<T>, device, fused.data<T>(), one.data<F>(), scale, logits.data<T>(),
           lse.data<F>(), targets.data<int32_t>(), N, V, -1, true);
  };
  auto run_copy = [&] { copy.copy_(logits); };

  run_separate();
  run_fused();
  const std::vector<float> a = separate.to(DType::F32).to_vector<float>(), b = fused.to(DType::F32).to_vector<float>();
  int64_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += a[i] != b[i];
  if (differ != 0) {
    std::fprintf(stderr,
                 "error: bench_classifier: the fused gradient differs from the separate one in %lld of %zu "
                 "elements (N %lld, V %lld)\n",
                 (long long)differ, a.size(), (long long)N, (long long)V);
    std::exit(1);
  }

  auto time = [&](auto&& f) {
    if (device == Device::CUDA) cuda::synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    if (device == Device::CUDA) cuda::synchronize();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  std::vector<double> ts, tf, tc;
  for (int r = 0; r < rounds + 1; ++r) {  // round 0 warms up
    const double s = time(run_separate), f = time(run_fused), c = time(run_copy);
    if (r > 0) ts.push_back(s), tf.push_back(f), tc.push_back(c);
  }
  const Stats s = stats(ts), f = stats(tf), c = stats(tc);
  const double bytes = 2.0 * double(N) * double(V) * double(sizeof(T));
  std::printf(
      "| %lld x %lld | %s | %.3f / %.3f / %.3f | %.3f / %.3f / %.3f | %.3f / %.3f / %.3f | %.2fx | %.0f | %.0f |\n",
      (long long)N, (long long)V, dtype_name(dt), s.min, s.median, s.max, f.min, f.median, f.max, c.min, c.median,
      c.max, s.median / f.median, bytes / f.median / 1e6, bytes / c.median / 1e6);
}

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr, "error: bench_classifier: %s (see --help)\n", what.c_str());
  std::exit(2);
}

int64_t positive(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v <= 0 || v > (1LL << 30))
    usage_error(flag + " needs a positive integer, got '" + text + "'");
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  Device device = Device::CPU;
  bool bf16_only = false;
  int64_t rows = 0;
  int rounds = 10;
  std::vector<int64_t> vocabs = {65, 50304};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: bench_classifier [--device cpu|cuda] [--bf16] [--rows N] [--vocab V[,V...]] [--rounds R]\n"
          "  Times the classifier's loss and gradient as training runs them: the fused kernel against the\n"
          "  separate forward, zeroing and backward, and a plain copy of the logits (the floor), in f32 and bf16\n"
          "  (--bf16: bf16 only). Rows default to 4096 on the CPU and 16384 on the GPU (a vocabulary of 50304\n"
          "  gets a quarter of them on the CPU); vocabularies default to 65,50304; 10 rounds.\n");
      return 0;
    } else if (a == "--device") {
      const std::string d = value();
      if (d == "cpu")
        device = Device::CPU;
      else if (d == "cuda")
        device = Device::CUDA;
      else
        usage_error("--device takes cpu or cuda, got '" + d + "'");
    } else if (a == "--bf16") {
      bf16_only = true;
    } else if (a == "--rows") {
      rows = positive(a, value());
    } else if (a == "--rounds") {
      rounds = int(positive(a, value()));
    } else if (a == "--vocab") {
      vocabs.clear();
      std::string list = value();
      for (size_t p = 0; p <= list.size();) {
        const size_t q = std::min(list.find(',', p), list.size());
        vocabs.push_back(positive(a, list.substr(p, q - p)));
        p = q + 1;
      }
    } else {
      usage_error("unknown argument '" + a + "'");
    }
  }
  if (device == Device::CUDA && cuda::device_count() == 0) {
    std::printf("bench_classifier: no CUDA device here; skipped\n");
    return 0;
  }
  std::printf(
      "bench_classifier on %s: ms for the loss and gradient of N x V logits (min / median / max of %d rounds); "
      "GB/s: the fused pass's bytes (logits read once, gradient written once) over the median\n\n",
      device == Device::CUDA ? "cuda" : "cpu", rounds);
  std::printf("| N x V | dtype | separate ms | fused ms | copy ms | separate / fused | fused GB/s | copy GB/s |\n");
  std::printf("|---|---|---:|---:|---:|---:|---:|---:|\n");
  for (const int64_t V : vocabs) {
    const int64_t N = rows > 0 ? rows : device == Device::CUDA ? 16384 : V > 4096 ? 1024 : 4096;
    if (!bf16_only) run_row<float>(device, N, V, rounds);
    run_row<bf16>(device, N, V, rounds);
  }
  return 0;
}

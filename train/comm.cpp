#include "train/comm.h"

#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "autograd/tensor.h"
#include "kernels/device.h"

#if TINYGPT_HAS_MPI
#include <mpi.h>
#endif

namespace tinygpt {

namespace {

/// The world size a launcher announced in the environment (OpenMPI, PMI/PMIx as Slurm's srun sets them); 1 when
/// this process was started on its own.
int launcher_world_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS"}) {
    if (const char* v = std::getenv(var); v != nullptr && *v != '\0') return std::max(1, std::atoi(v));
  }
  return 1;
}

class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  const char* backend() const override { return "none"; }
  void all_reduce_sum(float*, int64_t) override {}
  void all_reduce_sum(double*, int64_t) override {}
  void all_reduce_sum_gpu(float*, int64_t) override {}
  void start_all_reduce_sum(float*, int64_t) override {}
  void progress() override {}
  void wait_all() override {}
  int local_rank() const override { return 0; }
  void broadcast(void*, int64_t, int) override {}
  void barrier() override {}
  [[noreturn]] void abort(int code) override { std::exit(code); }
};

#if TINYGPT_HAS_MPI

void check(int status, const char* call) {
  if (status == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(status, text, &len);
  throw Error(fmt::format("{} failed: {}", call, std::string(text, size_t(len))));
}

class Mpi final : public Communicator {
 public:
  Mpi() {
    int provided = 0;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
    MPI_Comm node;  // the ranks that share this machine's memory
    check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
          "MPI_Comm_split_type");
    check(MPI_Comm_rank(node, &local_rank_), "MPI_Comm_rank");
    MPI_Comm_free(&node);
    // The started reductions' two phases each on a communicator of their own: MPI wants collectives in one order on
    // every rank, and a rank moves a reduction to its second phase whenever its first is done here.
    check(MPI_Comm_dup(MPI_COMM_WORLD, &scatter_comm_), "MPI_Comm_dup");
    check(MPI_Comm_dup(MPI_COMM_WORLD, &gather_comm_), "MPI_Comm_dup");
  }
  ~Mpi() override {
    MPI_Comm_free(&scatter_comm_);
    MPI_Comm_free(&gather_comm_);
    MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  const char* backend() const override { return "MPI"; }
  void all_reduce_sum(float* data, int64_t n) override { reduce(data, n, MPI_FLOAT); }
  void all_reduce_sum(double* data, int64_t n) override { reduce(data, n, MPI_DOUBLE); }
  void all_reduce_sum_gpu(float* data, int64_t n) override {
    if (!cuda::built_with_nccl()) {  // through host memory
      host_.resize(size_t(n));
      cuda::copy_to_host(host_.data(), data, size_t(n) * sizeof(float));
      reduce(host_.data(), n, MPI_FLOAT);
      cuda::copy_to_device(data, host_.data(), size_t(n) * sizeof(float));
      return;
    }
    if (!nccl_ready_) {  // rank 0 makes the communicator's id and hands it to the others over MPI
      cuda::NcclId id{};
      if (rank_ == 0) id = cuda::nccl_unique_id();
      broadcast(&id, sizeof(id), 0);
      cuda::nccl_init(id, rank_, size_);
      nccl_ready_ = true;
    }
    cuda::nccl_all_reduce_sum(data, n);
  }
  int local_rank() const override { return local_rank_; }

  void start_all_reduce_sum(float* data, int64_t n) override {
    Pending& p = pending_.emplace_back();
    p.data = data, p.n = n;
    plan(n, p.plan);
    p.parts.resize(size_t(p.plan.own) * size_t(size_));
    check(MPI_Ialltoallv(data, p.plan.counts.data(), p.plan.offsets.data(), MPI_FLOAT, p.parts.data(),
                         p.plan.mine.data(), p.plan.zeros.data(), MPI_FLOAT, scatter_comm_, &p.request),
          "MPI_Ialltoallv");
  }

  /// Moves the started reductions on in the order they were started, each from its scatter to its sum and gather,
  /// stopping at the first one still in flight (so the gathers, too, start in one order on every rank).
  void progress() override { advance(false); }
  void wait_all() override { advance(true); }
  void broadcast(void* data, int64_t bytes, int root) override {
    check(MPI_Bcast(data, int(bytes), MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
  }
  void barrier() override { check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::exit(code);
  }

 private:
  /// Rank i owns elements [begin(i), begin(i + 1)): every rank sends each owner its part (MPI_Alltoallv), the
  /// owner adds the parts in rank order, and MPI_Allgatherv hands every rank all the sums.
  /// Who sends what where: rank i owns elements [offsets[i], offsets[i] + counts[i]); every rank sends each owner
  /// its part, and the owner receives the ranks' parts as rows of (N, own).
  struct Plan {
    std::vector<int> counts, offsets, mine, zeros;
    int own = 0;
  };
  void plan(int64_t n, Plan& p) const {
    const int N = size_;
    auto begin = [&](int i) { return int(n * i / N); };
    const auto ranks = static_cast<size_t>(N);
    p.counts.resize(ranks), p.offsets.resize(ranks), p.mine.resize(ranks), p.zeros.resize(ranks);
    for (int i = 0; i < N; ++i) p.counts[size_t(i)] = begin(i + 1) - begin(i), p.offsets[size_t(i)] = begin(i);
    p.own = p.counts[size_t(rank_)];
    for (int i = 0; i < N; ++i) p.mine[size_t(i)] = p.own, p.zeros[size_t(i)] = i * p.own;
  }

  /// The owner's sums of its slice: the ranks' parts added in rank order.
  template <class T>
  void sum_parts(T* sum, const T* parts, int own) const {
    for (int e = 0; e < own; ++e) {
      T acc = parts[e];
      for (int i = 1; i < size_; ++i) acc += parts[size_t(i) * size_t(own) + size_t(e)];
      sum[e] = acc;
    }
  }

  /// The owner of each slice adds the ranks' contributions in rank order (MPI_Alltoallv, then the sum), and
  /// MPI_Allgatherv hands every rank all the sums.
  template <class T>
  void reduce(T* data, int64_t n, MPI_Datatype type) {
    Plan p;
    plan(n, p);
    recv_.resize(size_t(p.own) * size_t(size_) * sizeof(T));
    T* parts = reinterpret_cast<T*>(recv_.data());  // (N, own): rank i's contribution in row i
    check(MPI_Alltoallv(data, p.counts.data(), p.offsets.data(), type, parts, p.mine.data(), p.zeros.data(), type,
                        MPI_COMM_WORLD),
          "MPI_Alltoallv");
    sum_parts(data + p.offsets[size_t(rank_)], parts, p.own);
    check(MPI_Allgatherv(MPI_IN_PLACE, 0, type, data, p.counts.data(), p.offsets.data(), type, MPI_COMM_WORLD),
          "MPI_Allgatherv");
  }

  /// A started reduction: scattering (phase 0), then gathering (phase 1).
  struct Pending {
    float* data = nullptr;
    int64_t n = 0;
    Plan plan;
    std::vector<float> parts;
    MPI_Request request = MPI_REQUEST_NULL;
    int phase = 0;
  };

  void advance(bool wait) {
    while (!pending_.empty()) {
      Pending& p = pending_.front();
      int done = 0;
      if (wait) {
        check(MPI_Wait(&p.request, MPI_STATUS_IGNORE),
              p.phase == 0 ? "MPI_Wait (Ialltoallv)" : "MPI_Wait (Iallgatherv)");
        done = 1;
      } else {
        check(MPI_Test(&p.request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      }
      if (!done) return;
      if (p.phase == 1) {
        pending_.pop_front();
        continue;
      }
      sum_parts(p.data + p.plan.offsets[size_t(rank_)], p.parts.data(), p.plan.own);
      check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, p.data, p.plan.counts.data(), p.plan.offsets.data(), MPI_FLOAT,
                            gather_comm_, &p.request),
            "MPI_Iallgatherv");
      p.phase = 1;
    }
  }

  int rank_ = 0, size_ = 1, local_rank_ = 0;
  MPI_Comm scatter_comm_ = MPI_COMM_NULL, gather_comm_ = MPI_COMM_NULL;
  std::deque<Pending> pending_;  // started reductions, oldest first (references stay valid as it grows)
  std::vector<char> recv_;
  std::vector<float> host_;  // GPU buffers pass through here without NCCL
  bool nccl_ready_ = false;
};

#endif

}  // namespace

bool built_with_mpi() { return TINYGPT_HAS_MPI != 0; }

void end_job_on_error(const std::string& message) {
  if (launcher_world_size() <= 1 || !built_with_mpi()) return;
  Communicator& comm = communicator();
  fmt::print(stderr, "error: rank {} of {}: {}\n", comm.rank(), comm.world_size(), message);
  std::fflush(stderr);
  comm.abort(1);
}

Communicator& communicator() {
  static const std::unique_ptr<Communicator> comm = []() -> std::unique_ptr<Communicator> {
    const int world = launcher_world_size();
    if (world <= 1) return std::make_unique<SingleProcess>();
#if TINYGPT_HAS_MPI
    return std::make_unique<Mpi>();
#else
    throw Error(
        fmt::format("started as one of {} ranks, but this tinygpt was built without MPI, so every rank would "
                    "train the same thing alone; install libopenmpi-dev and rebuild (scripts/setup.sh, "
                    "scripts/build.sh), or start one process",
                    world));
#endif
  }();
  return *comm;
}

}  // namespace tinygpt

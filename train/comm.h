// Data-parallel communication behind one small interface, as llm.c keeps every MPI and NCCL call in one place:
// rank, world size, all-reduce of a contiguous buffer, broadcast, barrier, abort. The trainer talks only to
// this; no MPI call appears anywhere else.
//
// Backends: none (one process) and MPI (OpenMPI from Debian, when the build found it), with NCCL for buffers in GPU
// memory when the CUDA build found it (bootstrapped over MPI). A process started by mpirun or srun with more than
// one rank uses MPI; a binary built without MPI refuses to run as one of several ranks instead of letting N copies
// train the same thing.
#pragma once

#include <cstdint>
#include <string>

namespace tinygpt {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  /// "none" or "MPI".
  virtual const char* backend() const = 0;
  /// Sums `n` values over the ranks, in place on every rank, in a fixed order (rank 0 + rank 1 + ... for every
  /// element), so the same job repeats bit for bit: a reduce-scatter where the owner of each chunk adds the
  /// ranks' contributions in rank order, then an all-gather. MPI_Allreduce promises no order, so it is not used.
  virtual void all_reduce_sum(float* data, int64_t n) = 0;
  virtual void all_reduce_sum(double* data, int64_t n) = 0;
  /// all_reduce_sum of a host buffer without waiting for it (same order, same result): progress() moves the started
  /// reductions on, wait_all() finishes every one. The buffer is not to be touched until then. Every rank starts
  /// the same reductions in the same order. Without MPI, nothing to do.
  virtual void start_all_reduce_sum(float* data, int64_t n) = 0;
  virtual void progress() = 0;
  virtual void wait_all() = 0;
  /// The same for `n` floats in GPU memory, in the same order: over NCCL (set up on first use) when the build has
  /// it, otherwise through host memory over MPI.
  virtual void all_reduce_sum_gpu(float* data, int64_t n) = 0;
  /// This rank's index among the ranks on its machine: the GPU it takes.
  virtual int local_rank() const = 0;
  /// Copies `bytes` from rank `root` to every rank.
  virtual void broadcast(void* data, int64_t bytes, int root) = 0;
  virtual void barrier() = 0;
  /// Ends every rank of the job at once with `code` (after an error on this one, so that no rank waits forever
  /// on a peer that will not come).
  [[noreturn]] virtual void abort(int code) = 0;
};

/// This process's communicator, made on first use: MPI when started as one of several ranks (mpirun, srun),
/// otherwise none. Throws when started as one of several ranks by a binary built without MPI.
Communicator& communicator();

/// True when this binary was built with MPI support.
bool built_with_mpi();

/// After an error: when this process is one of several MPI ranks, prints "error: rank r of N: <message>" and
/// ends every rank of the job with a non-zero status (no rank is left waiting on this one). Returns otherwise.
void end_job_on_error(const std::string& message);

}  // namespace tinygpt

// The ranks of a run and what they exchange. A run started by mpirun (or Slurm's srun) has one
// process per rank; `world()` is their communicator, or a single rank when no launcher started the
// process. Everything here works on host memory (the CPU backend's buffers).
//
// Reductions are deterministic and the same bits on every rank: instead of MPI's own sum, whose
// order depends on the algorithm the library picks (and, for more than two ranks, need not be
// the same on every rank), each rank receives every rank's copy of its shard, adds them in rank
// order, and the shards are gathered back (engine/parallel/grad_reducer.h). Weights updated from
// such sums stay identical on every rank without a broadcast.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace remat::parallel {

/// An exchange in flight (0: none). Wait on it, or test it, exactly once.
struct Request {
  int64_t id = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// "MPI (Open MPI v4.1.4), 2 ranks" or "one rank (no launcher)".
  virtual std::string describe() const = 0;

  /// All to all: floats send[displs[q], displs[q] + counts[q]) go to rank q; rank q receives
  /// counts[q] floats from each rank p at recv + p * counts[q]. Non-blocking: the buffers and
  /// both vectors must stay as they are until the request is done.
  virtual Request start_exchange(const float* send, const std::vector<int>& counts,
                                 const std::vector<int>& displs, float* recv) = 0;
  /// All-gather in place: rank q's floats buf[displs[q], displs[q] + counts[q]) reach every rank.
  /// Non-blocking, with the same lifetime rule.
  virtual Request start_allgather(float* buf, const std::vector<int>& counts,
                                  const std::vector<int>& displs) = 0;
  /// True once `r` is done (then it is finished and reset); lets MPI progress.
  virtual bool test(Request& r) = 0;
  virtual void wait(Request& r) = 0;
  /// Point to point, non-blocking: `n_send` floats of `send` to rank `dest`, and `n_recv` floats
  /// from rank `src` into `recv` (a ring step). The buffers must stay as they are until it is done.
  virtual Request start_sendrecv(const float* send, int64_t n_send, int dest, float* recv,
                                 int64_t n_recv, int src) = 0;
  /// Blocking gather to `root`: each rank's `n` floats at `send` land at recv + displs[q] on the
  /// root (rank q's n is counts[q]); `recv`, `counts` and `displs` matter on the root only.
  virtual void gather(const float* send, int n, float* recv, const std::vector<int>& counts,
                      const std::vector<int>& displs, int root) = 0;
  /// Blocking: rank `root`'s `bytes` bytes at `data` reach every rank (NCCL's bootstrap id).
  virtual void broadcast(void* data, int64_t bytes, int root) = 0;
  /// The ranks of this communicator with the same `color`, ordered by `key` (MPI_Comm_split).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  /// Blocking: every rank's `n` doubles, rank 0's first (all.size() == size() * n).
  virtual std::vector<double> allgather(const double* mine, int n) = 0;
  virtual void barrier() = 0;
  /// Stops every rank of the job with exit code `code` (the launcher propagates it).
  [[noreturn]] virtual void abort(int code) = 0;
  /// How long one wait of this communicator (and of the ones split from it later) may last before
  /// the job is aborted with a line naming the exchange (parallel.timeout): a rank stopped or hung
  /// would otherwise leave the others waiting forever. 0: forever (the default).
  virtual void set_timeout(double seconds) { (void)seconds; }
};

/// Sums `values` over the ranks in rank order: the same bits on every rank.
std::vector<double> sum_over_ranks(Communicator& comm, const std::vector<double>& values);

/// The job's ranks as the launcher set them in the environment (Open MPI, MPICH/PMI, Slurm,
/// PMIx), before MPI is initialised: 1 when no launcher started this process.
int launched_ranks();

/// How many ranks of the job run on this node, as the launcher set it (1 without one).
int local_ranks();

/// This process's rank among those of its node, as the launcher set it (0 without one): which
/// of the node's GPUs it drives.
int local_rank();

/// Initialises MPI when a launcher started the process (once; later calls return the same).
/// Throws ConfigError when mpirun started several ranks of a build without MPI.
Communicator& init_world();
/// The communicator init_world() made, or a single rank if it was never called.
Communicator& world();
/// Finalises MPI if init_world() initialised it (main's normal exit).
void finalize_world();

/// A communicator of one rank: what a run without a launcher gets.
std::unique_ptr<Communicator> make_single_rank();
/// Implemented in mpi/mpi_communicator.cpp (or mpi/no_mpi.cpp in a build without MPI): nullptr
/// when this build has no MPI.
std::unique_ptr<Communicator> make_mpi_world();
bool mpi_is_built();
/// "Open MPI v4.1.4" (callable before MPI is initialised), or "built without MPI".
std::string mpi_library();

}  // namespace remat::parallel

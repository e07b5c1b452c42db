// Ranks and the world communicator (see engine/parallel/communicator.h).
#include "engine/parallel/communicator.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "engine/core/error.h"

namespace remat::parallel {

namespace {

class SingleRank final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string describe() const override { return "one rank (no launcher)"; }
  Request start_exchange(const float* send, const std::vector<int>& counts,
                         const std::vector<int>& displs, float* recv) override {
    std::copy_n(send + displs[0], counts[0], recv);
    return {};
  }
  Request start_allgather(float*, const std::vector<int>&, const std::vector<int>&) override {
    return {};
  }
  bool test(Request& r) override {
    r = {};
    return true;
  }
  void wait(Request& r) override { r = {}; }
  Request start_sendrecv(const float* send, int64_t n_send, int, float* recv, int64_t,
                         int) override {
    std::copy_n(send, n_send, recv);
    return {};
  }
  std::unique_ptr<Communicator> split(int, int) override { return std::make_unique<SingleRank>(); }
  void gather(const float* send, int n, float* recv, const std::vector<int>&,
              const std::vector<int>& displs, int) override {
    std::copy_n(send, n, recv + displs[0]);
  }
  void broadcast(void*, int64_t, int) override {}
  std::vector<double> allgather(const double* mine, int n) override {
    return std::vector<double>(mine, mine + n);
  }
  void barrier() override {}
  [[noreturn]] void abort(int code) override { std::exit(code); }
};

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  int n = 0;
  const auto [end, ec] = std::from_chars(v, v + std::strlen(v), n);
  return ec == std::errc() && *end == '\0' ? n : 0;
}

std::unique_ptr<Communicator>& world_slot() {
  static std::unique_ptr<Communicator> w;
  return w;
}

}  // namespace

std::unique_ptr<Communicator> make_single_rank() {
  return std::make_unique<SingleRank>();
}

std::vector<double> sum_over_ranks(Communicator& comm, const std::vector<double>& values) {
  const int n = static_cast<int>(values.size());
  const std::vector<double> all = comm.allgather(values.data(), n);
  std::vector<double> sum(values.size(), 0.0);
  for (int r = 0; r < comm.size(); ++r)
    for (int i = 0; i < n; ++i) sum[static_cast<size_t>(i)] += all[static_cast<size_t>(r * n + i)];
  return sum;
}

int launched_ranks() {
  // Open MPI's mpirun, then MPICH/Intel MPI and Slurm's PMI-2, then Slurm's own count (srun with
  // PMIx sets PMIX_RANK and SLURM_NTASKS).
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const int n = env_int(name); n > 0) return n;
  if (std::getenv("PMIX_RANK"))
    if (const int n = env_int("SLURM_NTASKS"); n > 0) return n;
  return 1;
}

int local_ranks() {
  for (const char* name :
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (const int n = env_int(name); n > 0) return n;
  return 1;
}

int local_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* v = std::getenv(name); v && *v) return env_int(name);
  return 0;
}

Communicator& init_world() {
  auto& w = world_slot();
  if (w) return *w;
  const bool launched = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") ||
                        std::getenv("PMIX_RANK") || std::getenv("PMI_RANK");
  if (launched) w = make_mpi_world();
  if (!w && launched_ranks() > 1)
    throw ConfigError(fmt::format(
        "[parallel] a launcher started {} ranks, but this remat-train was built without MPI. "
        "Fix: install libopenmpi-dev (scripts/install-deps.sh) and rebuild, or run one rank",
        launched_ranks()));
  if (!w) w = make_single_rank();
  return *w;
}

Communicator& world() {
  auto& w = world_slot();
  if (!w) w = make_single_rank();
  return *w;
}

}  // namespace remat::parallel

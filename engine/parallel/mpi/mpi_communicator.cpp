// The world communicator over MPI (see engine/parallel/communicator.h). Compiled when CMake finds
// MPI; mpi/no_mpi.cpp stands in otherwise.
// The C API only: Open MPI's and MPICH's mpi.h pull in their deprecated C++ bindings otherwise.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <fmt/format.h>
#include <mpi.h>

#include <cstdio>
#include <map>

#include "engine/error.h"
#include "engine/parallel/communicator.h"

namespace remat::parallel {

namespace {

bool g_initialised = false;

class MpiWorld final : public Communicator {
 public:
  MpiWorld() {
    // One thread calls MPI (the trainer's); OpenMP threads never do.
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    g_initialised = true;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    int len = 0;
    MPI_Get_library_version(version, &len);
    library_ = std::string(version, static_cast<size_t>(len));
    if (const auto comma = library_.find(','); comma != std::string::npos)
      library_.resize(comma);  // "Open MPI v4.1.4, package: ..." -> "Open MPI v4.1.4"
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override {
    return fmt::format("MPI ({}), {} rank{}", library_, size_, size_ == 1 ? "" : "s");
  }

  Request start_exchange(const float* send, const std::vector<int>& counts,
                         const std::vector<int>& displs, float* recv) override {
    const int mine = counts[static_cast<size_t>(rank_)];
    auto& [rc, rd] = recv_layout_[next_id_];
    rc.assign(static_cast<size_t>(size_), mine);
    rd.resize(static_cast<size_t>(size_));
    for (int p = 0; p < size_; ++p) rd[static_cast<size_t>(p)] = p * mine;
    MPI_Request req;
    MPI_Ialltoallv(send, counts.data(), displs.data(), MPI_FLOAT, recv, rc.data(), rd.data(),
                   MPI_FLOAT, MPI_COMM_WORLD, &req);
    return remember(req);
  }
  Request start_allgather(float* buf, const std::vector<int>& counts,
                          const std::vector<int>& displs) override {
    MPI_Request req;
    MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts.data(), displs.data(),
                    MPI_FLOAT, MPI_COMM_WORLD, &req);
    return remember(req);
  }
  bool test(Request& r) override {
    if (r.id == 0) return true;
    int done = 0;
    MPI_Test(&requests_.at(r.id), &done, MPI_STATUS_IGNORE);
    if (done) forget(r);
    return done != 0;
  }
  void wait(Request& r) override {
    if (r.id == 0) return;
    MPI_Wait(&requests_.at(r.id), MPI_STATUS_IGNORE);
    forget(r);
  }
  std::vector<double> allgather(const double* mine, int n) override {
    std::vector<double> all(static_cast<size_t>(size_) * static_cast<size_t>(n));
    MPI_Allgather(mine, n, MPI_DOUBLE, all.data(), n, MPI_DOUBLE, MPI_COMM_WORLD);
    return all;
  }
  void barrier() override { MPI_Barrier(MPI_COMM_WORLD); }
  [[noreturn]] void abort(int code) override {
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; this keeps the compiler sure of it
  }

 private:
  Request remember(MPI_Request req) {
    const int64_t id = next_id_++;
    requests_[id] = req;
    return {id};
  }
  void forget(Request& r) {
    requests_.erase(r.id);
    recv_layout_.erase(r.id);
    r = {};
  }
  int rank_ = 0, size_ = 1;
  std::string library_;
  int64_t next_id_ = 1;
  std::map<int64_t, MPI_Request> requests_;
  // An exchange's receive counts and displacements, alive until it is done (MPI reads them late).
  std::map<int64_t, std::pair<std::vector<int>, std::vector<int>>> recv_layout_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_world() {
  return std::make_unique<MpiWorld>();
}
bool mpi_is_built() {
  return true;
}

void finalize_world() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (g_initialised && !finalized) MPI_Finalize();
}

}  // namespace remat::parallel

// The world communicator over MPI (see engine/parallel/communicator.h). Compiled when CMake finds
// MPI; mpi/no_mpi.cpp stands in otherwise.
// The C API only: Open MPI's and MPICH's mpi.h pull in their deprecated C++ bindings otherwise.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <fmt/format.h>
#include <mpi.h>
#include <sched.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <vector>

#include "engine/core/error.h"
#include "engine/parallel/communicator.h"

namespace remat::parallel {

namespace {

bool g_initialised = false;

std::string library_version() {
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(version, &len);
  std::string v(version, static_cast<size_t>(len));
  if (const auto comma = v.find(','); comma != std::string::npos)
    v.resize(comma);  // "Open MPI v4.1.4, package: ..." -> "Open MPI v4.1.4"
  return v;
}

int mpi_count(int64_t n) {
  REMAT_ASSERT(n >= 0 && n <= INT32_MAX,
               "MPI message of {} floats exceeds MPI's int count; split it", n);
  return static_cast<int>(n);
}

class MpiComm final : public Communicator {
 public:
  /// Over `comm` (MPI_COMM_WORLD, or a split of it, freed with this object).
  explicit MpiComm(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    library_ = library_version();
  }
  ~MpiComm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm_ != MPI_COMM_WORLD && !finalized) MPI_Comm_free(&comm_);
  }
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override {
    return fmt::format("MPI ({}), {} rank{}", library_, size_, size_ == 1 ? "" : "s");
  }

  void set_timeout(double seconds) override { timeout_s_ = seconds; }

  Request start_exchange(const float* send, const std::vector<int>& counts,
                         const std::vector<int>& displs, float* recv) override {
    const int mine = counts[static_cast<size_t>(rank_)];
    auto& [rc, rd] = recv_layout_[next_id_];
    rc.assign(static_cast<size_t>(size_), mine);
    rd.resize(static_cast<size_t>(size_));
    for (int p = 0; p < size_; ++p) rd[static_cast<size_t>(p)] = p * mine;
    std::vector<MPI_Request> req(1);
    MPI_Ialltoallv(send, counts.data(), displs.data(), MPI_FLOAT, recv, rc.data(), rd.data(),
                   MPI_FLOAT, comm_, &req[0]);
    return remember(std::move(req), "an all-to-all exchange (the gradients' reduction)");
  }
  Request start_allgather(float* buf, const std::vector<int>& counts,
                          const std::vector<int>& displs) override {
    std::vector<MPI_Request> req(1);
    MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts.data(), displs.data(),
                    MPI_FLOAT, comm_, &req[0]);
    return remember(std::move(req), "an all-gather (the reduced gradients or updated weights)");
  }
  Request start_sendrecv(const float* send, int64_t n_send, int dest, float* recv, int64_t n_recv,
                         int src) override {
    std::vector<MPI_Request> req(2);
    MPI_Irecv(recv, mpi_count(n_recv), MPI_FLOAT, src, kRingTag, comm_, &req[0]);
    MPI_Isend(send, mpi_count(n_send), MPI_FLOAT, dest, kRingTag, comm_, &req[1]);
    return remember(std::move(req),
                    fmt::format("a ring step with ranks {} and {} (context-parallel "
                                "attention)",
                                src, dest));
  }
  void gather(const float* send, int n, float* recv, const std::vector<int>& counts,
              const std::vector<int>& displs, int root) override {
    std::vector<MPI_Request> req(1);
    MPI_Igatherv(send, n, MPI_FLOAT, recv, counts.data(), displs.data(), MPI_FLOAT, root, comm_,
                 &req[0]);
    wait_all(req, fmt::format("a gather to rank {}", root));
  }
  void broadcast(void* data, int64_t bytes, int root) override {
    std::vector<MPI_Request> req(1);
    MPI_Ibcast(data, mpi_count(bytes), MPI_BYTE, root, comm_, &req[0]);
    wait_all(req, fmt::format("a broadcast from rank {}", root));
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm sub;
    MPI_Comm_split(comm_, color, key, &sub);
    auto part = std::make_unique<MpiComm>(sub);
    part->set_timeout(timeout_s_);
    return part;
  }
  bool test(Request& r) override {
    if (r.id == 0) return true;
    int done = 0;
    auto& reqs = requests_.at(r.id);
    MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
    if (done) forget(r);
    return done != 0;
  }
  void wait(Request& r) override {
    if (r.id == 0) return;
    wait_all(requests_.at(r.id), names_.at(r.id));
    forget(r);
  }
  std::vector<double> allgather(const double* mine, int n) override {
    std::vector<double> all(static_cast<size_t>(size_) * static_cast<size_t>(n));
    std::vector<MPI_Request> req(1);
    MPI_Iallgather(mine, n, MPI_DOUBLE, all.data(), n, MPI_DOUBLE, comm_, &req[0]);
    wait_all(req, "an all-gather of the step's statistics (loss, norms, stop)");
    return all;
  }
  void barrier() override {
    std::vector<MPI_Request> req(1);
    MPI_Ibarrier(comm_, &req[0]);
    wait_all(req, "a barrier");
  }
  [[noreturn]] void abort(int code) override {
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; this keeps the compiler sure of it
  }

 private:
  static constexpr int kRingTag = 17;
  Request remember(std::vector<MPI_Request> req, std::string what) {
    const int64_t id = next_id_++;
    requests_[id] = std::move(req);
    names_[id] = std::move(what);
    return {id};
  }
  void forget(Request& r) {
    requests_.erase(r.id);
    names_.erase(r.id);
    recv_layout_.erase(r.id);
    r = {};
  }
  // MPI_Waitall with a deadline: polls as Open MPI's wait does (yielding the core once the wait
  // is long), and past parallel.timeout aborts the job naming the exchange, since the ranks it
  // waits for will not come (stopped, hung, lost).
  void wait_all(std::vector<MPI_Request>& reqs, const std::string& what) {
    const int n = static_cast<int>(reqs.size());
    if (timeout_s_ <= 0) {
      MPI_Waitall(n, reqs.data(), MPI_STATUSES_IGNORE);
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      int done = 0;
      MPI_Testall(n, reqs.data(), &done, MPI_STATUSES_IGNORE);
      if (done) return;
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > timeout_s_) {
        int world_rank = 0, world_size = 1;  // a split's own numbering would mislead
        MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
        MPI_Comm_size(MPI_COMM_WORLD, &world_size);
        fmt::print(stderr,
                   "error: [parallel] rank {} of {} waited {:.0f} s for the other ranks at {}: "
                   "one of them stopped or hung (a stopped process, a debugger, a stuck "
                   "file system), so the job is aborted. Fix: find the rank that stopped; if a "
                   "step keeps ranks that far apart on purpose, raise parallel.timeout (0 waits "
                   "forever)\n",
                   world_rank, world_size, waited, what);
        abort(1);
      }
      if (waited > 0.05) sched_yield();
    }
  }
  double timeout_s_ = 0;
  std::map<int64_t, std::string> names_;  // each request's exchange, for the timeout's message
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::string library_;
  int64_t next_id_ = 1;
  std::map<int64_t, std::vector<MPI_Request>> requests_;
  // An exchange's receive counts and displacements, alive until it is done (MPI reads them late).
  std::map<int64_t, std::pair<std::vector<int>, std::vector<int>>> recv_layout_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_world() {
  // One thread calls MPI (the trainer's); OpenMP threads never do.
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  g_initialised = true;
  return std::make_unique<MpiComm>(MPI_COMM_WORLD);
}
bool mpi_is_built() {
  return true;
}
std::string mpi_library() {
  return library_version();
}

void finalize_world() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (g_initialised && !finalized) MPI_Finalize();
}

}  // namespace remat::parallel

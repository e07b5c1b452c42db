// A build without MPI (CMake found none): one rank only (see engine/parallel/communicator.h).
#include "engine/parallel/communicator.h"

namespace remat::parallel {

std::unique_ptr<Communicator> make_mpi_world() {
  return nullptr;
}
bool mpi_is_built() {
  return false;
}
std::string mpi_library() {
  return "built without MPI";
}
void finalize_world() {}

}  // namespace remat::parallel

// Out-of-line part of engine/core/error.h: the abort path of REMAT_ASSERT.
#include "engine/core/error.h"

#include <cstdio>
#include <cstdlib>

namespace remat::detail {

void assert_fail(const char* file, int line, const char* cond, const std::string& msg) {
  std::fprintf(stderr, "%s:%d: REMAT_ASSERT(%s) failed: %s\n", file, line, cond, msg.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace remat::detail

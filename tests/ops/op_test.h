// What every op test (tests/ops/test_<op>.cpp) includes: the shared helpers and tolerances
// (tests/test_util.h) and, in the gpu test binary (REMAT_TEST_CUDA_ROWS), the CUDA rows' fixture
// (tests/ops/backend_rows.h).
#pragma once

#include <cstring>
#include <numbers>
#include <tuple>

#include "tests/test_util.h"
#if REMAT_TEST_CUDA_ROWS
#include "tests/ops/backend_rows.h"
#endif

namespace remat::test {

/// The backend the CPU sections test: the specification every other backend is checked against.
using cpu::CpuBackend;

}  // namespace remat::test

// What the planner tests share: a run made of the real model and synthetic data, and a planner
// for the CPU with a given thread count and budget.
#pragma once

#include <cstdint>

#include "data/synthetic.h"
#include "engine/planner/planner.h"
#include "layers/models.h"

namespace remat::test {

inline RunParts synthetic_run_parts(const Config& c, Backend& be) {
  return RunParts{make_model(c, be), make_synthetic_data(c)};
}

inline Planner cpu_test_planner(int threads, uint64_t budget) {
  PlanTarget t;
  t.name = "cpu";
  t.count = CountTarget{DeviceKind::Cpu, DType::F32, threads};
  t.device_bytes = budget;
  return Planner(t, synthetic_run_parts);
}

}  // namespace remat::test

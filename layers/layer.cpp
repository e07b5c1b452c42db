// Parameter creation: pool allocation of value, gradient and optimizer moments, and
// initialization from a counter-based RNG keyed by (seed, parameter name).
#include "layers/layer.h"

#include "engine/core/error.h"
#include "engine/core/nf4.h"
#include "engine/core/rng.h"

namespace remat {

Param make_param(Backend& be, const std::string& name, const std::vector<int64_t>& shape,
                 ParamInit init, uint64_t seed, MomentHome moments, bool on_host, bool frozen,
                 DType dtype) {
  REMAT_ASSERT(!on_host || moments == MomentHome::Host, "{}: weights on the host, moments not",
               name);
  REMAT_ASSERT(dtype == DType::F32 || frozen, "{}: a {} weight must be frozen", name,
               dtype_name(dtype));
  if (frozen) on_host = false;  // read by every step, never updated: it stays on the device
  const bool moments_on_host = moments == MomentHome::Host;
  MemoryPool& pool = on_host ? be.host_pool() : be.pool();
  // Zeros and ones in whichever pool the tensor is in (a host-pool tensor is filled on the host).
  auto fill = [&](const Buffer& t, bool host, float value) {
    if (host)
      be.fill_host(t, value);
    else
      be.fill(t, value);
  };
  Param p;
  p.name = name;
  p.value = pool.allocate(shape, dtype, MemCategory::Weights, name);
  p.frozen = frozen;
  if (!frozen) {
    p.grad = pool.allocate(shape, DType::F32, MemCategory::Grads, name + ".grad");
    p.moments_on_host = moments_on_host;
    p.on_host = on_host;
    p.use_decay = shape.size() >= 2;
    fill(p.grad, on_host, 0.0f);
  }
  if (!frozen && moments != MomentHome::Sharded) {
    MemoryPool& home = moments_on_host ? be.host_pool() : be.pool();
    p.m = home.allocate(shape, DType::F32, MemCategory::Optimizer, name + ".adam_m");
    p.v = home.allocate(shape, DType::F32, MemCategory::Optimizer, name + ".adam_v");
    for (const Buffer* moment : {&p.m, &p.v}) fill(*moment, moments_on_host, 0.0f);
  }
  const bool drawn = init.kind == ParamInit::Normal || init.kind == ParamInit::Uniform;
  if (drawn || dtype != DType::F32) {
    if (be.computes()) {  // a dry run needs no values
      const int64_t n = p.value.tensor().numel();
      std::vector<float> host(static_cast<size_t>(n), init.kind == ParamInit::Ones ? 1.0f : 0.0f);
      const uint64_t stream = hash_name(name.c_str());
      const bool normal = init.kind == ParamInit::Normal;
      // Element i depends only on (seed, stream, i): any split over threads gives the same bits.
      // One thread took 3.6 s for GPT-2 124M (a log, a sqrt and a cos per element), 10 s for 350M.
#pragma omp parallel for schedule(static) if (drawn && n >= (int64_t{1} << 16))
      for (int64_t i = 0; i < (drawn ? n : 0); ++i) {
        const auto u = static_cast<uint64_t>(i);
        host[static_cast<size_t>(i)] =
            static_cast<float>(normal ? init.std * rng_normal(seed, stream, u)
                                      : init.std * (2.0 * rng_uniform(seed, stream, u) - 1.0));
      }
      upload_weight(be, p.value, host.data());
    }
  } else {
    fill(p.value, on_host, init.kind == ParamInit::Ones ? 1.0f : 0.0f);
  }
  return p;
}

}  // namespace remat

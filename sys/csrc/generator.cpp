// The state of a device's default random generator (`torch.get_rng_state()` /
// `torch.set_rng_state()`), which the Trainer saves in a checkpoint so that a resumed run
// draws the same dropout masks; tch 0.26 does not expose it. Also draws from a fresh CPU
// generator of a given seed (`torch.Generator().manual_seed(seed)`), which APOLLO's random
// projections use and tch cannot express (its ops take no generator).
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>

#include <cstdint>

#include <mutex>

#include "guard.h"

namespace {

// The default generator of the CPU (device 0) or of CUDA device `index` (device 1).
at::Generator default_generator(int device, int index) {
  return device == 1
      ? at::globalContext().defaultGenerator(c10::Device(c10::DeviceType::CUDA, index))
      : at::globalContext().defaultGenerator(c10::Device(c10::DeviceType::CPU));
}

}  // namespace

extern "C" {

// `torch.get_rng_state()` (device 0) / `torch.cuda.get_rng_state(index)` (device 1): a new
// uint8 tensor holding the default generator's state.
char* tchtrain_get_rng_state(int device, int index, at::Tensor** out) {
  return tchtrain::guarded([&] {
    at::Generator g = default_generator(device, index);
    std::lock_guard<std::mutex> lock(g.mutex());
    *out = new at::Tensor(g.get_state());
  });
}

// `torch.set_rng_state(state)` / `torch.cuda.set_rng_state(state, index)`.
char* tchtrain_set_rng_state(int device, int index, const at::Tensor* state) {
  return tchtrain::guarded([&] {
    at::Generator g = default_generator(device, index);
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(*state);
  });
}

// `torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)`:
// a new float32 CPU tensor of `ndim` dimensions `shape`, drawn from a fresh generator.
char* tchtrain_randn_seeded(uint64_t seed, const int64_t* shape, size_t ndim, at::Tensor** out) {
  return tchtrain::guarded([&] {
    at::Generator g = at::detail::createCPUGenerator(seed);
    *out = new at::Tensor(
        at::randn(at::IntArrayRef(shape, ndim), g, at::TensorOptions().dtype(at::kFloat)));
  });
}

// `torch.randint(low, high, (n,), generator=torch.Generator().manual_seed(seed))`: a new int64
// CPU tensor drawn from a fresh generator.
char* tchtrain_randint_seeded(uint64_t seed, int64_t low, int64_t high, int64_t n, at::Tensor** out) {
  return tchtrain::guarded([&] {
    at::Generator g = at::detail::createCPUGenerator(seed);
    *out = new at::Tensor(at::randint(low, high, {n}, g, at::TensorOptions().dtype(at::kLong)));
  });
}

}  // extern "C"

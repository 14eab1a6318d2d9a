// The state of a device's default random generator (`torch.get_rng_state()` /
// `torch.set_rng_state()`), which the Trainer saves in a checkpoint so that a resumed run
// draws the same dropout masks; tch 0.26 does not expose it.
#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

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

}  // extern "C"

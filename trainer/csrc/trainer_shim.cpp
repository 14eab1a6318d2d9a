// C boundary between tchtrain-trainer (Rust) and two pieces of libtorch state that tch 0.26
// does not expose: autocast for a given device type (tch's `autocast` only drives the CUDA
// one, through the deprecated `at::autocast::set_enabled`), and the state of a device's
// default random generator (`torch.get_rng_state()` / `torch.set_rng_state()`, which the
// Trainer saves in a checkpoint so that a resumed run draws the same dropout masks).
//
// Every function returns nullptr on success or a heap-allocated error message (free it with
// `tchtrain_trainer_free_error`); no C++ exception crosses this boundary.
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>

namespace {

char* error_message(const char* what) {
  size_t n = std::strlen(what);
  char* out = static_cast<char*>(std::malloc(n + 1));
  if (out != nullptr) {
    std::memcpy(out, what, n + 1);
  }
  return out;
}

template <typename F>
char* guarded(F&& f) {
  try {
    f();
    return nullptr;
  } catch (const std::exception& e) {
    return error_message(e.what());
  } catch (...) {
    return error_message("unknown C++ exception");
  }
}

c10::DeviceType device_type(int device) {
  return device == 1 ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
}

}  // namespace

extern "C" {

void tchtrain_trainer_free_error(char* err) { std::free(err); }

// `torch.autocast(device_type, dtype).__enter__()`: remembers the previous enabled flag,
// dtype and cache flag in the out-parameters, enables autocast with `dtype` (a
// c10::ScalarType), bumps the nesting and turns the weight-cast cache on.
char* tchtrain_trainer_autocast_enter(int device, int dtype, bool* prev_enabled,
                                      int* prev_dtype, bool* prev_cache) {
  return guarded([&] {
    auto dev = device_type(device);
    *prev_cache = at::autocast::is_autocast_cache_enabled();
    *prev_enabled = at::autocast::is_autocast_enabled(dev);
    *prev_dtype = static_cast<int>(at::autocast::get_autocast_dtype(dev));
    at::autocast::set_autocast_enabled(dev, true);
    at::autocast::set_autocast_dtype(dev, static_cast<at::ScalarType>(dtype));
    at::autocast::increment_nesting();
    at::autocast::set_autocast_cache_enabled(true);
  });
}

// `torch.autocast.__exit__`: clears the cast cache when leaving the outermost region and
// restores what `tchtrain_trainer_autocast_enter` returned.
char* tchtrain_trainer_autocast_exit(int device, bool prev_enabled, int prev_dtype,
                                     bool prev_cache) {
  return guarded([&] {
    auto dev = device_type(device);
    if (at::autocast::decrement_nesting() == 0) {
      at::autocast::clear_cache();
    }
    at::autocast::set_autocast_enabled(dev, prev_enabled);
    at::autocast::set_autocast_dtype(dev, static_cast<at::ScalarType>(prev_dtype));
    at::autocast::set_autocast_cache_enabled(prev_cache);
  });
}

// `torch.get_rng_state()` (device 0) / `torch.cuda.get_rng_state(index)` (device 1): a new
// uint8 tensor holding the default generator's state.
char* tchtrain_trainer_get_rng_state(int device, int index, at::Tensor** out) {
  return guarded([&] {
    const at::Generator& gen = device == 1
        ? at::globalContext().defaultGenerator(c10::Device(c10::DeviceType::CUDA, index))
        : at::globalContext().defaultGenerator(c10::Device(c10::DeviceType::CPU));
    at::Generator g = gen;
    std::lock_guard<std::mutex> lock(g.mutex());
    *out = new at::Tensor(g.get_state());
  });
}

// `torch.set_rng_state(state)` / `torch.cuda.set_rng_state(state, index)`.
char* tchtrain_trainer_set_rng_state(int device, int index, const at::Tensor* state) {
  return guarded([&] {
    const at::Generator& gen = device == 1
        ? at::globalContext().defaultGenerator(c10::Device(c10::DeviceType::CUDA, index))
        : at::globalContext().defaultGenerator(c10::Device(c10::DeviceType::CPU));
    at::Generator g = gen;
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(*state);
  });
}

}  // extern "C"

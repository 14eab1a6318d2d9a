// Autocast for a given device type: tch 0.26's `autocast` only drives the CUDA one, through
// the deprecated `at::autocast::set_enabled`. accelerate enters `torch.autocast(device_type,
// dtype)` around the model's forward; these are its `__enter__` and `__exit__`.
#include <ATen/autocast_mode.h>

#include "guard.h"

extern "C" {

// `torch.autocast(device_type, dtype).__enter__()`: remembers the previous enabled flag,
// dtype and cache flag in the out-parameters, enables autocast with `dtype` (a
// c10::ScalarType), bumps the nesting and turns the weight-cast cache on.
char* tchtrain_autocast_enter(int device, int dtype, bool* prev_enabled,
                                      int* prev_dtype, bool* prev_cache) {
  return tchtrain::guarded([&] {
    auto dev = tchtrain::device_type(device);
    *prev_cache = at::autocast::is_autocast_cache_enabled();
    *prev_enabled = at::autocast::is_autocast_enabled(dev);
    *prev_dtype = static_cast<int>(at::autocast::get_autocast_dtype(dev));
    at::autocast::set_autocast_enabled(dev, true);
    at::autocast::set_autocast_dtype(dev, static_cast<at::ScalarType>(dtype));
    at::autocast::increment_nesting();
    at::autocast::set_autocast_cache_enabled(true);
  });
}

// `torch.autocast(device_type, enabled=False).__enter__()`: as `tchtrain_autocast_enter`, with
// autocast turned off (its dtype kept) inside the region.
char* tchtrain_autocast_enter_disabled(int device, bool* prev_enabled, int* prev_dtype,
                                               bool* prev_cache) {
  return tchtrain::guarded([&] {
    auto dev = tchtrain::device_type(device);
    *prev_cache = at::autocast::is_autocast_cache_enabled();
    *prev_enabled = at::autocast::is_autocast_enabled(dev);
    *prev_dtype = static_cast<int>(at::autocast::get_autocast_dtype(dev));
    at::autocast::set_autocast_enabled(dev, false);
    at::autocast::increment_nesting();
    at::autocast::set_autocast_cache_enabled(true);
  });
}

// `torch.autocast.__exit__`: clears the cast cache when leaving the outermost region and
// restores what `tchtrain_autocast_enter` returned.
char* tchtrain_autocast_exit(int device, bool prev_enabled, int prev_dtype,
                                     bool prev_cache) {
  return tchtrain::guarded([&] {
    auto dev = tchtrain::device_type(device);
    if (at::autocast::decrement_nesting() == 0) {
      at::autocast::clear_cache();
    }
    at::autocast::set_autocast_enabled(dev, prev_enabled);
    at::autocast::set_autocast_dtype(dev, static_cast<at::ScalarType>(prev_dtype));
    at::autocast::set_autocast_cache_enabled(prev_cache);
  });
}

}  // extern "C"

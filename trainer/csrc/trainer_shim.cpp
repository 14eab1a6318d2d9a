// C boundary between tchtrain-trainer (Rust) and two pieces of libtorch state that tch 0.26
// does not expose: autocast for a given device type (tch's `autocast` only drives the CUDA
// one, through the deprecated `at::autocast::set_enabled`), and the state of a device's
// default random generator (`torch.get_rng_state()` / `torch.set_rng_state()`, which the
// Trainer saves in a checkpoint so that a resumed run draws the same dropout masks), plus a
// gradient boundary: an identity op whose backward calls back into Rust (ZeRO-3's per-layer
// gathering).
//
// Every function returns nullptr on success or a heap-allocated error message (free it with
// `tchtrain_trainer_free_error`); no C++ exception crosses this boundary.
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <stdexcept>

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

// A Rust function the backward of a gradient boundary calls with its token: 0 when the action
// succeeded, anything else when it failed (the Rust side keeps the error).
typedef int (*boundary_fn)(uint64_t token);

// Identity in the forward; its backward first runs the action registered under `token`, then
// passes the gradient through unchanged. ZeRO-3 puts one on the hidden states entering and
// leaving each layer: the one on a layer's output fires just before that layer's backward (to
// gather its parameters again), the one on its input just after (to reduce its gradients and
// release it), as DeepSpeed's pre- and post-backward module hooks.
struct GradBoundary : public torch::autograd::Function<GradBoundary> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            int64_t token, int64_t fn) {
    ctx->saved_data["token"] = token;
    ctx->saved_data["fn"] = fn;
    return x.view_as(x);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto token = static_cast<uint64_t>(ctx->saved_data["token"].toInt());
    auto fn = reinterpret_cast<boundary_fn>(ctx->saved_data["fn"].toInt());
    if (fn(token) != 0) {
      throw std::runtime_error(
          "a gradient boundary's action failed (the Trainer reports the cause)");
    }
    return {grads[0], at::Tensor(), at::Tensor()};
  }
};

}  // namespace

extern "C" {

// `x` behind a GradBoundary whose backward calls `fn(token)`: a new tensor in `*out`.
char* tchtrain_trainer_grad_boundary(const at::Tensor* x, uint64_t token, boundary_fn fn,
                                     at::Tensor** out) {
  return guarded([&] {
    *out = new at::Tensor(GradBoundary::apply(*x, static_cast<int64_t>(token),
                                              reinterpret_cast<int64_t>(fn)));
  });
}

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

// Activation checkpointing (`torch.utils.checkpoint.checkpoint(layer, hidden_states)`, as
// transformers' `GradientCheckpointingLayer` calls it): the layer runs without keeping its
// activations; its backward runs the layer again on the saved input, with the default
// generators' states of the forward replayed (so dropout draws the same masks) and the
// autocast state of the forward restored, then backpropagates through the recomputed graph.
// The layer is a Rust closure reached through two function pointers; the autograd node owns it
// (a capsule in its saved data) and frees it with the graph. tch 0.26 has no custom autograd.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <mutex>
#include <stdexcept>

#include "guard.h"

namespace {

// Runs the layer on `input`: 0 and a new tensor in `*out`, or non-zero (the Rust side logs why).
typedef int (*layer_fn)(void* layer, const at::Tensor* input, at::Tensor** out);
// Frees the closure.
typedef void (*drop_fn)(void* layer);

// Owns the Rust closure for as long as the autograd node that may recompute it.
struct Layer : torch::CustomClassHolder {
  Layer(void* layer, layer_fn run, drop_fn drop) : layer(layer), run(run), drop(drop) {}
  ~Layer() override { drop(layer); }
  at::Tensor call(const at::Tensor& input) const {
    at::Tensor* out = nullptr;
    if (run(layer, &input, &out) != 0 || out == nullptr) {
      throw std::runtime_error(
          "activation checkpointing: the layer's forward failed (the log has the cause)");
    }
    at::Tensor result = std::move(*out);
    delete out;
    return result;
  }
  void* layer;
  layer_fn run;
  drop_fn drop;
};

at::Generator generator_of(const at::Device& device) {
  return at::globalContext().defaultGenerator(device);
}

at::Tensor rng_state(const at::Device& device) {
  at::Generator g = generator_of(device);
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.get_state();
}

void set_rng_state(const at::Device& device, const at::Tensor& state) {
  at::Generator g = generator_of(device);
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_state(state);
}

// The autocast state of the CPU and CUDA, to replay the forward's in the recompute.
struct AutocastState {
  bool cpu_enabled, cuda_enabled;
  at::ScalarType cpu_dtype, cuda_dtype;
  static AutocastState now() {
    return {at::autocast::is_autocast_enabled(at::kCPU),
            at::autocast::is_autocast_enabled(at::kCUDA),
            at::autocast::get_autocast_dtype(at::kCPU),
            at::autocast::get_autocast_dtype(at::kCUDA)};
  }
  void apply() const {
    at::autocast::set_autocast_enabled(at::kCPU, cpu_enabled);
    at::autocast::set_autocast_enabled(at::kCUDA, cuda_enabled);
    at::autocast::set_autocast_dtype(at::kCPU, cpu_dtype);
    at::autocast::set_autocast_dtype(at::kCUDA, cuda_dtype);
  }
};

struct Checkpoint : public torch::autograd::Function<Checkpoint> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            c10::intrusive_ptr<Layer> layer, bool preserve_rng_state,
                            bool offload) {
    ctx->saved_data["layer"] = c10::IValue::make_capsule(layer);
    ctx->saved_data["preserve_rng_state"] = preserve_rng_state;
    ctx->saved_data["requires_grad"] = x.requires_grad();
    ctx->saved_data["device"] = c10::IValue(x.device());
    if (preserve_rng_state) {
      // torch.utils.checkpoint stashes the CPU state and that of each input's CUDA device.
      ctx->saved_data["cpu_rng"] = rng_state(at::Device(at::kCPU));
      if (x.is_cuda()) {
        ctx->saved_data["cuda_rng"] = rng_state(x.device());
      }
    }
    auto autocast = AutocastState::now();
    ctx->saved_data["autocast"] = c10::IValue(std::vector<int64_t>{
        autocast.cpu_enabled, autocast.cuda_enabled, static_cast<int64_t>(autocast.cpu_dtype),
        static_cast<int64_t>(autocast.cuda_dtype)});
    // `offload`: the saved input waits in host memory (transformers' `save_on_cpu`).
    ctx->save_for_backward({offload && !x.is_cpu() ? x.to(at::kCPU) : x});
    return layer->call(x);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    torch::autograd::variable_list none(4);
    if (!grads[0].defined()) {
      return none;
    }
    auto layer = ctx->saved_data["layer"].toCapsule();
    auto* run = static_cast<Layer*>(layer.get());
    at::Device device = ctx->saved_data["device"].toDevice();
    at::Tensor x = ctx->get_saved_variables()[0].to(device).detach();
    x.requires_grad_(ctx->saved_data["requires_grad"].toBool());
    bool preserve = ctx->saved_data["preserve_rng_state"].toBool();
    // torch.random.fork_rng: the forward's states for the recompute, today's restored after.
    at::Tensor cpu_now, cuda_now;
    if (preserve) {
      cpu_now = rng_state(at::Device(at::kCPU));
      set_rng_state(at::Device(at::kCPU), ctx->saved_data["cpu_rng"].toTensor());
      if (device.is_cuda()) {
        cuda_now = rng_state(device);
        set_rng_state(device, ctx->saved_data["cuda_rng"].toTensor());
      }
    }
    auto saved = ctx->saved_data["autocast"].toIntVector();
    AutocastState then{saved[0] != 0, saved[1] != 0, static_cast<at::ScalarType>(saved[2]),
                       static_cast<at::ScalarType>(saved[3])};
    auto autocast_now = AutocastState::now();
    at::Tensor out;
    try {
      then.apply();
      if (then.cpu_enabled || then.cuda_enabled) {
        at::autocast::increment_nesting();
      }
      {
        at::AutoGradMode grad_mode(true);
        out = run->call(x);
      }
      if ((then.cpu_enabled || then.cuda_enabled) && at::autocast::decrement_nesting() == 0) {
        at::autocast::clear_cache();
      }
    } catch (...) {
      autocast_now.apply();
      if (preserve) {
        set_rng_state(at::Device(at::kCPU), cpu_now);
        if (device.is_cuda()) set_rng_state(device, cuda_now);
      }
      throw;
    }
    autocast_now.apply();
    if (preserve) {
      set_rng_state(at::Device(at::kCPU), cpu_now);
      if (device.is_cuda()) set_rng_state(device, cuda_now);
    }
    if (out.requires_grad()) {
      torch::autograd::backward({out}, {grads[0]});
    }
    none[0] = x.requires_grad() ? x.grad() : at::Tensor();
    return none;
  }
};

}  // namespace

extern "C" {

// `checkpoint(layer, x)`: the layer's output in `*out`, computed without keeping its graph;
// its backward recomputes it (see the file's comment). `layer` is handed over: `drop` frees it
// when the graph no longer needs it (at once when nothing requires a gradient).
char* tchtrain_checkpoint(const at::Tensor* x, void* layer, layer_fn run, drop_fn drop,
                          bool preserve_rng_state, bool offload, at::Tensor** out) {
  auto holder = c10::make_intrusive<Layer>(layer, run, drop);
  return tchtrain::guarded([&] {
    *out = new at::Tensor(Checkpoint::apply(*x, holder, preserve_rng_state, offload));
  });
}

}  // extern "C"

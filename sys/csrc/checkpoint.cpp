// Activation checkpointing (`torch.utils.checkpoint.checkpoint(layer, hidden_states)`, as
// transformers' `GradientCheckpointingLayer` calls it, with an optional second tensor input
// such as DeBERTa's relative embeddings): the layer runs without keeping its activations; its backward runs the layer again on the saved input, with the default
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

#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>

#include "guard.h"

namespace {

// Runs the layer on `input` (and `extra`, null when there is none): nullptr and a new tensor
// in `*out`, or an error message made by `tchtrain_checkpoint_message` (freed here).
typedef char* (*layer_fn)(void* layer, const at::Tensor* input, const at::Tensor* extra,
                          at::Tensor** out);
// Frees the closure.
typedef void (*drop_fn)(void* layer);

// Owns the Rust closure for as long as the autograd node that may recompute it.
struct Layer : torch::CustomClassHolder {
  Layer(void* layer, layer_fn run, drop_fn drop) : layer(layer), run(run), drop(drop) {}
  ~Layer() override { drop(layer); }
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;
  // The layer's output; its error (an out-of-memory message included) as a runtime_error.
  at::Tensor call(const at::Tensor& input, const at::Tensor& extra) const {
    at::Tensor* out = nullptr;
    char* err = run(layer, &input, extra.defined() ? &extra : nullptr, &out);
    if (err != nullptr) {
      std::string message(err);
      std::free(err);
      throw std::runtime_error(message);
    }
    if (out == nullptr) {
      throw std::runtime_error("activation checkpointing: the layer returned no tensor");
    }
    at::Tensor result = std::move(*out);
    delete out;
    return result;
  }
  void* layer;
  layer_fn run;
  drop_fn drop;
};

at::Tensor rng_state(const at::Device& device) {
  at::Generator g = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.get_state();
}

void set_rng_state(const at::Device& device, const at::Tensor& state) {
  at::Generator g = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_state(state);
}

// The autocast state of the CPU and CUDA.
struct AutocastState {
  bool cpu_enabled, cuda_enabled;
  at::ScalarType cpu_dtype, cuda_dtype;
  static AutocastState now() {
    return {at::autocast::is_autocast_enabled(at::kCPU),
            at::autocast::is_autocast_enabled(at::kCUDA),
            at::autocast::get_autocast_dtype(at::kCPU),
            at::autocast::get_autocast_dtype(at::kCUDA)};
  }
  bool any() const { return cpu_enabled || cuda_enabled; }
  void apply() const {
    at::autocast::set_autocast_enabled(at::kCPU, cpu_enabled);
    at::autocast::set_autocast_enabled(at::kCUDA, cuda_enabled);
    at::autocast::set_autocast_dtype(at::kCPU, cpu_dtype);
    at::autocast::set_autocast_dtype(at::kCUDA, cuda_dtype);
  }
};

// The forward's generator and autocast states for the length of a recompute
// (`torch.random.fork_rng` and `torch.autocast(**forward's)`): set on construction, today's
// put back on destruction, also when the recompute throws; the autocast nesting entered here
// is left (and the cast cache cleared when it was the outermost) either way.
class Replay {
 public:
  Replay(const AutocastState& then, bool preserve, const at::Device& device,
         const at::Tensor& cpu_then, const at::Tensor& cuda_then)
      : autocast_now_(AutocastState::now()), then_(then), preserve_(preserve), device_(device) {
    if (preserve_) {
      cpu_now_ = rng_state(at::Device(at::kCPU));
      if (device_.is_cuda()) {
        cuda_now_ = rng_state(device_);
      }
      restoring_rng_ = true;
      set_rng_state(at::Device(at::kCPU), cpu_then);
      if (device_.is_cuda()) {
        set_rng_state(device_, cuda_then);
      }
    }
    then_.apply();
    if (then_.any()) {
      at::autocast::increment_nesting();
      nested_ = true;
    }
  }
  ~Replay() {
    try {
      if (nested_ && at::autocast::decrement_nesting() == 0) {
        at::autocast::clear_cache();
      }
      autocast_now_.apply();
      if (restoring_rng_) {
        set_rng_state(at::Device(at::kCPU), cpu_now_);
        if (cuda_now_.defined()) {
          set_rng_state(device_, cuda_now_);
        }
      }
    } catch (...) {
      // A destructor must not throw; the states are those libtorch accepted before.
    }
  }
  Replay(const Replay&) = delete;
  Replay& operator=(const Replay&) = delete;

 private:
  AutocastState autocast_now_;
  AutocastState then_;
  bool preserve_;
  at::Device device_;
  at::Tensor cpu_now_, cuda_now_;
  bool restoring_rng_ = false;
  bool nested_ = false;
};

struct Checkpoint : public torch::autograd::Function<Checkpoint> {
  // `inputs`: the hidden states, and the second input when there is one (only defined
  // tensors: an undefined one has no device for the autograd engine). A `TensorList`: the
  // autograd function counts each of its tensors as an input (a `std::vector` argument would
  // be taken for a non-tensor one, and cut the graph).
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::TensorList inputs,
                            c10::intrusive_ptr<Layer> layer, bool preserve_rng_state,
                            bool offload) {
    const at::Tensor& x = inputs[0];
    at::Tensor extra = inputs.size() > 1 ? inputs[1] : at::Tensor();
    ctx->saved_data["layer"] = c10::IValue::make_capsule(layer);
    ctx->saved_data["preserve_rng_state"] = preserve_rng_state;
    ctx->saved_data["requires_grad"] = x.requires_grad();
    ctx->saved_data["inputs"] = static_cast<int64_t>(inputs.size());
    ctx->saved_data["extra_requires_grad"] = extra.defined() && extra.requires_grad();
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
    torch::autograd::variable_list saved{offload && !x.is_cpu() ? x.to(at::kCPU) : x};
    if (extra.defined()) {
      saved.push_back(extra);
    }
    ctx->save_for_backward(saved);
    return layer->call(x, extra);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    // One gradient per tensor input, then none for the layer and the two flags.
    size_t n_inputs = static_cast<size_t>(ctx->saved_data["inputs"].toInt());
    torch::autograd::variable_list none(n_inputs + 3);
    if (!grads[0].defined()) {
      return none;
    }
    auto layer = ctx->saved_data["layer"].toCapsule();
    auto* run = static_cast<Layer*>(layer.get());
    at::Device device = ctx->saved_data["device"].toDevice();
    auto saved_inputs = ctx->get_saved_variables();
    at::Tensor x = saved_inputs[0].to(device).detach();
    x.requires_grad_(ctx->saved_data["requires_grad"].toBool());
    // The second input as a leaf of the recompute: its gradient is handed back to the graph
    // that made it (reentrant checkpointing's treatment of every tensor input).
    at::Tensor extra = saved_inputs.size() > 1 ? saved_inputs[1] : at::Tensor();
    if (extra.defined()) {
      extra = extra.detach();
      extra.requires_grad_(ctx->saved_data["extra_requires_grad"].toBool());
    }
    bool preserve = ctx->saved_data["preserve_rng_state"].toBool();
    auto saved = ctx->saved_data["autocast"].toIntVector();
    AutocastState then{saved[0] != 0, saved[1] != 0, static_cast<at::ScalarType>(saved[2]),
                       static_cast<at::ScalarType>(saved[3])};
    at::Tensor out;
    {
      Replay replay(then, preserve, device,
                    preserve ? ctx->saved_data["cpu_rng"].toTensor() : at::Tensor(),
                    preserve && device.is_cuda() ? ctx->saved_data["cuda_rng"].toTensor()
                                                 : at::Tensor());
      at::AutoGradMode grad_mode(true);
      out = run->call(x, extra);
    }
    if (out.requires_grad()) {
      torch::autograd::backward({out}, {grads[0]});
    }
    none[0] = x.requires_grad() ? x.grad() : at::Tensor();
    if (n_inputs > 1) {
      none[1] = extra.requires_grad() ? extra.grad() : at::Tensor();
    }
    return none;
  }
};

}  // namespace

extern "C" {

// A malloc'd copy of `message`, for a layer's error (freed by the checkpoint).
char* tchtrain_checkpoint_message(const char* message) {
  return tchtrain::error_message(message);
}

// `checkpoint(layer, x[, extra])` (`extra` may be null): the layer's output in `*out`, computed without keeping its graph;
// its backward recomputes it (see the file's comment). `layer` is handed over: `drop` frees it
// when the graph no longer needs it (at once when nothing requires a gradient, or on failure).
char* tchtrain_checkpoint(const at::Tensor* x, const at::Tensor* extra, void* layer,
                          layer_fn run, drop_fn drop, bool preserve_rng_state, bool offload,
                          at::Tensor** out) {
  c10::intrusive_ptr<Layer> holder;
  try {
    holder = c10::make_intrusive<Layer>(layer, run, drop);
  } catch (...) {
    drop(layer);
    return tchtrain::error_message("activation checkpointing: out of memory");
  }
  return tchtrain::guarded([&] {
    torch::autograd::variable_list inputs{*x};
    if (extra != nullptr) {
      inputs.push_back(*extra);
    }
    *out = new at::Tensor(Checkpoint::apply(at::TensorList(inputs), std::move(holder),
                                            preserve_rng_state, offload));
  });
}

}  // extern "C"

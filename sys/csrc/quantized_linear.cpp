// bitsandbytes' quantized linear maps as autograd functions (`autograd/_functions.py`:
// `MatMul4Bit`, `MatMul8bitFp`, `MatMul8bitLt`): the forward and the input's gradient are
// computed by a Rust closure that holds the quantized weight (the packed 4-bit codes and their
// state, or the int8 rows and their scales), so the graph keeps the quantized weight, never a
// dequantized copy: the backward dequantizes again, as bitsandbytes' does. The bias's gradient
// is `grad.sum(0)` in the bias's dtype, as bitsandbytes computes it (autograd then sums the
// rest down to the bias's shape). This is what keeps a quantized model's training memory at
// its packed size rather than a dequantized copy of every weight per step.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "guard.h"

namespace {

// Runs the closure: `op` 0 is the forward (`t` the input, `bias` possibly null), `op` 1 the
// input's gradient (`t` the output's gradient, `dtype` the input's dtype code). The result in
// `*out`; nullptr, or an error message made by `tchtrain_checkpoint_message` (freed here).
typedef char* (*quantized_fn)(void* weight, int op, const at::Tensor* t, const at::Tensor* bias,
                              int dtype, at::Tensor** out);
// Frees the closure.
typedef void (*quantized_drop_fn)(void* weight);

struct QuantizedWeight : torch::CustomClassHolder {
  QuantizedWeight(void* weight, quantized_fn run, quantized_drop_fn drop)
      : weight(weight), run(run), drop(drop) {}
  ~QuantizedWeight() override { drop(weight); }
  QuantizedWeight(const QuantizedWeight&) = delete;
  QuantizedWeight& operator=(const QuantizedWeight&) = delete;
  at::Tensor call(int op, const at::Tensor& t, const at::Tensor* bias, int dtype) const {
    at::Tensor* out = nullptr;
    char* err = run(weight, op, &t, bias, dtype, &out);
    if (err != nullptr) {
      std::string message(err);
      std::free(err);
      throw std::runtime_error(message);
    }
    if (out == nullptr) {
      throw std::runtime_error("quantized linear: the closure returned no tensor");
    }
    at::Tensor result = std::move(*out);
    delete out;
    return result;
  }
  void* weight;
  quantized_fn run;
  quantized_drop_fn drop;
};

struct QuantizedLinear : public torch::autograd::Function<QuantizedLinear> {
  // `inputs`: the input, and the bias when there is one (defined tensors only, each counted
  // as an input of the node).
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::TensorList inputs,
                            c10::intrusive_ptr<QuantizedWeight> weight) {
    const at::Tensor& x = inputs[0];
    const at::Tensor* bias = inputs.size() > 1 ? &inputs[1] : nullptr;
    ctx->saved_data["weight"] = c10::IValue::make_capsule(weight);
    ctx->saved_data["inputs"] = static_cast<int64_t>(inputs.size());
    ctx->saved_data["input_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["bias_dtype"] =
        static_cast<int64_t>(bias ? bias->scalar_type() : at::ScalarType::Undefined);
    return weight->call(0, x, bias, -1);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    size_t n_inputs = static_cast<size_t>(ctx->saved_data["inputs"].toInt());
    torch::autograd::variable_list out(n_inputs + 1);
    const at::Tensor& g = grads[0];
    if (!g.defined()) {
      return out;
    }
    if (n_inputs > 1 && ctx->needs_input_grad(1)) {
      auto dtype = static_cast<at::ScalarType>(ctx->saved_data["bias_dtype"].toInt());
      out[1] = g.sum(0, false, dtype);
    }
    if (ctx->needs_input_grad(0)) {
      auto holder = ctx->saved_data["weight"].toCapsule();
      auto* weight = static_cast<QuantizedWeight*>(holder.get());
      int dtype = static_cast<int>(ctx->saved_data["input_dtype"].toInt());
      out[0] = weight->call(1, g, nullptr, dtype);
    }
    return out;
  }
};

}  // namespace

extern "C" {

// The quantized linear map of `x` (and `bias`, possibly null): the output in `*out`. `weight`
// is handed over: `drop` frees it when the graph no longer needs it (at once when nothing
// requires a gradient, or on failure).
char* tchtrain_quantized_linear(const at::Tensor* x, const at::Tensor* bias, void* weight,
                                quantized_fn run, quantized_drop_fn drop, at::Tensor** out) {
  c10::intrusive_ptr<QuantizedWeight> holder;
  try {
    holder = c10::make_intrusive<QuantizedWeight>(weight, run, drop);
  } catch (...) {
    drop(weight);
    return tchtrain::error_message("quantized linear: out of memory");
  }
  return tchtrain::guarded([&] {
    torch::autograd::variable_list inputs{*x};
    if (bias != nullptr) {
      inputs.push_back(*bias);
    }
    *out = new at::Tensor(QuantizedLinear::apply(at::TensorList(inputs), std::move(holder)));
  });
}

}  // extern "C"

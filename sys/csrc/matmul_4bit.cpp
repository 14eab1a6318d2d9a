// bitsandbytes' `MatMul4Bit` (`autograd/_functions.py`): `linear(x, W, bias)` where W is a
// 4-bit weight dequantized by a Rust closure for the call only. The graph keeps the closure
// (which holds the packed codes and their state), not W: the backward dequantizes again, as
// bitsandbytes' does, and returns `grad · W` (W in its own dtype, then the gradient's) for
// the input and `grad.sum(0)` in the bias's dtype for the bias (autograd then sums the rest
// down to the bias's shape). This is what keeps a 4-bit model's training memory at its packed
// size rather than a dequantized copy of every weight per step.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "guard.h"

namespace {

// Dequantizes the weight in `dtype` (-1: the weight's own dtype) into `*out`: nullptr, or
// an error message made by `tchtrain_checkpoint_message` (freed here).
typedef char* (*dequant_fn)(void* weight, int dtype, at::Tensor** out);
// Frees the closure.
typedef void (*dequant_drop_fn)(void* weight);

struct Weight4bit : torch::CustomClassHolder {
  Weight4bit(void* weight, dequant_fn run, dequant_drop_fn drop)
      : weight(weight), run(run), drop(drop) {}
  ~Weight4bit() override { drop(weight); }
  Weight4bit(const Weight4bit&) = delete;
  Weight4bit& operator=(const Weight4bit&) = delete;
  at::Tensor dequantize(int dtype) const {
    at::Tensor* out = nullptr;
    char* err = run(weight, dtype, &out);
    if (err != nullptr) {
      std::string message(err);
      std::free(err);
      throw std::runtime_error(message);
    }
    if (out == nullptr) {
      throw std::runtime_error("4-bit matmul: the weight's dequantization returned no tensor");
    }
    at::Tensor result = std::move(*out);
    delete out;
    return result;
  }
  void* weight;
  dequant_fn run;
  dequant_drop_fn drop;
};

struct MatMul4Bit : public torch::autograd::Function<MatMul4Bit> {
  // `inputs`: the input, and the bias when there is one (defined tensors only, each counted
  // as an input of the node).
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::TensorList inputs,
                            c10::intrusive_ptr<Weight4bit> weight) {
    const at::Tensor& x = inputs[0];
    c10::optional<at::Tensor> bias;
    if (inputs.size() > 1) {
      bias = inputs[1];
    }
    ctx->saved_data["weight"] = c10::IValue::make_capsule(weight);
    ctx->saved_data["inputs"] = static_cast<int64_t>(inputs.size());
    ctx->saved_data["bias_dtype"] =
        static_cast<int64_t>(bias ? bias->scalar_type() : at::ScalarType::Undefined);
    at::Tensor w = weight->dequantize(static_cast<int>(x.scalar_type()));
    return at::linear(x, w, bias);
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
      auto* weight = static_cast<Weight4bit*>(holder.get());
      out[0] = at::matmul(g, weight->dequantize(-1).to(g.scalar_type()));
    }
    return out;
  }
};

}  // namespace

extern "C" {

// `matmul_4bit(x, W, bias)` with `bias` possibly null: the output in `*out`. `weight` is
// handed over: `drop` frees it when the graph no longer needs it (at once when nothing
// requires a gradient, or on failure).
char* tchtrain_matmul_4bit(const at::Tensor* x, const at::Tensor* bias, void* weight,
                           dequant_fn run, dequant_drop_fn drop, at::Tensor** out) {
  c10::intrusive_ptr<Weight4bit> holder;
  try {
    holder = c10::make_intrusive<Weight4bit>(weight, run, drop);
  } catch (...) {
    drop(weight);
    return tchtrain::error_message("4-bit matmul: out of memory");
  }
  return tchtrain::guarded([&] {
    torch::autograd::variable_list inputs{*x};
    if (bias != nullptr) {
      inputs.push_back(*bias);
    }
    *out = new at::Tensor(MatMul4Bit::apply(at::TensorList(inputs), std::move(holder)));
  });
}

}  // extern "C"

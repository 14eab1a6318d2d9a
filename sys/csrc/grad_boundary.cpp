// A gradient boundary: an identity op whose backward first calls back into Rust (ZeRO-3's
// per-layer gathering in tchtrain-accelerate), which tch 0.26 cannot express.
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <stdexcept>

#include "guard.h"

namespace {

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
char* tchtrain_grad_boundary(const at::Tensor* x, uint64_t token, boundary_fn fn,
                                     at::Tensor** out) {
  return tchtrain::guarded([&] {
    *out = new at::Tensor(GradBoundary::apply(*x, static_cast<int64_t>(token),
                                              reinterpret_cast<int64_t>(fn)));
  });
}

}  // extern "C"

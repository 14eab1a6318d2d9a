// C boundary between tchtrain-optim (Rust) and libtorch ops that tch 0.26 does not expose:
// the `alpha` / `value` scalars of add / addcmul / addcdiv (torch.optim's single-tensor
// code passes them, and the kernels fuse them, so they must be the very same calls), and
// the fused multi-tensor kernels `_fused_adamw_`, `_fused_adam_`, `_fused_sgd_`.
//
// Every function returns nullptr on success or a heap-allocated error message (free it with
// `tchtrain_free_error`); no C++ exception crosses this boundary.
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/_fused_sgd.h>
#include <ATen/ops/add.h>
#include <ATen/ops/addcdiv.h>
#include <ATen/ops/addcmul.h>
#include <ATen/ops/linalg_vector_norm.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "guard.h"

namespace {

// libtorch's optimizers step under no_grad.
template <typename F>
char* guarded_no_grad(F&& f) {
  return tchtrain::guarded([&] {
    at::NoGradGuard no_grad;
    f();
  });
}

std::vector<at::Tensor> gather(at::Tensor* const* ts, size_t n) {
  std::vector<at::Tensor> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(*ts[i]);
  }
  return out;
}

}  // namespace

extern "C" {

// self.add_(other, alpha=alpha)
char* tchtrain_optim_add_(at::Tensor* self, const at::Tensor* other, double alpha) {
  return guarded_no_grad([&] { self->add_(*other, alpha); });
}

// *out = self.add(other, alpha=alpha)
char* tchtrain_optim_add(const at::Tensor* self, const at::Tensor* other, double alpha, at::Tensor** out) {
  return guarded_no_grad([&] { *out = new at::Tensor(at::add(*self, *other, alpha)); });
}

// self.addcmul_(t1, t2, value=value)
char* tchtrain_optim_addcmul_(at::Tensor* self, const at::Tensor* t1, const at::Tensor* t2, double value) {
  return guarded_no_grad([&] { self->addcmul_(*t1, *t2, value); });
}

// *out = self.addcmul(t1, t2, value=value)
char* tchtrain_optim_addcmul(const at::Tensor* self, const at::Tensor* t1, const at::Tensor* t2, double value,
                             at::Tensor** out) {
  return guarded_no_grad([&] { *out = new at::Tensor(at::addcmul(*self, *t1, *t2, value)); });
}

// self.addcdiv_(t1, t2, value=value)
char* tchtrain_optim_addcdiv_(at::Tensor* self, const at::Tensor* t1, const at::Tensor* t2, double value) {
  return guarded_no_grad([&] { self->addcdiv_(*t1, *t2, value); });
}

// *out = torch.linalg.vector_norm(self, ord) over all elements
// `p.grad = grad` (a null `grad`: `p.grad = None`); shapes, dtypes and devices must agree.
char* tchtrain_optim_set_grad(at::Tensor* self, const at::Tensor* grad) {
  return guarded_no_grad([&] {
    if (grad == nullptr) {
      self->mutable_grad() = at::Tensor();
      return;
    }
    TORCH_CHECK(grad->sizes() == self->sizes(), "assigned grad has data of a different size: ",
                grad->sizes(), " vs the parameter's ", self->sizes());
    TORCH_CHECK(grad->scalar_type() == self->scalar_type(), "assigned grad has data of a different type: ",
                grad->scalar_type(), " vs the parameter's ", self->scalar_type());
    TORCH_CHECK(grad->device() == self->device(), "assigned grad has data located on a different device: ",
                grad->device(), " vs the parameter's ", self->device());
    self->mutable_grad() = *grad;
  });
}

char* tchtrain_optim_vector_norm(const at::Tensor* self, double ord, at::Tensor** out) {
  return guarded_no_grad([&] { *out = new at::Tensor(at::linalg_vector_norm(*self, ord)); });
}

// torch._fused_adamw_ (decoupled != 0) or torch._fused_adam_ over n parameters.
// `max_exp_avg_sqs` is read only when amsgrad != 0 (pass the exp_avg_sqs otherwise).
char* tchtrain_optim_fused_adam(at::Tensor* const* params, at::Tensor* const* grads, at::Tensor* const* exp_avgs,
                                at::Tensor* const* exp_avg_sqs, at::Tensor* const* max_exp_avg_sqs,
                                at::Tensor* const* state_steps, size_t n, double lr, double beta1, double beta2,
                                double weight_decay, double eps, int amsgrad, int maximize, int decoupled) {
  return guarded_no_grad([&] {
    auto p = gather(params, n);
    auto g = gather(grads, n);
    auto m = gather(exp_avgs, n);
    auto v = gather(exp_avg_sqs, n);
    std::vector<at::Tensor> vmax;
    if (amsgrad != 0) {
      vmax = gather(max_exp_avg_sqs, n);
    }
    auto s = gather(state_steps, n);
    if (decoupled != 0) {
      at::_fused_adamw_(p, g, m, v, vmax, s, lr, beta1, beta2, weight_decay, eps, amsgrad != 0, maximize != 0);
    } else {
      at::_fused_adam_(p, g, m, v, vmax, s, lr, beta1, beta2, weight_decay, eps, amsgrad != 0, maximize != 0);
    }
  });
}

// torch._fused_sgd_ over n parameters (momentum buffers are read only when momentum != 0).
char* tchtrain_optim_fused_sgd(at::Tensor* const* params, at::Tensor* const* grads, at::Tensor* const* momentum_buffers,
                               size_t n, double weight_decay, double momentum, double lr, double dampening,
                               int nesterov, int maximize, int is_first_step) {
  return guarded_no_grad([&] {
    auto p = gather(params, n);
    auto g = gather(grads, n);
    std::vector<at::Tensor> b;
    if (momentum != 0.0) {
      b = gather(momentum_buffers, n);
    }
    at::_fused_sgd_(p, g, b, weight_decay, momentum, lr, dampening, nesterov != 0, maximize != 0,
                    is_first_step != 0);
  });
}

}  // extern "C"

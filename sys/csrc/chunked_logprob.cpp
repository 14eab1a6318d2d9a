// TRL's `ChunkedLogProbFunction` (`trl/kernels/chunked_logprob.py`) on devices without Triton:
// the per-token log-probabilities of `hidden @ weight.T` (and on request the entropy,
// `log(sum_v p_v^2)`, the mean logit and whether the target is the first maximum) without
// materializing the `[N, V]` logits. The projection runs on tiles of
// 4096 tokens x `chunk_size` vocabulary entries folded into online-logsumexp statistics in
// float32; the backward recomputes each tile, turns it into the logits' gradient in place and
// accumulates the gradients' products in float32. Every operation is the Python fallback's
// (`_forward_tile`, `_backward_tile`), in its order, so the numbers are TRL's to the bit.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <limits>

#include "guard.h"

namespace {

constexpr int64_t LOGPROB_TOKEN_CHUNK = 4096;

struct LogProbTransform {
  double logit_scale;
  double softcap;  // used when has_softcap
  double inv_t;
  bool has_softcap;
};

// `_torch_transform`.
at::Tensor logprob_transform(at::Tensor z, const LogProbTransform& k) {
  z = z * k.logit_scale;
  if (k.has_softcap) {
    z = k.softcap * at::tanh(z / k.softcap);
  }
  return z * k.inv_t;
}

struct ChunkedLogProb : public torch::autograd::Function<ChunkedLogProb> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& hidden, const at::Tensor& weight,
                                                const at::Tensor& bias_or_empty,
                                                const at::Tensor& targets, bool has_bias,
                                                double temperature, int64_t chunk_size,
                                                double softcap, double logit_scale,
                                                bool want_entropy, bool want_top1,
                                                bool want_log_sum_sq, bool want_mean_logits) {
    ctx->set_materialize_grads(false);
    // An absent bias travels as an empty tensor (an undefined input has no metadata for the
    // node), and is undefined from here on.
    const at::Tensor bias = has_bias ? bias_or_empty : at::Tensor();
    const auto device = hidden.device();
    const int64_t N = hidden.size(0);
    const int64_t vocab = weight.size(0);
    const at::ScalarType compute =
        at::autocast::is_autocast_enabled(device.type())
            ? at::autocast::get_autocast_dtype(device.type())
            : hidden.scalar_type();
    LogProbTransform k{logit_scale, std::isnan(softcap) ? 1.0 : softcap, 1.0 / temperature,
                !std::isnan(softcap)};
    auto f32 = at::TensorOptions().device(device).dtype(at::kFloat);
    const double inf = std::numeric_limits<double>::infinity();
    at::Tensor running_max = at::full({N}, -inf, f32);
    at::Tensor sum_exp = at::zeros({N}, f32);
    at::Tensor x_sum_exp = at::zeros({N}, f32);
    at::Tensor sq_sum_exp = at::zeros({N}, f32);
    at::Tensor z_sum = at::zeros({N}, f32);
    at::Tensor max_before_target = at::full({N}, -inf, f32);
    at::Tensor target_logit = at::zeros({N}, f32);
    at::Tensor mm_buf = at::empty({std::min(N, LOGPROB_TOKEN_CHUNK), chunk_size},
                                  at::TensorOptions().device(device).dtype(compute));
    {
      // The folds are plain computations (the function's own backward differentiates them).
      // (Runs without autograd: the function's forward is not recorded.)
      for (int64_t ts = 0; ts < N; ts += LOGPROB_TOKEN_CHUNK) {
        const int64_t te = std::min(ts + LOGPROB_TOKEN_CHUNK, N);
        const int64_t n = te - ts;
        at::Tensor hidden_chunk = hidden.slice(0, ts, te).to(compute);
        at::Tensor tg = targets.slice(0, ts, te);
        at::Tensor rm = running_max.slice(0, ts, te);
        at::Tensor se = sum_exp.slice(0, ts, te);
        at::Tensor xse = x_sum_exp.slice(0, ts, te);
        at::Tensor sse = sq_sum_exp.slice(0, ts, te);
        at::Tensor zs = z_sum.slice(0, ts, te);
        at::Tensor mbt = max_before_target.slice(0, ts, te);
        at::Tensor tl = target_logit.slice(0, ts, te);
        for (int64_t start = 0; start < vocab; start += chunk_size) {
          const int64_t end = std::min(start + chunk_size, vocab);
          const int64_t n_cols = end - start;
          at::Tensor tile = mm_buf.slice(0, 0, n).slice(1, 0, n_cols);
          at::mm_out(tile, hidden_chunk, weight.slice(0, start, end).to(compute).t());
          if (bias.defined()) {
            tile.add_(bias.slice(0, start, end).to(compute));
          }
          // `_forward_tile`.
          at::Tensor z = logprob_transform(tile.to(at::kFloat), k);
          at::Tensor local = tg - start;
          if (want_mean_logits) {
            zs.add_(z.sum(-1));
          }
          if (want_top1) {
            at::Tensor before_target =
                at::arange(n_cols, tg.options()) < local.unsqueeze(-1);
            mbt.copy_(at::maximum(
                mbt, z.masked_fill(before_target.logical_not(), -inf).amax(-1)));
          }
          at::Tensor new_m = at::maximum(rm, z.amax(-1));
          at::Tensor rescale = at::exp(rm - new_m);
          at::Tensor e = at::exp(z - new_m.unsqueeze(-1));
          se.mul_(rescale).add_(e.sum(-1));
          if (want_entropy) {
            xse.mul_(rescale).add_((e * z).sum(-1));
          }
          if (want_log_sum_sq) {
            sse.mul_(rescale * rescale).add_((e * e).sum(-1));
          }
          rm.copy_(new_m);
          at::Tensor in_tile = (local >= 0).logical_and(local < n_cols);
          at::Tensor target_z =
              z.gather(-1, local.clamp(0, n_cols - 1).unsqueeze(-1)).squeeze(-1);
          tl.copy_(at::where(in_tile, target_z, tl));
        }
      }
    }
    at::Tensor log_z = running_max + at::log(sum_exp);
    at::Tensor logprobs = target_logit - log_z;
    at::Tensor entropy = want_entropy ? log_z - x_sum_exp / sum_exp : at::Tensor();
    at::Tensor log_sum_sq_probs =
        want_log_sum_sq ? at::log(sq_sum_exp) - 2 * at::log(sum_exp) : at::Tensor();
    at::Tensor mean_logits = want_mean_logits ? z_sum / vocab : at::Tensor();
    at::Tensor is_top1 =
        want_top1 ? (target_logit >= running_max).logical_and(target_logit > max_before_target)
                  : at::Tensor();
    ctx->save_for_backward({hidden, weight, bias_or_empty, targets, log_z,
                            entropy.defined() ? entropy : log_z});
    ctx->saved_data["has_entropy"] = entropy.defined();
    ctx->saved_data["has_bias"] = has_bias;
    ctx->saved_data["compute"] = static_cast<int64_t>(compute);
    ctx->saved_data["chunk_size"] = chunk_size;
    ctx->saved_data["logit_scale"] = k.logit_scale;
    ctx->saved_data["softcap"] = k.softcap;
    ctx->saved_data["inv_t"] = k.inv_t;
    ctx->saved_data["has_softcap"] = k.has_softcap;
    // An output not asked for is an empty placeholder (a custom function's outputs must be
    // defined), dropped by the caller.
    torch::autograd::variable_list non_differentiable;
    auto placeholder = [&](at::Tensor& t, bool differentiable) {
      if (!t.defined()) {
        t = at::empty({0}, f32);
        non_differentiable.push_back(t);
      } else if (!differentiable) {
        non_differentiable.push_back(t);
      }
    };
    placeholder(entropy, true);
    placeholder(log_sum_sq_probs, false);
    placeholder(mean_logits, false);
    placeholder(is_top1, false);
    ctx->mark_non_differentiable(non_differentiable);
    return {logprobs, entropy, log_sum_sq_probs, mean_logits, is_top1};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& hidden = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor bias = ctx->saved_data["has_bias"].toBool() ? saved[2] : at::Tensor();
    const at::Tensor& targets = saved[3];
    const at::Tensor& log_z = saved[4];
    const at::Tensor& entropy = saved[5];
    const auto compute = static_cast<at::ScalarType>(ctx->saved_data["compute"].toInt());
    const int64_t chunk_size = ctx->saved_data["chunk_size"].toInt();
    LogProbTransform k{ctx->saved_data["logit_scale"].toDouble(), ctx->saved_data["softcap"].toDouble(),
                ctx->saved_data["inv_t"].toDouble(), ctx->saved_data["has_softcap"].toBool()};
    const bool need_hidden = ctx->needs_input_grad(0);
    const bool need_weight = ctx->needs_input_grad(1);
    const bool need_bias = bias.defined() && ctx->needs_input_grad(2);
    const int64_t N = hidden.size(0);
    const int64_t vocab = weight.size(0);
    auto f32 = at::TensorOptions().device(hidden.device()).dtype(at::kFloat);
    at::Tensor grad_hidden = need_hidden ? at::zeros(hidden.sizes(), f32) : at::Tensor();
    at::Tensor grad_weight = need_weight ? at::zeros(weight.sizes(), f32) : at::Tensor();
    at::Tensor grad_bias = need_bias ? at::zeros(bias.sizes(), f32) : at::Tensor();
    at::Tensor mm_buf = at::empty({std::min(N, LOGPROB_TOKEN_CHUNK), chunk_size},
                                  at::TensorOptions().device(hidden.device()).dtype(compute));
    at::Tensor grad_lp = grads[0].defined() ? grads[0].to(at::kFloat).contiguous() : at::Tensor();
    at::Tensor grad_ent = ctx->saved_data["has_entropy"].toBool() && grads.size() > 1 &&
                                  grads[1].defined()
                              ? grads[1].to(at::kFloat).contiguous()
                              : at::Tensor();
    for (int64_t ts = 0; ts < N; ts += LOGPROB_TOKEN_CHUNK) {
      const int64_t te = std::min(ts + LOGPROB_TOKEN_CHUNK, N);
      const int64_t n = te - ts;
      at::Tensor hidden_chunk = hidden.slice(0, ts, te).to(compute);
      at::Tensor tg = targets.slice(0, ts, te);
      at::Tensor lz = log_z.slice(0, ts, te);
      at::Tensor ent = entropy.slice(0, ts, te);
      for (int64_t start = 0; start < vocab; start += chunk_size) {
        const int64_t end = std::min(start + chunk_size, vocab);
        const int64_t n_cols = end - start;
        at::Tensor w_chunk = weight.slice(0, start, end).to(compute);
        at::Tensor tile = mm_buf.slice(0, 0, n).slice(1, 0, n_cols);
        at::mm_out(tile, hidden_chunk, w_chunk.t());
        if (bias.defined()) {
          tile.add_(bias.slice(0, start, end).to(compute));
        }
        // `_backward_tile`.
        at::Tensor y = tile.to(at::kFloat) * k.logit_scale;
        at::Tensor t, z;
        if (k.has_softcap) {
          t = at::tanh(y / k.softcap);
          z = k.softcap * t * k.inv_t;
        } else {
          z = y * k.inv_t;
        }
        at::Tensor log_p = z - lz.unsqueeze(-1);
        at::Tensor p = at::exp(log_p);
        at::Tensor grad = at::zeros_like(z);
        if (grad_lp.defined()) {
          at::Tensor is_target =
              at::arange(start, start + n_cols, tg.options()) == tg.unsqueeze(-1);
          grad += grad_lp.slice(0, ts, te).unsqueeze(-1) * (is_target.to(at::kFloat) - p);
        }
        if (grad_ent.defined()) {
          grad -= grad_ent.slice(0, ts, te).unsqueeze(-1) * p * (log_p + ent.unsqueeze(-1));
        }
        grad = grad * k.inv_t;
        if (k.has_softcap) {
          grad = grad * (1 - t * t);
        }
        tile.copy_(grad * k.logit_scale);
        if (need_hidden) {
          grad_hidden.slice(0, ts, te).addmm_(tile.to(at::kFloat), w_chunk.to(at::kFloat));
        }
        if (need_weight) {
          grad_weight.slice(0, start, end).addmm_(tile.t().to(at::kFloat),
                                                   hidden_chunk.to(at::kFloat));
        }
        if (need_bias) {
          grad_bias.slice(0, start, end) += tile.sum(0, false, at::kFloat);
        }
      }
    }
    torch::autograd::variable_list out(13);
    if (need_hidden) out[0] = grad_hidden.to(hidden.scalar_type());
    if (need_weight) out[1] = grad_weight.to(weight.scalar_type());
    if (need_bias) out[2] = grad_bias.to(bias.scalar_type());
    return out;
  }
};

}  // namespace

extern "C" {

// `ChunkedLogProbFunction.apply(hidden [N, H], weight [V, H], bias [V] or null, targets [N],
// temperature, chunk_size, final_logit_softcapping (NaN: none), logit_scale, outputs)` with the
// log-probabilities always computed and the optional outputs when asked: the log-probabilities,
// entropy, `log(sum_v p_v^2)`, mean logit and `is_top1` in `out[0..5]` (null where not
// computed).
char* tchtrain_chunked_logprob(const at::Tensor* hidden, const at::Tensor* weight,
                               const at::Tensor* bias, const at::Tensor* targets,
                               double temperature, int64_t chunk_size, double softcap,
                               double logit_scale, bool want_entropy, bool want_top1,
                               bool want_log_sum_sq, bool want_mean_logits, at::Tensor** out) {
  return tchtrain::guarded([&] {
    at::Tensor b = bias != nullptr ? *bias : at::empty({0}, hidden->options());
    auto outputs = ChunkedLogProb::apply(*hidden, *weight, b, *targets, bias != nullptr,
                                         temperature, chunk_size, softcap, logit_scale,
                                         want_entropy, want_top1, want_log_sum_sq,
                                         want_mean_logits);
    const bool wanted[5] = {true, want_entropy, want_log_sum_sq, want_mean_logits, want_top1};
    for (size_t i = 0; i < 5; ++i) {
      out[i] = wanted[i] && outputs[i].defined() ? new at::Tensor(outputs[i]) : nullptr;
    }
  });
}

}  // extern "C"

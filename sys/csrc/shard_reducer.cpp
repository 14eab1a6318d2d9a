// A sharded engine's gradient reduction overlapped with the backward (ZeRO-1 / 2, FSDP's
// SHARD_GRAD_OP): DeepSpeed's `reduce_bucket_size` buckets, reduced from gradient hooks as
// `DeepSpeedZeroOptimizer.reduce_independent_p_g_buckets_and_remove_grads` reduces them.
//
// Every parameter's gradient accumulator gets a post hook. The parameters are cut into
// buckets once, in reverse order (the order their gradients are produced in) and by dtype,
// each at most `bucket_bytes` (a larger parameter alone), so every rank has the same
// buckets. During an armed backward a bucket whose last gradient is in is flattened into a
// fresh buffer (cast to the reduction dtype, divided by `pre`) and its all-reduce starts at
// once, while the backward goes on; buckets start strictly in order, so every rank issues
// the same collectives in the same order even when a parameter goes unused on some rank
// (its bucket, and those after it, start when the backward is over). `finish` starts what
// is left (a parameter that got no gradient counts as zeros), waits, finishes the
// arithmetic (an average divided by the world size, then `post`) and writes the results
// into the gradients (created where a parameter had none). The buffers live only from a
// bucket's start to `finish`: unlike DDP's reducer nothing the size of the gradients is kept
// between steps, which is the point of stage 2.
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "guard.h"

struct tchtrain_shard_reducer {
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  std::vector<at::Tensor> params;
  // Kept alive: a leaf's accumulator is held weakly by the tensor and made anew (without
  // the hook) once nothing else holds it.
  std::vector<decltype(torch::autograd::impl::grad_accumulator(std::declval<at::Tensor>()))> accumulators;
  std::vector<uintptr_t> hook_keys;
  std::vector<std::vector<size_t>> buckets;
  std::vector<size_t> bucket_of;

  double pre = 1.0;
  double post = 1.0;
  bool average = false;
  c10d::ReduceOp op = c10d::ReduceOp(c10d::ReduceOp::SUM);
  std::optional<at::ScalarType> kind;

  // One armed backward.
  std::mutex mutex;
  bool armed = false;
  std::vector<char> ready;
  std::vector<size_t> waiting;  // per bucket: its parameters not yet ready
  size_t next_bucket = 0;
  std::vector<std::pair<at::Tensor, c10::intrusive_ptr<c10d::Work>>> started;

  // Flattens bucket `b` and starts its all-reduce (the mutex held).
  void start(size_t b) {
    std::vector<at::Tensor> pieces;
    pieces.reserve(buckets[b].size());
    for (size_t i : buckets[b]) {
      const at::Tensor& p = params[i];
      const at::Tensor& g = p.grad();
      pieces.push_back(g.defined() ? g.reshape({-1}) : at::zeros({p.numel()}, p.options()));
    }
    at::Tensor flat = at::cat(pieces);
    if (kind.has_value() && *kind != flat.scalar_type()) {
      flat = flat.to(*kind);
    }
    if (pre != 1.0) {
      flat.div_(pre);
    }
    std::vector<at::Tensor> tensors = {flat};
    c10d::AllreduceOptions opts;
    opts.reduceOp = op;
    auto work = group->allreduce(tensors, opts);
    started.emplace_back(flat, work);
  }

  // Starts every bucket from `next_bucket` on whose parameters are all ready.
  void start_ready() {
    while (next_bucket < buckets.size() && waiting[next_bucket] == 0) {
      start(next_bucket++);
    }
  }

  void mark_ready(size_t index) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!armed) {
      return;
    }
    if (ready[index]) {
      throw std::runtime_error(
          "a parameter's gradient was accumulated twice in one backward (a parameter shared by "
          "two checkpointed segments?); its bucket's reduction had already started");
    }
    ready[index] = 1;
    --waiting[bucket_of[index]];
    start_ready();
  }
};

extern "C" {

// A reducer over `params` (leaves that require grad, one device) on the group of `pg`
// (`struct tchtrain_pg` of csrc/c10d.cpp, earlier in csrc/unity.cpp). The reduction: cast
// to `kind` (a c10 ScalarType, -1 for the gradients' own), divided by `pre`, all-reduced
// with `op` (as csrc/c10d.cpp's `reduce_op` reads it), divided by the world size when
// `average`, then by `post`. Writes the number of buckets.
char* tchtrain_shard_reducer_new(
    tchtrain_pg* pg,
    at::Tensor** params,
    size_t n,
    int64_t bucket_bytes,
    double pre,
    double post,
    int op,
    int average,
    int kind,
    tchtrain_shard_reducer** out,
    size_t* num_buckets) {
  return tchtrain::guarded([&] {
    auto r = std::make_unique<tchtrain_shard_reducer>();
    r->group = pg->group;
    r->pre = pre;
    r->post = post;
    r->average = average != 0;
    r->op = reduce_op(op);
    if (kind >= 0) {
      r->kind = static_cast<at::ScalarType>(kind);
    }
    for (size_t i = 0; i < n; ++i) {
      const at::Tensor& p = *params[i];
      TORCH_CHECK(p.is_leaf() && p.requires_grad(), "parameter ", i, " is not a leaf that requires grad");
      r->params.push_back(p);
    }
    // Reverse order, one dtype per bucket, at most `bucket_bytes` (a larger parameter alone).
    r->bucket_of.assign(n, 0);
    int64_t bytes = 0;
    for (size_t k = n; k-- > 0;) {
      const at::Tensor& p = r->params[k];
      int64_t size = p.numel() * static_cast<int64_t>(p.element_size());
      bool new_bucket = r->buckets.empty();
      if (!new_bucket) {
        const at::Tensor& last = r->params[r->buckets.back().back()];
        new_bucket = bytes + size > bucket_bytes || last.scalar_type() != p.scalar_type();
      }
      if (new_bucket) {
        r->buckets.emplace_back();
        bytes = 0;
      }
      r->buckets.back().push_back(k);
      r->bucket_of[k] = r->buckets.size() - 1;
      bytes += size;
    }
    tchtrain_shard_reducer* raw = r.get();
    for (size_t i = 0; i < n; ++i) {
      auto acc = torch::autograd::impl::grad_accumulator(r->params[i]);
      TORCH_CHECK(acc, "parameter ", i, " has no gradient accumulator");
      auto key = acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [raw, i](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
            raw->mark_ready(i);
            return outputs;
          }));
      r->hook_keys.push_back(key);
      r->accumulators.push_back(std::move(acc));
    }
    *num_buckets = r->buckets.size();
    *out = r.release();
  });
}

// Before a backward that ends an accumulation window: its gradients are reduced as they
// become ready. Anything a failed earlier backward left is dropped.
char* tchtrain_shard_reducer_arm(tchtrain_shard_reducer* r) {
  return tchtrain::guarded([&] {
    std::lock_guard<std::mutex> lock(r->mutex);
    r->started.clear();
    r->ready.assign(r->params.size(), 0);
    r->waiting.clear();
    for (const auto& b : r->buckets) {
      r->waiting.push_back(b.size());
    }
    r->next_bucket = 0;
    r->armed = true;
  });
}

// After the armed backward: the rest started, everything waited for and written into the
// gradients. Writes how many buckets had started during the backward.
char* tchtrain_shard_reducer_finish(tchtrain_shard_reducer* r, size_t* started_in_backward) {
  return tchtrain::guarded([&] {
    std::lock_guard<std::mutex> lock(r->mutex);
    TORCH_CHECK(r->armed, "the reduction was not armed before the backward");
    r->armed = false;
    *started_in_backward = r->next_bucket;
    while (r->next_bucket < r->buckets.size()) {
      r->start(r->next_bucket++);
    }
    const double world = static_cast<double>(r->group->getSize());
    for (size_t b = 0; b < r->buckets.size(); ++b) {
      auto& [flat, work] = r->started[b];
      work->wait();
      if (r->average) {
        flat.div_(world);
      }
      if (r->post != 1.0) {
        flat.div_(r->post);
      }
      int64_t offset = 0;
      for (size_t i : r->buckets[b]) {
        at::Tensor& p = r->params[i];
        int64_t numel = p.numel();
        at::Tensor piece = flat.narrow(0, offset, numel).view(p.sizes());
        at::Tensor& g = p.mutable_grad();
        if (g.defined()) {
          g.copy_(piece);
        } else {
          g = piece.to(p.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
        }
        offset += numel;
      }
    }
    r->started.clear();
  });
}

void tchtrain_shard_reducer_free(tchtrain_shard_reducer* r) {
  for (size_t i = 0; i < r->accumulators.size(); ++i) {
    r->accumulators[i]->del_post_hook(r->hook_keys[i]);
  }
  // Waiting for an all-reduce still running may throw: dropped, as nothing can act on it.
  std::free(tchtrain::guarded([&] { r->started.clear(); }));
  delete r;
}

} // extern "C"

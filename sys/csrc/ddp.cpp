// DistributedDataParallel's gradient reduction, overlapped with the backward: torch's own
// `c10d::Reducer` (torch/csrc/distributed/c10d/reducer.cpp), built as
// `torch.nn.parallel.DistributedDataParallel._ddp_init_helper` builds it and driven as its
// `_pre_forward` / `_post_forward` drive it. The reducer hooks every parameter's gradient
// accumulator; during a synchronised backward a parameter's gradient is copied (divided by
// the world size) into its bucket as soon as it is ready, and a bucket's all-reduce starts
// as soon as its last gradient is in, while the backward goes on. At the end of the
// backward (an autograd engine callback) the reducer waits for the all-reduces and copies
// the averaged buckets back into the gradients. The first iteration reduces everything as
// one bucket; the buckets are then rebuilt in the order the gradients became ready (the
// first one `first_bucket_bytes_cap`, the others `bucket_bytes_cap`), agreed from rank 0.
#include <torch/csrc/distributed/c10d/reducer.hpp>
#include <torch/headeronly/version.h>

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "guard.h"

struct tchtrain_reducer {
  std::unique_ptr<c10d::Reducer> reducer;
};

extern "C" {

// A reducer over `params` (leaf tensors that require grad, one device) on the group's
// backend (`struct tchtrain_pg` of csrc/c10d.cpp, earlier in csrc/unity.cpp). `bucket_bytes_cap` / `first_bucket_bytes_cap` as DDP's `_BucketCapacityConfig`
// computes them from `bucket_cap_mb`. Also writes the first iteration's bucket count.
char* tchtrain_ddp_reducer_new(
    tchtrain_pg* pg,
    at::Tensor** params,
    size_t n,
    int64_t bucket_bytes_cap,
    int64_t first_bucket_bytes_cap,
    int find_unused_parameters,
    tchtrain_reducer** out,
    size_t* num_buckets) {
  return tchtrain::guarded([&] {
    std::vector<at::Tensor> parameters;
    parameters.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      parameters.push_back(*params[i]);
    }
    std::vector<bool> expect_sparse(n, false);
    // `_BucketCapacityConfig.compute_bucket_size_limits` (no static graph, no per-bucket
    // list): without unused-parameter detection one bucket until the rebuild.
    std::vector<size_t> limits;
    if (!find_unused_parameters) {
      limits.push_back(static_cast<size_t>(std::numeric_limits<int64_t>::max()));
    } else if (first_bucket_bytes_cap < bucket_bytes_cap) {
      limits = {static_cast<size_t>(first_bucket_bytes_cap), static_cast<size_t>(bucket_bytes_cap)};
    } else {
      limits.push_back(static_cast<size_t>(bucket_bytes_cap));
    }
    auto [bucket_indices, per_bucket_limits] =
        c10d::compute_bucket_assignment_by_size(parameters, limits, expect_sparse);
    (void)per_bucket_limits;
    // Reversed, "to approximate the order in which their gradients are produced".
    std::vector<std::vector<size_t>> reversed(bucket_indices.rbegin(), bucket_indices.rend());
    *num_buckets = reversed.size();
    auto reducer = std::make_unique<c10d::Reducer>(
        std::move(parameters),
        std::move(reversed),
        pg->group,
        std::move(expect_sparse),
        bucket_bytes_cap,
        find_unused_parameters != 0,
        /*gradient_as_bucket_view=*/false,
        std::unordered_map<size_t, std::string>(),
        first_bucket_bytes_cap,
        /*skip_all_reduce_unused_params=*/false,
        /*use_python_reducer=*/false,
        /*bucket_bytes_cap_list=*/std::vector<int64_t>()
#if TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 12
        // (torch 2.11, which the GPU bundle builds against, has no such argument)
        ,
        /*batched_grad_copy=*/false
#endif
    );
    *out = new tchtrain_reducer{std::move(reducer)};
  });
}

// Before a forward whose backward ends an accumulation window (`_pre_forward` with
// `require_backward_grad_sync`): the iteration count and the bucket rebuild.
char* tchtrain_ddp_reducer_prepare_for_forward(tchtrain_reducer* r) {
  return tchtrain::guarded([&] { r->reducer->prepare_for_forward(); });
}

// `_pre_forward`'s `reducer._rebuild_buckets()`, on every forward with grad enabled (a
// collective once, the iteration after the first synchronised backward). 1 when it rebuilt.
char* tchtrain_ddp_reducer_rebuild_buckets(tchtrain_reducer* r, int* rebuilt) {
  return tchtrain::guarded([&] { *rebuilt = r->reducer->rebuild_buckets() ? 1 : 0; });
}

// `_post_forward` with `require_backward_grad_sync`: the hooks of the coming backward
// reduce; with unused-parameter detection the graph is searched from `outputs`.
char* tchtrain_ddp_reducer_prepare_for_backward(tchtrain_reducer* r, at::Tensor** outputs, size_t n) {
  return tchtrain::guarded([&] {
    std::vector<at::Tensor> outs;
    outs.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      outs.push_back(*outputs[i]);
    }
    r->reducer->prepare_for_backward(outs);
  });
}

// `_check_reducer_finalized`: an error when the last synchronised backward left a bucket
// unreduced (a parameter without a gradient and no unused-parameter detection).
char* tchtrain_ddp_reducer_check_finalized(tchtrain_reducer* r) {
  return tchtrain::guarded([&] { r->reducer->check_finalized(); });
}

// The current number of buckets.
size_t tchtrain_ddp_reducer_num_buckets(tchtrain_reducer* r) {
  return r->reducer->get_grad_buckets(/*return_zero_tensors=*/false).size();
}

void tchtrain_ddp_reducer_free(tchtrain_reducer* r) {
  // The destructor removes the hooks and may throw (a reduction still pending): dropped,
  // as nothing can act on it any more.
  std::free(tchtrain::guarded([&] { r->reducer.reset(); }));
  delete r;
}

} // extern "C"

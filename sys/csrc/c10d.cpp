// C boundary between tchtrain-distributed (Rust) and libtorch's c10d: a TCPStore
// rendezvous and a ProcessGroupGloo (or, built with USE_C10D_NCCL by the `cuda` feature,
// a ProcessGroupNCCL), with the collectives the trainer needs, on tch tensors in place (a
// tch `Tensor` is an `at::Tensor*` on this side).
//
// Every function returns nullptr on success or a heap-allocated error message (free it
// with `tchtrain_free_error`); `work->wait()` rethrows engine errors (a dead peer, a
// timeout) and they are caught here, so no C++ exception crosses into Rust.
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "guard.h"

namespace {

using tchtrain::error_message;
using tchtrain::guarded;

c10d::ReduceOp reduce_op(int op) {
  switch (op) {
    case 1:
      return c10d::ReduceOp(c10d::ReduceOp::PRODUCT);
    case 2:
      return c10d::ReduceOp(c10d::ReduceOp::MIN);
    case 3:
      return c10d::ReduceOp(c10d::ReduceOp::MAX);
    default:
      return c10d::ReduceOp(c10d::ReduceOp::SUM);
  }
}

// The TCPStore every backend rendezvouses through: rank 0 serves it and waits for the
// others up to `timeout`.
c10::intrusive_ptr<c10d::Store> make_store(
    const char* host,
    uint16_t port,
    int rank,
    int world_size,
    std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions opts;
  opts.port = port;
  opts.isServer = rank == 0;
  opts.numWorkers = static_cast<std::size_t>(world_size);
  opts.waitWorkers = true;
  opts.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(std::string(host), opts);
}

// The `ProcessGroup` over one backend, as `init_process_group` builds it: what DDP's
// reducer (csrc/ddp.cpp) runs its bucket all-reduces through.
c10::intrusive_ptr<c10d::ProcessGroup> make_group(
    const c10::intrusive_ptr<c10d::Store>& store,
    int rank,
    int world_size,
    const c10::intrusive_ptr<c10d::Backend>& backend,
    bool nccl) {
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world_size);
  auto type = nccl ? c10d::ProcessGroup::BackendType::NCCL : c10d::ProcessGroup::BackendType::GLOO;
  group->setBackend(nccl ? c10::DeviceType::CUDA : c10::DeviceType::CPU, type, backend);
  group->setDefaultBackend(type);
  return group;
}

} // namespace

struct tchtrain_pg {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> pg;
  bool nccl;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
};

extern "C" {

char* tchtrain_c10d_new_gloo(
    const char* host,
    uint16_t port,
    int rank,
    int world_size,
    int64_t timeout_ms,
    const char* gloo_interface,
    tchtrain_pg** out) {
  return guarded([&] {
    auto timeout = std::chrono::milliseconds(timeout_ms);
    auto store = make_store(host, port, rank, world_size, timeout);
    auto options = c10d::ProcessGroupGloo::Options::create(timeout);
    std::string h(host);
    if (gloo_interface != nullptr && gloo_interface[0] != '\0') {
      options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(gloo_interface));
    } else if (h == "127.0.0.1" || h == "localhost") {
      options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    } else {
      options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    c10::intrusive_ptr<c10d::Backend> pg =
        c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, options);
    *out = new tchtrain_pg{store, pg, false, make_group(store, rank, world_size, pg, false)};
  });
}

// 1 when this shim was compiled with NCCL (the `cuda` feature), 0 otherwise.
int tchtrain_c10d_has_nccl() {
#ifdef USE_C10D_NCCL
  return 1;
#else
  return 0;
#endif
}

// A ProcessGroupNCCL on CUDA device `device_index`, bound to it (barriers and the eager
// communicator use it). `TORCH_NCCL_BLOCKING_WAIT=1` is set unless the caller set it: then
// `wait()` blocks the host and throws once `timeout_ms` passes (a dead peer, a hang), so
// an NCCL failure comes back as an error like Gloo's instead of the watchdog's abort.
char* tchtrain_c10d_new_nccl(
    const char* host,
    uint16_t port,
    int rank,
    int world_size,
    int64_t timeout_ms,
    int device_index,
    tchtrain_pg** out) {
#ifdef USE_C10D_NCCL
  return guarded([&] {
    int count = static_cast<int>(c10::cuda::device_count());
    if (device_index < 0 || device_index >= count) {
      throw std::runtime_error(
          "NCCL needs CUDA device " + std::to_string(device_index) + " but this process sees " +
          std::to_string(count) + " CUDA device(s)");
    }
    setenv("TORCH_NCCL_BLOCKING_WAIT", "1", 0);
    auto device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device_index));
    c10::cuda::set_device(device.index());
    auto timeout = std::chrono::milliseconds(timeout_ms);
    auto store = make_store(host, port, rank, world_size, timeout);
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = timeout;
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, options);
    pg->setBoundDeviceId(device);
    pg->eagerConnectSingleDevice(device);
    *out = new tchtrain_pg{store, pg, true, make_group(store, rank, world_size, pg, true)};
  });
#else
  (void)host;
  (void)port;
  (void)rank;
  (void)world_size;
  (void)timeout_ms;
  (void)device_index;
  (void)out;
  return error_message(
      "this build of tchtrain-distributed has no NCCL: rebuild with the `cuda` feature "
      "(cargo build --features tchtrain-distributed/cuda) or use the gloo backend");
#endif
}

void tchtrain_c10d_free(tchtrain_pg* pg) {
  if (pg != nullptr && pg->nccl) {
    // NCCL communicators are finalized explicitly (destroy_process_group); errors here
    // (a peer already gone) cannot be acted on any more and are dropped.
    std::free(guarded([&] { pg->pg->shutdown(); }));
  }
  delete pg;
}

char* tchtrain_c10d_allreduce(tchtrain_pg* pg, at::Tensor* t, int op) {
  return guarded([&] {
    std::vector<at::Tensor> ts{*t};
    c10d::AllreduceOptions o;
    o.reduceOp = reduce_op(op);
    pg->pg->allreduce(ts, o)->wait();
  });
}

char* tchtrain_c10d_broadcast(tchtrain_pg* pg, at::Tensor* t, int root) {
  return guarded([&] {
    std::vector<at::Tensor> ts{*t};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    pg->pg->broadcast(ts, o)->wait();
  });
}

char* tchtrain_c10d_allgather(tchtrain_pg* pg, at::Tensor* out, at::Tensor* in) {
  return guarded([&] { pg->pg->_allgather_base(*out, *in)->wait(); });
}

char* tchtrain_c10d_reduce_scatter(tchtrain_pg* pg, at::Tensor* out, at::Tensor* in, int op) {
  return guarded([&] {
    c10d::ReduceScatterOptions o;
    o.reduceOp = reduce_op(op);
    pg->pg->_reduce_scatter_base(*out, *in, o)->wait();
  });
}

char* tchtrain_c10d_barrier(tchtrain_pg* pg) {
  return guarded([&] { pg->pg->barrier()->wait(); });
}

} // extern "C"

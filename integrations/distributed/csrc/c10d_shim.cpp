// C boundary between tchtrain-distributed (Rust) and libtorch's c10d: a TCPStore
// rendezvous and a ProcessGroupGloo, with the collectives the trainer needs, on tch
// tensors in place (a tch `Tensor` is an `at::Tensor*` on this side).
//
// Every function returns nullptr on success or a heap-allocated error message (free it
// with `tchtrain_c10d_free_error`); `work->wait()` rethrows engine errors (a dead peer, a
// timeout) and they are caught here, so no C++ exception crosses into Rust.
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace {

char* error_message(const char* what) {
  size_t n = std::strlen(what);
  char* out = static_cast<char*>(std::malloc(n + 1));
  if (out != nullptr) {
    std::memcpy(out, what, n + 1);
  }
  return out;
}

template <typename F>
char* guarded(F&& f) {
  try {
    f();
    return nullptr;
  } catch (const c10::Error& e) {
    // libtorch's own errors: the message without the C++ backtrace that `what()` appends.
    return error_message(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return error_message(e.what());
  } catch (...) {
    return error_message("unknown C++ exception");
  }
}

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

} // namespace

struct tchtrain_pg {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
};

extern "C" {

void tchtrain_c10d_free_error(char* err) {
  std::free(err);
}

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
    c10d::TCPStoreOptions opts;
    opts.port = port;
    opts.isServer = rank == 0;
    opts.numWorkers = static_cast<std::size_t>(world_size);
    opts.waitWorkers = true;
    opts.timeout = timeout;
    auto store = c10::make_intrusive<c10d::TCPStore>(std::string(host), opts);
    auto options = c10d::ProcessGroupGloo::Options::create(timeout);
    std::string h(host);
    if (gloo_interface != nullptr && gloo_interface[0] != '\0') {
      options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(gloo_interface));
    } else if (h == "127.0.0.1" || h == "localhost") {
      options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    } else {
      options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, options);
    *out = new tchtrain_pg{store, pg};
  });
}

void tchtrain_c10d_free(tchtrain_pg* pg) {
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

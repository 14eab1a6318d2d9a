// The one exception guard of tchtrain's C++: every `extern "C"` function of `tchtrain-sys`
// returns nullptr on success or a heap-allocated error message (free it with
// `tchtrain_free_error`), so no C++ exception crosses into Rust.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <exception>

namespace tchtrain {

// A malloc'd copy of `what` (nullptr when out of memory).
inline char* error_message(const char* what) {
  size_t n = std::strlen(what);
  char* out = static_cast<char*>(std::malloc(n + 1));
  if (out != nullptr) {
    std::memcpy(out, what, n + 1);
  }
  return out;
}

// Runs `f`; returns nullptr, or the message of the exception it threw. libtorch's own errors
// give their message without the C++ backtrace `what()` appends.
template <typename F>
char* guarded(F&& f) {
  try {
    f();
    return nullptr;
  } catch (const c10::Error& e) {
    return error_message(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return error_message(e.what());
  } catch (...) {
    return error_message("unknown C++ exception");
  }
}

// 0 = CPU, 1 = CUDA: the device codes the Rust side passes.
inline c10::DeviceType device_type(int device) {
  return device == 1 ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
}

}  // namespace tchtrain

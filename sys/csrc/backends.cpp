// Process-wide backend switches upstream sets from `TrainingArguments`: `tf32`
// (`enable_tf32`: torch.backends.fp32_precision = "tf32" / "ieee"), `full_determinism`
// (`enable_full_determinism`: deterministic algorithms, cuDNN deterministic, no cuDNN
// benchmark) and `torch_empty_cache_steps` (the device allocator's `emptyCache`); the device
// allocator's counters for `skip_memory_metrics=False` (`*_mem_gpu_*`).
#include <ATen/Context.h>
#include <ATen/Version.h>
#include <c10/core/CachingDeviceAllocator.h>

#include "guard.h"

#include <dlfcn.h>

extern "C" {

// torch.backends.fp32_precision = "tf32" (on != 0) or "ieee", as upstream's `enable_tf32`
// does with torch >= 2.9.
char* tchtrain_set_fp32_precision_tf32(int on) {
  return tchtrain::guarded([&] {
    at::globalContext().setFloat32Precision(
        at::Float32Backend::GENERIC, at::Float32Op::ALL,
        on != 0 ? at::Float32Precision::TF32 : at::Float32Precision::IEEE);
  });
}

// 1 when ATen's CPU capability (`torch.backends.cpu.get_cpu_capability()`) is "AVX512".
int tchtrain_cpu_capability_avx512() {
  try {
    return at::get_cpu_capability() == "AVX512" ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

// The compute capability's major number of CUDA device `index` (cudaDevAttrComputeCapabilityMajor
// through the CUDA runtime libtorch_cuda loaded), or -1 when there is no CUDA runtime or device.
// Looked up at run time so that CPU builds need no CUDA header.
int tchtrain_cuda_capability_major(int index) {
  using GetAttribute = int (*)(int*, int, int);
  auto get = reinterpret_cast<GetAttribute>(dlsym(RTLD_DEFAULT, "cudaDeviceGetAttribute"));
  if (get == nullptr) {
    return -1;
  }
  constexpr int kComputeCapabilityMajor = 75;
  int major = -1;
  if (get(&major, kComputeCapabilityMajor, index) != 0) {
    return -1;
  }
  return major;
}

// torch.use_deterministic_algorithms(on, warn_only); torch.backends.cudnn.deterministic = on;
// torch.backends.cudnn.benchmark = false when on.
char* tchtrain_set_deterministic(int on, int warn_only) {
  return tchtrain::guarded([&] {
    auto& ctx = at::globalContext();
    ctx.setDeterministicAlgorithms(on != 0, warn_only != 0);
    ctx.setDeterministicCuDNN(on != 0);
    if (on != 0) {
      ctx.setBenchmarkCuDNN(false);
    }
  });
}

// torch.are_deterministic_algorithms_enabled().
int tchtrain_deterministic_algorithms() {
  return at::globalContext().deterministicAlgorithms() ? 1 : 0;
}

// torch.cuda.empty_cache() (device 1); an error for a device without a caching allocator.
char* tchtrain_empty_device_cache(int device) {
  return tchtrain::guarded([&] {
    c10::getDeviceAllocator(tchtrain::device_type(device))->emptyCache();
  });
}

// torch.cuda.memory_allocated(index) and torch.cuda.max_memory_allocated(index) (device 1):
// the caching allocator's `allocated_bytes.all.current` and `.peak`, in bytes.
char* tchtrain_device_memory_allocated(int device, int index, int64_t* current, int64_t* peak) {
  return tchtrain::guarded([&] {
    auto stats = c10::getDeviceAllocator(tchtrain::device_type(device))
                     ->getDeviceStats(static_cast<c10::DeviceIndex>(index));
    const auto& all =
        stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
    *current = all.current;
    *peak = all.peak;
  });
}

// torch.cuda.reset_peak_memory_stats(index) (device 1).
char* tchtrain_device_reset_peak_memory_stats(int device, int index) {
  return tchtrain::guarded([&] {
    c10::getDeviceAllocator(tchtrain::device_type(device))
        ->resetPeakStats(static_cast<c10::DeviceIndex>(index));
  });
}

}  // extern "C"

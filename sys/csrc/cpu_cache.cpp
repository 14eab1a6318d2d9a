// A caching CPU allocator for libtorch, installed while the Trainer trains or evaluates.
//
// Why: glibc hands every freed block above its mmap threshold (at most 32 MB) back to the
// kernel, so a training step that allocates the same large buffers every time (GPT-2's
// [batch, seq, 50257] logits, their gradient, the log-softmax) maps, faults in, zeroes and
// unmaps hundreds of MB of pages per step; that page-fault work was ~18 % of a CPU step and
// made steps ~2x longer than with the memory kept. This is the CPU side of what torch's CUDA
// caching allocator does: requests of at least `kMinCached` bytes are rounded up to one of 8
// sizes per power of two, and their blocks are kept when freed and handed to the next request
// they fit (the smallest cached block at least as large, if at most twice as large; the whole
// block counts as in use), in place of a fresh mapping. Before a request no cached block fits
// gets fresh memory, the oldest cached blocks are freed until the memory held (in use +
// cached) stays within the most ever in use at once plus 1/4, so the cache adds at most that
// 1/4 to the peak; the free blocks kept are also capped (`limit` bytes). Smaller requests go
// straight to c10::alloc_cpu, as with libtorch's default allocator.
//
// Installed with c10::SetCPUAllocator while at least one holder is active (a count, so nested
// or concurrent Trainers share it); when the last one leaves, the previous allocator is put
// back and the cache emptied. Blocks allocated here and freed later still come back here (their
// DataPtr names this deleter) and are then released to the system. No C++ exception leaves
// this file through the C functions.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <unordered_map>

namespace {

constexpr size_t kMinCached = size_t(1) << 20;  // 1 MiB

struct Stats {
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t cached_bytes = 0;
  uint64_t peak_cached_bytes = 0;
};

class CachingCpuAllocator final : public c10::Allocator {
 public:
  static CachingCpuAllocator& instance() {
    // Never destroyed: DataPtrs handed out may outlive static destruction order.
    static auto* alloc = new CachingCpuAllocator();
    return *alloc;
  }

  c10::DataPtr allocate(size_t n) override {
    void* ptr = nullptr;
    if (n >= kMinCached) {
      ptr = take(size_class(n));
    } else {
      ptr = c10::alloc_cpu(n);
    }
    return {ptr, ptr, &deleter, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &deleter; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  // Returns false when another allocator of higher priority is in place.
  bool acquire(uint64_t limit) {
    std::lock_guard<std::mutex> lock(mu_);
    if (holders_ == 0) {
      c10::Allocator* current = c10::GetCPUAllocator();
      if (current != this) {
        previous_ = current;
      }
      c10::SetCPUAllocator(this, 0);
      if (c10::GetCPUAllocator() != this) {
        return false;
      }
      limit_ = limit;
    } else if (limit > limit_) {
      limit_ = limit;
    }
    ++holders_;
    return true;
  }

  void release_holder() {
    std::lock_guard<std::mutex> lock(mu_);
    if (holders_ == 0) {
      return;
    }
    if (--holders_ == 0) {
      if (previous_ != nullptr && c10::GetCPUAllocator() == this) {
        c10::SetCPUAllocator(previous_, 0);
      }
      evict_until(0);
      // The next holders measure their own peak.
      peak_in_use_ = in_use_;
    }
  }

  Stats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  struct Block {
    void* ptr;
    size_t size;
  };
  using Fifo = std::list<Block>;

  static void deleter(void* ptr) { instance().give_back(ptr); }

  // `n` rounded up to one of 8 sizes per power of two (at most 1/8 more), so requests of
  // nearby sizes (a batch padded to 100 or to 104 tokens) share blocks.
  static size_t size_class(size_t n) {
    size_t p = size_t(1) << (63 - __builtin_clzll(static_cast<unsigned long long>(n)));
    size_t step = p / 8;
    return (n + step - 1) / step * step;
  }

  void* take(size_t n) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = by_size_.lower_bound(n);
      if (it != by_size_.end() && it->first <= n + n) {
        Fifo::iterator block = it->second;
        void* ptr = block->ptr;
        size_t size = block->size;
        by_size_.erase(it);
        fifo_.erase(block);
        stats_.cached_bytes -= size;
        live_[ptr] = size;
        in_use(size);
        ++stats_.hits;
        return ptr;
      }
      ++stats_.misses;
      // Keep the memory held (in use + cached) within the most ever in use at once (this
      // request included) plus 1/4: the oldest cached blocks go first. Without that, blocks
      // cached at the peak of a step would add to the peak.
      uint64_t peak = std::max(peak_in_use_, in_use_ + n);
      uint64_t budget = peak + peak / 4;
      uint64_t needed = in_use_ + n;
      evict_until(budget > needed ? budget - needed : 0);
    }
    void* ptr = nullptr;
    try {
      ptr = c10::alloc_cpu(n);
    } catch (const c10::Error&) {
      // Out of memory: hand every cached block back and try once more (as the CUDA caching
      // allocator frees its cache before it fails), so a full cache is never the cause.
      {
        std::lock_guard<std::mutex> lock(mu_);
        evict_until(0);
      }
      ptr = c10::alloc_cpu(n);
    }
    std::lock_guard<std::mutex> lock(mu_);
    live_[ptr] = n;
    in_use(n);
    return ptr;
  }

  void give_back(void* ptr) {
    if (ptr == nullptr) {
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = live_.find(ptr);
      if (it != live_.end()) {
        size_t size = it->second;
        live_.erase(it);
        in_use_ -= size;
        if (holders_ > 0 && size <= limit_) {
          evict_until(limit_ - size);
          fifo_.push_back(Block{ptr, size});
          by_size_.emplace(size, std::prev(fifo_.end()));
          stats_.cached_bytes += size;
          if (stats_.cached_bytes > stats_.peak_cached_bytes) {
            stats_.peak_cached_bytes = stats_.cached_bytes;
          }
          return;
        }
      }
    }
    c10::free_cpu(ptr);
  }

  // Counts `size` more bytes handed out. Caller holds mu_.
  void in_use(uint64_t size) {
    in_use_ += size;
    peak_in_use_ = std::max(peak_in_use_, in_use_);
  }

  // Frees the oldest cached blocks until at most `keep` bytes stay cached. Caller holds mu_.
  void evict_until(uint64_t keep) {
    while (stats_.cached_bytes > keep && !fifo_.empty()) {
      Block oldest = fifo_.front();
      auto range = by_size_.equal_range(oldest.size);
      for (auto it = range.first; it != range.second; ++it) {
        if (it->second == fifo_.begin()) {
          by_size_.erase(it);
          break;
        }
      }
      fifo_.pop_front();
      stats_.cached_bytes -= oldest.size;
      c10::free_cpu(oldest.ptr);
    }
  }

  std::mutex mu_;
  size_t holders_ = 0;
  uint64_t limit_ = 0;
  uint64_t in_use_ = 0;       // bytes of large blocks handed out
  uint64_t peak_in_use_ = 0;  // the most of them at once
  c10::Allocator* previous_ = nullptr;
  Fifo fifo_;                                   // free blocks, oldest first
  std::multimap<size_t, Fifo::iterator> by_size_;  // the same blocks by size
  std::unordered_map<void*, size_t> live_;       // large blocks handed out
  Stats stats_;
};

}  // namespace

extern "C" {

// Installs the caching allocator (or joins the current holders); `limit` caps the bytes of
// free blocks kept. Returns false when it could not be installed.
bool tchtrain_cpu_cache_acquire(uint64_t limit) {
  try {
    return CachingCpuAllocator::instance().acquire(limit);
  } catch (...) {
    return false;
  }
}

// Leaves; the last holder restores the previous allocator and empties the cache.
void tchtrain_cpu_cache_release() {
  try {
    CachingCpuAllocator::instance().release_holder();
  } catch (...) {
  }
}

// Counters since the process started: reuses, fresh large allocations, bytes cached now and
// at most.
void tchtrain_cpu_cache_stats(uint64_t* hits, uint64_t* misses, uint64_t* cached,
                                      uint64_t* peak_cached) {
  try {
    Stats s = CachingCpuAllocator::instance().stats();
    *hits = s.hits;
    *misses = s.misses;
    *cached = s.cached_bytes;
    *peak_cached = s.peak_cached_bytes;
  } catch (...) {
  }
}

}  // extern "C"

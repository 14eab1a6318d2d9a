//! The caching CPU allocator (`CpuMemoryCache`): while held, a freed large block is handed to
//! the next request of a close size instead of going back to the system; blocks above the cap
//! are not kept; when the last holder drops, libtorch's previous allocator is back. The
//! counters are process-wide, so the test runs alone in a child process of this binary (no
//! other test's thread allocates between the checks).

use tch::{Device, Kind, Tensor};
use tchtrain_testing::lock;
use tchtrain_trainer::CpuMemoryCache;

const MIB: i64 = 1 << 20;

fn four_mib() -> Tensor {
    Tensor::empty([MIB], (Kind::Float, Device::Cpu))
}

#[test]
fn large_blocks_are_reused_while_held_and_released_after() {
    let _g = lock();
    if !crate::common::isolated("large_blocks_are_reused_while_held_and_released_after") {
        return;
    }
    // Without a holder: nothing goes through the cache.
    let before = CpuMemoryCache::stats();
    drop(four_mib());
    assert_eq!(CpuMemoryCache::stats(), before);

    let cache = CpuMemoryCache::with_limit(64 * MIB as u64).expect("installs");
    let a = four_mib();
    let ptr = a.data_ptr();
    drop(a);
    let held = CpuMemoryCache::stats();
    assert_eq!(held.cached_bytes, 4 * MIB as u64);

    // The same size again: the same block, counted as a hit.
    let b = four_mib();
    assert_eq!(b.data_ptr(), ptr);
    assert_eq!(CpuMemoryCache::stats().hits, held.hits + 1);
    assert_eq!(CpuMemoryCache::stats().cached_bytes, 0);
    // Reused memory holds whatever was there; ops that promise zeros still give zeros.
    let z = Tensor::zeros([MIB], (Kind::Float, Device::Cpu));
    assert_eq!(z.abs().sum(Kind::Double).double_value(&[]), 0.0);
    drop(z);
    drop(b);

    // A request larger than every cached block gets fresh memory.
    let misses = CpuMemoryCache::stats().misses;
    let big = Tensor::empty([MIB * 3], (Kind::Float, Device::Cpu)); // 12 MiB
    assert_eq!(CpuMemoryCache::stats().misses, misses + 1);
    drop(big);

    // Small blocks (under 1 MiB) bypass the cache.
    let s = CpuMemoryCache::stats();
    drop(Tensor::empty([1024], (Kind::Float, Device::Cpu)));
    assert_eq!(CpuMemoryCache::stats().hits, s.hits);
    assert_eq!(CpuMemoryCache::stats().misses, s.misses);

    // Cached now: the 4 MiB block, the 8 MiB double copy `sum(Kind::Double)` made, the 12 MiB
    // block: 24 MiB, under the cap.
    assert_eq!(CpuMemoryCache::stats().cached_bytes, 24 * MIB as u64);
    // An 80 MiB request fits no cached block. The most in use at once becomes 80 MiB, so the
    // memory held may be 80 + 80 / 4 = 100 MiB: with 80 in use, 20 MiB stay cached and the
    // oldest block (4 MiB) is freed first.
    let huge = Tensor::empty([MIB * 20], (Kind::Float, Device::Cpu));
    assert_eq!(CpuMemoryCache::stats().cached_bytes, 20 * MIB as u64);
    // Freed, it is above the 64 MiB cap, so it is not kept.
    drop(huge);
    assert_eq!(
        CpuMemoryCache::stats().cached_bytes,
        20 * MIB as u64,
        "a block above the cap is not kept"
    );

    // Sizes round up to 8 classes per power of two: 40 MiB + 4 bytes and 42.5 MiB are both
    // served a 44 MiB block, so the second reuses the first's (without the classes, a
    // 40.000004 MiB block could not serve 42.5 MiB).
    let a = Tensor::empty([10 * MIB + 1], (Kind::Float, Device::Cpu));
    let ptr = a.data_ptr();
    drop(a);
    let b = Tensor::empty([10 * MIB + 5 * MIB / 8], (Kind::Float, Device::Cpu));
    assert_eq!(b.data_ptr(), ptr);
    drop(b);

    // Nested holders share the cache; the last one to drop empties it.
    let inner = CpuMemoryCache::with_limit(64 * MIB as u64).expect("joins");
    drop(inner);
    assert!(
        CpuMemoryCache::stats().cached_bytes > 0,
        "still held by the outer holder"
    );
    drop(cache);
    assert_eq!(CpuMemoryCache::stats().cached_bytes, 0);
    let after = CpuMemoryCache::stats();
    drop(four_mib());
    assert_eq!(
        CpuMemoryCache::stats(),
        after,
        "the previous allocator is back"
    );

    // A cap of 0 means no cache.
    assert!(CpuMemoryCache::with_limit(0).is_none());
}

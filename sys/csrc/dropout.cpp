// Dropout's noise on the CPU, drawn exactly as libtorch draws it, about four times faster.
//
// `torch.nn.functional.dropout(x, p, training=True)` on the CPU is `_dropout_impl`:
// `noise = empty_like(x).bernoulli_(1 - p); noise.div_(1 - p); x * noise`. The scalar
// `bernoulli_` is `templates::cpu::bernoulli_kernel`: for every element, in memory order,
// `bernoulli_distribution<double>(1 - p)` on the default CPU generator, that is two draws of
// its mt19937 (`random64()`: the first draw is the high word), the low 53 bits scaled by
// 2^-53, and `u < 1 - p`. libtorch draws them one call at a time through a serial
// TensorIterator loop (about 4 ns an element), which made dropout a sixth of a LoRA step.
//
// Here the same engine state is advanced in blocks (the twist and the tempering are plain
// loops the compiler vectorises), each element's draw is compared as an integer
// (`x53 < ceil((1 - p) 2^53)` is exactly `x53 2^-53 < 1 - p`), and the noise is written
// directly as `0` or `1 / (1 - p)` (float, the bits `div_` gives). The default generator is
// left exactly where libtorch's own draw would leave it.
//
// Before the first use, a self-check compares this draw with libtorch's `bernoulli_` on
// fresh generators (sizes across the 624-word block boundary, odd start positions); if a
// libtorch build draws differently (another kernel, another engine), every call falls back
// to libtorch's own ops, so the result is libtorch's either way.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/MT19937RNGEngine.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>

#include "guard.h"

namespace {

constexpr int kN = 624;
constexpr int kM = 397;
constexpr uint32_t kMatrixA = 0x9908b0df;
constexpr uint32_t kUpper = 0x80000000;
constexpr uint32_t kLower = 0x7fffffff;

inline uint32_t twist(uint32_t u, uint32_t v) {
  uint32_t mixed = (u & kUpper) | (v & kLower);
  return (mixed >> 1) ^ ((0u - (v & 1u)) & kMatrixA);
}

inline uint32_t temper(uint32_t y) {
  y ^= (y >> 11);
  y ^= (y << 7) & 0x9d2c5680;
  y ^= (y << 15) & 0xefc60000;
  y ^= (y >> 18);
  return y;
}

// at::mt19937::next_state, as index loops.
// Each hot loop is compiled twice, for AVX2 and for the baseline, picked at load time
// (`target_clones`), and at -O3 whatever the profile (the loops vectorise only there).
#define TCHTRAIN_HOT __attribute__((target_clones("avx2", "default"), optimize("O3")))

TCHTRAIN_HOT void next_state(uint32_t* s) {
  for (int i = 0; i < kN - kM; ++i) {
    s[i] = s[i + kM] ^ twist(s[i], s[i + 1]);
  }
  for (int i = kN - kM; i < kN - 1; ++i) {
    s[i] = s[i + kM - kN] ^ twist(s[i], s[i + 1]);
  }
  s[kN - 1] = s[kM - 1] ^ twist(s[kN - 1], s[0]);
}

// `n` outputs of the engine whose state is `d`, as `n` calls of at::mt19937::operator()
// would return them, leaving `d` as those calls would.
TCHTRAIN_HOT void draw(at::mt19937_data_pod& d, uint32_t* out, int64_t n) {
  while (n > 0) {
    if (d.left_ == 1) {
      // The next call twists, then reads word 0 and leaves left_ = kN.
      next_state(d.state_.data());
      d.left_ = kN + 1;
      d.next_ = 0;
    }
    const int64_t k = std::min<int64_t>(n, d.left_ - 1);
    const uint32_t* s = d.state_.data() + d.next_;
    for (int64_t i = 0; i < k; ++i) {
      out[i] = temper(s[i]);
    }
    d.next_ += static_cast<uint32_t>(k);
    d.left_ -= static_cast<int>(k);
    out += k;
    n -= k;
  }
}

// `bernoulli_distribution<double>(q)` for `n` elements: `keep` where the draw falls below
// `q`, else 0.
TCHTRAIN_HOT void fill(at::mt19937_data_pod& d, float* out, int64_t n, double q, float keep) {
  // x53 * 2^-53 < q  <=>  x53 < q * 2^53 (exact)  <=>  x53 < ceil(q * 2^53).
  const uint64_t threshold = static_cast<uint64_t>(std::ceil(std::ldexp(q, 53)));
  constexpr int64_t kChunk = 2048;
  uint32_t words[2 * kChunk];
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t m = std::min(kChunk, n - start);
    draw(d, words, 2 * m);
    float* o = out + start;
    for (int64_t j = 0; j < m; ++j) {
      const uint64_t x = (static_cast<uint64_t>(words[2 * j] & 0x1fffff) << 32) | words[2 * j + 1];
      o[j] = x < threshold ? keep : 0.0f;
    }
  }
}

// Draws `n` elements of `bernoulli(q)` (0 / 1) with `fill` into a fresh float tensor, from
// generator `g`.
at::Tensor fill_with(at::Generator& g, int64_t n, double q) {
  at::Tensor out = at::empty({n}, at::TensorOptions().dtype(at::kFloat));
  auto* impl = at::check_generator<at::CPUGeneratorImpl>(g);
  std::lock_guard<std::mutex> lock(g.mutex());
  at::mt19937 engine = impl->engine();
  at::mt19937_data_pod d = engine.data();
  fill(d, out.data_ptr<float>(), n, q, 1.0f);
  engine.set_data(d);
  impl->set_engine(engine);
  return out;
}

// Whether `fill` draws what libtorch's `bernoulli_` draws, and leaves the generator where
// it leaves it.
bool self_check() {
  const int64_t sizes[] = {1, 7, 311, 623, 624, 625, 1249, 5000, 70001};
  const double qs[] = {0.95, 0.9, 0.5, 0.1, 1.0 - 1e-9};
  uint64_t seed = 1234;
  for (int64_t n : sizes) {
    for (double q : qs) {
      for (int64_t skip : {0, 1, 623}) {
        at::Generator theirs = at::detail::createCPUGenerator(seed);
        at::Generator ours = at::detail::createCPUGenerator(seed);
        ++seed;
        for (int64_t i = 0; i < skip; ++i) {
          at::check_generator<at::CPUGeneratorImpl>(theirs)->random();
          at::check_generator<at::CPUGeneratorImpl>(ours)->random();
        }
        at::Tensor expected = at::empty({n}, at::TensorOptions().dtype(at::kFloat));
        expected.bernoulli_(q, theirs);
        at::Tensor got = fill_with(ours, n, q);
        if (!at::equal(expected, got)) {
          return false;
        }
        if (at::check_generator<at::CPUGeneratorImpl>(theirs)->random64() !=
            at::check_generator<at::CPUGeneratorImpl>(ours)->random64()) {
          return false;
        }
      }
    }
  }
  return true;
}

bool fast_path() {
  static const bool exact = self_check();
  return exact;
}

}  // namespace

extern "C" {

// Whether `tchtrain_dropout_noise` draws with its own loop (1) or with libtorch's ops (0,
// when the self-check found that this libtorch draws differently).
int tchtrain_dropout_fast_path() {
  try {
    return fast_path() ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

// Fills `noise` (float32, CPU, contiguous) with `bernoulli(1 - p) / (1 - p)` from the default
// CPU generator: the values and the generator state `_dropout_impl`'s
// `noise.bernoulli_(1 - p); noise.div_(1 - p)` give.
char* tchtrain_dropout_noise_(at::Tensor* noise, double p) {
  return tchtrain::guarded([&] {
    TORCH_CHECK(noise->device().is_cpu() && noise->scalar_type() == at::kFloat &&
                    noise->is_contiguous(),
                "tchtrain_dropout_noise_ takes a contiguous float32 CPU tensor");
    TORCH_CHECK(p > 0.0 && p < 1.0, "tchtrain_dropout_noise_ takes 0 < p < 1, got ", p);
    const double q = 1.0 - p;
    if (!fast_path()) {
      noise->bernoulli_(q);
      noise->div_(q);
      return;
    }
    at::Generator g = at::detail::getDefaultCPUGenerator();
    auto* impl = at::check_generator<at::CPUGeneratorImpl>(g);
    const float keep = 1.0f / static_cast<float>(q);
    std::lock_guard<std::mutex> lock(g.mutex());
    at::mt19937 engine = impl->engine();
    at::mt19937_data_pod d = engine.data();
    fill(d, noise->data_ptr<float>(), noise->numel(), q, keep);
    engine.set_data(d);
    impl->set_engine(engine);
  });
}

}  // extern "C"

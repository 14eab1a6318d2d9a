//! `TorchGenerator`: a bit-exact copy of PyTorch's CPU random generator
//! (`torch.Generator()`: mt19937 as in ATen's `CPUGeneratorImpl`) with the two draws the
//! masking collators use, `bernoulli` with a per-element probability and `randint`.
//!
//! Upstream seeds a private `torch.Generator().manual_seed(seed)` for
//! `DataCollatorForLanguageModeling(seed=...)`. tch exposes only libtorch's global
//! generator (`tch::manual_seed`), which the model (dropout) shares, so a seeded collator
//! keeps its own generator here. The algorithms are those of ATen 2.13:
//! `at::mt19937` (`MT19937RNGEngine.h`), `bernoulli_distribution<float>` over
//! `uniform_real_distribution<float>` (24 random bits, `u < p`,
//! `DistributionsHelper.h`, `TransformationHelper.h`), and `random_from_to`
//! (`random() % range`, or `random64() % range` when `range >= 2^28`), each drawn
//! serially in row-major order as `cpu_serial_kernel` does.

const N: usize = 624;
const M: usize = 397;
const MATRIX_A: u32 = 0x9908_b0df;
const UPPER_MASK: u32 = 0x8000_0000;
const LOWER_MASK: u32 = 0x7fff_ffff;

/// PyTorch's CPU generator: same seed, same stream as `torch.Generator().manual_seed(seed)`.
///
/// ```
/// use tchtrain_collators::TorchGenerator;
/// let mut g = TorchGenerator::new(0);
/// // torch.randint(10, (5,), generator=torch.Generator().manual_seed(0)).tolist()
/// let v: Vec<i64> = (0..5).map(|_| g.randint(10)).collect();
/// assert_eq!(v, [4, 9, 3, 0, 3]);
/// ```
#[derive(Debug, Clone)]
pub struct TorchGenerator {
    state: Box<[u32; N]>,
    left: usize,
    next: usize,
    seed: u64,
}

impl TorchGenerator {
    /// A generator seeded as `torch.Generator().manual_seed(seed)`.
    pub fn new(seed: u64) -> Self {
        let mut state = Box::new([0u32; N]);
        state[0] = (seed & 0xffff_ffff) as u32;
        for j in 1..N {
            let prev = state[j - 1];
            state[j] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(j as u32);
        }
        Self {
            state,
            left: 1,
            next: 0,
            seed,
        }
    }

    /// The seed this generator was created with (`initial_seed()`).
    pub fn initial_seed(&self) -> u64 {
        self.seed
    }

    fn twist(u: u32, v: u32) -> u32 {
        let mixed = (u & UPPER_MASK) | (v & LOWER_MASK);
        (mixed >> 1) ^ if v & 1 != 0 { MATRIX_A } else { 0 }
    }

    fn next_state(&mut self) {
        let s = &mut self.state;
        self.left = N;
        self.next = 0;
        for i in 0..N - M {
            s[i] = s[i + M] ^ Self::twist(s[i], s[i + 1]);
        }
        for i in N - M..N - 1 {
            s[i] = s[i + M - N] ^ Self::twist(s[i], s[i + 1]);
        }
        s[N - 1] = s[M - 1] ^ Self::twist(s[N - 1], s[0]);
    }

    /// One 32-bit draw (`CPUGeneratorImpl::random`).
    pub fn random(&mut self) -> u32 {
        self.left -= 1;
        if self.left == 0 {
            self.next_state();
        }
        let mut y = self.state[self.next];
        self.next += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^= y >> 18;
        y
    }

    /// One 64-bit draw (`CPUGeneratorImpl::random64`: two 32-bit draws, first one high).
    pub fn random64(&mut self) -> u64 {
        let hi = u64::from(self.random());
        let lo = u64::from(self.random());
        (hi << 32) | lo
    }

    /// One `bernoulli_distribution<float>(p)` draw: 24 random bits as a uniform in
    /// `[0, 1)`, compared with `p` in float32.
    pub fn bernoulli(&mut self, p: f32) -> bool {
        let u = (self.random() & 0x00ff_ffff) as f32 * (1.0 / 16_777_216.0);
        u < p
    }

    /// One `torch.randint(high, ...)` element: uniform in `0..high` (`high >= 1`).
    pub fn randint(&mut self, high: i64) -> i64 {
        let range = high.max(1) as u64;
        let v = if range >= 1 << 28 {
            self.random64() % range
        } else {
            u64::from(self.random()) % range
        };
        v as i64
    }

    /// `torch.bernoulli(probabilities, generator=g)` over a row-major matrix.
    pub fn bernoulli_matrix(&mut self, probabilities: &[f32]) -> Vec<bool> {
        probabilities.iter().map(|&p| self.bernoulli(p)).collect()
    }
}

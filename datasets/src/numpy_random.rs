//! numpy's `default_rng(seed)` (numpy 2.4: `SeedSequence` → `PCG64`) and
//! `Generator.permutation(n)`, what `datasets`' `Dataset.shuffle(seed=...)` draws its order
//! from: the seed's 32-bit words hashed into a 4-word pool (`SeedSequence.mix_entropy`),
//! `generate_state(4, uint64)` as PCG64's initial state and increment (`pcg64_srandom`),
//! XSL-RR output of the 128-bit LCG, `next_uint32` from the halves of a 64-bit draw, and the
//! Fisher-Yates shuffle with masked rejection (`random_interval`). Equal to numpy's output.
//!
//! ```
//! // list(np.random.default_rng(42).permutation(5))
//! let p = tchtrain_datasets::numpy_random::default_rng(42).permutation(5);
//! assert_eq!(p.len(), 5);
//! ```

const INIT_A: u32 = 0x43b0_d7e5;
const MULT_A: u32 = 0x931e_8875;
const INIT_B: u32 = 0x8b51_f9dd;
const MULT_B: u32 = 0x58f3_8ded;
const MIX_MULT_L: u32 = 0xca01_f9dd;
const MIX_MULT_R: u32 = 0x4973_f715;
const POOL_SIZE: usize = 4;
const PCG_MULT: u128 = 0x2360_ED05_1FC6_5DA4_4385_DF64_9FCC_F645;

fn hashmix(value: u32, hash_const: &mut u32) -> u32 {
    let mut v = value ^ *hash_const;
    *hash_const = hash_const.wrapping_mul(MULT_A);
    v = v.wrapping_mul(*hash_const);
    v ^ (v >> 16)
}

fn mix(x: u32, y: u32) -> u32 {
    let r = MIX_MULT_L
        .wrapping_mul(x)
        .wrapping_sub(MIX_MULT_R.wrapping_mul(y));
    r ^ (r >> 16)
}

/// numpy's `SeedSequence(seed)`: the entropy pool of a non-negative integer seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeedSequence {
    pool: [u32; POOL_SIZE],
}

impl SeedSequence {
    /// The pool of `seed` (its 32-bit words, least significant first).
    pub fn new(seed: u64) -> Self {
        let mut entropy = vec![seed as u32];
        if seed >> 32 != 0 {
            entropy.push((seed >> 32) as u32);
        }
        let mut pool = [0u32; POOL_SIZE];
        let mut hc = INIT_A;
        for (i, slot) in pool.iter_mut().enumerate() {
            *slot = hashmix(entropy.get(i).copied().unwrap_or(0), &mut hc);
        }
        for src in 0..POOL_SIZE {
            for dst in 0..POOL_SIZE {
                if src != dst {
                    pool[dst] = mix(pool[dst], hashmix(pool[src], &mut hc));
                }
            }
        }
        for &e in entropy.iter().skip(POOL_SIZE) {
            for slot in pool.iter_mut() {
                *slot = mix(*slot, hashmix(e, &mut hc));
            }
        }
        Self { pool }
    }

    /// `generate_state(n_words)` (uint32 words).
    pub fn generate_state(&self, n_words: usize) -> Vec<u32> {
        let mut hc = INIT_B;
        (0..n_words)
            .map(|i| {
                let mut v = self.pool[i % POOL_SIZE] ^ hc;
                hc = hc.wrapping_mul(MULT_B);
                v = v.wrapping_mul(hc);
                v ^ (v >> 16)
            })
            .collect()
    }
}

/// numpy's `PCG64` bit generator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pcg64 {
    state: u128,
    inc: u128,
    buffered: Option<u32>,
}

impl Pcg64 {
    /// `PCG64(SeedSequence(seed))`.
    pub fn new(seed: u64) -> Self {
        let w = SeedSequence::new(seed).generate_state(8);
        let u: Vec<u64> = w
            .chunks_exact(2)
            .map(|p| u64::from(p[0]) | (u64::from(p[1]) << 32))
            .collect();
        let initstate = (u128::from(u[0]) << 64) | u128::from(u[1]);
        let initseq = (u128::from(u[2]) << 64) | u128::from(u[3]);
        let mut g = Self {
            state: 0,
            inc: (initseq << 1) | 1,
            buffered: None,
        };
        g.step();
        g.state = g.state.wrapping_add(initstate);
        g.step();
        g
    }

    fn step(&mut self) {
        self.state = self.state.wrapping_mul(PCG_MULT).wrapping_add(self.inc);
    }

    /// `next_uint64`: the LCG stepped, then XSL-RR.
    pub fn next_u64(&mut self) -> u64 {
        self.step();
        let x = ((self.state >> 64) as u64) ^ (self.state as u64);
        x.rotate_right((self.state >> 122) as u32)
    }

    /// `next_uint32`: the low half of a 64-bit draw, its high half kept for the next call.
    pub fn next_u32(&mut self) -> u32 {
        if let Some(u) = self.buffered.take() {
            return u;
        }
        let v = self.next_u64();
        self.buffered = Some((v >> 32) as u32);
        v as u32
    }

    /// `random_interval(max)`: uniform in `0..=max` by masked rejection.
    pub fn random_interval(&mut self, max: u64) -> u64 {
        if max == 0 {
            return 0;
        }
        let mut mask = max;
        for s in [1, 2, 4, 8, 16, 32] {
            mask |= mask >> s;
        }
        loop {
            let v = if max <= u64::from(u32::MAX) {
                u64::from(self.next_u32()) & mask
            } else {
                self.next_u64() & mask
            };
            if v <= max {
                return v;
            }
        }
    }

    /// `Generator.permutation(n)`: `arange(n)` shuffled (Fisher-Yates from the end).
    pub fn permutation(&mut self, n: usize) -> Vec<usize> {
        let mut a: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            let j = self.random_interval(i as u64) as usize;
            a.swap(i, j);
        }
        a
    }
}

/// `np.random.default_rng(seed)`.
pub fn default_rng(seed: u64) -> Pcg64 {
    Pcg64::new(seed)
}

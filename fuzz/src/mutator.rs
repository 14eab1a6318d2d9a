//! Inputs made from seeds, for the replay test: a few of libFuzzer's mutations (bit flips,
//! interesting bytes and numbers, erased / copied / inserted ranges, crossover, truncation)
//! drawn from a fixed seed, so a run is the same on every machine and a failure is
//! reproduced by its seed and index.

/// Bytes a parser of JSON, CSV or pickles treats specially.
const INTERESTING_BYTES: &[u8] =
    b"\0\x01\x7f\x80\xff\"\\{}[],:-+.0123456789eE \n\r\t'#/nulltruefalseN";

/// Numbers that sit on the edges of integer and float parsing.
const INTERESTING_NUMBERS: &[&str] = &[
    "0",
    "-0",
    "1",
    "-1",
    "2",
    "255",
    "256",
    "65536",
    "2147483647",
    "-2147483648",
    "4294967296",
    "9223372036854775807",
    "-9223372036854775808",
    "18446744073709551616",
    "1e309",
    "-1e309",
    "1e-320",
    "0.5",
    "NaN",
    "Infinity",
    "-Infinity",
    "null",
    "\"\"",
    "[]",
    "{}",
];

/// The longest input made (the committed seeds are well under it).
const MAX_LEN: usize = 1 << 16;

/// A seeded source of inputs made from a set of seeds.
pub struct Mutator {
    state: u64,
}

impl Mutator {
    /// A mutator whose draws follow from `seed` alone.
    pub fn new(seed: u64) -> Self {
        Self {
            state: seed ^ 0x9e37_79b9_7f4a_7c15,
        }
    }

    /// The next draw (SplitMix64).
    fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A draw in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// A new input: one of `seeds` (or an empty input when there are none) with one to
    /// four mutations applied.
    pub fn input(&mut self, seeds: &[Vec<u8>]) -> Vec<u8> {
        let mut data = if seeds.is_empty() {
            Vec::new()
        } else {
            seeds[self.below(seeds.len())].clone()
        };
        for _ in 0..1 + self.below(4) {
            self.mutate(&mut data, seeds);
        }
        data.truncate(MAX_LEN);
        data
    }

    /// One mutation of `data`, in place.
    fn mutate(&mut self, data: &mut Vec<u8>, seeds: &[Vec<u8>]) {
        let len = data.len();
        match self.below(9) {
            // Flip one bit.
            0 if len > 0 => {
                let i = self.below(len);
                data[i] ^= 1 << self.below(8);
            }
            // Overwrite one byte with an interesting one.
            1 if len > 0 => {
                let i = self.below(len);
                data[i] = INTERESTING_BYTES[self.below(INTERESTING_BYTES.len())];
            }
            // Insert an interesting byte.
            2 => {
                let i = self.below(len + 1);
                data.insert(i, INTERESTING_BYTES[self.below(INTERESTING_BYTES.len())]);
            }
            // Erase a range.
            3 if len > 0 => {
                let start = self.below(len);
                let end = start + 1 + self.below((len - start).min(64));
                data.drain(start..end);
            }
            // Copy a range elsewhere.
            4 if len > 0 => {
                let start = self.below(len);
                let end = start + 1 + self.below((len - start).min(64));
                let chunk: Vec<u8> = data[start..end].to_vec();
                let at = self.below(len + 1);
                data.splice(at..at, chunk);
            }
            // Replace a run of digits (or insert) with an interesting number.
            5 => {
                let number = INTERESTING_NUMBERS[self.below(INTERESTING_NUMBERS.len())];
                let at = self.below(len + 1);
                let mut end = at;
                while end < len && (data[end].is_ascii_digit() || data[end] == b'.') {
                    end += 1;
                }
                data.splice(at..end, number.bytes());
            }
            // Crossover: the head of this input and the tail of another seed.
            6 if !seeds.is_empty() => {
                let other = &seeds[self.below(seeds.len())];
                let cut = self.below(len + 1);
                let from = self.below(other.len() + 1);
                data.truncate(cut);
                data.extend_from_slice(&other[from..]);
            }
            // Truncate.
            7 if len > 0 => {
                let keep = self.below(len);
                data.truncate(keep);
            }
            // Insert random bytes.
            _ => {
                let at = self.below(len + 1);
                let n = 1 + self.below(8);
                let bytes: Vec<u8> = (0..n).map(|_| self.next() as u8).collect();
                data.splice(at..at, bytes);
            }
        }
    }
}

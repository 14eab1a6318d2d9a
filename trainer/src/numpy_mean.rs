//! numpy's `ndarray.mean()` of a 1-D float32 array, bit for bit: upstream's
//! `evaluation_loop` reports `{prefix}_loss` as `all_losses.mean().item()` over the
//! concatenated per-row losses (a float32 numpy array), and numpy sums float32 in float32
//! with its pairwise summation (`@TYPE@_pairwise_sum` in `loops_utils.h.src`: blocks of up
//! to 128 values summed in 8 interleaved accumulators, larger runs split in two at a
//! multiple of 8), then divides in float32 (`_methods._mean`: `ret.dtype.type(ret / rcount)`).
//! Any other order (libtorch's vectorised, thread-split sum) can differ by a few ulps, and
//! by how many depends on the machine's vector width and thread count.

/// numpy's `PW_BLOCKSIZE`.
const PW_BLOCKSIZE: usize = 128;

/// numpy's float32 `pairwise_sum`, in float32.
fn pairwise_sum(a: &[f32]) -> f32 {
    let n = a.len();
    if n < 8 {
        // `res = 0.; for (...) res += a[i];` (`-0.0` sums to `+0.0`, as there).
        let mut res = 0.0f32;
        for &x in a {
            res += x;
        }
        res
    } else if n <= PW_BLOCKSIZE {
        let mut r = [0.0f32; 8];
        r.copy_from_slice(&a[..8]);
        let mut i = 8;
        while i < n - (n % 8) {
            for (j, acc) in r.iter_mut().enumerate() {
                *acc += a[i + j];
            }
            i += 8;
        }
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for &x in &a[i..] {
            res += x;
        }
        res
    } else {
        let mut n2 = n / 2;
        n2 -= n2 % 8;
        pairwise_sum(&a[..n2]) + pairwise_sum(&a[n2..])
    }
}

/// `np.asarray(values, dtype=np.float32).mean().item()`: NaN for an empty slice, as numpy
/// (which also warns).
pub fn numpy_mean_f32(values: &[f32]) -> f64 {
    // The reduction starts from add's identity 0 (`io1 = 0; io1 += pairwise_sum(...)`).
    let sum = 0.0f32 + pairwise_sum(values);
    f64::from(sum / values.len() as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_array_sums_left_to_right_from_zero() {
        let v = [0.1f32, 0.2, 0.3, 1e8, -1e8, 0.7, 0.05];
        let mut want = 0.0f32;
        for x in v {
            want += x;
        }
        assert_eq!(pairwise_sum(&v), want);
        assert_eq!(numpy_mean_f32(&[1.0, 2.0, 2.0]), f64::from(5.0f32 / 3.0f32));
        assert!(numpy_mean_f32(&[]).is_nan());
    }

    /// numpy's own results (scripts/reference/numpy_mean.py), bit for bit, on lengths
    /// around the pairwise boundaries (8, 128 and the recursive splits).
    #[test]
    fn equals_numpy_bit_for_bit() {
        let assets = std::env::var_os("TCHTRAIN_ASSETS").map_or_else(
            || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets"),
            std::path::PathBuf::from,
        );
        let path = assets.join("reference/numpy_mean/numpy_mean.json");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run `cargo xtask setup`)", path.display()));
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        let cases = json["cases"].as_array().unwrap();
        assert!(cases.len() >= 10);
        for case in cases {
            let values: Vec<f32> = case["bits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| f32::from_bits(b.as_u64().unwrap() as u32))
                .collect();
            let want = f64::from_bits(case["mean_bits"].as_u64().unwrap());
            let got = numpy_mean_f32(&values);
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "n = {}: {got} vs numpy {want}",
                values.len()
            );
        }
    }
}

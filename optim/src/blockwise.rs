//! bitsandbytes' dynamic 8-bit data type and its blockwise quantization, as bitsandbytes
//! 0.50.2 computes them on a CPU.
//!
//! - [`create_dynamic_map`]: `bitsandbytes.functional.create_dynamic_map` (the 256-entry
//!   codebooks `qmap1` / `qmap2` of the 8-bit optimizers), built with the same torch ops so the
//!   float32 values are identical.
//! - [`quantize_blockwise`] / [`dequantize_blockwise`]: the C library's
//!   `cquantize_blockwise_cpu_fp32` / `cdequantize_blockwise_cpu_fp32` (csrc/cpu_ops.cpp):
//!   per block of `blocksize` elements, `absmax = max |x|` and each `x * (1 / absmax)` mapped to
//!   a code index through a 65536-bin lookup table of the codebook's midpoints; dequantizing is
//!   `code[q] * absmax`. The lookup table, the bin index (computed with a fused multiply-add, as
//!   the x86-64 build compiles it) and the float32 arithmetic are reproduced bit for bit, so
//!   the quantized bytes equal the library's.

use tch::{Device, Kind, Scalar, TchError, Tensor};

use crate::Result;

/// The block size of bitsandbytes' 8-bit optimizer states on CPU.
pub const BLOCKSIZE: usize = 256;

/// Entries of a codebook (`2 ** 8`).
const CODEBOOK_SIZE: usize = 256;

/// Bins of the quantization lookup table over `[-1, 1]` (the C library's `kLUTSize`).
const LUT_SIZE: usize = 65536;

/// `bitsandbytes.functional.create_dynamic_map(signed, max_exponent_bits=7, total_bits=8)`:
/// the dynamic data type (a dynamic exponent and a fraction) as a sorted float32 tensor of
/// 256 values in `[-1, 1]` (`signed`) or `[0, 1]`. The 8-bit optimizers quantize their first
/// state with the signed map and the second (Adam's, AdEMAMix's `nu`) with the unsigned one.
pub fn create_dynamic_map(signed: bool) -> Result<Tensor> {
    const MAX_EXPONENT_BITS: i32 = 7;
    let mut data: Vec<f32> = Vec::with_capacity(CODEBOOK_SIZE);
    // (total_bits - 1 == max_exponent_bits: no additional linear items)
    for i in 0..MAX_EXPONENT_BITS {
        let fraction_items = if signed {
            (1i64 << i) + 1
        } else {
            (1i64 << (i + 1)) + 1
        };
        let boundaries = Tensor::f_linspace(
            Scalar::float(0.1),
            Scalar::int(1),
            fraction_items,
            (Kind::Float, Device::Cpu),
        )?;
        let n = fraction_items - 1;
        let means = boundaries
            .f_narrow(0, 0, n)?
            .f_add(&boundaries.f_narrow(0, 1, n)?)?
            .f_div_scalar(2.0)?;
        // Python's `10 ** (-6 + i)`: a float for negative exponents (libm pow), the int 1 last.
        let exponent = -(MAX_EXPONENT_BITS - 1) + i;
        let scale = if exponent < 0 {
            10f64.powf(f64::from(exponent))
        } else {
            1.0
        };
        data.extend(Vec::<f32>::try_from(&means.f_mul_scalar(scale)?)?);
        if signed {
            data.extend(Vec::<f32>::try_from(&means.f_mul_scalar(-scale)?)?);
        }
    }
    data.push(0.0);
    data.push(1.0);
    if data.len() != CODEBOOK_SIZE {
        return Err(TchError::Shape(format!(
            "dynamic map has {} entries, expected {CODEBOOK_SIZE}",
            data.len()
        ))
        .into());
    }
    data.sort_by(f32::total_cmp);
    Ok(Tensor::from_slice(&data))
}

/// A codebook and its quantization lookup table (the C library's `build_quantize_lut`):
/// bin `i` of `[-1, 1]` holds the index of the first codebook entry whose upper midpoint is
/// not below the bin's value.
pub(crate) struct Quantizer {
    code: Vec<f32>,
    lut: Vec<u8>,
}

impl std::fmt::Debug for Quantizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Quantizer")
            .field("code", &self.code.len())
            .finish_non_exhaustive()
    }
}

impl Quantizer {
    /// Builds the lookup table of `code` (256 sorted values in `[-1, 1]`).
    pub(crate) fn new(code: &[f32]) -> Result<Self> {
        check_code(code.len())?;
        let midpoints: Vec<f32> = code.windows(2).map(|w| 0.5 * (w[0] + w[1])).collect();
        let mut lut = vec![0u8; LUT_SIZE];
        let mut code_idx = 0usize;
        for (i, slot) in lut.iter_mut().enumerate() {
            // exact: i < 2^16, so 2i is an exact float32
            let val = -1.0f32 + (2.0f32 * i as f32) / (LUT_SIZE - 1) as f32;
            while code_idx < CODEBOOK_SIZE - 1 && midpoints[code_idx] < val {
                code_idx += 1;
            }
            *slot = code_idx as u8;
        }
        Ok(Self {
            code: code.to_vec(),
            lut,
        })
    }

    /// The codebook.
    pub(crate) fn code(&self) -> &[f32] {
        &self.code
    }

    /// The code index of a value already divided by its block's absmax (`norm_to_lut_index`
    /// and the table look-up). The x86-64 library compiles `((v + 1) * 0.5) * 65535 + 0.5`
    /// into one fused multiply-add (`vfmadd213ss`), so `mul_add` (correctly rounded) it is.
    fn index(&self, v: f32) -> u8 {
        let v = v.clamp(-1.0, 1.0);
        let half = (v + 1.0) * 0.5;
        let bin = half.mul_add((LUT_SIZE - 1) as f32, 0.5);
        // truncation as `vcvttss2si` then `uint16_t`; `v` in [-1, 1] keeps it in 0..=65535
        // (a nan clamps to nan and maps to 0 on both sides)
        self.lut[usize::from(bin as i32 as u16)]
    }

    /// Quantizes `a` block by block into `out` (one byte per element) and `absmax` (one value
    /// per block).
    pub(crate) fn quantize(&self, a: &[f32], blocksize: usize, out: &mut [u8], absmax: &mut [f32]) {
        for ((block, q), m) in a
            .chunks(blocksize)
            .zip(out.chunks_mut(blocksize))
            .zip(absmax.iter_mut())
        {
            // `std::max(m, fabs(x))` keeps `m` when `x` is nan
            let block_max = block
                .iter()
                .fold(0.0f32, |m, x| if m < x.abs() { x.abs() } else { m });
            *m = block_max;
            if block_max == 0.0 {
                q.fill(0);
                continue;
            }
            let inv = 1.0f32 / block_max;
            for (x, q) in block.iter().zip(q.iter_mut()) {
                *q = self.index(x * inv);
            }
        }
    }
}

/// `code[a[i]] * absmax[i / blocksize]` for every element (`cdequantize_blockwise_cpu_fp32`).
pub(crate) fn dequantize(code: &[f32], a: &[u8], absmax: &[f32], blocksize: usize) -> Vec<f32> {
    a.chunks(blocksize)
        .zip(absmax)
        .flat_map(|(block, &m)| block.iter().map(move |&q| code[usize::from(q)] * m))
        .collect()
}

/// The lookup tables built so far, one per distinct codebook (an optimizer sees two).
#[derive(Debug, Default)]
pub(crate) struct QuantizerCache {
    quantizers: Vec<Quantizer>,
}

impl QuantizerCache {
    /// The quantizer of `code`, built on first use.
    pub(crate) fn get(&mut self, code: &[f32]) -> Result<&Quantizer> {
        let found = self.quantizers.iter().position(|q| q.code() == code);
        let i = match found {
            Some(i) => i,
            None => {
                self.quantizers.push(Quantizer::new(code)?);
                self.quantizers.len() - 1
            }
        };
        Ok(&self.quantizers[i])
    }
}

fn check_code(len: usize) -> Result<()> {
    if len == CODEBOOK_SIZE {
        Ok(())
    } else {
        Err(TchError::Shape(format!(
            "a quantization codebook has {CODEBOOK_SIZE} entries, this one {len}"
        ))
        .into())
    }
}

fn check_blocksize(blocksize: i64) -> Result<usize> {
    usize::try_from(blocksize)
        .ok()
        .filter(|&b| b > 0)
        .ok_or_else(|| {
            TchError::Shape(format!("blocksize must be positive, got {blocksize}")).into()
        })
}

/// The elements of a tensor as f32, in row-major order, read on the CPU.
pub(crate) fn f32_values(t: &Tensor) -> Result<Vec<f32>> {
    let t = t
        .f_to_device(Device::Cpu)?
        .f_to_kind(Kind::Float)?
        .f_contiguous()?
        .f_view([-1])?;
    Ok(Vec::<f32>::try_from(&t)?)
}

/// The bytes of a uint8 tensor, in row-major order, read on the CPU.
pub(crate) fn u8_values(t: &Tensor) -> Result<Vec<u8>> {
    if t.kind() != Kind::Uint8 {
        return Err(TchError::Kind(format!("expected a uint8 tensor, got {:?}", t.kind())).into());
    }
    let t = t.f_to_device(Device::Cpu)?.f_contiguous()?.f_view([-1])?;
    Ok(Vec::<u8>::try_from(&t)?)
}

/// Number of blocks of `n` elements (`ceil(n / blocksize)`).
pub(crate) fn num_blocks(n: usize, blocksize: usize) -> usize {
    n.div_ceil(blocksize)
}

/// `bitsandbytes.functional.quantize_blockwise(a, code, blocksize)` on CPU for float32 input:
/// the uint8 codes (shape of `a`) and the float32 absmax of each block. Other float dtypes
/// are read as float32.
pub fn quantize_blockwise(a: &Tensor, code: &Tensor, blocksize: i64) -> Result<(Tensor, Tensor)> {
    let bs = check_blocksize(blocksize)?;
    let values = f32_values(a)?;
    let quantizer = Quantizer::new(&f32_values(code)?)?;
    let mut out = vec![0u8; values.len()];
    let mut absmax = vec![0f32; num_blocks(values.len(), bs)];
    quantizer.quantize(&values, bs, &mut out, &mut absmax);
    let out = Tensor::from_slice(&out)
        .f_view(a.size().as_slice())?
        .f_to_device(a.device())?;
    let absmax = Tensor::from_slice(&absmax).f_to_device(a.device())?;
    Ok((out, absmax))
}

/// `bitsandbytes.functional.dequantize_blockwise(a, absmax, code=code, blocksize=blocksize)`
/// on CPU: float32 values of `a`'s shape, `code[a] * absmax[block]`.
pub fn dequantize_blockwise(
    a: &Tensor,
    absmax: &Tensor,
    code: &Tensor,
    blocksize: i64,
) -> Result<Tensor> {
    let bs = check_blocksize(blocksize)?;
    let bytes = u8_values(a)?;
    let code = f32_values(code)?;
    check_code(code.len())?;
    let absmax = f32_values(absmax)?;
    let blocks = num_blocks(bytes.len(), bs);
    if absmax.len() != blocks {
        return Err(TchError::Shape(format!(
            "{} elements in blocks of {bs} need {blocks} absmax values, got {}",
            bytes.len(),
            absmax.len()
        ))
        .into());
    }
    let out = dequantize(&code, &bytes, &absmax, bs);
    Ok(Tensor::from_slice(&out)
        .f_view(a.size().as_slice())?
        .f_to_device(a.device())?)
}

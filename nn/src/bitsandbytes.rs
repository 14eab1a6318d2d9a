//! bitsandbytes' 4-bit quantization as its CPU backend computes it (bitsandbytes 0.50:
//! `functional.py`, `backends/default/ops.py`, `backends/cpu/ops.py` and its C kernels):
//! the NF4 / FP4 codes, `quantize_4bit` (absmax per block of 64, each value's nearest code by
//! the midpoints, two codes per byte, high nibble first), the double quantization of the
//! absmax (`compress_statistics`: the mean subtracted, then 8-bit blockwise codes of the
//! dynamic map in blocks of 256, by the C kernel's 65 536-entry lookup table), and
//! dequantization (`code[q] · absmax` in float32, then the compute dtype).
//!
//! [`QuantState`] is bitsandbytes' `QuantState`, read from and written to its packed
//! `state_dict` keys (`weight.absmax`, `weight.quant_map`, `weight.nested_absmax`,
//! `weight.nested_quant_map`, `weight.quant_state.bitsandbytes__nf4`: the JSON of the
//! remaining fields, as bytes), which transformers' pre-quantized checkpoints hold.

use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result};

/// bitsandbytes' 4-bit data types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantType {
    /// NormalFloat 4 (`nf4`).
    Nf4,
    /// 4-bit float with 2 exponent bits (`fp4`).
    Fp4,
}

impl QuantType {
    /// `bnb_4bit_quant_type` / `quant_type` as written (`"nf4"`, `"fp4"`).
    pub fn parse(value: &str, field: &'static str) -> Result<Self> {
        match value {
            "nf4" => Ok(Self::Nf4),
            "fp4" => Ok(Self::Fp4),
            other => Err(Error::InvalidArgument {
                field,
                detail: format!("{other:?}: bitsandbytes' 4-bit types are \"nf4\" and \"fp4\""),
            }),
        }
    }

    /// The name bitsandbytes writes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Nf4 => "nf4",
            Self::Fp4 => "fp4",
        }
    }

    /// `get_4bit_type(typename)`: the 16 values, divided by their largest magnitude.
    pub fn code(self) -> Tensor {
        let data: [f32; 16] = match self {
            Self::Nf4 => [
                -1.0,
                -0.696_192_8,
                -0.525_073_05,
                -0.394_917_5,
                -0.284_441_38,
                -0.184_773_43,
                -0.091_050_036,
                0.0,
                0.079_580_3,
                0.160_930_2,
                0.246_112_3,
                0.337_915_24,
                0.440_709_83,
                0.562_617,
                0.722_956_84,
                1.0,
            ],
            Self::Fp4 => [
                0.0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0, -0.0, -0.0625, -8.0, -12.0, -4.0, -6.0,
                -2.0, -3.0,
            ],
        };
        let t = Tensor::from_slice(&data);
        // `data.div_(data.abs().max())`.
        &t / t.abs().max()
    }
}

/// `create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8)`: the 256 values of
/// the 8-bit dynamic type that double quantization codes the absmax with, sorted.
pub fn create_dynamic_map() -> Vec<f32> {
    let (max_exponent_bits, non_sign_bits) = (7i32, 7i32);
    let mut data: Vec<f64> = Vec::with_capacity(256);
    let linspace_means = |items: i64| -> Tensor {
        let b = Tensor::linspace(0.1, 1.0, items, (Kind::Float, Device::Cpu));
        (b.narrow(0, 0, items - 1) + b.narrow(0, 1, items - 1)) / 2.0
    };
    let push = |data: &mut Vec<f64>, t: &Tensor| {
        data.extend(
            Vec::<f32>::try_from(t)
                .unwrap_or_default()
                .into_iter()
                .map(f64::from),
        );
    };
    for i in 0..max_exponent_bits {
        let fraction_items = 2i64.pow((i + non_sign_bits - max_exponent_bits) as u32) + 1;
        let means = linspace_means(fraction_items);
        // `10 ** (-(max_exponent_bits - 1) + i)`: a Python float (an int from 10 ** 0 on).
        let scale = 10f64.powf(f64::from(-(max_exponent_bits - 1) + i));
        push(&mut data, &(&means * scale));
        push(&mut data, &(&means * -scale));
    }
    // `additional_items = 2 ** (non_sign_bits - max_exponent_bits) - 1` is 0 here.
    data.push(0.0);
    data.push(1.0);
    let mut data: Vec<f32> = data.into_iter().map(|v| v as f32).collect();
    data.resize(256, 0.0);
    data.sort_by(f32::total_cmp);
    // `sorted()` on Python floats puts -0.0 and 0.0 as they came; no -0.0 arises here.
    data
}

/// The C kernel's lookup table for a code: entry `i` is the code nearest to
/// `-1 + 2i / 65535` by the midpoints (the first whose midpoint is not below it).
fn quantize_lut(code: &[f32]) -> Vec<u8> {
    const LUT: usize = 65536;
    let midpoints: Vec<f32> = code.windows(2).map(|w| 0.5f32 * (w[0] + w[1])).collect();
    let mut lut = vec![0u8; LUT];
    let mut idx = 0usize;
    for (i, slot) in lut.iter_mut().enumerate() {
        let val = -1.0f32 + (2.0f32 * i as f32) / (LUT - 1) as f32;
        while idx < midpoints.len() && midpoints[idx] < val {
            idx += 1;
        }
        *slot = idx as u8;
    }
    lut
}

/// `quantize_blockwise(A, code, blocksize)` on the CPU (the C kernel): per block the absmax,
/// each value times `1 / absmax` (float32), its code from the lookup table; a block of zeros
/// codes 0. `a` is read as float32; returns the codes (`a`'s shape, uint8) and the absmax.
pub fn quantize_blockwise(a: &Tensor, code: &[f32], blocksize: i64) -> Result<(Tensor, Tensor)> {
    if code.len() != 256 || blocksize <= 0 {
        return Err(Error::InvalidArgument {
            field: "blocksize",
            detail: format!(
                "{blocksize} (code of {} values): bitsandbytes' 8-bit blockwise codes take 256 values and a positive block size",
                code.len()
            ),
        });
    }
    let values: Vec<f32> =
        Vec::try_from(a.f_to_kind(Kind::Float)?.f_reshape([-1])?).map_err(Error::Torch)?;
    let lut = quantize_lut(code);
    let bs = blocksize as usize;
    let mut out = vec![0u8; values.len()];
    let mut absmax = Vec::with_capacity(values.len().div_ceil(bs));
    for (block, q) in values.chunks(bs).zip(out.chunks_mut(bs)) {
        let m = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        absmax.push(m);
        if m == 0.0 {
            continue;
        }
        let inv = 1.0f32 / m;
        for (v, q) in block.iter().zip(q.iter_mut()) {
            let v = (v * inv).clamp(-1.0, 1.0);
            let index = ((v + 1.0f32) * 0.5f32 * 65535f32 + 0.5f32) as u16;
            *q = lut[usize::from(index)];
        }
    }
    let q = Tensor::from_slice(&out).f_reshape(a.size())?;
    Ok((q, Tensor::from_slice(&absmax)))
}

/// `dequantize_blockwise`: `code[q] · absmax` per block, in float32, then `kind`.
pub fn dequantize_blockwise(
    q: &Tensor,
    absmax: &Tensor,
    code: &Tensor,
    blocksize: i64,
    kind: Kind,
) -> Result<Tensor> {
    let flat = q.f_reshape([-1])?.f_to_kind(Kind::Int64)?;
    let values = code.f_index_select(0, &flat)?;
    let out = scale_blocks(&values, absmax, blocksize)?;
    Ok(out.f_to_kind(kind)?.f_reshape(q.size())?)
}

/// `values [n]` times their block's absmax (the last block possibly short).
fn scale_blocks(values: &Tensor, absmax: &Tensor, blocksize: i64) -> Result<Tensor> {
    let n = values.size()[0];
    let rem = n % blocksize;
    let full = n - rem;
    let blocks = full / blocksize;
    let head = values
        .f_narrow(0, 0, full)?
        .f_reshape([blocks, blocksize])?
        .f_mul(&absmax.f_narrow(0, 0, blocks)?.f_view([-1, 1])?)?
        .f_reshape([full])?;
    if rem == 0 {
        return Ok(head);
    }
    let tail = values
        .f_narrow(0, full, rem)?
        .f_mul(&absmax.f_select(0, blocks)?)?;
    Ok(Tensor::f_cat(&[head, tail], 0)?)
}

/// The double quantization of a 4-bit state's absmax (`state2` and `offset`).
#[derive(Debug)]
pub struct NestedState {
    /// `offset`: the mean of the absmax, subtracted before coding (float32 scalar).
    pub offset: Tensor,
    /// `state2.absmax` (float32, one per block of 256 absmax).
    pub absmax: Tensor,
    /// `state2.code`: the dynamic map.
    pub code: Tensor,
    /// `state2.blocksize` (256).
    pub blocksize: i64,
    /// `state2.dtype` (float32).
    pub dtype: Kind,
}

/// bitsandbytes' `QuantState` of a 4-bit weight.
#[derive(Debug)]
pub struct QuantState {
    /// `absmax` per block: float32, or with double quantization its 8-bit codes.
    pub absmax: Tensor,
    /// The weight's shape `[out, in]`.
    pub shape: Vec<i64>,
    /// `code` (`quant_map`): the 16 values of the type.
    pub code: Tensor,
    /// The weight's dtype before quantization (what `dequantize_4bit` returns).
    pub dtype: Kind,
    /// `blocksize` (64).
    pub blocksize: i64,
    /// `quant_type`.
    pub quant_type: QuantType,
    /// `compress_statistics`: the absmax double-quantized.
    pub nested: Option<NestedState>,
}

/// `str(dtype).strip("torch.")`.
fn dtype_name(kind: Kind) -> Result<&'static str> {
    Ok(match kind {
        Kind::Float => "float32",
        Kind::BFloat16 => "bfloat16",
        Kind::Half => "float16",
        Kind::Double => "float64",
        other => {
            return Err(Error::InvalidArgument {
                field: "quant_state.dtype",
                detail: format!("{other:?} is not a floating dtype bitsandbytes quantizes"),
            });
        }
    })
}

fn dtype_of(name: &str) -> Result<Kind> {
    Ok(match name {
        "float32" => Kind::Float,
        "bfloat16" => Kind::BFloat16,
        "float16" => Kind::Half,
        "float64" => Kind::Double,
        other => {
            return Err(Error::InvalidArgument {
                field: "quant_state.dtype",
                detail: format!("{other:?}: expected float32, bfloat16, float16 or float64"),
            });
        }
    })
}

/// `quantize_4bit(A, blocksize, compress_statistics, quant_type)` (the default backend's,
/// which the CPU runs): the packed codes `[(numel + 1) / 2, 1]` (uint8) and the state.
pub fn quantize_4bit(
    a: &Tensor,
    blocksize: i64,
    quant_type: QuantType,
    compress_statistics: bool,
) -> Result<(Tensor, QuantState)> {
    if blocksize <= 0 {
        return Err(Error::InvalidArgument {
            field: "blocksize",
            detail: format!("{blocksize}: use a positive block size (64)"),
        });
    }
    let code = quant_type.code();
    // `_get_4bit_quantize_bounds`: the midpoints of the sorted code, and the order that maps
    // a sorted index back to the code's (the identity for NF4).
    let order = code.f_argsort(0, false)?;
    let sorted = code.f_index_select(0, &order)?;
    let bounds = (sorted.f_narrow(0, 0, 15)? + sorted.f_narrow(0, 1, 15)?) / 2.0;
    let flat = a.f_reshape([-1])?.f_to_kind(Kind::Float)?;
    let n = flat.size()[0];
    let rem = n % blocksize;
    let full = n - rem;
    let blocks = full / blocksize;
    let com = flat.f_narrow(0, 0, full)?.f_reshape([blocks, blocksize])?;
    let mut absmax = com.f_abs()?.f_amax([-1i64].as_slice(), false)?;
    let mut scaled = (&com * absmax.f_clamp_min(1e-38)?.f_reciprocal()?.f_view([-1, 1])?)
        .f_clamp(-1.0, 1.0)?
        .f_reshape([-1])?;
    if rem > 0 {
        let tail = flat.f_narrow(0, full, rem)?;
        let am = tail.f_abs()?.f_max()?.f_clamp_min(1e-38)?;
        absmax = Tensor::f_cat(&[absmax, am.f_unsqueeze(0)?], 0)?;
        scaled = Tensor::f_cat(&[scaled, tail.f_div(&am)?.f_clamp(-1.0, 1.0)?], 0)?;
    }
    if scaled.size()[0] % 2 == 1 {
        scaled = scaled.f_constant_pad_nd([0i64, 1].as_slice())?;
    }
    let mut q = Tensor::f_bucketize(&scaled, &bounds, true, false)?;
    if quant_type != QuantType::Nf4 {
        q = order.f_index_select(0, &q.f_to_kind(Kind::Int64)?)?;
    }
    let q8 = q.f_to_kind(Kind::Uint8)?;
    let high = q8
        .f_slice(0, 0, None, 2)?
        .f_bitwise_left_shift_tensor_scalar(4)?;
    let packed = high
        .f_bitwise_or_tensor(&q8.f_slice(0, 1, None, 2)?)?
        .f_unsqueeze(1)?;
    let nested = if compress_statistics {
        // `offset = absmax.mean(); quantize_blockwise(absmax - offset, blocksize=256)`.
        let offset = absmax.f_mean(Kind::Float)?;
        let centred = absmax.f_sub(&offset)?;
        let map = create_dynamic_map();
        let (qabsmax, absmax2) = quantize_blockwise(&centred, &map, 256)?;
        absmax = qabsmax;
        Some(NestedState {
            offset,
            absmax: absmax2,
            code: Tensor::from_slice(&map),
            blocksize: 256,
            dtype: Kind::Float,
        })
    } else {
        None
    };
    Ok((
        packed,
        QuantState {
            absmax,
            shape: a.size(),
            code,
            dtype: a.kind(),
            blocksize,
            quant_type,
            nested,
        },
    ))
}

impl NestedState {
    /// A handle to the same tensors.
    pub fn shallow_clone(&self) -> Self {
        Self {
            offset: self.offset.shallow_clone(),
            absmax: self.absmax.shallow_clone(),
            code: self.code.shallow_clone(),
            blocksize: self.blocksize,
            dtype: self.dtype,
        }
    }
}

impl QuantState {
    /// A handle to the same tensors.
    pub fn shallow_clone(&self) -> Self {
        Self {
            absmax: self.absmax.shallow_clone(),
            shape: self.shape.clone(),
            code: self.code.shallow_clone(),
            dtype: self.dtype,
            blocksize: self.blocksize,
            quant_type: self.quant_type,
            nested: self.nested.as_ref().map(NestedState::shallow_clone),
        }
    }

    /// The absmax per block in float32 (the nested codes dequantized, plus `offset`).
    pub fn block_absmax(&self) -> Result<Tensor> {
        Ok(match &self.nested {
            None => self.absmax.f_to_kind(Kind::Float)?,
            Some(n) => {
                dequantize_blockwise(&self.absmax, &n.absmax, &n.code, n.blocksize, Kind::Float)?
                    .f_add(&n.offset)?
            }
        })
    }

    /// `dequantize_4bit(packed, state)` in `kind`: each nibble's code (high first) times its
    /// block's absmax, in float32, then cast.
    pub fn dequantize(&self, packed: &Tensor, kind: Kind) -> Result<Tensor> {
        // Each byte's two values at once: a 256 × 2 table of the codes (high nibble first),
        // one gather for the whole weight.
        let byte = Tensor::f_arange(256, (Kind::Int64, self.code.device()))?;
        let table = Tensor::f_stack(
            &[
                self.code
                    .f_index_select(0, &byte.f_bitwise_right_shift_tensor_scalar(4)?)?,
                self.code.f_index_select(0, &byte.f_bitwise_and(0xF)?)?,
            ],
            1,
        )?;
        let n: i64 = self.shape.iter().product();
        let index = packed.f_reshape([-1])?.f_to_kind(Kind::Int)?;
        let values = table
            .f_index_select(0, &index)?
            .f_reshape([-1])?
            .f_narrow(0, 0, n)?;
        let out = scale_blocks(&values, &self.block_absmax()?, self.blocksize)?;
        Ok(out.f_reshape(self.shape.as_slice())?.f_to_kind(kind)?)
    }

    /// Checks the state against its packed codes (the sizes `dequantize` reads), so that a
    /// checkpoint's inconsistent state is refused when it loads.
    pub fn validate(&self, packed: &Tensor) -> Result<()> {
        let bad = |detail: String| Error::InvalidArgument {
            field: "quant_state",
            detail,
        };
        let n: i64 = self.shape.iter().product();
        if self.shape.len() != 2 || n <= 0 || self.blocksize <= 0 {
            return Err(bad(format!(
                "shape {:?} and blocksize {}: a linear weight's 2-D shape and a positive block size",
                self.shape, self.blocksize
            )));
        }
        if packed.kind() != Kind::Uint8 || packed.numel() as i64 != (n + 1) / 2 {
            return Err(bad(format!(
                "the packed weight is {:?} {:?}; shape {:?} packs into {} uint8 bytes",
                packed.kind(),
                packed.size(),
                self.shape,
                (n + 1) / 2
            )));
        }
        let blocks = (n + self.blocksize - 1) / self.blocksize;
        if self.absmax.numel() as i64 != blocks || self.code.numel() != 16 {
            return Err(bad(format!(
                "absmax has {} values and quant_map {}; {blocks} blocks and 16 codes expected",
                self.absmax.numel(),
                self.code.numel()
            )));
        }
        if let Some(nested) = &self.nested {
            let nested_blocks = if nested.blocksize > 0 {
                (blocks + nested.blocksize - 1) / nested.blocksize
            } else {
                -1
            };
            if self.absmax.kind() != Kind::Uint8
                || nested.absmax.numel() as i64 != nested_blocks
                || nested.code.numel() != 256
            {
                return Err(bad(format!(
                    "double quantization: absmax {:?}, nested_absmax of {} values (blocksize {}), nested_quant_map of {}; uint8 codes, {nested_blocks} and 256 expected",
                    self.absmax.kind(),
                    nested.absmax.numel(),
                    nested.blocksize,
                    nested.code.numel()
                )));
            }
        }
        Ok(())
    }

    /// `as_dict(packed=True)` under `prefix` (`"...q_proj.weight"`): the tensors bitsandbytes
    /// saves beside the packed weight, the non-tensor fields as the JSON bytes of
    /// `quant_state.bitsandbytes__<type>`.
    pub fn as_dict(&self, prefix: &str) -> Result<Vec<(String, Tensor)>> {
        use tchtrain_python_json::JsonValue as J;
        let mut fields: Vec<(&str, J)> = vec![
            ("quant_type", J::Str(self.quant_type.name().into())),
            ("blocksize", J::Int(self.blocksize)),
            ("dtype", J::Str(dtype_name(self.dtype)?.into())),
            (
                "shape",
                J::Array(self.shape.iter().map(|d| J::Int(*d)).collect()),
            ),
        ];
        let mut tensors = vec![
            (format!("{prefix}.absmax"), self.absmax.shallow_clone()),
            (format!("{prefix}.quant_map"), self.code.shallow_clone()),
        ];
        if let Some(n) = &self.nested {
            tensors.push((format!("{prefix}.nested_absmax"), n.absmax.shallow_clone()));
            tensors.push((format!("{prefix}.nested_quant_map"), n.code.copy()));
            fields.push(("nested_blocksize", J::Int(n.blocksize)));
            fields.push(("nested_dtype", J::Str(dtype_name(n.dtype)?.into())));
            fields.push(("nested_offset", J::Float(n.offset.f_double_value(&[])?)));
        }
        let mut map = tchtrain_python_json::JsonMap::new();
        for (k, v) in fields {
            map.insert(k.to_string(), v);
        }
        let json = tchtrain_python_json::dumps(&J::Object(map), None, false);
        tensors.push((
            format!(
                "{prefix}.quant_state.bitsandbytes__{}",
                self.quant_type.name()
            ),
            Tensor::from_slice(json.as_bytes()),
        ));
        Ok(tensors)
    }

    /// `QuantState.from_dict`: the state from the tensors beside a packed weight, keyed
    /// without their prefix (`absmax`, `quant_map`, `nested_absmax`, `nested_quant_map`,
    /// `quant_state.bitsandbytes__nf4`).
    pub fn from_dict(get: impl Fn(&str) -> Option<Tensor>) -> Result<Self> {
        let missing = |key: &str| Error::InvalidArgument {
            field: "quantization_config",
            detail: format!(
                "a pre-quantized 4-bit weight lacks its `{key}` (bitsandbytes' layout: weight, absmax, quant_map, quant_state.bitsandbytes__nf4 / __fp4, and nested_absmax / nested_quant_map with double quantization)"
            ),
        };
        let (json_key, packed) = ["nf4", "fp4"]
            .iter()
            .find_map(|t| {
                let key = format!("quant_state.bitsandbytes__{t}");
                get(&key).map(|v| (key, v))
            })
            .ok_or_else(|| missing("quant_state.bitsandbytes__nf4"))?;
        let bytes: Vec<u8> =
            Vec::try_from(packed.f_reshape([-1])?.f_to_kind(Kind::Uint8)?).map_err(Error::Torch)?;
        let text = String::from_utf8(bytes).map_err(|e| Error::InvalidArgument {
            field: "quantization_config",
            detail: format!("`{json_key}` is not UTF-8 JSON: {e}"),
        })?;
        let fields = tchtrain_python_json::loads(&text).map_err(|e| Error::InvalidArgument {
            field: "quantization_config",
            detail: format!("`{json_key}` is not JSON: {e}"),
        })?;
        let bad = |key: &str| Error::InvalidArgument {
            field: "quantization_config",
            detail: format!("`{json_key}` has no valid `{key}`: {text}"),
        };
        let field = |key: &str| fields.as_object().and_then(|m| m.get(key));
        let int = |key: &str| field(key).and_then(|v| v.as_i64()).ok_or_else(|| bad(key));
        let string = |key: &str| field(key).and_then(|v| v.as_str()).ok_or_else(|| bad(key));
        let shape = field("shape")
            .and_then(|v| v.as_array())
            .and_then(|a| a.iter().map(|d| d.as_i64()).collect::<Option<Vec<_>>>())
            .ok_or_else(|| bad("shape"))?;
        let nested = match get("nested_absmax") {
            None => None,
            Some(absmax) => Some(NestedState {
                offset: Tensor::from(
                    field("nested_offset")
                        .and_then(|v| v.as_f64())
                        .ok_or_else(|| bad("nested_offset"))? as f32,
                ),
                absmax,
                code: get("nested_quant_map").ok_or_else(|| missing("nested_quant_map"))?,
                blocksize: int("nested_blocksize")?,
                dtype: dtype_of(string("nested_dtype")?)?,
            }),
        };
        Ok(Self {
            absmax: get("absmax").ok_or_else(|| missing("absmax"))?,
            shape,
            code: get("quant_map").ok_or_else(|| missing("quant_map"))?,
            dtype: dtype_of(string("dtype")?)?,
            blocksize: int("blocksize")?,
            quant_type: QuantType::parse(string("quant_type")?, "quant_state.quant_type")?,
            nested,
        })
    }
}

/// `int8_vectorwise_quant(A, threshold)` (LLM.int8's row-wise quantization, bitsandbytes'
/// default kernel, which its CPU backend runs) of a 2-D `a` (the callers cast to float16 as
/// bitsandbytes' do): with `threshold > 0`, the columns holding a value of magnitude
/// `>= threshold` are the outliers, those values zeroed before the row statistics are taken
/// and, over more than one row, the whole columns zeroed in the codes; then per row the absmax
/// (float32) and `round(a · (absmax⁻¹ · 127))` as int8 (torch's `127.0 / t` is
/// `t.reciprocal() * 127`). Returns the codes, the row statistics and the outlier columns
/// (`None` when `threshold` is 0).
pub fn int8_vectorwise_quant(
    a: &Tensor,
    threshold: f64,
) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    let size = a.size();
    if size.len() != 2 {
        return Err(Error::InvalidArgument {
            field: "A",
            detail: format!("shape {size:?}: int8_vectorwise_quant takes a 2-D tensor"),
        });
    }
    let rows = size[0];
    let mut a = a.shallow_clone();
    let mut outlier_cols = None;
    if threshold > 0.0 {
        let outliers = a.f_abs()?.f_ge(threshold)?;
        let cols = outliers.f_any_dim(0, false)?.f_argwhere()?.f_view([-1])?;
        if cols.numel() > 0 {
            // Zeroed in a copy (bitsandbytes zeroes them in place and restores them after).
            a = a.f_masked_fill(&outliers, 0.0)?;
        }
        outlier_cols = Some(cols);
    }
    let row_stats = a.f_abs()?.f_amax([1], false)?.f_to_kind(Kind::Float)?;
    let scale = row_stats
        .f_unsqueeze(-1)?
        .f_reciprocal()?
        .f_mul_scalar(127.0)?;
    let mut codes = a.f_mul(&scale)?.f_round()?.f_to_kind(Kind::Int8)?;
    if let Some(cols) = &outlier_cols
        && rows > 1
        && cols.numel() > 0
    {
        codes = codes.f_index_fill(1, cols, 0)?;
    }
    Ok((codes, row_stats, outlier_cols))
}

/// `int8_vectorwise_dequant(A, stats)`: `A · stats[:, None] · (1/127)` in float32 (the
/// reciprocal as bitsandbytes writes it, `7.874015718698502e-3`).
pub fn int8_vectorwise_dequant(a: &Tensor, stats: &Tensor) -> Result<Tensor> {
    Ok(a.f_mul(&stats.f_view([-1, 1])?)?
        .f_mul_scalar(7.874015718698502e-3)?)
}

/// `int8_mm_dequant(A, row_stats, col_stats, dtype, bias)`: the int32 products scaled back,
/// `A · (row_stats · col_stats) · 6.200124e-05` (1/127²) in float32, plus the bias, in `kind`.
pub fn int8_mm_dequant(
    a: &Tensor,
    row_stats: &Tensor,
    col_stats: &Tensor,
    kind: Kind,
    bias: Option<&Tensor>,
) -> Result<Tensor> {
    let n = *a.size().last().unwrap_or(&0);
    let scale = row_stats
        .f_reshape([-1])?
        .f_unsqueeze(-1)?
        .f_mul(&col_stats.f_reshape([-1])?.f_unsqueeze(0)?)?;
    let mut out = a
        .f_view([-1, n])?
        .f_mul(&scale)?
        .f_mul_scalar(6.200124e-05)?;
    if let Some(b) = bias {
        out = out.f_add(b)?;
    }
    Ok(out.f_to_kind(kind)?)
}

/// `int8_linear_matmul(A, B)`: `A Bᵀ` of int8 matrices in int32, as bitsandbytes' CPU kernels
/// compute it: `torch._int_mm` where ATen's CPU capability is AVX512 (its CPU backend
/// registers that kernel only there); elsewhere its default kernel,
/// `matmul(A.float(), B.float().t()).to(int32)`, which gives the same integers while the sums
/// stay below 2²⁴, but under CPU autocast multiplies in bfloat16 (autocast casts `matmul`'s
/// operands), as upstream's does on such a machine.
pub fn int8_linear_matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if a.device() != Device::Cpu || cpu_is_avx512() {
        return Ok(a.f_internal_int_mm(&b.f_tr()?)?);
    }
    Ok(a.f_to_kind(Kind::Float)?
        .f_matmul(&b.f_to_kind(Kind::Float)?.f_tr()?)?
        .f_to_kind(Kind::Int)?)
}

/// Whether ATen's CPU capability is AVX512 (`torch.backends.cpu.get_cpu_capability()`).
#[allow(unsafe_code)]
fn cpu_is_avx512() -> bool {
    // SAFETY: a query without arguments.
    unsafe { tchtrain_sys::tchtrain_cpu_capability_avx512() != 0 }
}

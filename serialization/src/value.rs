//! The values a checkpoint holds, as a tree: what `torch.load(weights_only=True)` gives back
//! (None, bools, ints, floats, strings, bytes, tuples, lists, dicts, `OrderedDict`s, tensors),
//! plus inert records of the few allow-listed classes a Trainer checkpoint pickles (numpy's RNG
//! state array, `torch.device`, `TrainingArguments` and its enums). Nothing here is callable.

use std::borrow::Cow;
use std::sync::Arc;

use crate::dtype::DType;
use crate::error::{Error, Result};

/// One value of a checkpoint.
///
/// Equality is structural; floats compare by their bits (so `NaN == NaN` and `0.0 != -0.0`:
/// a file read, written and read again compares equal to itself).
#[derive(Debug, Clone)]
pub enum Value {
    /// `None`.
    None,
    /// `True` / `False`.
    Bool(bool),
    /// An `int` that fits in an `i64`.
    Int(i64),
    /// An `int` outside `i64`: its minimal two's-complement little-endian bytes, as pickle's
    /// `LONG1` / `LONG4` carry them.
    BigInt(Vec<u8>),
    /// A `float`.
    Float(f64),
    /// A `str`.
    Str(String),
    /// A `bytes`.
    Bytes(Vec<u8>),
    /// A `tuple`.
    Tuple(Vec<Value>),
    /// A `list`.
    List(Vec<Value>),
    /// A `dict`, in insertion order (keys are values: optimizer state is keyed by ints).
    Dict(Vec<(Value, Value)>),
    /// A `collections.OrderedDict`, in order.
    OrderedDict(Vec<(Value, Value)>),
    /// A tensor (or an `nn.Parameter`) with its storage.
    Tensor(Tensor),
    /// A reference to an allow-listed class, function or constant, never resolved (`numpy.ndarray`
    /// as an argument of numpy's `_reconstruct`, `torch.float32` as a value).
    Global {
        /// The module (`numpy`, `torch`).
        module: String,
        /// The name in it (`ndarray`, `float32`).
        name: String,
    },
    /// An inert record of an allow-listed class: the call pickle would make, never made.
    Object(Object),
}

/// How an [`Object`] was constructed in the pickle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    /// `REDUCE`: `class(*args)` (enum members, `torch.device`, numpy's `_reconstruct`).
    Reduce,
    /// `NEWOBJ`: `class.__new__(class, *args)` (dataclasses such as `TrainingArguments`).
    NewObj,
}

/// An allow-listed class instance, kept as the record pickle holds: the class's name, the
/// constructor arguments, and the `BUILD` state (usually its `__dict__`).
#[derive(Debug, Clone, PartialEq)]
pub struct Object {
    /// The module of the class (`transformers.training_args`).
    pub module: String,
    /// The class name (`TrainingArguments`).
    pub name: String,
    /// `REDUCE` or `NEWOBJ`.
    pub kind: ObjectKind,
    /// The constructor arguments.
    pub args: Vec<Value>,
    /// The `BUILD` state, if any.
    pub state: Option<Box<Value>>,
}

impl Object {
    /// `module.name`.
    pub fn class(&self) -> String {
        format!("{}.{}", self.module, self.name)
    }
}

/// A storage: the raw little-endian bytes of a `torch.UntypedStorage` and the device it was
/// saved from (`"cpu"`, `"cuda:0"`). Tensors view it through offset, sizes and strides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Storage {
    /// The bytes, little-endian whatever the file's byte order was.
    pub bytes: Vec<u8>,
    /// torch's location tag (`"cpu"`, `"cuda:0"`).
    pub device: String,
}

/// A tensor as torch rebuilds it: a dtype view into a (possibly shared) storage.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// The element type.
    pub dtype: DType,
    /// The storage (shared by views of the same data).
    pub storage: Arc<Storage>,
    /// Offset into the storage, in elements of `dtype`.
    pub storage_offset: i64,
    /// Sizes (`tensor.shape`); empty for a 0-dim tensor.
    pub size: Vec<i64>,
    /// Strides, in elements.
    pub stride: Vec<i64>,
    /// `tensor.requires_grad`.
    pub requires_grad: bool,
    /// Whether it was pickled as an `nn.Parameter` (`torch._utils._rebuild_parameter`).
    pub parameter: bool,
}

impl Tensor {
    /// A contiguous CPU tensor over `bytes` (little-endian, row-major), as `torch.save` would
    /// write `torch.frombuffer(bytes, dtype).reshape(shape)`.
    pub fn from_bytes(dtype: DType, shape: &[i64], bytes: Vec<u8>) -> Result<Tensor> {
        let numel = shape.iter().try_fold(1u64, |n, &d| {
            u64::try_from(d).ok().and_then(|d| n.checked_mul(d))
        });
        let expected = numel.and_then(|n| n.checked_mul(dtype.element_size() as u64));
        if expected != Some(bytes.len() as u64) {
            return Err(Error::Unwritable {
                problem: format!(
                    "a {dtype} tensor of shape {shape:?} needs {} bytes, got {}",
                    expected.map_or_else(|| "too many".to_string(), |n| n.to_string()),
                    bytes.len()
                ),
            });
        }
        Ok(Tensor {
            dtype,
            storage: Arc::new(Storage {
                bytes,
                device: "cpu".into(),
            }),
            storage_offset: 0,
            stride: contiguous_strides(shape),
            size: shape.to_vec(),
            requires_grad: false,
            parameter: false,
        })
    }

    /// The number of elements (saturating at `u64::MAX` for sizes no storage could hold).
    pub fn numel(&self) -> u64 {
        if self.size.contains(&0) {
            return 0;
        }
        self.size
            .iter()
            .fold(1u64, |n, &d| n.saturating_mul(d.max(0) as u64))
    }

    /// Checks that the view (offset, sizes, strides) lies inside the storage: what
    /// `torch.load` needs of a tensor, without touching its elements.
    pub fn check_view(&self) -> Result<()> {
        let es = self.dtype.element_size() as u64;
        let fits = match view_extent(self.storage_offset, &self.size, &self.stride) {
            None => false,
            Some(None) => true,
            Some(Some(end)) => end
                .checked_mul(es)
                .is_some_and(|n| n <= self.storage.bytes.len() as u64),
        };
        if fits {
            Ok(())
        } else {
            Err(Error::Unwritable {
                problem: format!(
                    "a {} tensor view (offset {}, size {:?}, stride {:?}) reaches past its storage of {} bytes",
                    self.dtype,
                    self.storage_offset,
                    self.size,
                    self.stride,
                    self.storage.bytes.len()
                ),
            })
        }
    }

    /// Whether the view is row-major contiguous (size-1 dimensions may have any stride).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1i64;
        for (&d, &s) in self.size.iter().zip(&self.stride).rev() {
            if d == 0 {
                return true;
            }
            if d != 1 && s != expected {
                return false;
            }
            expected = expected.saturating_mul(d);
        }
        true
    }

    /// The elements in row-major order as little-endian bytes: borrowed from the storage when
    /// the view is contiguous, gathered otherwise. A loaded tensor's view was checked against
    /// its storage; a hand-made one that reaches past it is an error.
    pub fn contiguous_bytes(&self) -> Result<Cow<'_, [u8]>> {
        self.check_view()?;
        let es = self.dtype.element_size();
        let bytes = &self.storage.bytes;
        match view_extent(self.storage_offset, &self.size, &self.stride) {
            None | Some(None) => Ok(Cow::Borrowed(&[])),
            Some(_) if self.is_contiguous() => {
                let start = self.storage_offset as usize * es;
                let len = self.numel() as usize * es;
                Ok(Cow::Borrowed(&bytes[start..start + len]))
            }
            Some(_) => {
                // A broadcast view (stride 0) may be far larger than its storage.
                let too_large = || Error::TensorTooLarge {
                    dtype: self.dtype.to_string(),
                    elements: self.numel(),
                };
                let n = usize::try_from(self.numel())
                    .ok()
                    .and_then(|n| n.checked_mul(es))
                    .ok_or_else(too_large)?;
                let mut out = Vec::new();
                out.try_reserve_exact(n).map_err(|_| too_large())?;
                let mut index = vec![0i64; self.size.len()];
                loop {
                    let at = self.storage_offset
                        + index
                            .iter()
                            .zip(&self.stride)
                            .map(|(i, s)| i * s)
                            .sum::<i64>();
                    let at = at as usize * es;
                    out.extend_from_slice(&bytes[at..at + es]);
                    // Row-major increment.
                    let mut dim = self.size.len();
                    loop {
                        if dim == 0 {
                            return Ok(Cow::Owned(out));
                        }
                        dim -= 1;
                        index[dim] += 1;
                        if index[dim] < self.size[dim] {
                            break;
                        }
                        index[dim] = 0;
                    }
                }
            }
        }
    }

    /// The elements in row-major order as `f64` (floating, integer and bool dtypes;
    /// `int64` / `uint64` beyond 2^53 round). `None` for complex, quantized, float8 / float4
    /// and bit dtypes.
    pub fn to_f64_vec(&self) -> Result<Option<Vec<f64>>> {
        let bytes = self.contiguous_bytes()?;
        let es = self.dtype.element_size();
        let convert: fn(&[u8]) -> f64 = match self.dtype {
            DType::Float64 => |b| f64::from_le_bytes(b.try_into().unwrap_or_default()),
            DType::Float32 => |b| f32::from_le_bytes(b.try_into().unwrap_or_default()) as f64,
            DType::Float16 => |b| f16_to_f64(u16::from_le_bytes([b[0], b[1]])),
            DType::BFloat16 => {
                |b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16) as f64
            }
            DType::Int64 => |b| i64::from_le_bytes(b.try_into().unwrap_or_default()) as f64,
            DType::Int32 => |b| i32::from_le_bytes(b.try_into().unwrap_or_default()) as f64,
            DType::Int16 => |b| i16::from_le_bytes([b[0], b[1]]) as f64,
            DType::Int8 => |b| b[0] as i8 as f64,
            DType::UInt8 | DType::Bool => |b| b[0] as f64,
            DType::UInt16 => |b| u16::from_le_bytes([b[0], b[1]]) as f64,
            DType::UInt32 => |b| u32::from_le_bytes(b.try_into().unwrap_or_default()) as f64,
            DType::UInt64 => |b| u64::from_le_bytes(b.try_into().unwrap_or_default()) as f64,
            _ => return Ok(None),
        };
        Ok(Some(bytes.chunks_exact(es).map(convert).collect()))
    }
}

/// Row-major strides of `shape`.
pub(crate) fn contiguous_strides(shape: &[i64]) -> Vec<i64> {
    let mut stride = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        stride[i] = stride[i + 1].saturating_mul(shape[i + 1].max(1));
    }
    stride
}

/// The number of storage elements a view needs (`offset + 1 + Σ (size-1)·stride`), `Some(None)`
/// for an empty view, `None` when a size / stride / offset is negative or the sum overflows.
pub(crate) fn view_extent(offset: i64, size: &[i64], stride: &[i64]) -> Option<Option<u64>> {
    if offset < 0 || size.len() != stride.len() {
        return None;
    }
    let mut last = offset as u64;
    for (&d, &s) in size.iter().zip(stride) {
        if d < 0 || s < 0 {
            return None;
        }
        if d == 0 {
            return Some(None);
        }
        last = last.checked_add((d as u64 - 1).checked_mul(s as u64)?)?;
    }
    Some(Some(last.checked_add(1)?))
}

fn f16_to_f64(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = ((h >> 10) & 0x1f) as i32;
    let frac = (h & 0x3ff) as f64;
    sign * match exp {
        0 => frac * 2f64.powi(-24),
        31 if frac == 0.0 => f64::INFINITY,
        31 => f64::NAN,
        e => (1.0 + frac / 1024.0) * 2f64.powi(e - 15),
    }
}

impl PartialEq for Value {
    fn eq(&self, other: &Self) -> bool {
        use Value as V;
        match (self, other) {
            (V::None, V::None) => true,
            (V::Bool(a), V::Bool(b)) => a == b,
            (V::Int(a), V::Int(b)) => a == b,
            (V::BigInt(a), V::BigInt(b)) => a == b,
            (V::Float(a), V::Float(b)) => a.to_bits() == b.to_bits(),
            (V::Str(a), V::Str(b)) => a == b,
            (V::Bytes(a), V::Bytes(b)) => a == b,
            (V::Tuple(a), V::Tuple(b)) | (V::List(a), V::List(b)) => a == b,
            (V::Dict(a), V::Dict(b)) | (V::OrderedDict(a), V::OrderedDict(b)) => a == b,
            (V::Tensor(a), V::Tensor(b)) => a == b,
            (
                V::Global {
                    module: m1,
                    name: n1,
                },
                V::Global {
                    module: m2,
                    name: n2,
                },
            ) => m1 == m2 && n1 == n2,
            (V::Object(a), V::Object(b)) => a == b,
            _ => false,
        }
    }
}

impl Value {
    /// The value under a string key of a `dict` / `OrderedDict` (or an object's `__dict__`
    /// state).
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Dict(items) | Value::OrderedDict(items) => items
                .iter()
                .find(|(k, _)| matches!(k, Value::Str(s) if s == key))
                .map(|(_, v)| v),
            Value::Object(o) => o.state.as_deref().and_then(|s| s.get(key)),
            _ => None,
        }
    }

    /// The entries of a `dict` or `OrderedDict`.
    pub fn as_dict(&self) -> Option<&[(Value, Value)]> {
        match self {
            Value::Dict(items) | Value::OrderedDict(items) => Some(items),
            _ => None,
        }
    }

    /// The items of a `list` or `tuple`.
    pub fn as_seq(&self) -> Option<&[Value]> {
        match self {
            Value::List(items) | Value::Tuple(items) => Some(items),
            _ => None,
        }
    }

    /// The text of a `str`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// An `int` (or a `bool`, as Python treats it) as `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::Int(i) => Some(i),
            Value::Bool(b) => Some(b as i64),
            _ => None,
        }
    }

    /// A `float`, or an `int` / `bool` converted.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::Float(f) => Some(f),
            Value::Int(i) => Some(i as f64),
            Value::Bool(b) => Some(b as i64 as f64),
            _ => None,
        }
    }

    /// The tensor, if this is one.
    pub fn as_tensor(&self) -> Option<&Tensor> {
        match self {
            Value::Tensor(t) => Some(t),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_views_gather_in_row_major_order() {
        let bytes: Vec<u8> = (0u8..12).collect();
        let base = Tensor::from_bytes(DType::UInt8, &[3, 4], bytes).unwrap();
        assert!(base.is_contiguous());
        let transposed = Tensor {
            size: vec![4, 3],
            stride: vec![1, 4],
            ..base.clone()
        };
        assert!(!transposed.is_contiguous());
        assert_eq!(
            &*transposed.contiguous_bytes().unwrap(),
            &[0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11]
        );
        let past_end = Tensor {
            storage_offset: 1,
            ..base
        };
        assert!(past_end.contiguous_bytes().is_err());
        assert_eq!(view_extent(0, &[2, 0], &[5, 1]), Some(None));
        assert_eq!(view_extent(0, &[], &[]), Some(Some(1)));
        assert_eq!(view_extent(0, &[-1], &[1]), None);
        assert_eq!(f16_to_f64(0x3c00), 1.0);
        assert_eq!(f16_to_f64(0xc000), -2.0);
    }
}

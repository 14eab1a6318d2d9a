//! `torch.dtype` as checkpoints name it: the dtypes a storage can hold, their element sizes, the
//! legacy typed-storage class each one is pickled with (`torch.FloatStorage`; torch's
//! `_dtype_to_storage_type_map`), and the newer dtypes that torch pickles with an untyped
//! storage plus a `torch.<dtype>` global (`_rebuild_tensor_v3`; torch's `_new_dtypes`).

use std::fmt;

/// A tensor element type, named as `torch` names it (`DType::Float32` is `torch.float32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(missing_docs)]
pub enum DType {
    Float64,
    Float32,
    Float16,
    BFloat16,
    Int64,
    Int32,
    Int16,
    Int8,
    UInt8,
    Bool,
    Complex128,
    Complex64,
    QInt8,
    QInt32,
    QUInt8,
    QUInt4x2,
    QUInt2x4,
    Complex32,
    UInt16,
    UInt32,
    UInt64,
    Float8E4M3Fn,
    Float8E5M2,
    Float8E4M3Fnuz,
    Float8E5M2Fnuz,
    Float8E8M0Fnu,
    Float4E2M1FnX2,
    Bits8,
    Bits16,
    Bits1x8,
    Bits2x4,
    Bits4x2,
}

/// (dtype, `torch.<name>`, element size in bytes, legacy storage class or "").
const TABLE: [(DType, &str, usize, &str); 32] = [
    (DType::Float64, "float64", 8, "DoubleStorage"),
    (DType::Float32, "float32", 4, "FloatStorage"),
    (DType::Float16, "float16", 2, "HalfStorage"),
    (DType::BFloat16, "bfloat16", 2, "BFloat16Storage"),
    (DType::Int64, "int64", 8, "LongStorage"),
    (DType::Int32, "int32", 4, "IntStorage"),
    (DType::Int16, "int16", 2, "ShortStorage"),
    (DType::Int8, "int8", 1, "CharStorage"),
    (DType::UInt8, "uint8", 1, "ByteStorage"),
    (DType::Bool, "bool", 1, "BoolStorage"),
    (DType::Complex128, "complex128", 16, "ComplexDoubleStorage"),
    (DType::Complex64, "complex64", 8, "ComplexFloatStorage"),
    (DType::QInt8, "qint8", 1, "QInt8Storage"),
    (DType::QInt32, "qint32", 4, "QInt32Storage"),
    (DType::QUInt8, "quint8", 1, "QUInt8Storage"),
    (DType::QUInt4x2, "quint4x2", 1, "QUInt4x2Storage"),
    (DType::QUInt2x4, "quint2x4", 1, "QUInt2x4Storage"),
    (DType::Complex32, "complex32", 4, ""),
    (DType::UInt16, "uint16", 2, ""),
    (DType::UInt32, "uint32", 4, ""),
    (DType::UInt64, "uint64", 8, ""),
    (DType::Float8E4M3Fn, "float8_e4m3fn", 1, ""),
    (DType::Float8E5M2, "float8_e5m2", 1, ""),
    (DType::Float8E4M3Fnuz, "float8_e4m3fnuz", 1, ""),
    (DType::Float8E5M2Fnuz, "float8_e5m2fnuz", 1, ""),
    (DType::Float8E8M0Fnu, "float8_e8m0fnu", 1, ""),
    (DType::Float4E2M1FnX2, "float4_e2m1fn_x2", 1, ""),
    (DType::Bits8, "bits8", 1, ""),
    (DType::Bits16, "bits16", 2, ""),
    (DType::Bits1x8, "bits1x8", 1, ""),
    (DType::Bits2x4, "bits2x4", 1, ""),
    (DType::Bits4x2, "bits4x2", 1, ""),
];

impl DType {
    /// Every dtype this crate reads and writes.
    pub const ALL: [DType; 32] = {
        let mut all = [DType::Float64; 32];
        let mut i = 0;
        while i < 32 {
            all[i] = TABLE[i].0;
            i += 1;
        }
        all
    };

    fn row(self) -> &'static (DType, &'static str, usize, &'static str) {
        // TABLE is in declaration order.
        &TABLE[self as usize]
    }

    /// The name after `torch.`: `"float32"`.
    pub fn name(self) -> &'static str {
        self.row().1
    }

    /// Bytes per element (`torch._utils._element_size`).
    pub fn element_size(self) -> usize {
        self.row().2
    }

    /// The legacy storage class torch pickles this dtype's storages as (`"FloatStorage"`), or
    /// `None` for the dtypes torch saves through `_rebuild_tensor_v3` and an `UntypedStorage`.
    pub fn legacy_storage_name(self) -> Option<&'static str> {
        Some(self.row().3).filter(|s| !s.is_empty())
    }

    /// The dtype named `torch.<name>` (`"float32"`), also accepting torch's aliases
    /// (`float`, `double`, `half`, `long`, `int`, `short`, `cfloat`, `cdouble`, `chalf`).
    pub fn from_name(name: &str) -> Option<DType> {
        let canonical = match name {
            "float" => "float32",
            "double" => "float64",
            "half" => "float16",
            "long" => "int64",
            "int" => "int32",
            "short" => "int16",
            "cfloat" => "complex64",
            "cdouble" => "complex128",
            "chalf" => "complex32",
            other => other,
        };
        TABLE.iter().find(|r| r.1 == canonical).map(|r| r.0)
    }

    /// The dtype of a legacy storage class name (`"FloatStorage"`).
    pub fn from_legacy_storage_name(name: &str) -> Option<DType> {
        TABLE
            .iter()
            .find(|r| !r.3.is_empty() && r.3 == name)
            .map(|r| r.0)
    }

    /// The unit a big-endian checkpoint's bytes are swapped in: the element size, or half of
    /// it for complex dtypes (torch swaps the real and imaginary parts separately).
    pub fn swap_unit(self) -> usize {
        match self {
            DType::Complex128 | DType::Complex64 | DType::Complex32 => self.element_size() / 2,
            _ => self.element_size(),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "torch.{}", self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_in_declaration_order() {
        for (i, row) in TABLE.iter().enumerate() {
            assert_eq!(row.0 as usize, i, "{}", row.1);
            assert_eq!(DType::from_name(row.1), Some(row.0));
        }
        assert_eq!(
            DType::from_legacy_storage_name("BFloat16Storage"),
            Some(DType::BFloat16)
        );
        assert_eq!(DType::from_legacy_storage_name(""), None);
        assert_eq!(DType::UInt16.legacy_storage_name(), None);
    }
}

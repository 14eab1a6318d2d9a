//! Input checks shared by the losses: shapes, dtypes and label ranges, run before
//! libtorch is called so that bad input becomes a typed [`Error`].

use tch::{Kind, Tensor};

use crate::error::{Error, Result};

/// Fails with [`Error::EmptyBatch`] when `t` has no element.
pub(crate) fn non_empty(t: &Tensor, what: &'static str) -> Result<()> {
    if t.numel() == 0 {
        return Err(Error::EmptyBatch {
            what,
            shape: t.size(),
        });
    }
    Ok(())
}

/// Fails with [`Error::NonPositiveSize`] when `value <= 0`.
pub(crate) fn positive(value: i64, what: &'static str) -> Result<()> {
    if value <= 0 {
        return Err(Error::NonPositiveSize { what, value });
    }
    Ok(())
}

/// Whether `kind` is an integer dtype (class indices).
pub(crate) fn is_integer(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Uint8 | Kind::Int8 | Kind::Int16 | Kind::Int | Kind::Int64
    )
}

/// Whether `kind` is a floating-point dtype.
pub(crate) fn is_float(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Half | Kind::BFloat16 | Kind::Float | Kind::Double
    )
}

/// Fails with [`Error::InvalidDtype`] unless `t` holds integers.
pub(crate) fn integer_labels(t: &Tensor, what: &'static str) -> Result<()> {
    let kind = t.kind();
    if !is_integer(kind) {
        return Err(Error::InvalidDtype {
            what,
            expected: "an integer dtype (class indices)",
            got: kind,
        });
    }
    Ok(())
}

/// Fails with [`Error::InvalidDtype`] unless `t` holds floating-point values.
pub(crate) fn float_tensor(t: &Tensor, what: &'static str, expected: &'static str) -> Result<()> {
    let kind = t.kind();
    if !is_float(kind) {
        return Err(Error::InvalidDtype {
            what,
            expected,
            got: kind,
        });
    }
    Ok(())
}

/// Fails with [`Error::ShapeMismatch`] unless `t` has exactly `expected`.
pub(crate) fn shape_eq(t: &Tensor, expected: &[i64], what: &'static str) -> Result<()> {
    let got = t.size();
    if got != expected {
        return Err(Error::ShapeMismatch {
            what,
            expected: format!("{expected:?}"),
            got,
        });
    }
    Ok(())
}

/// Fails with [`Error::LabelOutOfRange`] when a label that is not `ignore_index` lies
/// outside `0..num_classes`. Reads the labels back (one device sync on GPU).
pub(crate) fn labels_in_range(
    labels: &Tensor,
    num_classes: i64,
    ignore_index: i64,
    what: &'static str,
) -> Result<()> {
    let out_of_range = labels.f_lt(0)?.f_logical_or(&labels.f_ge(num_classes)?)?;
    let bad = out_of_range.f_logical_and(&labels.f_ne(ignore_index)?)?;
    if bad.f_any()?.f_int64_value(&[])? != 0 {
        let label = labels
            .f_masked_select(&bad)?
            .f_to_kind(Kind::Int64)?
            .f_int64_value(&[0])?;
        return Err(Error::LabelOutOfRange {
            what,
            label,
            num_classes,
            ignore_index,
        });
    }
    Ok(())
}

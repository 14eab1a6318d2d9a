//! Arrow columns as cells: what pyarrow's `to_pylist()` (and so `Dataset.to_list()`) gives,
//! as JSON values. Nulls are `null`; booleans, integers (8 to 64 bits, signed or not) and
//! floats (16, 32 and 64 bits; a float32 widens exactly, as Python's `float` does) are JSON
//! booleans and numbers; strings (`string`, `large_string`, `string_view`) are strings;
//! dictionary-encoded columns are their values; lists (`list`, `large_list`,
//! `fixed_size_list`) are arrays and structs are objects. NaN and the infinities have no
//! JSON number: they become `null`. Other Arrow types (binary, timestamps, dates, decimals,
//! maps, unions, ...) have no cell type here and are refused by name.

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float16Type, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type,
    UInt16Type, UInt32Type, UInt64Type,
};
use arrow_array::{
    Array, ArrayRef, ArrowPrimitiveType, GenericListArray, OffsetSizeTrait, RecordBatch,
};
use arrow_schema::DataType;
use serde_json::{Map, Value};

/// Why a column cannot become cells.
#[derive(Debug)]
pub(crate) enum CellError {
    /// A type (the column's, or one nested in it) with no cell type.
    Unsupported(DataType),
    /// The array's buffers contradict each other (offsets past the values, a dictionary
    /// key past the dictionary): the file is corrupt.
    Corrupt(String),
}

/// `Ok` when every value of `data_type` has a cell; else the first type that has none.
pub(crate) fn check_type(data_type: &DataType) -> std::result::Result<(), DataType> {
    match data_type {
        DataType::Null
        | DataType::Boolean
        | DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64
        | DataType::Float16
        | DataType::Float32
        | DataType::Float64
        | DataType::Utf8
        | DataType::LargeUtf8
        | DataType::Utf8View
        | DataType::Binary
        | DataType::LargeBinary => Ok(()),
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            check_type(f.data_type())
        }
        DataType::Struct(fields) => fields.iter().try_for_each(|f| check_type(f.data_type())),
        DataType::Dictionary(key, value) if key.is_dictionary_key_type() => check_type(value),
        other => Err(other.clone()),
    }
}

/// Every cell of `array`, in order.
pub(crate) fn column_cells(array: &dyn Array) -> std::result::Result<Vec<Value>, CellError> {
    let n = array.len();
    let nulls = |i: usize| array.is_null(i);
    Ok(match array.data_type() {
        DataType::Null => vec![Value::Null; n],
        DataType::Boolean => array
            .as_boolean_opt()
            .ok_or_else(|| mismatch(array))?
            .iter()
            .map(|v| v.map_or(Value::Null, Value::Bool))
            .collect(),
        DataType::Int8 => numbers::<Int8Type>(array, Value::from)?,
        DataType::Int16 => numbers::<Int16Type>(array, Value::from)?,
        DataType::Int32 => numbers::<Int32Type>(array, Value::from)?,
        DataType::Int64 => numbers::<Int64Type>(array, Value::from)?,
        DataType::UInt8 => numbers::<UInt8Type>(array, Value::from)?,
        DataType::UInt16 => numbers::<UInt16Type>(array, Value::from)?,
        DataType::UInt32 => numbers::<UInt32Type>(array, Value::from)?,
        DataType::UInt64 => numbers::<UInt64Type>(array, Value::from)?,
        DataType::Float16 => numbers::<Float16Type>(array, |v| Value::from(v.to_f64()))?,
        DataType::Float32 => numbers::<Float32Type>(array, |v| Value::from(f64::from(v)))?,
        DataType::Float64 => numbers::<Float64Type>(array, Value::from)?,
        DataType::Utf8 => strings(
            array
                .as_string_opt::<i32>()
                .ok_or_else(|| mismatch(array))?,
        ),
        DataType::LargeUtf8 => strings(
            array
                .as_string_opt::<i64>()
                .ok_or_else(|| mismatch(array))?,
        ),
        DataType::Utf8View => array
            .as_string_view_opt()
            .ok_or_else(|| mismatch(array))?
            .iter()
            .map(|v| v.map_or(Value::Null, |s| Value::String(s.to_string())))
            .collect(),
        DataType::List(_) => list(array.as_list_opt::<i32>().ok_or_else(|| mismatch(array))?)?,
        DataType::LargeList(_) => list(array.as_list_opt::<i64>().ok_or_else(|| mismatch(array))?)?,
        DataType::FixedSizeList(_, _) => {
            let a = array
                .as_fixed_size_list_opt()
                .ok_or_else(|| mismatch(array))?;
            let size = usize::try_from(a.value_length())
                .map_err(|_| CellError::Corrupt(format!("list size {}", a.value_length())))?;
            let needed = size
                .checked_mul(n)
                .filter(|&m| m <= a.values().len())
                .ok_or_else(|| {
                    CellError::Corrupt(format!(
                        "{n} lists of {size} values but {} values",
                        a.values().len()
                    ))
                })?;
            let mut values = column_cells(a.values().slice(0, needed).as_ref())?.into_iter();
            (0..n)
                .map(|i| {
                    let items: Vec<Value> = values.by_ref().take(size).collect();
                    if nulls(i) {
                        Value::Null
                    } else {
                        Value::Array(items)
                    }
                })
                .collect()
        }
        // Bytes (an `Image` / `Audio` cell's `bytes`): the list of its byte values.
        DataType::Binary => {
            let a = array
                .as_binary_opt::<i32>()
                .ok_or_else(|| mismatch(array))?;
            a.iter().map(bytes_cell).collect()
        }
        DataType::LargeBinary => {
            let a = array
                .as_binary_opt::<i64>()
                .ok_or_else(|| mismatch(array))?;
            a.iter().map(bytes_cell).collect()
        }
        DataType::Struct(_) => {
            let a = array.as_struct_opt().ok_or_else(|| mismatch(array))?;
            let names = a.column_names();
            let mut fields = Vec::with_capacity(names.len());
            for column in a.columns() {
                if column.len() < n {
                    return Err(CellError::Corrupt(format!(
                        "a struct of {n} rows has a field of {} rows",
                        column.len()
                    )));
                }
                fields.push(column_cells(column.as_ref())?.into_iter());
            }
            (0..n)
                .map(|i| {
                    let mut object = Map::new();
                    for (name, field) in names.iter().zip(fields.iter_mut()) {
                        object.insert((*name).to_string(), field.next().unwrap_or(Value::Null));
                    }
                    if nulls(i) {
                        Value::Null
                    } else {
                        Value::Object(object)
                    }
                })
                .collect()
        }
        DataType::Dictionary(_, _) => {
            let a = array
                .as_any_dictionary_opt()
                .ok_or_else(|| mismatch(array))?;
            let values = column_cells(a.values().as_ref())?;
            let keys = a.normalized_keys();
            (0..n)
                .map(|i| {
                    if nulls(i) {
                        return Ok(Value::Null);
                    }
                    let key = keys.get(i).copied().unwrap_or(usize::MAX);
                    values.get(key).cloned().ok_or_else(|| {
                        CellError::Corrupt(format!(
                            "dictionary key {key} past a dictionary of {} values",
                            values.len()
                        ))
                    })
                })
                .collect::<std::result::Result<_, _>>()?
        }
        other => return Err(CellError::Unsupported(other.clone())),
    })
}

/// The cells of each column of `batch`, named.
pub(crate) fn batch_columns(
    batch: &RecordBatch,
) -> std::result::Result<Vec<Vec<Value>>, (String, CellError)> {
    let schema = batch.schema();
    batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(column, field): (&ArrayRef, _)| {
            column_cells(column.as_ref()).map_err(|e| (field.name().clone(), e))
        })
        .collect()
}

/// Column-major cells to rows: `columns[c][r]` becomes `rows[r][c]`.
pub(crate) fn rows_from_columns(columns: Vec<Vec<Value>>, num_rows: usize) -> Vec<Vec<Value>> {
    let width = columns.len();
    let mut iters: Vec<_> = columns.into_iter().map(Vec::into_iter).collect();
    (0..num_rows)
        .map(|_| {
            let mut row = Vec::with_capacity(width);
            for it in &mut iters {
                row.push(it.next().unwrap_or(Value::Null));
            }
            row
        })
        .collect()
}

fn bytes_cell(b: Option<&[u8]>) -> Value {
    b.map_or(Value::Null, |b| {
        Value::Array(b.iter().map(|&x| Value::from(x)).collect())
    })
}

fn mismatch(array: &dyn Array) -> CellError {
    CellError::Corrupt(format!(
        "an array of type {} has another layout",
        array.data_type()
    ))
}

fn numbers<T: ArrowPrimitiveType>(
    array: &dyn Array,
    cell: impl Fn(T::Native) -> Value,
) -> std::result::Result<Vec<Value>, CellError> {
    Ok(array
        .as_primitive_opt::<T>()
        .ok_or_else(|| mismatch(array))?
        .iter()
        .map(|v| v.map_or(Value::Null, &cell))
        .collect())
}

fn strings<O: OffsetSizeTrait>(array: &arrow_array::GenericStringArray<O>) -> Vec<Value> {
    array
        .iter()
        .map(|v| v.map_or(Value::Null, |s| Value::String(s.to_string())))
        .collect()
}

/// A `list` / `large_list` column: the values between consecutive offsets, converted once.
fn list<O: OffsetSizeTrait>(a: &GenericListArray<O>) -> std::result::Result<Vec<Value>, CellError> {
    let offsets = a.value_offsets();
    let corrupt = || CellError::Corrupt("list offsets past the values".into());
    let first = offsets
        .first()
        .and_then(|o| o.to_usize())
        .ok_or_else(corrupt)?;
    let last = offsets
        .last()
        .and_then(|o| o.to_usize())
        .ok_or_else(corrupt)?;
    if last < first || last > a.values().len() || offsets.len() != a.len() + 1 {
        return Err(corrupt());
    }
    let mut values = column_cells(a.values().slice(first, last - first).as_ref())?.into_iter();
    offsets
        .windows(2)
        .enumerate()
        .map(|(i, w)| {
            let (start, end) = (w[0].to_usize(), w[1].to_usize());
            let len = match (start, end) {
                (Some(s), Some(e)) if e >= s => e - s,
                _ => return Err(corrupt()),
            };
            let items: Vec<Value> = values.by_ref().take(len).collect();
            Ok(if a.is_null(i) {
                Value::Null
            } else {
                Value::Array(items)
            })
        })
        .collect()
}

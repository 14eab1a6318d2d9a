//! Parquet files as the `datasets` "parquet" loader reads them (through pyarrow): every row
//! of every row group, each cell as `to_list()` gives it (see [`Table`] and the cell rules in
//! `arrow_cells`); compressed with snappy, gzip, zstd, lz4, brotli or not at all, plain or
//! dictionary-encoded, data pages v1 or v2. Also row group by row group
//! ([`ParquetFile::iter_row_groups`], [`ParquetFile::iter_column`]), so that a file far
//! larger than memory can be tokenised one row group at a time (`run_clm.py --streaming`).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::errors::ParquetError;
use serde_json::Value;

use crate::arrow_cells::{CellError, batch_columns, check_type, rows_from_columns};
use crate::error::{Error, Result, catch_decoder_panic};
use crate::table::{Table, other_format_hint, read_up_to};

const FORMAT: &str = "Parquet";

/// The magic bytes a Parquet file starts and ends with.
const MAGIC: &[u8; 4] = b"PAR1";

/// Rows decoded per Arrow batch inside one row group: the memory of a pass is one row
/// group's cells plus one batch of Arrow buffers, whatever the row group's declared size.
const BATCH_ROWS: usize = 8192;

/// An open Parquet file: its schema and row groups, read on demand (pyarrow's
/// `pq.ParquetFile`).
///
/// ```no_run
/// use tchtrain_datasets::ParquetFile;
/// let file = ParquetFile::open("train.parquet")?;
/// println!("{} rows in {} row groups", file.num_rows(), file.num_row_groups());
/// for chunk in file.iter_column("text")? {
///     let cells = chunk?; // one row group's cells of "text"
///     println!("{} rows", cells.len());
/// }
/// # Ok::<(), tchtrain_datasets::Error>(())
/// ```
#[derive(Debug)]
pub struct ParquetFile {
    path: PathBuf,
    file: File,
    metadata: ArrowReaderMetadata,
}

impl ParquetFile {
    /// Opens `path` and reads its footer (schema and row groups; no data yet). A file that
    /// is not Parquet is [`Error::NotFormat`], one cut short [`Error::Truncated`], one whose
    /// footer does not decode [`Error::Corrupt`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let mut file = File::open(&path).map_err(|e| Error::io("reading", &path, e))?;
        check_magic(&path, &mut file)?;
        let metadata = catch_decoder_panic(&path, FORMAT, || {
            let metadata = ArrowReaderMetadata::load(&file, ArrowReaderOptions::new())
                .map_err(|e| parquet_error(&path, e))?;
            check_column_chunks(&path, &file, &metadata)?;
            Ok(metadata)
        })?;
        Ok(Self {
            path,
            file,
            metadata,
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The column names (the top-level fields of its Arrow schema), in order.
    pub fn columns(&self) -> Vec<String> {
        self.metadata
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    }

    /// The number of rows the footer declares.
    pub fn num_rows(&self) -> usize {
        usize::try_from(self.metadata.metadata().file_metadata().num_rows()).unwrap_or(0)
    }

    /// The number of row groups.
    pub fn num_row_groups(&self) -> usize {
        self.metadata.metadata().num_row_groups()
    }

    /// The `datasets` features the file records (the footer's `huggingface` key-value
    /// metadata, `{"info": {"features": ...}}`, which `Dataset.to_parquet` and the hub's
    /// Parquet export write); `None` when absent or not that JSON.
    pub fn huggingface_features(&self) -> Option<serde_json::Value> {
        let kv = self
            .metadata
            .metadata()
            .file_metadata()
            .key_value_metadata()?;
        let text = kv
            .iter()
            .find(|e| e.key == "huggingface")?
            .value
            .as_deref()?;
        let json: serde_json::Value = match serde_json::from_str(text) {
            Ok(j) => j,
            Err(e) => {
                log::warn!(
                    "{}: the `huggingface` metadata is not JSON ({e}); its features are ignored",
                    self.path.display()
                );
                return None;
            }
        };
        json.get("info")?.get("features").cloned()
    }

    /// Every row of the file (`datasets.load_dataset("parquet", data_files=...)`). A column
    /// whose type has no cell is [`Error::UnsupportedType`], before anything is decoded.
    pub fn read(&self) -> Result<Table> {
        let mut groups = self.iter_row_groups(None)?;
        let names = groups.selection.names.clone();
        let mut columns: Vec<Vec<Value>> = vec![Vec::new(); names.len()];
        while let Some(cells) = groups.next_columns() {
            for (all, part) in columns.iter_mut().zip(cells?) {
                all.extend(part);
            }
        }
        let n = columns.first().map_or(0, Vec::len);
        Ok(Table::from_parts(
            self.path.clone(),
            names,
            rows_from_columns(columns, n),
        ))
    }

    /// The rows of row group `index` (0-based), of `columns` only (in that order) or of
    /// every column (pyarrow's `read_row_group(i, columns=...)`).
    pub fn read_row_group(&self, index: usize, columns: Option<&[&str]>) -> Result<Table> {
        if index >= self.num_row_groups() {
            return Err(Error::IndexOutOfRange {
                index,
                len: self.num_row_groups(),
            });
        }
        let selection = self.select(columns)?;
        let names = selection.names.clone();
        let cells = self.decode_row_group(index, &selection)?;
        let n = cells.first().map_or(0, Vec::len);
        Ok(Table::from_parts(
            self.path.clone(),
            names,
            rows_from_columns(cells, n),
        ))
    }

    /// The row groups one by one, each as a [`Table`] of `columns` (or of every column):
    /// only one row group is in memory at a time.
    pub fn iter_row_groups(&self, columns: Option<&[&str]>) -> Result<RowGroups> {
        Ok(RowGroups {
            reader: self.try_clone()?,
            selection: self.select(columns)?,
            next: 0,
        })
    }

    /// The cells of `column`, one row group at a time (each item is one column chunk): the
    /// streamed form of `Table::column`, for a text column too large for memory. A column
    /// not in the file is [`Error::MissingColumn`].
    pub fn iter_column(&self, column: &str) -> Result<ColumnChunks> {
        Ok(ColumnChunks {
            groups: self.iter_row_groups(Some(&[column]))?,
        })
    }

    /// A second handle on the same file (its own file descriptor, the same decoded footer).
    fn try_clone(&self) -> Result<Self> {
        Ok(Self {
            path: self.path.clone(),
            file: self
                .file
                .try_clone()
                .map_err(|e| Error::io("reading", &self.path, e))?,
            metadata: self.metadata.clone(),
        })
    }

    /// The columns to read: their names, their root indices, and a check that each has a
    /// cell type.
    fn select(&self, columns: Option<&[&str]>) -> Result<Selection> {
        let fields = self.metadata.schema().fields();
        let all = self.columns();
        let indices: Vec<usize> = match columns {
            None => (0..fields.len()).collect(),
            Some(wanted) => wanted
                .iter()
                .map(|c| {
                    all.iter()
                        .position(|a| a == c)
                        .ok_or_else(|| Error::MissingColumn {
                            column: (*c).to_string(),
                            path: self.path.clone(),
                            available: all.join(", "),
                        })
                })
                .collect::<Result<_>>()?,
        };
        if let Some(c) = indices
            .iter()
            .enumerate()
            .find_map(|(k, i)| indices[..k].contains(i).then(|| &all[*i]))
        {
            return Err(Error::InvalidArgument {
                field: "columns",
                detail: format!("column '{c}' is asked for twice"),
            });
        }
        for &i in &indices {
            if let Err(t) = check_type(fields[i].data_type()) {
                return Err(self.unsupported(fields[i].name(), &t));
            }
        }
        Ok(Selection {
            names: indices.iter().map(|&i| all[i].clone()).collect(),
            indices,
        })
    }

    fn unsupported(&self, column: &str, data_type: &arrow_schema::DataType) -> Error {
        Error::UnsupportedType {
            path: self.path.clone(),
            column: column.to_string(),
            data_type: data_type.to_string(),
        }
    }

    /// Decodes the selected columns of row group `index`: the cells, column by column, in
    /// the selection's order.
    fn decode_row_group(&self, index: usize, selection: &Selection) -> Result<Vec<Vec<Value>>> {
        let file = self
            .file
            .try_clone()
            .map_err(|e| Error::io("reading", &self.path, e))?;
        let path = &self.path;
        let (cells, names) = catch_decoder_panic(path, FORMAT, || {
            let mask = ProjectionMask::roots(
                self.metadata.parquet_schema(),
                selection.indices.iter().copied(),
            );
            let reader =
                ParquetRecordBatchReaderBuilder::new_with_metadata(file, self.metadata.clone())
                    .with_row_groups(vec![index])
                    .with_projection(mask)
                    .with_batch_size(BATCH_ROWS)
                    .build()
                    .map_err(|e| parquet_error(path, e))?;
            let mut out: Vec<Vec<Value>> = Vec::new();
            let mut names: Vec<String> = Vec::new();
            for batch in reader {
                let batch = batch.map_err(|e| arrow_error(path, e))?;
                let columns = batch_columns(&batch).map_err(|(column, e)| match e {
                    CellError::Unsupported(t) => self.unsupported(&column, &t),
                    CellError::Corrupt(detail) => Error::Corrupt {
                        path: path.clone(),
                        format: FORMAT,
                        detail: format!("column '{column}': {detail}"),
                    },
                })?;
                if out.is_empty() {
                    names = batch
                        .schema()
                        .fields()
                        .iter()
                        .map(|f| f.name().clone())
                        .collect();
                    out = columns;
                } else {
                    for (all, part) in out.iter_mut().zip(columns) {
                        all.extend(part);
                    }
                }
            }
            Ok((out, names))
        })?;
        // The projection returns the columns in file order; put them in the caller's.
        if cells.is_empty() {
            return Ok(vec![Vec::new(); selection.names.len()]);
        }
        let mut by_name: Vec<Option<Vec<Value>>> = cells.into_iter().map(Some).collect();
        selection
            .names
            .iter()
            .map(|name| {
                names
                    .iter()
                    .position(|n| n == name)
                    .and_then(|i| by_name[i].take())
                    .ok_or_else(|| Error::Corrupt {
                        path: path.clone(),
                        format: FORMAT,
                        detail: format!("row group {index} did not yield column '{name}'"),
                    })
            })
            .collect()
    }
}

/// The columns a reader decodes.
#[derive(Debug, Clone)]
struct Selection {
    /// Names, in the caller's order.
    names: Vec<String>,
    /// Root column indices, in the caller's order.
    indices: Vec<usize>,
}

/// The row groups of a [`ParquetFile`], one [`Table`] each
/// ([`ParquetFile::iter_row_groups`]).
#[derive(Debug)]
pub struct RowGroups {
    reader: ParquetFile,
    selection: Selection,
    next: usize,
}

impl RowGroups {
    /// The number of row groups (the number of items a full pass yields).
    pub fn num_row_groups(&self) -> usize {
        self.reader.num_row_groups()
    }

    fn next_columns(&mut self) -> Option<Result<Vec<Vec<Value>>>> {
        if self.next >= self.reader.num_row_groups() {
            return None;
        }
        let index = self.next;
        self.next += 1;
        let cells = self.reader.decode_row_group(index, &self.selection);
        if cells.is_err() {
            // A failed row group ends the pass: its error is the last item.
            self.next = usize::MAX;
        }
        Some(cells)
    }
}

impl Iterator for RowGroups {
    type Item = Result<Table>;

    fn next(&mut self) -> Option<Self::Item> {
        Some(self.next_columns()?.map(|cells| {
            let n = cells.first().map_or(0, Vec::len);
            Table::from_parts(
                self.reader.path.clone(),
                self.selection.names.clone(),
                rows_from_columns(cells, n),
            )
        }))
    }
}

/// One column of a [`ParquetFile`], one row group (one column chunk) per item
/// ([`ParquetFile::iter_column`]).
#[derive(Debug)]
pub struct ColumnChunks {
    groups: RowGroups,
}

impl ColumnChunks {
    /// The file.
    pub fn path(&self) -> &Path {
        &self.groups.reader.path
    }

    /// The column.
    pub fn column(&self) -> &str {
        &self.groups.selection.names[0]
    }

    /// The number of row groups (the number of items a full pass yields).
    pub fn num_row_groups(&self) -> usize {
        self.groups.num_row_groups()
    }
}

impl Iterator for ColumnChunks {
    type Item = Result<Vec<Value>>;

    fn next(&mut self) -> Option<Self::Item> {
        Some(
            self.groups
                .next_columns()?
                .map(|cells| cells.into_iter().next().unwrap_or_default()),
        )
    }
}

/// Checks the `PAR1` magic at both ends, so that a file of another kind or one cut short is
/// named as such (the decoder would call both a corrupt footer).
fn check_magic(path: &Path, file: &mut File) -> Result<()> {
    let len = file
        .metadata()
        .map_err(|e| Error::io("reading", path, e))?
        .len();
    let not = |detail: String| Error::NotFormat {
        path: path.to_path_buf(),
        format: FORMAT,
        detail,
    };
    let truncated = |detail: String| Error::Truncated {
        path: path.to_path_buf(),
        format: FORMAT,
        detail,
    };
    if len == 0 {
        return Err(not("the file is empty".into()));
    }
    let mut head = [0u8; 4];
    let n = read_up_to(file, &mut head).map_err(|e| Error::io("reading", path, e))?;
    if head[..n] != MAGIC[..n] {
        return Err(not(format!(
            "it does not start with the magic bytes PAR1{}",
            other_format_hint(&head[..n])
        )));
    }
    // Magic, footer length (4 bytes), magic: 12 bytes at the least.
    if len < 12 {
        return Err(truncated(format!(
            "{len} bytes, less than a Parquet file's header and footer"
        )));
    }
    let mut tail = [0u8; 8];
    file.seek(SeekFrom::End(-8))
        .and_then(|_| file.read_exact(&mut tail))
        .map_err(|e| Error::io("reading", path, e))?;
    if &tail[4..] != MAGIC {
        let detail = if &tail[4..] == b"PARE" {
            return Err(not(
                "its footer is encrypted (PARE), which is not supported".into(),
            ));
        } else {
            "it does not end with the magic bytes PAR1 (the footer is missing)".to_string()
        };
        return Err(truncated(detail));
    }
    let footer = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]));
    if footer + 12 > len {
        return Err(truncated(format!(
            "the footer says it is {footer} bytes long but the file has {len} bytes"
        )));
    }
    file.seek(SeekFrom::Start(0))
        .map_err(|e| Error::io("reading", path, e))?;
    Ok(())
}

/// Checks that every column chunk the footer declares lies within the file: the decoder
/// allocates a chunk's declared size before reading it, so a corrupt size would otherwise
/// ask for any amount of memory (and a negative one panics).
fn check_column_chunks(path: &Path, file: &File, metadata: &ArrowReaderMetadata) -> Result<()> {
    let len = file
        .metadata()
        .map_err(|e| Error::io("reading", path, e))?
        .len();
    for (g, group) in metadata.metadata().row_groups().iter().enumerate() {
        if group.num_rows() < 0 {
            return Err(Error::Corrupt {
                path: path.to_path_buf(),
                format: FORMAT,
                detail: format!("row group {g} has {} rows", group.num_rows()),
            });
        }
        for (c, column) in group.columns().iter().enumerate() {
            let start = column
                .dictionary_page_offset()
                .unwrap_or_else(|| column.data_page_offset());
            let size = column.compressed_size();
            let end = u64::try_from(start)
                .ok()
                .zip(u64::try_from(size).ok())
                .and_then(|(s, n)| s.checked_add(n));
            if end.is_none_or(|end| end > len) {
                return Err(Error::Corrupt {
                    path: path.to_path_buf(),
                    format: FORMAT,
                    detail: format!(
                        "row group {g}, column chunk {c} ({}) declares bytes {start}..{start}+{size}, \
                         outside the file's {len} bytes",
                        column.column_path()
                    ),
                });
            }
        }
    }
    Ok(())
}

/// A decoder error: running out of bytes is [`Error::Truncated`], the rest [`Error::Corrupt`].
fn parquet_error(path: &Path, e: ParquetError) -> Error {
    match e {
        ParquetError::EOF(detail) => Error::Truncated {
            path: path.to_path_buf(),
            format: FORMAT,
            detail,
        },
        ParquetError::NeedMoreData(_) | ParquetError::NeedMoreDataRange(_) => Error::Truncated {
            path: path.to_path_buf(),
            format: FORMAT,
            detail: e.to_string(),
        },
        other => Error::Corrupt {
            path: path.to_path_buf(),
            format: FORMAT,
            detail: other.to_string(),
        },
    }
}

fn arrow_error(path: &Path, e: arrow_schema::ArrowError) -> Error {
    match e {
        arrow_schema::ArrowError::IoError(_, io)
            if io.kind() == std::io::ErrorKind::UnexpectedEof =>
        {
            Error::Truncated {
                path: path.to_path_buf(),
                format: FORMAT,
                detail: io.to_string(),
            }
        }
        other => Error::Corrupt {
            path: path.to_path_buf(),
            format: FORMAT,
            detail: other.to_string(),
        },
    }
}

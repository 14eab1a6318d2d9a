//! Tabular data files as the `datasets` "csv", "json", "parquet" and "arrow" loaders read
//! them for the example scripts: a header of column names and rows of cells. CSV (RFC 4180:
//! quoted fields with commas, doubled quotes and line breaks), JSON lines (one object per
//! line) or a JSON array of objects, any of them bzip2-compressed when the name ends in
//! `.bz2`; Parquet (`parquet.rs`) and Arrow IPC (`arrow_ipc.rs`) files.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result};

/// Rows of named cells read from a data file. CSV cells are strings; JSON cells keep their
/// JSON type (a missing key is `null`); Parquet and Arrow cells are what `to_list()` gives in
/// Python, as JSON (integers, floats, strings, lists as arrays, structs as objects).
///
/// ```
/// use tchtrain_datasets::Table;
/// let t = Table::from_csv_str("text,label\n\"a, b\",1\n\"say \"\"hi\"\"\",0\n", "inline.csv")?;
/// assert_eq!(t.columns(), ["text", "label"]);
/// assert_eq!(t.cell(0, "text")?.as_str(), Some("a, b"));
/// assert_eq!(t.cell(1, "text")?.as_str(), Some("say \"hi\""));
/// # Ok::<(), tchtrain_datasets::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Table {
    path: PathBuf,
    columns: Vec<String>,
    rows: Vec<Vec<Value>>,
}

/// Reads a text file, decompressing it when its name ends in `.bz2`.
pub fn read_text_maybe_bz2(path: impl AsRef<Path>) -> Result<String> {
    let path = path.as_ref();
    let file = std::fs::File::open(path).map_err(|e| Error::io("reading", path, e))?;
    let mut text = String::new();
    let is_bz2 = path.extension().is_some_and(|e| e == "bz2");
    let read = if is_bz2 {
        bzip2::read::MultiBzDecoder::new(std::io::BufReader::new(file)).read_to_string(&mut text)
    } else {
        std::io::BufReader::new(file).read_to_string(&mut text)
    };
    read.map_err(|e| Error::io("reading", path, e))?;
    Ok(text)
}

/// The format of a data file, from its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Csv,
    Json,
    Parquet,
    Arrow,
}

/// The format of a data file, from its name: `.csv`, `.json`, `.jsonl` (each optionally
/// followed by `.bz2`), `.parquet`, `.arrow`.
fn format_of(path: &Path) -> Option<Format> {
    let name = path.file_name()?.to_str()?.to_ascii_lowercase();
    if name.ends_with(".parquet") {
        return Some(Format::Parquet);
    }
    if name.ends_with(".arrow") {
        return Some(Format::Arrow);
    }
    let name = name.strip_suffix(".bz2").unwrap_or(&name);
    if name.ends_with(".csv") {
        Some(Format::Csv)
    } else if name.ends_with(".json") || name.ends_with(".jsonl") {
        Some(Format::Json)
    } else {
        None
    }
}

/// Whether `path` names a Parquet file (by its extension, as [`Table::read`] decides).
pub(crate) fn is_parquet(path: &Path) -> bool {
    format_of(path) == Some(Format::Parquet)
}

impl Table {
    /// Reads a data file, the format chosen by the extension as upstream's examples do:
    /// `.csv`, `.json`, `.jsonl` (optionally `.bz2`-compressed), `.parquet`
    /// ([`Table::read_parquet`]) or `.arrow` ([`Table::read_arrow`]).
    pub fn read(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let Some(format) = format_of(path) else {
            return Err(Error::DataFile {
                path: path.to_path_buf(),
                line: 1,
                detail: "unknown format: the name should end in .csv, .json or .jsonl \
                         (optionally .bz2), .parquet or .arrow"
                    .into(),
            });
        };
        match format {
            Format::Parquet => Self::read_parquet(path),
            Format::Arrow => Self::read_arrow(path),
            Format::Csv => Self::from_csv_str(&read_text_maybe_bz2(path)?, path),
            Format::Json => Self::from_json_str(&read_text_maybe_bz2(path)?, path),
        }
    }

    /// Reads every row of a Parquet file (`datasets.load_dataset("parquet", ...)`); see
    /// [`crate::ParquetFile`] to read it row group by row group.
    pub fn read_parquet(path: impl AsRef<Path>) -> Result<Self> {
        crate::parquet::ParquetFile::open(path)?.read()
    }

    /// Reads every row of an Arrow IPC stream or file (`datasets.load_dataset("arrow", ...)`;
    /// `datasets` writes streams).
    pub fn read_arrow(path: impl AsRef<Path>) -> Result<Self> {
        crate::arrow_ipc::read_arrow_ipc(path.as_ref())
    }

    /// Reads a `Dataset.save_to_disk` folder (`Dataset.load_from_disk`): its shards, in the
    /// order `state.json` lists them. See [`crate::load_from_disk`] for `DatasetDict`s.
    pub fn load_from_disk(path: impl AsRef<Path>) -> Result<Self> {
        crate::arrow_dataset::load_dataset_folder(path.as_ref())
    }

    /// A table of `rows` (each as long as `columns`) read from `path`.
    pub(crate) fn from_parts(path: PathBuf, columns: Vec<String>, rows: Vec<Vec<Value>>) -> Self {
        Self {
            path,
            columns,
            rows,
        }
    }

    /// The rows, by value.
    pub(crate) fn into_rows(self) -> Vec<Vec<Value>> {
        self.rows
    }

    /// Parses CSV text with a header row; `path` names the source in errors.
    pub fn from_csv_str(text: &str, path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let records = parse_csv(text, &path)?;
        let mut it = records.into_iter();
        let Some((_, header)) = it.next() else {
            return Err(Error::DataFile {
                path,
                line: 1,
                detail: "empty file: a CSV file needs a header row".into(),
            });
        };
        let mut rows = Vec::new();
        for (line, record) in it {
            if record.len() == 1 && record[0].is_empty() {
                continue;
            }
            if record.len() != header.len() {
                return Err(Error::DataFile {
                    path,
                    line,
                    detail: format!(
                        "{} fields where the header has {}",
                        record.len(),
                        header.len()
                    ),
                });
            }
            rows.push(record.into_iter().map(Value::String).collect());
        }
        Ok(Self {
            path,
            columns: header,
            rows,
        })
    }

    /// Parses JSON lines (one object per line) or a JSON array of objects; columns are the
    /// keys in the order first seen.
    pub fn from_json_str(text: &str, path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let bad = |line: usize, detail: String| Error::DataFile {
            path: path.clone(),
            line,
            detail,
        };
        let mut objects: Vec<(usize, serde_json::Map<String, Value>)> = Vec::new();
        if text.trim_start().starts_with('[') {
            let value: Value =
                serde_json::from_str(text).map_err(|e| bad(e.line(), e.to_string()))?;
            for (i, v) in value.as_array().into_iter().flatten().enumerate() {
                match v {
                    Value::Object(o) => objects.push((i + 1, o.clone())),
                    _ => return Err(bad(1, format!("array item {i} is not an object"))),
                }
            }
        } else {
            for (i, line) in text.lines().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                match serde_json::from_str::<Value>(line) {
                    Ok(Value::Object(o)) => objects.push((i + 1, o)),
                    Ok(_) => return Err(bad(i + 1, "not a JSON object".into())),
                    Err(e) => return Err(bad(i + 1, e.to_string())),
                }
            }
        }
        let mut columns: Vec<String> = Vec::new();
        for (_, o) in &objects {
            for k in o.keys() {
                if !columns.contains(k) {
                    columns.push(k.clone());
                }
            }
        }
        let rows = objects
            .into_iter()
            .map(|(_, mut o)| {
                columns
                    .iter()
                    .map(|c| o.remove(c).unwrap_or(Value::Null))
                    .collect()
            })
            .collect();
        Ok(Self {
            path,
            columns,
            rows,
        })
    }

    /// The file the table was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The column names.
    pub fn columns(&self) -> &[String] {
        &self.columns
    }

    /// Adds the columns and every cell (not the path) to `fingerprint`: two tables with the
    /// same content fingerprint alike.
    pub fn fingerprint_into(&self, fingerprint: &mut crate::map_cache::Fingerprint) {
        for c in &self.columns {
            fingerprint.update(c);
        }
        for row in &self.rows {
            for cell in row {
                fingerprint.update(cell.to_string());
            }
        }
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether the table has no rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The position of `column`, or [`Error::MissingColumn`].
    pub fn column_index(&self, column: &str) -> Result<usize> {
        self.columns
            .iter()
            .position(|c| c == column)
            .ok_or_else(|| Error::MissingColumn {
                column: column.to_string(),
                path: self.path.clone(),
                available: self.columns.join(", "),
            })
    }

    /// Every cell of `column`, in row order.
    pub fn column(&self, column: &str) -> Result<Vec<&Value>> {
        let i = self.column_index(column)?;
        Ok(self.rows.iter().map(|r| &r[i]).collect())
    }

    /// The cell of `column` in row `row`.
    pub fn cell(&self, row: usize, column: &str) -> Result<&Value> {
        let i = self.column_index(column)?;
        let len = self.rows.len();
        self.rows
            .get(row)
            .map(|r| &r[i])
            .ok_or(Error::IndexOutOfRange { index: row, len })
    }

    /// The rows for which `keep(table, row)` is true (`datasets`' `filter`).
    pub fn filter(&self, mut keep: impl FnMut(&Self, usize) -> bool) -> Self {
        let rows = (0..self.rows.len())
            .filter(|&i| keep(self, i))
            .map(|i| self.rows[i].clone())
            .collect();
        Self {
            path: self.path.clone(),
            columns: self.columns.clone(),
            rows,
        }
    }

    /// The rows at `indices`, in that order (`datasets`' `select`); indices past the end
    /// are [`Error::IndexOutOfRange`].
    pub fn select(&self, indices: &[usize]) -> Result<Self> {
        let len = self.rows.len();
        let rows = indices
            .iter()
            .map(|&i| {
                self.rows
                    .get(i)
                    .cloned()
                    .ok_or(Error::IndexOutOfRange { index: i, len })
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            path: self.path.clone(),
            columns: self.columns.clone(),
            rows,
        })
    }

    /// The rows of several tables, one after the other (`concatenate_datasets`, as
    /// `load_dataset` joins a split's files): the columns must be the same, in the same
    /// order, else [`Error::DataFile`] names the first table that differs. The result
    /// carries the first table's path.
    pub fn concat(tables: Vec<Self>) -> Result<Self> {
        let mut tables = tables.into_iter();
        let Some(mut out) = tables.next() else {
            return Ok(Self::default());
        };
        for t in tables {
            if t.columns != out.columns {
                return Err(Error::DataFile {
                    path: t.path,
                    line: 1,
                    detail: format!(
                        "its columns {:?} differ from {:?} of {}; the files of one split must have the same columns",
                        t.columns,
                        out.columns,
                        out.path.display()
                    ),
                });
            }
            out.rows.extend(t.rows);
        }
        Ok(out)
    }

    /// The table without the columns `names` (`remove_columns`); a name that is not a
    /// column is [`Error::MissingColumn`].
    pub fn remove_columns(&self, names: &[String]) -> Result<Self> {
        for n in names {
            self.column_index(n)?;
        }
        let keep: Vec<usize> = (0..self.columns.len())
            .filter(|&i| !names.contains(&self.columns[i]))
            .collect();
        Ok(Self {
            path: self.path.clone(),
            columns: keep.iter().map(|&i| self.columns[i].clone()).collect(),
            rows: self
                .rows
                .iter()
                .map(|r| keep.iter().map(|&i| r[i].clone()).collect())
                .collect(),
        })
    }
}

/// Reads up to `buf.len()` bytes (fewer only at the end of the file).
pub(crate) fn read_up_to(file: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// A hint naming the format a binary file's first bytes belong to, when we know it.
pub(crate) fn other_format_hint(head: &[u8]) -> &'static str {
    if head.starts_with(b"ARRO") || head.starts_with(&[0xff, 0xff, 0xff, 0xff]) {
        " (it looks like an Arrow IPC file: name it .arrow)"
    } else if head.starts_with(b"PAR1") {
        " (it looks like a Parquet file: name it .parquet)"
    } else if head.starts_with(b"BZh") {
        " (it looks bzip2-compressed)"
    } else if head.starts_with(b"{") || head.starts_with(b"[") {
        " (it looks like JSON)"
    } else {
        ""
    }
}

/// A cell as text: strings as they are, numbers and booleans as JSON writes them, `null`
/// as the empty string.
pub fn cell_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// RFC 4180 records with the line each starts on.
fn parse_csv(text: &str, path: &Path) -> Result<Vec<(usize, Vec<String>)>> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut records = Vec::new();
    let mut record: Vec<String> = Vec::new();
    let mut field = String::new();
    let mut line = 1;
    let mut start_line = 1;
    let mut in_quotes = false;
    let mut quoted_field = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if in_quotes {
            match c {
                '"' if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                '"' => in_quotes = false,
                '\n' => {
                    line += 1;
                    field.push(c);
                }
                _ => field.push(c),
            }
            continue;
        }
        match c {
            '"' if field.is_empty() && !quoted_field => {
                in_quotes = true;
                quoted_field = true;
            }
            ',' => {
                record.push(std::mem::take(&mut field));
                quoted_field = false;
            }
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' => {
                record.push(std::mem::take(&mut field));
                records.push((start_line, std::mem::take(&mut record)));
                quoted_field = false;
                line += 1;
                start_line = line;
            }
            _ => field.push(c),
        }
    }
    if in_quotes {
        return Err(Error::DataFile {
            path: path.to_path_buf(),
            line: start_line,
            detail: "a quoted field is never closed".into(),
        });
    }
    if !field.is_empty() || !record.is_empty() || quoted_field {
        record.push(field);
        records.push((start_line, record));
    }
    Ok(records)
}

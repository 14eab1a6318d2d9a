//! Tabular data files as the `datasets` "csv" and "json" loaders read them for the example
//! scripts: a header of column names and rows of cells. CSV (RFC 4180: quoted fields with
//! commas, doubled quotes and line breaks), JSON lines (one object per line) or a JSON
//! array of objects; any of them bzip2-compressed when the name ends in `.bz2`.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result};

/// Rows of named cells read from a data file. CSV cells are strings; JSON cells keep their
/// JSON type (a missing key is `null`).
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

/// The format of a data file, from its name (`.csv`, `.json`, `.jsonl`, each optionally
/// followed by `.bz2`).
fn format_of(path: &Path) -> Option<&'static str> {
    let name = path.file_name()?.to_str()?.to_ascii_lowercase();
    let name = name.strip_suffix(".bz2").unwrap_or(&name);
    if name.ends_with(".csv") {
        Some("csv")
    } else if name.ends_with(".json") || name.ends_with(".jsonl") {
        Some("json")
    } else {
        None
    }
}

impl Table {
    /// Reads a CSV or JSON (lines) file, the format chosen by the extension as upstream's
    /// examples do (`.csv`, `.json`, `.jsonl`, optionally `.bz2`-compressed).
    pub fn read(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = read_text_maybe_bz2(path)?;
        match format_of(path) {
            Some("csv") => Self::from_csv_str(&text, path),
            Some(_) => Self::from_json_str(&text, path),
            None => Err(Error::DataFile {
                path: path.to_path_buf(),
                line: 1,
                detail:
                    "unknown format: the name should end in .csv, .json or .jsonl (optionally .bz2)"
                        .into(),
            }),
        }
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

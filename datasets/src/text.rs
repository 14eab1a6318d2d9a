//! Plain-text data for causal language modelling, as upstream's `run_clm.py` prepares it:
//! the `datasets` text loader (one row per line) or a Parquet file's text column,
//! `tokenize_function`, then `group_texts` (concatenate, cut into `block_size` blocks,
//! `labels = input_ids`).

use std::collections::VecDeque;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use tokenizers::Tokenizer;

use crate::error::{Error, Result};
use crate::feature::{Feature, Label};
use crate::parquet::{ColumnChunks, ParquetFile};
use crate::table::is_parquet;

/// `datasets.Dataset.map(batched=True)`'s default batch size: `group_texts` runs on chunks
/// of this many rows and drops each chunk's remainder.
pub const DEFAULT_MAP_BATCH_SIZE: usize = 1000;

/// Splits `text` into lines as Python's `str.splitlines(keepends)` does (the `datasets`
/// text loader's rule): line breaks are `\n`, `\r\n`, `\r`, `\v`, `\f`, `\x1c`-`\x1e`,
/// `\u{85}`, `\u{2028}`, `\u{2029}`; with `keep_linebreaks` each line keeps its break.
pub fn split_lines(text: &str, keep_linebreaks: bool) -> Vec<String> {
    let mut lines = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let is_break = matches!(
            c,
            '\n' | '\r'
                | '\x0b'
                | '\x0c'
                | '\x1c'
                | '\x1d'
                | '\x1e'
                | '\u{85}'
                | '\u{2028}'
                | '\u{2029}'
        );
        if !is_break {
            continue;
        }
        let mut end = i + c.len_utf8();
        if c == '\r' && chars.peek().is_some_and(|&(_, n)| n == '\n') {
            chars.next();
            end += 1;
        }
        lines.push(if keep_linebreaks {
            text[start..end].to_string()
        } else {
            text[start..i].to_string()
        });
        start = end;
    }
    if start < text.len() {
        lines.push(text[start..].to_string());
    }
    lines
}

/// Reads a UTF-8 text file as the `datasets` "text" loader does: one row per line
/// (see [`split_lines`]); `run_clm.py` passes `keep_linebreaks=True` by default.
pub fn load_text_lines(path: impl AsRef<Path>, keep_linebreaks: bool) -> Result<Vec<String>> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|e| Error::io("reading", path, e))?;
    Ok(split_lines(&text, keep_linebreaks))
}

/// `run_clm.py`'s `tokenize_function`: the token ids of each line (special tokens added as
/// the tokenizer's post-processor says; GPT-2 adds none). The lines are tokenized on all
/// cores (`TCHTRAIN_NUM_PROC` to change), in order.
pub fn tokenize_lines<S: AsRef<str> + Sync>(
    tokenizer: &Tokenizer,
    lines: &[S],
) -> Result<Vec<Vec<i64>>> {
    crate::parallel::parallel_map(lines, |i, line| {
        let enc = tokenizer
            .encode(line.as_ref(), true)
            .map_err(|e| Error::Tokenizer {
                what: format!("line {}", i + 1),
                detail: e.to_string(),
            })?;
        Ok(enc.get_ids().iter().map(|&id| i64::from(id)).collect())
    })
}

/// `run_clm.py`'s `group_texts` applied through `map(batched=True, batch_size=map_batch_size)`:
/// each chunk of `map_batch_size` tokenized rows is concatenated and cut into blocks of
/// `block_size` tokens, the chunk's remainder dropped. Rows get `attention_mask` all ones
/// (the tokenizer's) and `labels = input_ids`.
///
/// ```
/// use tchtrain_datasets::{Label, group_texts};
/// let rows = vec![vec![1, 2, 3], vec![4, 5], vec![6, 7, 8, 9]];
/// let blocks = group_texts(&rows, 4, None)?;
/// assert_eq!(blocks.len(), 2);
/// assert_eq!(blocks[1].input_ids, [5, 6, 7, 8]);
/// assert_eq!(blocks[1].labels, Some(Label::Ids(vec![5, 6, 7, 8])));
/// # Ok::<(), tchtrain_datasets::Error>(())
/// ```
pub fn group_texts(
    tokenized: &[Vec<i64>],
    block_size: usize,
    map_batch_size: Option<usize>,
) -> Result<Vec<Feature>> {
    if block_size == 0 {
        return Err(Error::InvalidArgument {
            field: "block_size",
            detail: "must be at least 1".into(),
        });
    }
    let chunk = map_batch_size.unwrap_or(DEFAULT_MAP_BATCH_SIZE).max(1);
    let mut out = Vec::new();
    for rows in tokenized.chunks(chunk) {
        let cat: Vec<i64> = rows.iter().flatten().copied().collect();
        let total = (cat.len() / block_size) * block_size;
        for block in cat[..total].chunks(block_size) {
            out.push(Feature {
                input_ids: block.to_vec(),
                attention_mask: Some(vec![1; block_size]),
                labels: Some(Label::Ids(block.to_vec())),
                ..Feature::default()
            });
        }
    }
    Ok(out)
}

/// `run_clm.py`'s choice of the column to tokenize: `"text"` if there is one, else the
/// first column (`text_column_name = "text" if "text" in column_names else
/// column_names[0]`). No columns at all is [`Error::MissingColumn`].
pub fn clm_text_column(columns: &[String], path: &Path) -> Result<String> {
    if columns.iter().any(|c| c == "text") {
        return Ok("text".into());
    }
    columns
        .first()
        .cloned()
        .ok_or_else(|| Error::MissingColumn {
            column: "text".into(),
            path: path.to_path_buf(),
            available: String::new(),
        })
}

/// The text of a cell of `run_clm.py`'s text column: a string, else [`Error::InvalidCell`]
/// (upstream's tokenizer refuses `None` and numbers too).
fn text_cell(cell: Value, chunks: &ColumnChunks, row: usize) -> Result<String> {
    match cell {
        Value::String(s) => Ok(s),
        other => Err(Error::InvalidCell {
            path: chunks.path().to_path_buf(),
            column: chunks.column().to_string(),
            row,
            detail: format!(
                "{} where text is needed",
                if other.is_null() {
                    "null".to_string()
                } else {
                    format!("the value {other}")
                }
            ),
        }),
    }
}

/// The rows of `run_clm.py`'s text column of a Parquet file (see [`clm_text_column`]).
fn parquet_text_rows(path: &Path) -> Result<Vec<String>> {
    let file = ParquetFile::open(path)?;
    let mut chunks = file.iter_column(&clm_text_column(&file.columns(), path)?)?;
    let mut lines = Vec::with_capacity(file.num_rows());
    while let Some(cells) = chunks.next() {
        for cell in cells? {
            let row = lines.len();
            lines.push(text_cell(cell, &chunks, row)?);
        }
    }
    Ok(lines)
}

/// The whole `run_clm.py` preparation of a text file: [`load_text_lines`] (line breaks
/// kept) — or, for a `.parquet` file, the rows of its text column ([`clm_text_column`]) —,
/// [`tokenize_lines`], [`group_texts`] with `datasets`' default chunking: the rows of the
/// blocks. Too little text for one block is [`Error::EmptyDataset`].
pub fn causal_lm_blocks_from_file(
    path: impl AsRef<Path>,
    tokenizer: &Tokenizer,
    block_size: usize,
) -> Result<Vec<Feature>> {
    let path = path.as_ref();
    let lines = if is_parquet(path) {
        parquet_text_rows(path)?
    } else {
        load_text_lines(path, true)?
    };
    let ids = tokenize_lines(tokenizer, &lines)?;
    let blocks = group_texts(&ids, block_size, None)?;
    if blocks.is_empty() {
        return Err(Error::EmptyDataset {
            what: "training",
            hint: format!(
                ": {} has fewer than block_size = {block_size} tokens per {DEFAULT_MAP_BATCH_SIZE} lines",
                path.display()
            ),
        });
    }
    Ok(blocks)
}

/// [`causal_lm_blocks_from_file`] as a stream (upstream's `run_clm.py --streaming`): the file
/// is read [`DEFAULT_MAP_BATCH_SIZE`] lines at a time, each chunk tokenized and grouped into
/// `block_size` blocks as the training consumes them, so the text never has to fit in
/// memory. The blocks are exactly those of the in-memory preparation, in the same order.
///
/// A `.parquet` file streams its text column ([`clm_text_column`]) one row group at a
/// time: the rows are the lines, chunked across row groups as `datasets`' batched `map` over
/// an `IterableDataset` chunks them.
#[derive(Clone)]
pub struct CausalLmTextStream {
    path: PathBuf,
    tokenizer: Arc<Tokenizer>,
    block_size: usize,
}

impl std::fmt::Debug for CausalLmTextStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CausalLmTextStream")
            .field("path", &self.path)
            .field("block_size", &self.block_size)
            .finish_non_exhaustive()
    }
}

impl CausalLmTextStream {
    /// A stream of `block_size`-token blocks of the text file (or `.parquet` file) at `path`.
    /// A zero block size is [`Error::InvalidArgument`]; a missing file is reported when a
    /// pass starts.
    pub fn new(
        path: impl AsRef<Path>,
        tokenizer: Arc<Tokenizer>,
        block_size: usize,
    ) -> Result<Self> {
        if block_size == 0 {
            return Err(Error::InvalidArgument {
                field: "block_size",
                detail: "must be at least 1".into(),
            });
        }
        Ok(Self {
            path: path.as_ref().to_path_buf(),
            tokenizer,
            block_size,
        })
    }

    /// One pass over the file from its beginning: the blocks in order, each an item (a
    /// line that cannot be read or tokenized is an error item, the last one). Failing to
    /// open the file (or, for Parquet, to read its footer or find its text column) is an
    /// error here. (`tchtrain-data` makes the stream an `IterableDataset`, one pass per
    /// epoch.)
    pub fn blocks(&self) -> Result<TextBlocks> {
        let source = if is_parquet(&self.path) {
            let file = ParquetFile::open(&self.path)?;
            let column = clm_text_column(&file.columns(), &self.path)?;
            LineSource::Parquet(file.iter_column(&column)?)
        } else {
            let file =
                std::fs::File::open(&self.path).map_err(|e| Error::io("reading", &self.path, e))?;
            LineSource::Text(std::io::BufReader::new(file))
        };
        Ok(TextBlocks {
            stream: self.clone(),
            source,
            line_no: 0,
            carried: VecDeque::new(),
            pending: VecDeque::new(),
            done: false,
        })
    }
}

/// Where a [`TextBlocks`] pass reads its lines.
enum LineSource {
    /// A text file, read up to each `\n`.
    Text(std::io::BufReader<std::fs::File>),
    /// A Parquet file's text column, one row group at a time.
    Parquet(ColumnChunks),
}

/// One pass of a [`CausalLmTextStream`]: an iterator over its blocks.
pub struct TextBlocks {
    stream: CausalLmTextStream,
    source: LineSource,
    /// Lines read so far (for error messages).
    line_no: usize,
    /// Lines already read but not yet in a chunk (a `\n`-terminated piece may hold several
    /// of Python's lines: `\r`, `\x0b`, ...; a row group holds many rows).
    carried: VecDeque<String>,
    /// Blocks of the current chunk not yet yielded.
    pending: VecDeque<Feature>,
    done: bool,
}

impl TextBlocks {
    /// Reads the next piece of the source into `carried`; false at its end.
    fn read_more(&mut self, lines_in_chunk: usize) -> Result<bool> {
        match &mut self.source {
            LineSource::Text(reader) => {
                let mut buf = Vec::new();
                let n = reader
                    .read_until(b'\n', &mut buf)
                    .map_err(|e| Error::io("reading", &self.stream.path, e))?;
                if n == 0 {
                    return Ok(false);
                }
                let piece = String::from_utf8(buf).map_err(|e| Error::DataFile {
                    path: self.stream.path.clone(),
                    line: self.line_no + lines_in_chunk + 1,
                    detail: format!("not UTF-8 ({e})"),
                })?;
                self.carried.extend(split_lines(&piece, true));
                Ok(true)
            }
            LineSource::Parquet(chunks) => {
                let Some(cells) = chunks.next() else {
                    return Ok(false);
                };
                let first_row = self.line_no + lines_in_chunk + self.carried.len();
                for (i, cell) in cells?.into_iter().enumerate() {
                    let line = text_cell(cell, chunks, first_row + i)?;
                    self.carried.push_back(line);
                }
                Ok(true)
            }
        }
    }

    /// Reads the next chunk of up to [`DEFAULT_MAP_BATCH_SIZE`] lines (Python's
    /// `splitlines(keepends=True)` lines, or a Parquet column's rows) and groups it into
    /// blocks, as `datasets`' batched `map` does chunk by chunk.
    fn refill(&mut self) -> Result<()> {
        let mut lines: Vec<String> = Vec::with_capacity(DEFAULT_MAP_BATCH_SIZE);
        while lines.len() < DEFAULT_MAP_BATCH_SIZE {
            if let Some(line) = self.carried.pop_front() {
                lines.push(line);
                continue;
            }
            if !self.read_more(lines.len())? {
                self.done = true;
                break;
            }
        }
        self.line_no += lines.len();
        let ids = tokenize_lines(&self.stream.tokenizer, &lines)?;
        self.pending
            .extend(group_texts(&ids, self.stream.block_size, None)?);
        Ok(())
    }
}

impl Iterator for TextBlocks {
    type Item = Result<Feature>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(block) = self.pending.pop_front() {
                return Some(Ok(block));
            }
            if self.done && self.carried.is_empty() {
                return None;
            }
            if let Err(e) = self.refill() {
                self.done = true;
                self.carried.clear();
                return Some(Err(e));
            }
        }
    }
}

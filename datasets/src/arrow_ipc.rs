//! Arrow IPC files as the `datasets` "arrow" loader and `load_from_disk` read them: the
//! streaming format (what `datasets` writes: `save_to_disk` shards, the cache's `.arrow`
//! files) and the random-access file format (`ARROW1` magic), their buffers uncompressed or
//! lz4 / zstd-compressed; each cell as `to_list()` gives it (see `arrow_cells`).

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::path::Path;

use arrow_array::RecordBatch;
use arrow_ipc::reader::{FileReader, StreamReader};
use arrow_schema::{ArrowError, SchemaRef};
use serde_json::Value;

use crate::arrow_cells::{CellError, batch_columns, check_type, rows_from_columns};
use crate::error::{Error, Result, catch_decoder_panic};
use crate::table::{Table, other_format_hint, read_up_to};

const FORMAT: &str = "Arrow IPC";

/// The magic bytes an Arrow IPC *file* starts (padded to 8) and ends with.
const FILE_MAGIC: &[u8; 6] = b"ARROW1";

/// The marker before each message of an IPC stream (since Arrow 0.15).
const CONTINUATION: [u8; 4] = [0xff; 4];

/// Reads every record batch of an Arrow IPC stream or file at `path` into a [`Table`]
/// (`datasets.load_dataset("arrow", data_files=...)`; pyarrow's `ipc.open_stream`, else
/// `ipc.open_file`).
pub(crate) fn read_arrow_ipc(path: &Path) -> Result<Table> {
    let mut file = File::open(path).map_err(|e| Error::io("reading", path, e))?;
    let len = file
        .metadata()
        .map_err(|e| Error::io("reading", path, e))?
        .len();
    let mut head = [0u8; 8];
    let n = read_up_to(&mut file, &mut head).map_err(|e| Error::io("reading", path, e))?;
    let head = &head[..n];
    let not = |detail: String| Error::NotFormat {
        path: path.to_path_buf(),
        format: FORMAT,
        detail,
    };
    if n == 0 {
        return Err(not("the file is empty".into()));
    }
    file.seek(SeekFrom::Start(0))
        .map_err(|e| Error::io("reading", path, e))?;
    if head.starts_with(FILE_MAGIC) || FILE_MAGIC.starts_with(head) {
        let mut tail = [0u8; 6];
        let ends_with_magic = len >= 14
            && file
                .seek(SeekFrom::End(-6))
                .and_then(|_| read_up_to(&mut file, &mut tail))
                .map_err(|e| Error::io("reading", path, e))?
                == 6
            && &tail == FILE_MAGIC;
        if !ends_with_magic {
            return Err(Error::Truncated {
                path: path.to_path_buf(),
                format: FORMAT,
                detail: "it starts as an Arrow IPC file (ARROW1) but does not end with the \
                         ARROW1 footer"
                    .into(),
            });
        }
        check_file_blocks(path, &mut file, len)?;
        file.seek(SeekFrom::Start(0))
            .map_err(|e| Error::io("reading", path, e))?;
        return catch_decoder_panic(path, FORMAT, || {
            let reader =
                FileReader::try_new_buffered(file, None).map_err(|e| ipc_error(path, e))?;
            let schema = reader.schema();
            collect(path, schema, reader)
        });
    }
    if !looks_like_stream(head, len) {
        return Err(not(format!(
            "it is neither an Arrow IPC stream nor an Arrow IPC file{}",
            other_format_hint(head)
        )));
    }
    catch_decoder_panic(path, FORMAT, || {
        let reader = StreamReader::try_new_buffered(file, None).map_err(|e| ipc_error(path, e))?;
        let schema = reader.schema();
        collect(path, schema, reader)
    })
}

/// Checks that every block (record batch, dictionary) the footer of an IPC file lists lies
/// within the file: the file reader allocates a block's declared size before reading it, so
/// a corrupt size would otherwise ask for any amount of memory (and a negative one panics).
/// The file ends with the footer, its length (4 bytes) and `ARROW1`.
fn check_file_blocks(path: &Path, file: &mut File, len: u64) -> Result<()> {
    let corrupt = |detail: String| Error::Corrupt {
        path: path.to_path_buf(),
        format: FORMAT,
        detail,
    };
    let mut footer_len = [0u8; 4];
    file.seek(SeekFrom::End(-10))
        .and_then(|_| read_up_to(file, &mut footer_len))
        .map_err(|e| Error::io("reading", path, e))?;
    let footer_len = i32::from_le_bytes(footer_len);
    // The 8 bytes of the leading magic, the footer, its length and the trailing magic.
    let data_end = u64::try_from(footer_len)
        .ok()
        .and_then(|n| len.checked_sub(n + 10))
        .filter(|&end| end >= 8)
        .ok_or_else(|| corrupt(format!("a footer length of {footer_len} bytes")))?;
    let mut footer = vec![0u8; (len - 10 - data_end) as usize];
    file.seek(SeekFrom::Start(data_end))
        .and_then(|_| read_up_to(file, &mut footer))
        .map_err(|e| Error::io("reading", path, e))?;
    let footer = catch_decoder_panic(path, FORMAT, || {
        arrow_ipc::root_as_footer(&footer).map_err(|e| corrupt(format!("the footer: {e}")))
    })?;
    let blocks = footer
        .dictionaries()
        .into_iter()
        .flatten()
        .chain(footer.recordBatches().into_iter().flatten());
    for block in blocks {
        let (offset, meta, body) = (block.offset(), block.metaDataLength(), block.bodyLength());
        let end = u64::try_from(offset)
            .ok()
            .zip(u64::try_from(meta).ok())
            .zip(u64::try_from(body).ok())
            .and_then(|((o, m), b)| o.checked_add(m)?.checked_add(b));
        if end.is_none_or(|end| end > data_end) {
            return Err(corrupt(format!(
                "a block at byte {offset} of {meta} + {body} bytes, outside the file's {data_end} \
                 bytes of data"
            )));
        }
    }
    Ok(())
}

/// Whether `head` opens an IPC stream: the continuation marker, or (before Arrow 0.15) a
/// positive metadata length within the file.
fn looks_like_stream(head: &[u8], len: u64) -> bool {
    if head.len() < 4 {
        return CONTINUATION.starts_with(head);
    }
    if head[..4] == CONTINUATION {
        return true;
    }
    let legacy = i32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    legacy > 0 && u64::try_from(legacy).is_ok_and(|l| l + 4 <= len)
}

/// The cells of every batch, after checking that every column has a cell type.
fn collect(
    path: &Path,
    schema: SchemaRef,
    batches: impl Iterator<Item = std::result::Result<RecordBatch, ArrowError>>,
) -> Result<Table> {
    let names: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
    for f in schema.fields() {
        if let Err(t) = check_type(f.data_type()) {
            return Err(unsupported(path, f.name(), &t));
        }
    }
    let mut columns: Vec<Vec<Value>> = vec![Vec::new(); names.len()];
    for batch in batches {
        let batch = batch.map_err(|e| ipc_error(path, e))?;
        let cells = batch_columns(&batch).map_err(|(column, e)| match e {
            CellError::Unsupported(t) => unsupported(path, &column, &t),
            CellError::Corrupt(detail) => Error::Corrupt {
                path: path.to_path_buf(),
                format: FORMAT,
                detail: format!("column '{column}': {detail}"),
            },
        })?;
        if cells.len() != columns.len() {
            return Err(Error::Corrupt {
                path: path.to_path_buf(),
                format: FORMAT,
                detail: format!(
                    "a record batch of {} columns in a stream of {}",
                    cells.len(),
                    columns.len()
                ),
            });
        }
        for (all, part) in columns.iter_mut().zip(cells) {
            all.extend(part);
        }
    }
    let n = columns.first().map_or(0, Vec::len);
    Ok(Table::from_parts(
        path.to_path_buf(),
        names,
        rows_from_columns(columns, n),
    ))
}

fn unsupported(path: &Path, column: &str, data_type: &arrow_schema::DataType) -> Error {
    Error::UnsupportedType {
        path: path.to_path_buf(),
        column: column.to_string(),
        data_type: data_type.to_string(),
    }
}

/// A decoder error: running out of bytes mid-message is [`Error::Truncated`], the rest
/// [`Error::Corrupt`].
fn ipc_error(path: &Path, e: ArrowError) -> Error {
    match e {
        ArrowError::IoError(_, io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
            Error::Truncated {
                path: path.to_path_buf(),
                format: FORMAT,
                detail: format!("a message ends early ({io})"),
            }
        }
        // arrow-ipc's message reader reports a short metadata read this way.
        ArrowError::ParseError(message) if message.starts_with("Unexpected end of stream") => {
            Error::Truncated {
                path: path.to_path_buf(),
                format: FORMAT,
                detail: message,
            }
        }
        other => Error::Corrupt {
            path: path.to_path_buf(),
            format: FORMAT,
            detail: other.to_string(),
        },
    }
}

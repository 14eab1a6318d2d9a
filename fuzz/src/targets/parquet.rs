//! The Parquet and Arrow IPC readers on a file: the first byte picks the reader (0:
//! `Table::read` of `data.parquet`, 1: `Table::read` of `data.arrow`, 2: `ParquetFile` row
//! group by row group and column by column), the rest is the file's bytes. An error or a
//! table, never a panic out of the reader.
//!
//! The readers catch panics of the `parquet` / `arrow` crates themselves (which have
//! panicked on malformed files) and return `Error::Corrupt`. libfuzzer-sys's panic hook
//! aborts on every panic, caught or not, so this target installs a quiet hook instead
//! ([`crate::quiet_panics`]) and fails only when a panic escapes the reader, with its
//! message.

use tchtrain_datasets::{ParquetFile, Table, cell_text};

const NAMES: [&str; 3] = ["data.parquet", "data.arrow", "data.parquet"];

/// One input.
pub fn run(data: &[u8]) {
    crate::quiet_panics();
    let Some((&pick, bytes)) = data.split_first() else {
        return;
    };
    let pick = pick as usize % NAMES.len();
    let path = crate::scratch_file(NAMES[pick], bytes);
    let read = std::panic::catch_unwind(|| {
        if pick == 2 {
            by_row_group(&path);
        } else if let Ok(table) = Table::read(&path) {
            read_all(&table);
        }
    });
    if read.is_err() {
        let message = crate::last_panic();
        eprintln!("a panic escaped the reader: {message}");
        panic!("a panic escaped the reader: {message}");
    }
}

/// Every row group, then every column as a stream.
fn by_row_group(path: &std::path::Path) {
    let Ok(file) = ParquetFile::open(path) else {
        return;
    };
    let _ = (file.num_rows(), file.num_row_groups());
    for i in 0..=file.num_row_groups() {
        if let Ok(table) = file.read_row_group(i, None) {
            read_all(&table);
        }
    }
    for column in file.columns() {
        if let Ok(chunks) = file.iter_column(&column) {
            for cells in chunks.flatten() {
                cells.iter().for_each(|c| drop(cell_text(c)));
            }
        }
    }
}

fn read_all(table: &Table) {
    for column in table.columns() {
        for row in 0..=table.len() {
            if let Ok(v) = table.cell(row, column) {
                let _ = cell_text(v);
            }
        }
    }
}

//! `decode_rows` (the tokenized-dataset cache files, `MapCache`) on arbitrary bytes: an
//! error or rows, never a panic; rows that decode encode back to the same bytes.

use tchtrain_datasets::{decode_rows, encode_rows};

/// One input.
pub fn run(data: &[u8]) {
    if let Ok(rows) = decode_rows(data) {
        assert_eq!(
            encode_rows(&rows),
            data,
            "decode then encode must give the same bytes"
        );
    }
}

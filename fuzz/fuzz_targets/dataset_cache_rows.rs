//! `decode_rows` (the tokenized-dataset cache files, `MapCache`) on arbitrary bytes: an
//! error or rows, never a panic; rows that decode encode back to the same bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tchtrain_datasets::{decode_rows, encode_rows};

fuzz_target!(|data: &[u8]| {
    if let Ok(rows) = decode_rows(data) {
        assert_eq!(
            encode_rows(&rows),
            data,
            "decode then encode must give the same bytes"
        );
    }
});

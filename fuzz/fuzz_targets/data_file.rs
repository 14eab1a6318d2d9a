//! `Table::read` on a file: the first byte picks the name (`.csv`, `.jsonl`, `.json`, each
//! also `.bz2`-compressed, or an unknown extension), the rest is the file's bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tchtrain_datasets::Table;

const NAMES: [&str; 7] = [
    "data.csv",
    "data.jsonl",
    "data.json",
    "data.csv.bz2",
    "data.jsonl.bz2",
    "data.json.bz2",
    "data.txt",
];

fuzz_target!(|data: &[u8]| {
    let Some((&pick, bytes)) = data.split_first() else {
        return;
    };
    let path = tchtrain_fuzz::scratch_file(NAMES[pick as usize % NAMES.len()], bytes);
    let _ = Table::read(&path);
});

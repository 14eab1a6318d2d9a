//! `Table::read` on a file: the first byte picks the name (`.csv`, `.jsonl`, `.json`, each
//! also `.bz2`-compressed, or an unknown extension), the rest is the file's bytes.

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

/// One input.
pub fn run(data: &[u8]) {
    let Some((&pick, bytes)) = data.split_first() else {
        return;
    };
    let path = crate::scratch_file(NAMES[pick as usize % NAMES.len()], bytes);
    let _ = Table::read(&path);
}

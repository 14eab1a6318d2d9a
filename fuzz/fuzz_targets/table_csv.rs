//! `Table::from_csv_str` (the `--train_file x.csv` loader) and reading every cell back.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tchtrain_datasets::{Table, cell_text};

fuzz_target!(|data: &[u8]| {
    let Some(text) = tchtrain_fuzz::text(data) else {
        return;
    };
    if let Ok(table) = Table::from_csv_str(text, "fuzz.csv") {
        read_all(&table);
    }
});

fn read_all(table: &Table) {
    for column in table.columns() {
        for row in 0..=table.len() {
            if let Ok(v) = table.cell(row, column) {
                let _ = cell_text(v);
            }
        }
    }
}

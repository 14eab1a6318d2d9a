//! `Table::from_json_str` (the `--train_file x.jsonl` / `x.json` loader: JSON lines or an
//! array of objects) and reading every cell back.

use tchtrain_datasets::{Table, cell_text};

/// One input.
pub fn run(data: &[u8]) {
    let Some(text) = crate::text(data) else {
        return;
    };
    let Ok(table) = Table::from_json_str(text, "fuzz.jsonl") else {
        return;
    };
    for column in table.columns() {
        for row in 0..=table.len() {
            if let Ok(v) = table.cell(row, column) {
                let _ = cell_text(v);
            }
        }
    }
}

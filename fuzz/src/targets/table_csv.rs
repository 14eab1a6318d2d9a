//! `Table::from_csv_str` (the `--train_file x.csv` loader) and reading every cell back.

use tchtrain_datasets::{Table, cell_text};

/// One input.
pub fn run(data: &[u8]) {
    let Some(text) = crate::text(data) else {
        return;
    };
    if let Ok(table) = Table::from_csv_str(text, "fuzz.csv") {
        read_all(&table);
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

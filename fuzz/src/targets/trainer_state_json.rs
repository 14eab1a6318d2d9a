//! `TrainerState::from_json_str` (a checkpoint's `trainer_state.json`) and the Python-style
//! `loads` / `dumps` under it; what parses must write itself out and read back.

use tchtrain_callbacks::{TrainerState, dumps, loads};

/// One input.
pub fn run(data: &[u8]) {
    let Some(text) = crate::text(data) else {
        return;
    };
    if let Ok(value) = loads(text) {
        let written = dumps(&value, Some(2), true);
        if let Err(e) = loads(&written) {
            panic!("dumps output does not parse again: {e}\n{written}");
        }
    }
    let Ok(state) = TrainerState::from_json_str(text, "trainer_state.json") else {
        return;
    };
    let saved = state.to_json_string();
    if let Err(e) = TrainerState::from_json_str(&saved, "saved trainer_state.json") {
        panic!("to_json_string output does not parse again: {e}\n{saved}");
    }
}

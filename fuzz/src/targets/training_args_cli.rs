//! `HfArgumentParser::parse_args_into_dataclasses` / `parse_known_args`: the input is a
//! command line, one argument per line.

use std::sync::OnceLock;

use tchtrain_training_args::HfArgumentParser;

/// One input.
pub fn run(data: &[u8]) {
    static PARSER: OnceLock<HfArgumentParser> = OnceLock::new();
    let parser = PARSER.get_or_init(HfArgumentParser::new);
    let Some(text) = crate::text(data) else {
        return;
    };
    let argv: Vec<&str> = if text.is_empty() {
        Vec::new()
    } else {
        text.split('\n').collect()
    };
    let _ = parser.parse_args_into_dataclasses(&argv);
    if let Ok((parsed, _rest)) = parser.parse_known_args(&argv) {
        let _ = parsed.args.to_json_string();
    }
}

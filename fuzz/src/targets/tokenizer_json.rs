//! `AutoTokenizer::from_pretrained` on a folder with a `tokenizer.json`; a tokenizer that
//! loads must also encode and decode a short text.

use tchtrain_models::AutoTokenizer;

/// One input.
pub fn run(data: &[u8]) {
    let path = crate::scratch_file("tokenizer.json", data);
    let Some(dir) = path.parent() else {
        return;
    };
    let Ok(tok) = AutoTokenizer::from_pretrained(dir) else {
        return;
    };
    let tokenizer = tok.tokenizer();
    if let Ok(encoding) = tokenizer.encode("Hello, world! A b c.", true) {
        let _ = tokenizer.decode(encoding.get_ids(), true);
    }
}
